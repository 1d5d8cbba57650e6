"""Prefill chunks of the decode engine (``holotron/engine.py``) as CUDA graphs, one per (rows, tokens) bucket.

An eager chunk through the 12B model queues about 1,600 kernels from Python: 36 ms of host time for one row
of 16 tokens on the H200's host, more than the GPU needs for a chunk of a few hundred tokens
(``dev/probes/pass_cost.py``; docs/benchmarks.md). A graph replays them with no host work. The chunk runs
``HybridLM.extend_static`` (rows, lengths and counts as device tensors, so nothing in it depends on the
rows' positions) on static buffers: embeddings (b, T, D) and a (3, b) table of rows / starts / counts.

Shapes are bucketed: b rounded *down* to a bucket (the requests left over wait for the next step: no row
is padded), T rounded up (right pads, masked) to a multiple of 16 up to 512 and of at most T / 16 above
(``token_buckets``; ``HOLOTRON_CHUNK_STEP`` sets the finest step, 16 by default). The pads are work: the
chunk's products are compute-bound and a chunk of several turns pads each one to the longest. With 100 one-tile
agents (turns of 297-337 tokens) steps of 64 made 15.4% of the chunks' slots pads, steps of 16 make 4.5%: +2.9%
tokens/s on an H100 (``stats["chunk_tokens"]`` / ``["chunk_slots"]``; docs/benchmarks.md, "Token buckets of 16").
Finer buckets mean more shapes to capture (the mixed passes: one graph per decode batch, chunk rows and tokens).
A bucket met for the first time runs eagerly through the same buffers (a one-off ``generate`` pays no capture: two
warm-up runs and the capture cost about three eager chunks); the second time its graph is captured
(``chunk_captures`` / ``capture_s`` in ``stats``), unless ``capture_chunks`` captured it ahead. Without
CUDA graphs (a CPU) the same buffers and bucketing run eagerly (the tests' check of this bookkeeping).
Warm-up and capture run with counts 0, which change no row's state (dt = 0, the keys of pads go to the
cache's last slot, past ``max_len``). ``CapturedChunks`` is a base class of ``Engine``, written against
its attributes.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from .devices import CAPTURE_MODE
from .state import device_ints

__all__ = ["CapturedChunks", "row_buckets", "token_buckets", "bucket_down", "bucket_up"]

log = logging.getLogger("holotron.engine")


def row_buckets(limit: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... (steps of about 1.5x) up to ``limit``."""
    out, b = [], 1
    while b <= limit:
        out.append(b)
        nxt = b * 3 // 2 if b >= 2 and (b & (b - 1)) == 0 else (1 << b.bit_length())
        b = max(b + 1, nxt)
    return out


def _chunk_step() -> int:
    """The finest step of the token buckets: ``HOLOTRON_CHUNK_STEP`` (64 gives the buckets below 1,024 used before
    2026-12-06), 16 when unset or not a whole number >= 1 (said once in the log)."""
    v = os.environ.get("HOLOTRON_CHUNK_STEP", "").strip()
    if v.isdigit() and int(v) >= 1:
        return int(v)
    if v:
        log.warning("holotron.engine: HOLOTRON_CHUNK_STEP=%r is not a whole number of tokens >= 1; using 16", v)
    return 16


CHUNK_STEP = _chunk_step()


def token_buckets(limit: int, step: int | None = None) -> list[int]:
    """step, 2 step, 3 step, ... (``CHUNK_STEP``, 16) to 512, then steps of 32 to 1,024, 64 to 2,048, doubling
    each octave (a pad of at most T / 16), never finer than ``step``; the last one >= ``limit``."""
    step = CHUNK_STEP if step is None else step
    if step < 1:
        raise ValueError(f"token_buckets: step must be >= 1, got {step}")
    out = [step]
    while out[-1] < limit:
        t = out[-1]
        out.append(t + max(step, 1 << max(0, t.bit_length() - 5)))
    return out


def bucket_down(n: int, buckets: list[int]) -> int:
    return max(b for b in buckets if b <= n)


def bucket_up(n: int, buckets: list[int]) -> int:
    return next(b for b in buckets if b >= n)


