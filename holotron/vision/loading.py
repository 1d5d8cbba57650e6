"""Strict loading of the vision half of a VL checkpoint: the ``vision_model.*`` and ``mlp1.*`` tensors.

``load_vision_state_dict(vision_model, mlp1, state_dict)`` takes a flat dict of the checkpoint's names
(other prefixes, e.g. ``language_model.``, are left to the language model's loader), loads every tensor
strictly and returns the names of the optional tensors it found (layer scales, video embedder, input
conditioner, summary_idxs). A missing tensor, an unknown name or a wrong shape raises
``VisionWeightsError`` with a short grouped message (per-block names folded into ``blocks.{j}``).
"""

from __future__ import annotations

import re

import torch
from torch import nn

__all__ = ["VisionWeightsError", "load_vision_state_dict", "OPTIONAL_TENSORS"]

PREFIXES = ("vision_model.", "mlp1.")

# tensors a RADIO checkpoint may hold beyond the ViT itself (regexes on names below vision_model.)
OPTIONAL_TENSORS = (
    r"radio_model\.input_conditioner\.norm_(mean|std)",
    r"radio_model\.summary_idxs",
    r"radio_model\.model\.patch_generator\.video_embedder\.weight",
    r"radio_model\.model\.blocks\.\d+\.layer_scale[12]\.lambda1",
)


class VisionWeightsError(ValueError):
    """The vision tensors of a checkpoint do not match holotron's module tree; the message names them."""


def _fold(names) -> list[str]:
    """Fold 'x.blocks.3.y' over block indices: ['x.blocks.{j}.y (j in 0-31)']."""
    groups: dict[str, list[int]] = {}
    for n in names:
        m = re.search(r"\.blocks\.(\d+)\.", n)
        key = n if m is None else n[: m.start()] + ".blocks.{j}." + n[m.end():]
        groups.setdefault(key, [])
        if m is not None:
            groups[key].append(int(m.group(1)))
    out = []
    for key, idx in sorted(groups.items()):
        if not idx:
            out.append(key)
            continue
        idx = sorted(idx)
        contiguous = len(idx) > 1 and idx == list(range(idx[0], idx[-1] + 1))
        ranges = "j in " + (f"{idx[0]}-{idx[-1]}" if contiguous else ",".join(map(str, idx)))
        out.append(f"{key} ({ranges})")
    return out


def load_vision_state_dict(vision_model: nn.Module, mlp1: nn.Module | None, state_dict: dict[str, torch.Tensor],
                           *, source: str = "the state dict", assign: bool = False) -> list[str]:
    """Load ``vision_model.*`` (and ``mlp1.*`` unless ``mlp1`` is None) strictly; returns the optional tensors found."""
    problems: list[str] = []
    parts = [("vision_model.", vision_model)] + ([("mlp1.", mlp1)] if mlp1 is not None else [])
    found: list[str] = []
    for prefix, module in parts:
        sub = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not sub:
            problems.append(f"no tensors named {prefix}* in {source}")
            continue
        try:
            res = module.load_state_dict(sub, strict=False, assign=assign)
        except RuntimeError as e:  # shape mismatches; torch lists every one
            shapes = re.findall(r"size mismatch for ([\w.]+): copying a param with shape (torch.Size\(\[[^\]]*\]\)) "
                                r"from checkpoint, the shape in current model is (torch.Size\(\[[^\]]*\]\))", str(e))
            if not shapes:
                raise VisionWeightsError(f"loading {prefix}* from {source}: {e}") from e
            for name, got, want in shapes:
                problems.append(f"wrong shape: {prefix}{name} is {got[11:-1]} in {source}, holotron expects {want[11:-1]}")
            continue
        if res.missing_keys:
            problems.append(f"missing from {source}: " + "; ".join(prefix + n for n in _fold(res.missing_keys)))
        if res.unexpected_keys:
            problems.append(f"unknown names in {source} (not part of holotron's {prefix.rstrip('.')}): "
                            + "; ".join(prefix + n for n in _fold(res.unexpected_keys)))
        if prefix == "vision_model.":
            found = [prefix + n for n in _fold(k for k in sub if any(re.fullmatch(p, k) for p in OPTIONAL_TENSORS))]
    if problems:
        raise VisionWeightsError("vision weights do not match:\n  " + "\n  ".join(problems))
    return found
