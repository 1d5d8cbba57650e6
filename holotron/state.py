"""The inference state: an explicit, typed value passed to ``HybridLM.forward`` and updated in place.

    InferenceState
      layers[i]  MambaState  for a Mamba2 layer:  conv (B, conv_dim, K)  the last K real xBC inputs
                                                  ssm  (B, H, P, N)      recurrent state (fp32 by default;
                                                                         ssm_dtype float16 / bfloat16)
                 KVCache     for an attention layer: k, v (B, Hkv, capacity, head_dim)
                 None        for an MLP layer
      seqlen     the one position counter: tokens consumed so far (pads included), advanced by the model
      valid      (B, capacity) bool: which consumed positions were real tokens (attention masks the rest)

The Mamba part never grows with the sequence; only the KV caches and ``valid`` do (their capacity
doubles when exceeded, or is reserved up front by ``generate``). Each layer's tensors live on that
layer's device and dtype. ``select(rows)`` keeps / reorders batch rows (dropping finished sequences,
beam search).

``DecodeState`` is the static-shape variant the decode engine (``holotron/engine.py``) uses: every
tensor allocated once for ``max_batch`` rows and ``max_len`` KV slots, one length per row, so one
decode step (``HybridLM.step``) has fixed shapes and can be captured in a CUDA graph. Its rows hold
real tokens only (a padded prompt is compacted when it is loaded); rows are loaded, moved and reset by
tensor copies. Both states are allocated by the layers' own ``new_state`` (``HybridLM.layer_states``).
``Positions`` tells every layer of one call where its tokens sit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .kv_cache import KVCache
from .state_snapshot import RowSnapshot, paged_snapshot, pieces
from .state_stacks import Stack, intact, stacked_layer_states

__all__ = ["MambaState", "KVCache", "InferenceState", "DecodeState", "Positions", "RowSnapshot", "device_ints"]

# a DecodeState's layers as views of stacked tensors (holotron/state_stacks.py); HOLOTRON_STATE_STACKS=0: each
# layer's own tensors, as before 2026-12-06 (to time the difference)
STACKS = os.environ.get("HOLOTRON_STATE_STACKS", "1") != "0"


def device_ints(values, device: torch.device | str) -> torch.Tensor:
    """A host list of ints as an int64 tensor on ``device`` without waiting for the GPU: a copy from pageable
    memory (``torch.tensor(values, device=cuda)``) waits for all the work queued before it, which would stop
    the host from queueing a pass's kernels ahead of the GPU. On CUDA it goes through pinned memory, not
    blocking (the caching host allocator keeps the buffer until the copy is done)."""
    t = torch.tensor(values, dtype=torch.long)
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _same_kv_format(dst: KVCache, src: KVCache) -> None:
    """What ``DecodeState.load`` / ``load_plain`` ask of a source's KV cache: this state's format (FP8 or not)."""
    if dst.quantized != src.quantized:
        raise ValueError("DecodeState.load: the source's KV cache and this state's differ in format "
                         "(FP8 and not); prefill the source with the same kv_dtype")


def _rows(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return index.to(device=like.device, dtype=torch.long)


@dataclass
class MambaState:
    """One Mamba2 layer: the causal-conv window and the SSD recurrent state."""

    conv: torch.Tensor  # (B, conv_dim, K): xBC inputs of the last K real tokens, oldest first
    ssm: torch.Tensor   # (B, H, P, N) fp32 (or the ssm_dtype asked for)

    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    def select(self, index: torch.Tensor) -> None:
        self.conv = self.conv.index_select(0, _rows(index, self.conv))
        self.ssm = self.ssm.index_select(0, _rows(index, self.ssm))

    def take(self, rows: list[int], index: torch.Tensor | None = None) -> "MambaState":
        """The states of ``rows``: views when they are consecutive (updates reach this state), else copies
        (``put`` writes them back). ``index``: ``rows`` already on the device (``Positions.row_index``)."""
        if rows == list(range(rows[0], rows[0] + len(rows))):
            return MambaState(conv=self.conv[rows[0]:rows[0] + len(rows)], ssm=self.ssm[rows[0]:rows[0] + len(rows)])
        idx = device_ints(rows, self.conv.device) if index is None else index
        return MambaState(conv=self.conv.index_select(0, idx), ssm=self.ssm.index_select(0, idx))

    def put(self, rows: list[int], part: "MambaState", index: torch.Tensor | None = None) -> None:
        """Write ``take(rows)``'s (updated) states back (nothing to do for views)."""
        if part.conv.data_ptr() == self.conv[rows[0]].data_ptr() and part.conv.shape[0] == len(rows):
            return
        idx = device_ints(rows, self.conv.device) if index is None else index
        self.conv.index_copy_(0, idx, part.conv)
        self.ssm.index_copy_(0, idx, part.ssm)


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
        kinds = "".join("M" if isinstance(s, MambaState) else "*" if isinstance(s, KVCache) else "-"
                        for s in self.layers)
        return (f"InferenceState(batch={self.batch_size}, seqlen={self.seqlen}, capacity={self.capacity}, "
                f"layers={kinds!r}, bytes={self.nbytes()['total']})")