class CapturedChunks:
    """``Engine._chunk_graphed``, ``capture_chunks``."""

    def _init_chunk_graphs(self) -> None:
        self._rows_b = row_buckets(self.max_batch)
        self._tokens_b = token_buckets(self.prefill_tokens)
        cap = max(b * bucket_up(min(self.prefill_tokens, max(1, self.prefill_tokens // b)), self._tokens_b)
                  for b in self._rows_b)
        w = self.lm.config.hidden_size
        dev, dt = self.device, self.lm.dtype
        with torch.inference_mode():
            self._cx = torch.zeros(cap, w, device=dev, dtype=dt)               # embeddings, viewed (b, T, D)
            self._cmeta = torch.zeros(3, self.max_batch, dtype=torch.long, device=dev)  # rows, starts, counts
            self._clogits = torch.zeros(self.max_batch, self.vocab, device=dev, dtype=torch.float32)
        self._chunk_pool = None

    def _graph_shape(self, rows: int, T: int) -> tuple[int, int] | None:
        """The bucket (b, T) a chunk of ``rows`` requests and T tokens runs in, or None (too large: eager)."""
        b = bucket_down(rows, self._rows_b)
        tb = bucket_up(T, self._tokens_b)
        if b * tb > self._cx.shape[0]:
            return None
        return b, tb

    def _chunk_graphed(self, take, counts, rows, starts, shape) -> torch.Tensor:
        """Run the chunk (``len(take) == shape[0]``) through its graph; returns its logits (b, V), valid until the
        next chunk."""
        b, T = shape
        g = None
        if self.cuda_graph:
            seen = self._chunk_seen.get(shape, 0)
            self._chunk_seen[shape] = seen + 1
            if shape in self.chunk_graphs or seen >= 1:   # a shape met once (a one-off generate) stays eager
                g = self._chunk_graph(b, T)
        x = self._fill_chunk(take, counts, rows, starts, b, T)
        if g is not None:
            g.replay()
        else:  # without CUDA graphs (tests on a CPU): the same call on the same buffers, eagerly
            self._clogits[:b].copy_(self.lm.extend_static(x, self.state, *self._cmeta[:, :b]))
        return self._clogits[:b]

    def _fill_chunk(self, take, counts, rows, starts, b: int, T: int) -> torch.Tensor:
        """The chunk's embeddings into ``_cx`` viewed (b, T, D) (returned; pads past each count are left as they
        are: masked) and its rows / starts / counts into ``_cmeta``; ``len(take) == b``."""
        x = self._cx[:b * T].view(b, T, -1)
        for i, (r, n) in enumerate(zip(take, counts)):
            x[i, :n].copy_(r.x[r.pos:r.pos + n])
        self.stats["chunk_tokens"] += sum(counts)
        self.stats["chunk_slots"] += b * T
        self._cmeta[:, :b].copy_(device_ints(list(rows) + list(starts) + list(counts), self.device).view(3, b))
        return x

    def _chunk_graph(self, b: int, T: int) -> torch.cuda.CUDAGraph:
        g = self.chunk_graphs.get((b, T))
        if g is not None:
            return g
        t0 = time.perf_counter()
        x = self._cx[:b * T].view(b, T, -1)
        rows, starts, counts = self._cmeta[0, :b], self._cmeta[1, :b], self._cmeta[2, :b]
        g = self._capture_static(b, lambda: self._clogits[:b].copy_(
            self.lm.extend_static(x, self.state, rows, starts, counts)))
        self.chunk_graphs[(b, T)] = g
        self.stats["chunk_captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return g

    def _capture_static(self, b: int, body, generator: bool = False) -> torch.cuda.CUDAGraph:
        """``body`` (a pass on the static chunk buffers of b rows) captured in a CUDA graph in the chunk graphs'
        pool, after two warm-ups on a side stream, with the chunk's rows 0 .. b-1 and counts 0, which change no
        row (see the module docstring). ``generator``: the graph draws from the engine's sampling generator."""
        with torch.inference_mode():
            self._cmeta[0, :b].copy_(torch.arange(b, device=self.device))
            self._cmeta[1:, :b].zero_()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    body()
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._chunk_pool is None:
                self._chunk_pool = torch.cuda.graph_pool_handle()
            g = torch.cuda.CUDAGraph()
            if generator and self.generator is not None:
                g.register_generator_state(self.generator)
            with torch.cuda.graph(g, pool=self._chunk_pool, capture_error_mode=CAPTURE_MODE):
                body()
            torch.cuda.synchronize(self.device)
        return g

    def capture_chunks(self, shapes: list[tuple[int, int]]) -> None:
        """Capture the chunk graphs of these (rows, tokens) shapes now (each rounded to its bucket), e.g. at
        startup for the sizes a workload will meet; ``stats`` does not count them."""
        if not self.prefill_graphs or not self.cuda_graph:
            return
        before = (self.stats["chunk_captures"], self.stats["capture_s"])
        for b, t in shapes:
            shape = self._graph_shape(min(b, self.max_batch), min(t, self.prefill_tokens))
            if shape is not None:
                self._chunk_graph(*shape)
        self.stats["chunk_captures"], self.stats["capture_s"] = before
