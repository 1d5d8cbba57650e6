"""A ``DecodeState``'s layer states as views of a few stacked tensors, so that one copy moves a row for every layer.

    layers, stacks = stacked_layer_states(lm, max_batch, capacity, ssm_dtype, zero, kv_dtype)

Every Mamba2 layer of a model has the same state shapes (conv window (R, conv_dim, K), SSD state (R, H, P, N)),
and so has every attention layer (K, V (R, Hkv, capacity, hd), plus the FP8 cache's scales (R, Hkv, capacity)).
Layers of one shape get one tensor per part, (L, R, ...), and each layer's ``MambaState`` / ``KVCache`` holds
the views ``stack[l]``: contiguous, so every kernel sees the tensors it saw before, and the same bytes in all.
A row exchange or move (``DecodeState.swap`` / ``move``, the engine's swap graph) then copies rows of the stacks,
``stack[:, r]``: at the 12B 6 tensors (2 Mamba parts, 4 of an FP8 cache) where there were 80 per-layer ones.
On an H100 a row exchange of the serving section (rows of about 90 MB) took 1.08 ms of GPU time with the per-layer
copies and 0.75 ms with the stacks (docs/benchmarks.md, "Prefix loads together, the state in stacks").

``Stack`` says which tensor and whether it is a KV part (its slot dimension, 3 in the stack, is cut to the used
slots by ``DecodeState.move`` / ``swap``). ``intact`` tells whether the layers still hold the stacks' views (a
state whose tensors were replaced falls back to per-layer copies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import KVCache

__all__ = ["Stack", "stacked_layer_states", "intact"]


@dataclass
class Stack:
    tensor: torch.Tensor        # (L, R, ...): part ``part`` of the L layers ``layers``
    kv: bool                    # a KV part: (L, R, Hkv, capacity, ...)
    layers: list[int]
    part: int


def _tensors_of(s) -> list[torch.Tensor]:
    """A layer state's tensors in a fixed order: (conv, ssm), or ``KVCache.tensors()`` (FP8 codes as uint8)."""
    return [s.conv, s.ssm] if not isinstance(s, KVCache) else list(s.tensors())


def stacked_layer_states(lm, batch: int, capacity: int, ssm_dtype: torch.dtype = torch.float32, zero: bool = True,
                         kv_dtype: torch.dtype | None = None) -> tuple[list, list[Stack]]:
    """``lm.layer_states(batch, capacity, ...)``, its tensors views of stacks (one per part and shape); returns
    the layers and the stacks. The shapes come from a one-row, one-slot state (a few MB at the 12B)."""
    one = lm.layer_states(1, 1, ssm_dtype, zero=False, kv_dtype=kv_dtype)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(one):
        if s is not None:
            key = (isinstance(s, KVCache),) + tuple((tuple(t.shape[1:]), t.dtype, t.device) for t in _tensors_of(s))
            groups.setdefault(key, []).append(i)
    layers: list = [None] * len(one)
    stacks: list[Stack] = []
    new = torch.zeros if zero else torch.empty
    for key, idx in groups.items():
        kv = key[0]
        views = []
        for j, (shape, dtype, device) in enumerate(key[1:]):
            shape = (shape[0], capacity, *shape[2:]) if kv else shape   # (Hkv, capacity, ...)
            t = new((len(idx), batch, *shape), dtype=dtype, device=device)
            stacks.append(Stack(t, kv, idx, j))
            views.append(t)
        for n, i in enumerate(idx):
            parts = [t[n] for t in views]
            # (a MambaState built as ``one[i]``'s type: holotron/state.py imports this module)
            layers[i] = KVCache.of(parts) if kv else type(one[i])(conv=parts[0], ssm=parts[1])
    return layers, stacks


def intact(layers: list, stacks: list[Stack]) -> bool:
    """Every layer still holds its views of ``stacks`` (nothing replaced a tensor since allocation)."""
    for st in stacks:
        base, step = st.tensor.data_ptr(), st.tensor[0].nbytes if st.tensor.shape[0] else 0
        for n, i in enumerate(st.layers):
            t = _tensors_of(layers[i])[st.part]
            if t.data_ptr() != base + n * step or t.shape != st.tensor.shape[1:]:
                return False
    return True

