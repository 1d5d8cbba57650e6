"""The processor's output: model inputs as a dict whose keys are also attributes, movable as one."""

from __future__ import annotations

import torch

from .devices import DeviceError, resolve_device
from .processor_errors import ProcessorError

__all__ = ["BatchInputs"]


def _checked_device(device) -> torch.device:
    """``device`` as a torch.device this machine has; ProcessorError (one line) otherwise."""
    try:
        return resolve_device(device, label=f"BatchInputs.to({str(device)!r})", use_cpu="'cpu'")
    except DeviceError as e:
        raise ProcessorError(str(e)) from None


class BatchInputs(dict):
    """Model inputs (input_ids, attention_mask and, with images, pixel_values and num_tiles).

    Keys are also attributes. ``texts`` holds the rendered prompts and ``images_per_prompt`` how
    many images each prompt took (pixel_values and num_tiles list them prompt by prompt).
    """

    texts: list[str]
    images_per_prompt: list[int]

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device=None, dtype=None) -> "BatchInputs":
        """Move tensors to ``device``; ``dtype`` (a floating torch dtype) applies to pixel_values only. A
        device this machine does not have, or a dtype that is not floating, is a ProcessorError up front."""
        dev = None if device is None else _checked_device(device)
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise ProcessorError(f"BatchInputs.to: dtype must be a floating torch dtype (e.g. torch.bfloat16), "
                                 f"got {dtype!r}")
        out = BatchInputs({k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in self.items()})
        if dtype is not None and "pixel_values" in out:
            out["pixel_values"] = out["pixel_values"].to(dtype)
        out.texts, out.images_per_prompt = self.texts, self.images_per_prompt
        return out