@dataclass
class Positions:
    """Where the tokens of one call sit, shared by every layer of that call.

    Prefill / ``forward`` (an ``InferenceState``): ``mask`` (B, T) bool, False at pads (None: no pads);
    ``attn_mask`` from ``causal_mask``; ``pos`` the first position of the call.
    Decode ``step`` (a ``DecodeState``, one token per row): ``lengths`` (B,) int64, the KV slot of each
    row's token; ``n_keys`` (B,) int64, each row attends to KV slots [0, n_keys); ``active`` (B,) int64,
    0 on rows whose state must not change (rows of the engine that are not decoding).
    Prefill into rows of a ``DecodeState`` (``HybridLM.extend``): ``rows`` (host ints, b of them) the
    state rows of the batch's rows, ``starts`` their lengths before the call (the KV slot of their first
    new token), ``counts`` their real tokens this call (right-padded: the first ``counts[i]`` positions;
    ``pads_after`` True); ``mask`` as for prefill. ``HybridLM.extend_static``: the same with ``static`` True
    and only device tensors (``row_index``, ``starts_t``, ``counts_t``).
    """

    mask: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None
    pos: int = 0
    lengths: torch.Tensor | None = None
    n_keys: torch.Tensor | None = None
    active: torch.Tensor | None = None
    rows: list[int] | None = None
    starts: list[int] | None = None
    counts: list[int] | None = None
    pads_after: bool = False  # every pad of ``mask`` comes after its row's tokens
    row_index: torch.Tensor | None = None  # ``rows`` on the device (made once per call, see ``device_ints``)
    # ``HybridLM.extend_static``: every position on the device (no host list: a CUDA graph can capture the call)
    static: bool = False
    starts_t: torch.Tensor | None = None   # (b,) int64: ``starts``
    counts_t: torch.Tensor | None = None   # (b,) int64: ``counts`` (0: a row of pads only, writing nothing real)


