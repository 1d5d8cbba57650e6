"""The inference state: an explicit, typed value passed to ``HybridLM.forward`` and updated in place.

    InferenceState
      layers[i]  MambaState  for a Mamba2 layer:  conv (B, conv_dim, K)  the last K real xBC inputs
                                                  ssm  (B, H, P, N)      fp32 recurrent state
                 KVCache     for an attention layer: k, v (B, Hkv, capacity, head_dim)
                 None        for an MLP layer
      seqlen     the one position counter: tokens consumed so far (pads included), advanced by the model
      valid      (B, capacity) bool: which consumed positions were real tokens (attention masks the rest)

The Mamba part never grows with the sequence; only the KV caches and ``valid`` do (their capacity
doubles when exceeded, or is reserved up front by ``generate``). Each layer's tensors live on that
layer's device and dtype. ``select(rows)`` keeps / reorders batch rows (dropping finished sequences,
beam search).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MambaState", "KVCache", "InferenceState"]


def _rows(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return index.to(device=like.device, dtype=torch.long)


@dataclass
class MambaState:
    """One Mamba2 layer: the causal-conv window and the SSD recurrent state."""

    conv: torch.Tensor  # (B, conv_dim, K): xBC inputs of the last K real tokens, oldest first
    ssm: torch.Tensor   # (B, H, P, N) fp32

    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    def select(self, index: torch.Tensor) -> None:
        self.conv = self.conv.index_select(0, _rows(index, self.conv))
        self.ssm = self.ssm.index_select(0, _rows(index, self.ssm))


@dataclass
class KVCache:
    """One attention layer: keys and values of every consumed position (slots [0, seqlen) are filled)."""

    k: torch.Tensor  # (B, Hkv, capacity, head_dim)
    v: torch.Tensor  # (B, Hkv, capacity, head_dim)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def nbytes(self, used: int | None = None) -> int:
        if used is None:
            return self.k.nbytes + self.v.nbytes
        per_slot = (self.k.nbytes + self.v.nbytes) // max(self.capacity, 1)
        return per_slot * used

    def grow(self, capacity: int, keep: int) -> None:
        """Reallocate to ``capacity`` slots, keeping the first ``keep``."""
        b, h, _, d = self.k.shape
        k = self.k.new_zeros(b, h, capacity, d)
        v = self.v.new_zeros(b, h, capacity, d)
        k[:, :, :keep] = self.k[:, :, :keep]
        v[:, :, :keep] = self.v[:, :, :keep]
        self.k, self.v = k, v

    def select(self, index: torch.Tensor) -> None:
        self.k = self.k.index_select(0, _rows(index, self.k))
        self.v = self.v.index_select(0, _rows(index, self.v))


class InferenceState:
    """Per-layer states plus the position counter; built by ``model.new_state(batch_size, capacity)``."""

    def __init__(self, layers: list, valid: torch.Tensor):
        self.layers: list[MambaState | KVCache | None] = layers
        self.valid = valid          # (B, capacity) bool
        self.seqlen = 0             # tokens consumed so far; advanced only by the model's forward
        self.has_pads = False       # True once a masked position was consumed

    @property
    def batch_size(self) -> int:
        return self.valid.shape[0]

    @property
    def capacity(self) -> int:
        return self.valid.shape[1]

    def reserve(self, n_new: int) -> None:
        """Make room for ``n_new`` more positions (capacity at least doubles when it grows)."""
        need = self.seqlen + n_new
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity)
        valid = self.valid.new_zeros(self.batch_size, cap)
        valid[:, :self.seqlen] = self.valid[:, :self.seqlen]
        self.valid = valid
        for s in self.layers:
            if isinstance(s, KVCache):
                s.grow(cap, self.seqlen)

    def select(self, index) -> "InferenceState":
        """Keep (or reorder, or repeat) batch rows: ``state.select(torch.tensor([2, 0]))``. In place; returns self."""
        index = torch.as_tensor(index, dtype=torch.long)
        if index.dim() != 1:
            raise ValueError(f"select: index must be 1-d (rows to keep), got shape {tuple(index.shape)}")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.batch_size):
            raise ValueError(f"select: row index out of range for batch size {self.batch_size}: {index.tolist()}")
        for s in self.layers:
            if s is not None:
                s.select(index)
        self.valid = self.valid.index_select(0, _rows(index, self.valid))
        return self

    def nbytes(self, used_only: bool = False) -> dict[str, int]:
        """Bytes held, by part: mamba (conv + ssm, constant), attention (KV), positions (the valid mask).

        ``used_only`` counts only the filled KV / mask slots instead of the allocated capacity.
        """
        mamba = sum(s.nbytes() for s in self.layers if isinstance(s, MambaState))
        used = self.seqlen if used_only else None
        kv = sum(s.nbytes(used) for s in self.layers if isinstance(s, KVCache))
        pos = self.batch_size * (self.seqlen if used_only else self.capacity) * self.valid.element_size()
        return {"mamba": mamba, "attention": kv, "positions": pos, "total": mamba + kv + pos}

    def __repr__(self) -> str:
        kinds = "".join("M" if isinstance(s, MambaState) else "*" if isinstance(s, KVCache) else "-" for s in self.layers)
        return (f"InferenceState(batch={self.batch_size}, seqlen={self.seqlen}, capacity={self.capacity}, "
                f"layers={kinds!r}, bytes={self.nbytes()['total']})")
