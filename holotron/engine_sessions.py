"""Agent sessions of the decode engine (``holotron/engine.py``): conversations kept between turns.

    s = eng.session()                                    # an empty conversation
    r1 = eng.submit(turn1_ids, session=s, pixel_values=px, max_new_tokens=100)
    eng.run()                                            # (or step() alongside other sessions)
    r2 = eng.submit(turn2_ids, session=s, ...)           # prefills only turn 2 (after r1's last token)
    a, b = eng.fork(s, 2)                                # two continuations of the same screen
    eng.save(s); eng.restore(s)                          # its state to host memory and back
    eng.close(s)

A session's state is a row of the engine's ``DecodeState`` (Mamba states: constant size; the KV of its
tokens so far) or, once saved, a ``RowSnapshot`` in host memory. A turn needs a row: a session on the
host is restored when its turn is admitted; when no row is free, the idle session used least recently
(``offload=True``, the default) is saved to host memory to make room, or, past ``host_limit``, dropped and
replayed at its next turn (holotron/engine_replay.py). ``memory()`` says what the rows cost and how many sessions fit.
``Sessions`` is a base class of ``Engine``, written against its attributes (``state``, ``rows``, ``active``, the
sampling tensors, ``vocab``).
"""

from __future__ import annotations

import os
import weakref

import torch

from .devices import CAPTURE_MODE
from .engine_requests import Prefix, Request, Session
from .kv_cache import kv_dtype_for, kv_slot_bytes
from .state import MambaState, device_ints

__all__ = ["Sessions", "row_bytes"]

# a prefix loaded into a row by one CUDA graph replay from its second use on (``Sessions._load_prefix``);
# HOLOTRON_PREFIX_GRAPHS=0: by ``DecodeState.load``'s copies, as before 2026-12-06 (to time the difference)
PREFIX_GRAPHS = os.environ.get("HOLOTRON_PREFIX_GRAPHS", "1") != "0"
# decoding rows moved only when that gives a smaller batch, a turn admitted into the lowest free row
# (``Sessions._compaction_target``); HOLOTRON_LAZY_ROWS=0: moved whenever a row below them does not decode, a turn
# admitted into the highest free row, as before 2026-12-06 (to time the difference)
LAZY_ROWS = os.environ.get("HOLOTRON_LAZY_ROWS", "1") != "0"
# the rows an admission starts from the same prefix loaded together (``Sessions._load_prefixes``);
# HOLOTRON_BATCH_LOADS=0: one row at a time, as before 2026-12-06 (to time the difference)
BATCH_LOADS = os.environ.get("HOLOTRON_BATCH_LOADS", "1") != "0"


