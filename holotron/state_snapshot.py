"""One sequence's state outside the decode state: ``RowSnapshot`` (``DecodeState.snapshot`` / ``restore`` in
``holotron/state.py``), and the pool of pinned host buffers that snapshots of a CUDA state go into."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowSnapshot"]

# pinned host buffers of restored snapshots, by size class (a power of two), kept for the next snapshots;
# copies into and out of them are ordered by the CUDA stream, so a buffer is reused only after its copy
_POOL: dict[int, list[torch.Tensor]] = {}
_POOL_KEEP = 8  # buffers kept per size class


def pinned_class(nbytes: int) -> int:
    """The bytes of the pinned buffer a snapshot of ``nbytes`` takes (its size class)."""
    return 1 << max(20, (nbytes - 1).bit_length())


def pooled_bytes() -> int:
    """Pinned host bytes held by the pool's free buffers."""
    return sum(b.numel() for free in _POOL.values() for b in free)


def pinned_held() -> int | None:
    """Pinned host bytes the process holds through torch's pinned allocator, blocks in use and cached ones (freed
    blocks stay cached for reuse until ``free_cached_pinned``); None where it is not known (no CUDA initialised,
    or a torch without these statistics)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    try:
        stats = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        return None
    return stats.get("allocated_bytes.current")


def free_cached_pinned() -> None:
    """Give the pool's free buffers and torch's cached pinned blocks back to the system (a device-wide sync)."""
    _POOL.clear()
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) \
        or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        empty()


def _pinned_take(nbytes: int) -> torch.Tensor:
    cls = pinned_class(nbytes)
    free = _POOL.get(cls)
    return free.pop() if free else torch.empty(cls, dtype=torch.uint8, pin_memory=True)


def _pinned_give(buf: torch.Tensor) -> None:
    free = _POOL.setdefault(buf.numel(), [])
    if len(free) < _POOL_KEEP:
        free.append(buf)


@dataclass(eq=False)
class RowSnapshot:
    """One sequence's state outside the decode state (``DecodeState.snapshot``): per layer (conv, ssm),
    (k, v) of its ``length`` filled slots (an FP8 cache: (codes k, codes v, k scales, v scales), the codes as
    uint8, holotron/kv_cache.py), or None; on the host or on a device."""

    parts: list
    length: int
    buffer: torch.Tensor | None = None  # the pinned buffer the parts are views of (host snapshots of CUDA)
    refs: int = 1                       # sessions sharing it (forks of a saved session)

    def nbytes(self) -> int:
        return sum(t.nbytes for p in self.parts if p is not None for t in p)

    def host_bytes(self) -> int:
        """The host memory it holds: its pinned buffer (a power-of-two size class), else its parts."""
        return self.buffer.numel() if self.buffer is not None else self.nbytes()

    def release(self) -> None:
        """One sharer is done with it; the last one gives the pinned buffer back to the pool."""
        self.refs -= 1
        if self.refs == 0 and self.buffer is not None:
            _pinned_give(self.buffer)
            self.buffer, self.parts = None, []
