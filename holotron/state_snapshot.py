"""One sequence's state outside the decode state: ``RowSnapshot`` (``DecodeState.snapshot`` / ``restore`` in
``holotron/state.py``), and the pinned host pages that snapshots of a CUDA state are packed into."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RowSnapshot", "paged_snapshot", "pieces", "reserve_pages"]

# Snapshots of a CUDA state go into pinned host pages of PAGE bytes, packed first-fit (a part larger than a page
# is split along its leading dimensions into pieces that fit). Freed pages are kept for the next snapshots: a
# session that grows needs more pages, never a larger block. (Before 2026-12-06 each snapshot took one buffer of a
# power-of-two size class; sessions growing past a class boundary, 15k tokens for a twelve-tile hybrid row, then
# took new 512 MiB blocks from the driver and left the 256 MiB ones cached: at 256 twelve-tile agents on an H100,
# by the run's progress lines, pinning new memory and that churn took about 70 of its 113.6 s of admissions,
# docs/benchmarks.md.) Copies into and out of the pages
# are ordered by the CUDA stream, so a page is reused only after its copy.
PAGE = 32 << 20
_PAGES: list[torch.Tensor] = []   # free pages


def _new_page() -> torch.Tensor:
    return torch.empty(PAGE, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


def reserve_pages(nbytes: int) -> int:
    """Allocate free pages until they hold ``nbytes`` (at startup, so that snapshots taken later find them and ask
    the driver for no pinned memory); returns the free pages' bytes."""
    while len(_PAGES) * PAGE < nbytes:
        _PAGES.append(_new_page())
    return pooled_bytes()


def paged_bytes(nbytes: int) -> int:
    """The pinned bytes a snapshot of ``nbytes`` may take: whole pages, one more for what packing leaves over."""
    return (-(-nbytes // PAGE) + 1) * PAGE


def pooled_bytes() -> int:
    """Pinned host bytes held by the free pages."""
    return len(_PAGES) * PAGE


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
    """Give the free pages and torch's cached pinned blocks back to the system (a device-wide sync)."""
    _PAGES.clear()
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) \
        or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        empty()


def pieces(t: torch.Tensor) -> list[torch.Tensor]:
    """Views of ``t`` that cover it in order, each at most PAGE bytes: ``t`` itself, or slices along its first
    dimension, or (one index of it being larger than a page) the pieces of each index."""
    if t.nbytes <= PAGE or t.dim() == 0:
        return [t]
    per = t.nbytes // t.shape[0]
    if per > PAGE:
        return [q for i in range(t.shape[0]) for q in pieces(t[i])]
    step = PAGE // per
    return [t[a:a + step] for a in range(0, t.shape[0], step)]


def paged_snapshot(srcs: list, length: int) -> "RowSnapshot":
    """A ``RowSnapshot`` of ``srcs`` (per layer a tuple of device tensors, or None) in pages: each tensor as the
    list of its pieces' copies (``pieces``), queued without waiting for the device."""
    pages: list[torch.Tensor] = []
    room: list[int] = []   # bytes used in each page
    parts = []
    for p in srcs:
        if p is None:
            parts.append(None)
            continue
        tensors = []
        for t in p:
            views = []
            for q in pieces(t):
                if q.numel() == 0:   # no KV slots used: nothing to keep, no page taken for it
                    views.append(torch.empty(q.shape, dtype=q.dtype))
                    continue
                nb = -(-q.nbytes // 256) * 256   # 256-byte aligned
                i = next((j for j, used in enumerate(room) if used + nb <= PAGE), None)
                if i is None:
                    pages.append(_PAGES.pop() if _PAGES else _new_page())
                    room.append(0)
                    i = len(pages) - 1
                v = pages[i][room[i]:room[i] + q.nbytes].view(q.dtype).view(q.shape)
                v.copy_(q, non_blocking=True)
                room[i] += nb
                views.append(v)
            tensors.append(views)
        parts.append(tuple(tensors))
    return RowSnapshot(parts, length, pages)


@dataclass(eq=False)
class RowSnapshot:
    """One sequence's state outside the decode state (``DecodeState.snapshot``): per layer (conv, ssm),
    (k, v) of its ``length`` filled slots (an FP8 cache: (codes k, codes v, k scales, v scales), the codes as
    uint8, holotron/kv_cache.py), or None; on the host or on a device. In pages (``paged_snapshot``) each tensor
    is the list of its pieces (``pieces``)."""

    parts: list
    length: int
    pages: list | None = None  # the pinned pages the parts are views of (paged snapshots)
    refs: int = 1              # sessions sharing it (forks of a saved session)

    def nbytes(self) -> int:
        return sum(sum(v.nbytes for v in t) if isinstance(t, list) else t.nbytes
                   for p in self.parts if p is not None for t in p)

    def host_bytes(self) -> int:
        """The host memory it holds: its pages, else its parts."""
        return len(self.pages) * PAGE if self.pages is not None else self.nbytes()

    def release(self) -> None:
        """One sharer is done with it; the last one gives its pages back to the free ones."""
        self.refs -= 1
        if self.refs == 0 and self.pages is not None:
            _PAGES.extend(self.pages)
            self.pages, self.parts = None, []
