"""holotron: hybrid SSM (Mamba2 + attention) vision-language models in plain PyTorch.

Public API: ``load``, ``Holotron``, ``HybridLM``, ``Processor``, ``generate`` and the scan ops
``ssd_scan`` / ``ssd_step`` (``holotron.kernels``). Heavier submodules are imported on first use.
"""

from __future__ import annotations

import importlib

from .kernels import ssd_scan, ssd_step

__version__ = "0.1.0"

# public name -> submodule that defines it (imported lazily, so `import holotron` stays cheap)
_LAZY = {
    "load": "holotron.weights",
    "save_pretrained": "holotron.weights",
    "HybridLM": "holotron.lm",
    "TextConfig": "holotron.config",
    "VisionConfig": "holotron.config",
    "HolotronConfig": "holotron.config",
    "Holotron": "holotron.model",
    "Processor": "holotron.processor",
    "generate": "holotron.generation",
    "generate_text": "holotron.generation",
}

__all__ = ["ssd_scan", "ssd_step", "__version__", *_LAZY]


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'holotron' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
