"""``python -m holotron.generate``: the command line (``holotron/cli.py``), and the generation functions
under their historical import path.

The functions are defined in ``holotron/generation.py``; ``from holotron.generate import generate, stream``
keeps working through the re-exports below. ``import holotron.generate`` binds the attribute
``holotron.generate`` to this module, so the module is made callable: ``holotron.generate(model, ids)``
calls ``generation.generate`` however the package was imported.
"""

from __future__ import annotations

import sys
import types

from .generation import eos_ids, generate, generate_text, sample, stop_ids, stream

__all__ = ["generate", "generate_text", "stream", "sample", "eos_ids", "stop_ids", "main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m holotron.generate``: see ``holotron.cli``."""
    from .cli import main as cli_main

    return cli_main(argv)


class _CallableModule(types.ModuleType):
    """Forwards calls to ``generate`` (see the module docstring)."""

    def __call__(self, *args, **kwargs):
        return generate(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
