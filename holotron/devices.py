"""Where and in what precision a model runs: a device or dtype named by a user, checked up front.

    resolve_device("cuda")          -> torch.device("cuda"), or DeviceError saying why it cannot be used
    resolve_dtype("bf16")           -> torch.bfloat16
    resolve_dtype("auto", device)   -> bfloat16 on CUDA, float32 elsewhere

Every refusal is a ``DeviceError`` (a ValueError) of one line that names the value given and the accepted
forms, raised before anything is read or allocated: a CPU user asking for CUDA hears that torch sees no
GPU (and which torch build this is), not an error from deep inside a loader. ``CAPTURE_MODE``: how the
engine captures its CUDA graphs on the device.
"""

from __future__ import annotations

import os

import torch

__all__ = ["DeviceError", "resolve_device", "resolve_dtype", "DEVICE_FORMS", "DTYPE_NAMES", "CAPTURE_MODE"]

# How the engine's CUDA graphs are captured (``torch.cuda.graph(..., capture_error_mode=CAPTURE_MODE)``): only this
# thread's calls are checked. In the default global mode another thread's CUDA call, e.g. a DataLoader's
# pin-memory thread allocating pinned buffers while a training run's eval builds an engine, invalidates the
# capture (cudaErrorStreamCaptureInvalidated, met on an H100 on 2026-12-05: dev/LOG.md).
CAPTURE_MODE = "thread_local"

DEVICE_FORMS = "'cpu', 'cuda', 'cuda:N', 'auto' (cuda when a GPU is visible, else cpu) or a torch.device"

# the floating dtypes a model can be loaded in, by every name they are commonly given
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


class DeviceError(ValueError):
    """A device or dtype that cannot be used here; the message names the value and what to use instead."""


def _torch_build() -> str:
    if torch.version.cuda is None:
        return f"torch {torch.__version__}, CPU build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return f"torch {torch.__version__}, built for CUDA {torch.version.cuda}: no driver or no visible GPU{seen}"


def _named(device) -> str:
    return f"device={str(device)!r}"


def resolve_device(device=None, *, label: str | None = None, use_cpu: str = "device='cpu'") -> torch.device:
    """``device`` as a ``torch.device`` that exists here. None: the CPU. ``"auto"``: CUDA when torch sees
    a GPU, else the CPU. Accepts "cpu", "cuda", "cuda:N", an int N (cuda:N), "mps" where torch has it, or a
    torch.device; anything else, or a GPU this machine does not have, raises ``DeviceError``.

    ``label`` names the culprit in the message (default ``device='...'``; a command line passes
    ``--device X``) and ``use_cpu`` is how the caller's user asks for the CPU instead."""
    named = label if label is not None else _named(device)
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device.strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise DeviceError(f"{label or 'device'}: expected {DEVICE_FORMS}, got {type(device).__name__} {device!r}")
    try:
        dev = device if isinstance(device, torch.device) else torch.device(device.strip() if isinstance(device, str)
                                                                           else device)
    except (RuntimeError, ValueError, TypeError):
        raise DeviceError(f"{named}: unknown device {str(device)!r}; use {DEVICE_FORMS}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"{named}: CUDA was asked for but torch sees no GPU ({_torch_build()}); "
                              f"use {use_cpu}")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            have = ", ".join(f"cuda:{i}" for i in range(n))
            raise DeviceError(f"{named}: torch sees {n} CUDA GPU{'s' if n != 1 else ''} ({have}); "
                              "use one of those")
        return dev
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceError(f"{named}: MPS was asked for but this torch / machine has none; "
                              f"use {use_cpu}")
        return dev
    raise DeviceError(f"{named}: holotron does not run on {dev.type!r} devices; use {DEVICE_FORMS}")


def resolve_dtype(dtype=None, device=None, *, label: str = "dtype") -> torch.dtype | None:
    """``dtype`` as a floating ``torch.dtype``, or None for None (the caller's default, e.g. the checkpoint's).

    Accepts a torch dtype or a name: "float32" / "fp32" / "float", "bfloat16" / "bf16", "float16" / "fp16" /
    "half", "float64" / "fp64" / "double" (any case, "torch." prefix allowed), and "auto": bfloat16 when
    ``device`` (resolved by ``resolve_device``) is CUDA, float32 otherwise. Anything else, including a
    non-floating dtype such as int8, raises ``DeviceError``."""
    if dtype is None:
        return None
    accepted = "'float32', 'bfloat16', 'float16', 'float64' (or fp32, bf16, fp16, half), 'auto' or a torch dtype"
    if isinstance(dtype, torch.dtype):
        if dtype not in set(DTYPE_NAMES.values()):
            raise DeviceError(f"{label}={dtype}: not a floating dtype a model can be loaded in; use {accepted}")
        return dtype
    if not isinstance(dtype, str):
        raise DeviceError(f"{label}: expected {accepted}, got {type(dtype).__name__} {dtype!r}")
    name = dtype.strip().lower().removeprefix("torch.")
    if name == "auto":
        return torch.bfloat16 if resolve_device(device).type == "cuda" else torch.float32
    if name not in DTYPE_NAMES:
        raise DeviceError(f"{label}={dtype!r}: not a dtype holotron loads models in; use {accepted}")
    return DTYPE_NAMES[name]