class DecodeState:
    """Preallocated state for ``max_batch`` rows of at most ``max_len`` tokens each.

        layers[i]  MambaState (conv (R, conv_dim, K), ssm (R, H, P, N) fp32)
                   | KVCache (k, v (R, Hkv, capacity, hd), capacity = max_len + 1 rounded up to a multiple of
                     64 (aligned rows for the fused attention kernels): slot max_len is a spare that is never
                     attended, where the step writes the keys of rows that are not decoding)
                   | None
        lengths    (R,) int64 on the model's device: KV slots [0, lengths[r]) of row r hold its tokens

    No position counter is shared between rows: each row's next token is written at slot ``lengths[r]``
    (there is no positional encoding, so a row's slots need only hold its own tokens, in any order of
    arrival). ``rows(b)`` is the DecodeState of the first b rows (views, updated in place): what
    ``HybridLM.step`` takes.
    """

    def __init__(self, layers: list, lengths: torch.Tensor, max_len: int, stacks: list[Stack] | None = None):
        self.layers: list[MambaState | KVCache | None] = layers
        self.lengths = lengths
        self.max_len = max_len
        self.stacks = stacks or []   # the layers' tensors as views of these (holotron/state_stacks.py)

    @classmethod
    def allocate(cls, lm, max_batch: int, max_len: int, ssm_dtype: torch.dtype = torch.float32,
                 zero: bool = True, kv_dtype: torch.dtype | None = None) -> "DecodeState":
        """For a ``HybridLM`` (the shapes of its layers' own ``new_state``, the one allocator; the tensors views
        of stacks, holotron/state_stacks.py). ``zero=False`` leaves the tensors uninitialised (benchmarks that
        time steps on synthetic states; masked KV slots must otherwise be finite, so the default zeroes).
        ``kv_dtype``: None (the model's dtype) or torch.float8_e4m3fn (holotron/kv_cache.py)."""
        cap = -(-(max_len + 1) // 64) * 64
        if STACKS:
            layers, stacks = stacked_layer_states(lm, max_batch, cap, ssm_dtype, zero=zero, kv_dtype=kv_dtype)
        else:
            layers, stacks = lm.layer_states(max_batch, cap, ssm_dtype, zero=zero, kv_dtype=kv_dtype), []
        lengths = torch.zeros(max_batch, dtype=torch.long, device=lm.backbone.embeddings.weight.device)
        return cls(layers, lengths, max_len, stacks)

    def rows(self, b: int) -> "DecodeState":
        """The first b rows as a DecodeState of views (in-place updates reach this state)."""
        out = DecodeState.__new__(DecodeState)
        out.layers, out.lengths, out.max_len, out.stacks = self.view(b), self.lengths[:b], self.max_len, []
        return out

    @property
    def max_batch(self) -> int:
        return self.lengths.shape[0]

    def view(self, b: int) -> list:
        """Per-layer states of rows [0, b) as views (in-place updates reach this state)."""
        out = []
        for s in self.layers:
            if isinstance(s, MambaState):
                out.append(MambaState(conv=s.conv[:b], ssm=s.ssm[:b]))
            elif isinstance(s, KVCache):
                out.append(s.rows(b))
            else:
                out.append(None)
        return out

    def load(self, row: int, src: InferenceState, src_row: int) -> int:
        """Copy row ``src_row`` of a (prefilled) ``InferenceState`` into ``row``, keeping its real
        tokens only (pads dropped, order kept). Returns the row's length."""
        keep = src.valid[src_row, :src.seqlen].nonzero().squeeze(1)  # slots of real tokens
        n = keep.numel()
        if n > self.max_len:
            raise ValueError(f"DecodeState.load: {n} tokens do not fit max_len {self.max_len}")
        for d, s in zip(self.layers, src.layers):
            if isinstance(d, MambaState):
                d.conv[row].copy_(s.conv[src_row])
                d.ssm[row].copy_(s.ssm[src_row])
            elif isinstance(d, KVCache):
                _same_kv_format(d, s)
                for dt, st in zip(d.tensors(), s.tensors()):
                    if n == src.seqlen:
                        dt[row, :, :n].copy_(st[src_row, :, :n])
                    else:
                        dt[row, :, :n].copy_(st[src_row].index_select(1, keep.to(st.device)))
        self.lengths[row] = n
        return n

    def load_plain(self, index: torch.Tensor, src: InferenceState) -> None:
        """Copy row 0 of ``src``, a state without pads (``src.valid`` all true: a prefix from ``Engine.prefix``),
        into the rows ``index`` (int64 on this state's device; one copy of the prefix per row). The ``load`` of
        such a source without reading the device: a fixed list of ops (capturable in a CUDA graph), one per
        tensor whatever the number of rows. Checks (format, length) as ``load``."""
        n = src.seqlen
        if n > self.max_len:
            raise ValueError(f"DecodeState.load: {n} tokens do not fit max_len {self.max_len}")
        k = index.shape[0]
        for d, s in zip(self.layers, src.layers):
            if isinstance(d, MambaState):
                for dt, st in ((d.conv, s.conv), (d.ssm, s.ssm)):
                    dt.index_copy_(0, index, st[:1].to(dt.dtype).expand(k, *st.shape[1:]))
            elif isinstance(d, KVCache):
                _same_kv_format(d, s)
                for dt, st in zip(d.tensors(), s.tensors()):
                    part = st[:1, :, :n]
                    dt[:, :, :n].index_copy_(0, index, part.expand(k, *part.shape[1:]))
        self.lengths.index_fill_(0, index, n)

    def _stacked(self) -> bool:
        """The layers' tensors are views of ``stacks``: row copies go through the stacks (one per part)."""
        return bool(self.stacks) and intact(self.layers, self.stacks)

    @staticmethod
    def _row(st: Stack, row: int, used: int) -> torch.Tensor:
        """Row ``row`` of a stack for every layer: the first ``used`` slots of a KV part."""
        return st.tensor[:, row, :, :used] if st.kv else st.tensor[:, row]

    def _parts(self, row: int, used: int) -> list[torch.Tensor]:
        """Row ``row`` of every tensor (the first ``used`` KV slots): the stacks' rows, else each layer's."""
        if self._stacked():
            return [self._row(st, row, used) for st in self.stacks]
        out = []
        for s in self.layers:
            if isinstance(s, MambaState):
                out += [s.conv[row], s.ssm[row]]
            elif isinstance(s, KVCache):
                out += [t[row, :, :used] for t in s.tensors()]
        return out

    def move(self, src: int, dst: int, used: int) -> None:
        """Copy row ``src`` into row ``dst`` (the first ``used`` KV slots, the Mamba state, the length)."""
        for d, s in zip(self._parts(dst, used), self._parts(src, used)):
            d.copy_(s)
        self.lengths[dst] = self.lengths[src]

    def swap(self, a: int, b: int, used_a: int, used_b: int) -> None:
        """Exchange rows ``a`` and ``b`` (their Mamba states, first ``used_*`` KV slots and lengths)."""
        keep = [t.clone() for t in self._parts(a, used_a)]
        for d, s in zip(self._parts(a, used_b), self._parts(b, used_b)):
            d.copy_(s)
        for d, s in zip(self._parts(b, used_a), keep):
            d.copy_(s)
        la, lb = self.lengths[a].clone(), self.lengths[b].clone()
        self.lengths[a], self.lengths[b] = lb, la

    def reset(self, row: int) -> None:
        """An empty row: zero Mamba states, length 0 (KV slots are masked by the length, not cleared)."""
        for t in self._parts(row, 0):   # (a KV part of 0 slots is empty)
            t.zero_()
        self.lengths[row] = 0

    def snapshot(self, row: int, used: int, device: torch.device | str = "cpu", paged: bool | None = None
                 ) -> "RowSnapshot":
        """A copy of row ``row`` (Mamba states, the first ``used`` KV slots) on ``device`` (host by default).
        From a CUDA state to the host it goes into pinned pages (``paged``: None, or True to page a CPU state too),
        taken from the free ones once snapshots are restored (``restore(..., release=True)``), copied
        asynchronously: later work on the row is ordered after the copy by the stream
        (holotron/state_snapshot.py)."""
        srcs = []
        for s in self.layers:
            if isinstance(s, MambaState):
                srcs.append((s.conv[row], s.ssm[row]))
            elif isinstance(s, KVCache):
                srcs.append(tuple(t[row, :, :used] for t in s.tensors()))  # FP8: codes and scales
            else:
                srcs.append(None)
        if paged is None:
            paged = self.lengths.is_cuda
        if not (torch.device(device).type == "cpu" and paged):
            return RowSnapshot([None if p is None else tuple(t.to(device, copy=True) for t in p) for p in srcs],
                               used)
        return paged_snapshot(srcs, used)

    def restore(self, row: int, snap: "RowSnapshot", release: bool = False) -> None:
        """Copy ``snap`` into row ``row`` (it becomes that row's state and length). ``release``: the snapshot
        is not needed any more (its pages return to the free ones)."""
        if snap.length > self.max_len:
            raise ValueError(f"DecodeState.restore: {snap.length} tokens do not fit max_len {self.max_len}")
        n = snap.length
        for s, part in zip(self.layers, snap.parts):
            if isinstance(s, MambaState):
                dsts = (s.conv[row], s.ssm[row])
            elif isinstance(s, KVCache):
                dsts = tuple(t[row, :, :n] for t in s.tensors())
            else:
                continue
            for d, p in zip(dsts, part, strict=True):
                for dq, pq in (zip(pieces(d), p, strict=True) if isinstance(p, list) else ((d, p),)):
                    dq.copy_(pq, non_blocking=True)
        self.lengths[row] = n
        if release:
            snap.release()

    def bytes_per_row(self, length: int | None = None) -> dict[str, int]:
        """Bytes one row holds: Mamba (constant) and KV for ``length`` tokens (default ``max_len``)."""
        length = self.max_len if length is None else length
        mamba = sum((s.conv[0].nbytes + s.ssm[0].nbytes) for s in self.layers if isinstance(s, MambaState))
        kv = sum(s.slot_bytes() * length for s in self.layers if isinstance(s, KVCache))
        return {"mamba": mamba, "attention": kv, "total": mamba + kv}

    def nbytes(self) -> int:
        n = self.lengths.nbytes
        return n + sum(s.nbytes() for s in self.layers if s is not None)
