"""The bundled example screenshot (example_screen.png) and the instruction that goes with it.

It is a generated training-distribution screen: a light desktop app window at 1280x800 with a menu
bar, a toolbar (icons, "Upload" and "Submit" buttons, a search field), tabs, checkboxes, radio
buttons, links and a status bar. ``python -m holotron.data.example`` writes it again.
"""

from __future__ import annotations

from importlib import resources

from .canvas import Element

EXAMPLE_SEED = 235
EXAMPLE_OPTIONS = {"size": (1280, 800), "layout": "app", "theme": "light"}
EXAMPLE_INSTRUCTION = "the Upload button"
EXAMPLE_TARGET = Element("Upload", "button", (344, 111, 412, 144))  # pixels, x1 / y1 exclusive
EXAMPLE_ANSWER = '{"x": 295, "y": 159}'  # the target's centre in the model's 0-1000 space
MADE_WITH_PILLOW = "13.0.0"  # text rendering (hence the pixels) may differ with other Pillow / FreeType builds


def example_path():
    """Path of the bundled PNG (a Traversable; ``str()`` of it is a file path in a normal install)."""
    return resources.files(__package__).joinpath("example_screen.png")


def example_sample():
    """Regenerate the example screen (a Sample; its own instruction may be phrased differently)."""
    from .screens import generate_sample

    return generate_sample(EXAMPLE_SEED, **EXAMPLE_OPTIONS)


if __name__ == "__main__":
    import sys

    out = sys.argv[1] if len(sys.argv) > 1 else str(example_path())
    example_sample().image.save(out, optimize=True)
    print(f"wrote {out}")
