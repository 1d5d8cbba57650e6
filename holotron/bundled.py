"""What ships inside the package: the tiny default model and an example screenshot.

``holotron.load("holotron-tiny-ui")`` and ``Processor.from_pretrained("holotron-tiny-ui")`` resolve the
name to the folder under ``holotron/models/``; ``python -m holotron.generate`` with no arguments runs
that model on ``example_image()``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_MODEL", "MODELS_DIR", "bundled_path", "default_model", "example_image"]

DEFAULT_MODEL = "holotron-tiny-ui"
MODELS_DIR = Path(__file__).resolve().parent / "models"
EXAMPLE_IMAGE = Path(__file__).resolve().parent / "data" / "example_screen.png"


def bundled_path(name) -> Path | None:
    """The folder of a bundled model called ``name`` (a bare name, no slash), or None."""
    s = str(name)
    if "/" in s or "\\" in s or s.startswith("."):
        return None
    folder = MODELS_DIR / s
    return folder if (folder / "config.json").is_file() else None


def default_model() -> str | None:
    """The bundled default model's folder as a string, or None when this build has none."""
    p = bundled_path(DEFAULT_MODEL)
    return None if p is None else str(p)


def example_image() -> Path:
    if not EXAMPLE_IMAGE.is_file():
        raise FileNotFoundError(f"the bundled example screenshot {EXAMPLE_IMAGE} is missing from this build: "
                                "pass --image")
    return EXAMPLE_IMAGE