def row_bytes(lm, max_len: int, ssm_dtype: torch.dtype = torch.float32,
              kv_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes one engine row holds for a ``HybridLM``: the Mamba states (constant) and the KV of
    ``max_len`` tokens, from the layer shapes (nothing is allocated); ``kv_dtype`` torch.float8_e4m3fn: the
    FP8 cache's codes and scales (holotron/kv_cache.py)."""
    kv_dtype = kv_dtype_for(kv_dtype, lm.device, lm.dtype, who="row_bytes")
    mamba = kv = 0
    for blk in lm.backbone.layers:
        m = blk.mixer
        if blk.kind == "mamba":
            w = m.conv1d.weight
            mamba += m.conv_dim * m.d_conv * w.element_size()
            mamba += m.n_heads * m.head_dim * m.d_state * torch.empty(0, dtype=ssm_dtype).element_size()
        elif blk.kind == "attention":
            kv += kv_slot_bytes(m.n_kv_heads, m.head_dim, kv_dtype, m.k_proj.weight.dtype) * max_len
    return {"mamba": mamba, "attention": kv, "total": mamba + kv}


class Sessions:
    """``Engine.session``, ``fork``, ``save``, ``restore``, ``close``, ``memory`` and the row bookkeeping."""

    def _init_sessions(self, host_limit: int | None) -> None:
        self.rows: list[Session | None] = [None] * self.max_batch   # host side: the session holding each row
        self.sessions: dict[int, Session] = {}
        self._next_id = 0
        self._load_idx: dict[int, torch.Tensor] = {}   # rows a prefix graph loads, by bucket (a power of two)
        self._prefix_graphs = weakref.WeakKeyDictionary()   # Prefix -> {bucket: its load graph (None: met once)}
        self._init_replays(host_limit)   # host_limit (holotron/engine_replay.py)

    # ------------------------------------------------------------------ the public calls
    def session(self) -> Session:
        """A new, empty conversation (it takes a row at its first turn)."""
        self._next_id += 1
        s = Session(self._next_id, turns=[] if self.host_limit is not None else None)
        self.sessions[s.id] = s
        return s

    @torch.inference_mode()
    def fork(self, s: Session, n: int = 1) -> list[Session]:
        """``n`` new sessions, each a copy of ``s``'s state (``s`` must be idle). A copy goes to a free row
        when there is one, else to host memory."""
        self._check_open(s, "fork")
        if s.busy:
            raise ValueError(f"fork: session {s.id} has a turn in flight; fork it when the turn is done")
        if n < 1:
            raise ValueError(f"fork: n must be >= 1, got {n}")
        out = []
        for _ in range(n):
            c = self.session()
            c.length, c.pending, c.prefix, c.dropped = s.length, s.pending, s.prefix, s.dropped
            c.turns = None if s.turns is None else list(s.turns)
            free = self._free_rows()
            if s.row is not None and free:
                r = free[0]
                self.state.move(s.row, r, s.length)
                self._hold(r, c)
            elif s.row is not None:
                c.snapshot = self.state.snapshot(s.row, s.length)
            elif s.snapshot is not None:
                c.snapshot = s.snapshot  # snapshots are never written to: sharing is a copy
                s.snapshot.refs += 1
            out.append(c)
        return out

    @torch.inference_mode()
    def save(self, s: Session) -> None:
        """Move ``s``'s state to host memory and free its row (``s`` must be idle)."""
        self._check_open(s, "save")
        if s.busy:
            raise ValueError(f"save: session {s.id} has a turn in flight")
        if s.row is not None:
            s.snapshot = self.state.snapshot(s.row, s.length)
            self._release(s.row)

    @torch.inference_mode()
    def restore(self, s: Session) -> None:
        """Bring a saved session back into a row now (a turn does this by itself)."""
        self._check_open(s, "restore")
        if s.dropped:
            raise ValueError(f"restore: session {s.id} was dropped for host memory (host_limit); its next turn "
                             "prefills its conversation again: submit that turn")
        if s.row is None and not self._acquire_row(s, None):
            raise RuntimeError(f"restore: no row is free for session {s.id} (every row is serving a turn)")

    @torch.inference_mode()
    def close(self, s: Session) -> None:
        """End a session: its row (or host copy) is freed; a turn in flight is cancelled."""
        if s.closed:
            return
        if s.busy:
            self.cancel(s.request)
        self._close(s)

    def memory(self) -> dict:
        """Rows, their bytes, and where the sessions are: ``sessions_fit`` is how many sessions the rows
        hold at once (more wait in host memory, ``host_bytes``)."""
        per_row = self.state.bytes_per_row()
        on_host = [s for s in self.sessions.values() if s.snapshot is not None]
        return {"rows": self.max_batch, "rows_held": sum(r is not None for r in self.rows),
                "row_bytes": per_row["total"], "row_mamba_bytes": per_row["mamba"],
                "row_kv_bytes": per_row["attention"], "state_bytes": self.state.nbytes(), "kv_dtype": self.kv_dtype,
                "sessions": len(self.sessions), "sessions_on_host": len(on_host),
                "host_bytes": sum(s.snapshot.nbytes() for s in on_host), "sessions_fit": self.max_batch,
                "host_limit": self.host_limit, "sessions_dropped": sum(s.dropped for s in self.sessions.values()),
                "turns_bytes": self._turns_bytes()}

    @staticmethod
    def rows_that_fit(model, max_len: int, free_bytes: int, ssm_dtype: torch.dtype = torch.float32,
                      kv_dtype: torch.dtype | None = None) -> int:
        """How many rows of ``max_len`` tokens fit in ``free_bytes``: the rows' state only, so pass the free
        memory (``torch.cuda.mem_get_info()[0]``) less a margin for the prefill's activations, the vision
        encoder, the step's (rows, vocab) logits and the captured graphs' pool. ``kv_dtype`` as ``Engine``'s."""
        lm = getattr(model, "language_model", model)
        return int(free_bytes // row_bytes(lm, max_len, ssm_dtype, kv_dtype)["total"])

    # ------------------------------------------------------------------ rows
    def _check_open(self, s: Session, what: str) -> None:
        if not isinstance(s, Session) or self.sessions.get(s.id) is not s:
            raise ValueError(f"{what}: not a session of this engine: {s!r}")
        if s.closed:
            raise ValueError(f"{what}: session {s.id} is closed; open a new one with Engine.session()")

    def _free_rows(self) -> list[int]:
        return [i for i, q in enumerate(self.rows) if q is None]

    def _hold(self, row: int, s: Session) -> None:
        self.rows[row], s.row = s, row
        self.active[row] = 0

    def _release(self, row: int) -> None:
        s = self.rows[row]
        self.rows[row] = None
        self.active[row] = 0
        if s is not None:
            s.row = None

    def _acquire_row(self, s: Session, req: Request | None, loads: list | None = None) -> bool:
        """A row for ``s``, loaded with its state (host snapshot, ``req``'s prefix, or empty). ``loads``: an
        admission's list, where a prefix load waits for ``_load_prefixes`` (else it is done at once)."""
        free = self._free_rows()
        if not free and not (self.offload and self._evict()):
            return False
        r = self._free_rows()[0 if LAZY_ROWS else -1]  # the lowest: the decoding rows stay low, the batch small
        if s.dropped:
            self._replay_into(s, req)
        with torch.inference_mode():
            if s.snapshot is not None:
                self.state.restore(r, s.snapshot, release=True)
                s.snapshot = None
            elif req is not None and req.prefix is not None:
                s.length = self._load_prefix(r, req.prefix, loads)
            else:
                self.state.reset(r)
        self._hold(r, s)
        return True

    def _load_prefix(self, row: int, prefix: Prefix, loads: list | None = None) -> int:
        """``prefix``'s state into ``row``; returns its length. A prefix made by ``Engine.prefix`` holds no pads:
        it is copied by ``DecodeState.load_plain``, without reading the device (``load`` asks it where the pads
        are). Given an admission's ``loads``, the copy waits there for ``_load_prefixes``, which loads every row
        of the admission that starts from the same prefix at once."""
        if not (prefix.padless and PREFIX_GRAPHS):
            return self.state.load(row, prefix.state, 0)
        if loads is not None and BATCH_LOADS:
            loads.append((row, prefix))
        else:
            self._load_prefix_rows([row], prefix)
        return prefix.length

    def _load_prefixes(self, loads: list[tuple[int, Prefix]]) -> None:
        """An admission's waiting prefix loads (row, prefix), one ``_load_prefix_rows`` per prefix."""
        groups: dict[Prefix, list[int]] = {}   # (a Prefix hashes by identity)
        for row, prefix in loads:
            groups.setdefault(prefix, []).append(row)
        for prefix, rows in groups.items():
            self._load_prefix_rows(rows, prefix)

    def _load_prefix_rows(self, rows: list[int], prefix: Prefix) -> None:
        """``prefix`` into ``rows`` by one ``load_plain`` whose row index has a power-of-two length (``rows``
        padded with repeats of its last: every copy to a repeated row writes the same values, the prefix's). On
        CUDA, from the second use of a (prefix, length) on, that is one replay of a graph of its copies: at the
        12B about 80 copies, which queued from Python cost about a millisecond of host time. The serving section's
        first 64 rows took 38.5 ms of GPU time on an H100 loaded one at a time (0.6 ms a row: 80 short copies),
        13.2 ms together (docs/benchmarks.md, "Prefix loads together, the state in stacks")."""
        k = 1 << (len(rows) - 1).bit_length()
        idx = self._load_idx.get(k)
        if idx is None:
            idx = self._load_idx[k] = torch.zeros(k, dtype=torch.long, device=self.device)
        if k == 1:
            idx.fill_(rows[0])
        else:
            idx.copy_(device_ints(rows + rows[-1:] * (k - len(rows)), self.device))
        graphs = self._prefix_graphs.setdefault(prefix, {})
        g = graphs.get(k)   # absent: never loaded; None: loaded once; else its graph
        if g is not None:
            g.replay()
            return
        self.state.load_plain(idx, prefix.state)   # (at the second use also the capture's warm-up)
        if self.cuda_graph and k in graphs:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode=CAPTURE_MODE):
                self.state.load_plain(idx, prefix.state)
        graphs[k] = g

    def _decoding(self, row: int) -> bool:
        s = self.rows[row]
        return s is not None and s.request is not None and s.request.phase == "decode"

    def _decoding_rows(self) -> list[int]:
        return [i for i in range(self.max_batch) if self._decoding(i)]

    def _compaction_target(self, dec: list[int]) -> int | None:
        """The smaller captured batch the step of the decoding rows ``dec`` (ascending) runs at once the rows above
        it are moved into it, or None when moving rows gives no smaller batch than the highest of them needs.
        Rows that do not decode below the highest one stay where they are: they are inactive rows of the same
        batch, as the rows past n of a batch are, and an exchange costs about a millisecond of GPU time at the
        12B (two whole rows of every layer's state; 1.1 ms a replay on an H100,
        dev/runs/serving-phases-h100-2026-12-06h.json)."""
        if not dec:
            return None
        if not LAZY_ROWS:
            return len(dec) if dec[-1] >= len(dec) else None
        target = self._step_batch(len(dec))
        return target if target < self._step_batch(dec[-1] + 1) else None

    def _compact(self) -> list[int]:
        """The decoding rows, ascending, after moving those above ``_compaction_target`` below it (into free rows
        first, then idle sessions' rows, then rows being prefilled, swapping with the last two)."""
        dec = self._decoding_rows()
        target = self._compaction_target(dec)
        if target is None:
            return dec
        holes = sorted((i for i in range(target) if not self._decoding(i)),
                       key=lambda i: (self.rows[i] is not None, self.rows[i] is not None and self.rows[i].busy))
        pairs = list(zip(holes, [i for i in dec if i >= target]))  # (no row of a chunk in flight: see _decode)
        for dst, src in pairs:
            a, b = self.rows[src], self.rows[dst]
            if self.cuda_graph:  # one replay: both rows whole (no host work per layer)
                self._swap_idx.copy_(device_ints([dst, src], self.device))
                self._swap_graph.replay()
            else:
                if b is None:
                    self.state.move(src, dst, a.length)
                else:
                    self.state.swap(src, dst, a.length, b.length)
                there, back = device_ints([dst, src], self.device), device_ints([src, dst], self.device)
                for t in (self.tokens, self.active, self.temperature, self.top_k, self.top_p):
                    t[there] = t[back]
            self.rows[dst], self.rows[src] = a, b
            a.row = dst
            if b is not None:
                b.row = src
        self.stats["row_moves"] += len(pairs)
        return self._decoding_rows()

    def _row_tensors(self) -> list[tuple[torch.Tensor, int]]:
        """Every tensor with one row per engine row and its row dimension: the layers' states (their stacks, row
        dimension 1: holotron/state_stacks.py; else each layer's), the lengths, the next tokens, ``active`` and
        the sampling settings."""
        out = [(t, 0) for t in (self.state.lengths, self.tokens, self.active, self.temperature, self.top_k,
                                self.top_p)]
        if self.state._stacked():
            return out + [(st.tensor, 1) for st in self.state.stacks]
        for st in self.state.layers:
            if isinstance(st, MambaState):
                out += [(st.conv, 0), (st.ssm, 0)]
            elif st is not None:
                out += [(t, 0) for t in st.tensors()]   # FP8: codes (as uint8) and scales
        return out

    def _capture_swap(self) -> None:
        """The CUDA graph of ``_compact``'s row exchange: rows ``_swap_idx[0]`` and ``[1]`` of every row tensor
        swapped whole, two ops per tensor: 12 tensors at the 12B with the stacks, 86 before them (a replay at the
        serving section's rows took 1.08 ms of GPU time on an H100 before, 0.75 ms with the stacks;
        docs/benchmarks.md). The eager ``DecodeState.swap`` copies the used KV slots only, but queues its ops from
        Python at each exchange."""
        with torch.inference_mode():
            self._swap_idx = torch.zeros(2, dtype=torch.long, device=self.device)  # rows 0 and 0: a no-op
            tensors = self._row_tensors()

            def swap():
                back = self._swap_idx.flip(0)
                for t, dim in tensors:
                    t.index_copy_(dim, self._swap_idx, t.index_select(dim, back))

            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                swap()
            torch.cuda.current_stream(self.device).wait_stream(side)
            self._swap_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._swap_graph, capture_error_mode=CAPTURE_MODE):
                swap()
            torch.cuda.synchronize(self.device)

    def _check_progress(self) -> None:
        """Turns are queued, nothing runs, and no row can be had: stepping would wait forever. (A row freed
        by this step's decoding is taken by the next step's admissions.)"""
        if (self.queue and self.live == 0 and not self.prefilling and self.inflight is None
                and not self._free_rows() and not self.offload):
            held = sum(q is not None for q in self.rows)
            raise RuntimeError(f"Engine: {len(self.queue)} turn(s) wait for a row but idle sessions hold all "
                               f"{held} rows and offload is off: close or save sessions (Engine.close / "
                               "Engine.save), or build the engine with offload=True")

    def _set_row_sampling(self, row: int, req: Request) -> None:
        self.temperature[row] = req.temperature
        self.top_k[row] = req.top_k if req.top_k is not None else self.vocab
        self.top_p[row] = req.top_p if req.top_p is not None else 2.0

    def _close(self, s: Session) -> None:
        if s.row is not None:
            self._release(s.row)
        if s.snapshot is not None:
            s.snapshot.release()
        s.snapshot, s.closed = None, True
        s.turns, s.prefix, s.dropped = None, None, False   # kept turns go with it (host memory)
        self.sessions.pop(s.id, None)
