"""The decode engine's mixed passes (``holotron/engine.py``, ``Engine(mixed=True)``; off by default).

A mixed engine step runs admissions, then one ``HybridLM.mixed`` pass for the decoding rows' next tokens and
the next prefill chunk together (every linear layer reads its weights once for both; the decode tokens go
through the decode step's kernels, the chunk through the prefill's), then admissions again into the rows
the step's turns gave up. When no chunk is due the captured decode step runs alone; when no row decodes,
the chunk alone (its graph, ``holotron/engine_chunks.py``).

The pass has static shapes (the chunk's rows, lengths and counts on the device, as the chunk graphs have): on CUDA
it is a CUDA graph per (decode batch, chunk rows, chunk tokens), the decode batch being the smallest captured
batch size that covers the decoding rows (its rows that do not decode, a chunk's among them, are inactive: their
decode token writes nothing), the chunk bucketed as the chunk graphs are (rows rounded down, tokens up). As there,
a shape met for the first time runs eagerly through the same buffers and its graph is captured the second time
(``mixed_captures``), unless ``capture_mixed`` captured it ahead; without CUDA graphs the same buffers run eagerly
(the tests' check of this bookkeeping). An eager pass through the 12B model costs 44-83 ms of host time on the
H200's host (docs/benchmarks.md, "The engine as graphs"): the graph is what makes the pass worth having.

Warm-up and capture run with every row inactive and chunk counts 0, which change no row's state (the keys
of inactive rows and of pads go to spare slots, dt = 0 leaves a Mamba state as it was) and no length; the
next tokens they write are put back. ``MixedSteps`` is a base class of ``Engine``, written against its
attributes.
"""

from __future__ import annotations

import time

import torch

from .engine_requests import Request

__all__ = ["MixedSteps"]


class MixedSteps:
    """``Engine._step_mixed``, ``_mixed_pass``, ``capture_mixed``."""

    def _step_mixed(self) -> list[tuple[Request, int]]:
        """``step`` of a mixed engine: admissions, then one pass for the decoding rows and the next chunk
        together (``HybridLM.mixed``), or the captured decode step alone when no chunk is due, or the chunk
        alone when no row decodes (a chunk not ready while rows decode waits for the next step's pass rather
        than running alone after the decode step); then admissions again, into the rows this step's turns
        gave up (as in a separate step: a turn that waits for a row gets one before the sessions that just
        finished a turn send their next one)."""
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self._admit()
            self._sync()
            t1 = time.perf_counter()
            dec = self._compact()
            n = len(dec)
            chunk = self._pick_chunk() if n else None
            shape = None if chunk is None else self._mixed_shape(dec, chunk)
            if shape is not None:
                out += self._mixed_pass(dec, chunk, shape)
                self.stats["mixed_steps"] += 1
                self.stats["mixed_tokens"] += n
            else:
                out += self._decode()
            self._sync()
            t2 = time.perf_counter()
            if shape is None and (chunk is not None or not n):  # no chunk was ready while rows decode: it
                out += self._prefill_step()   # waits for the next step's mixed pass (a screenshot's work on the
                self._sync()                  # vision stream, done during this decode, would else run alone)
            t3 = time.perf_counter()
            if self.queue:
                out += self._admit()
                self._sync()
            t4 = time.perf_counter()
        st = self.stats
        st["admit_s"] += t1 - t0 + t4 - t3
        st["mixed_s" if shape is not None else "decode_s"] += t2 - t1
        st["prefill_s"] += t3 - t2
        self.steps += 1
        return out

    def _mixed_shape(self, dec: list[int], chunk) -> tuple[int, int, int] | None:
        """(decode batch, chunk rows, chunk tokens) of the pass for the decoding rows ``dec`` and this chunk
        (the decode batch covers the highest of them; a chunk row below it is one of its inactive rows), or None when
        the chunk does not fit the chunk buffers (it then runs on its own, after a decode step)."""
        take, _, T, _, _ = chunk
        shape = self._graph_shape(len(take), T)
        if shape is None or shape[0] != len(take):
            return None
        return self._step_batch(dec[-1] + 1), shape[0], shape[1]

    def _mixed_pass(self, dec: list[int], chunk, shape: tuple[int, int, int]) -> list[tuple[Request, int]]:
        """One ``HybridLM.mixed`` pass (its graph, or eagerly): the next token of the decoding rows ``dec`` and the
        chunk; then the bookkeeping of both, as ``_decode`` and ``_finish_chunk``."""
        take, counts, _, rows, starts = chunk
        nb, b, T = shape
        g = None
        if self.cuda_graph:
            seen = self._mixed_seen.get(shape, 0)
            self._mixed_seen[shape] = seen + 1
            if shape in self.mixed_graphs or seen >= 1:   # a shape met once stays eager (see the docstring)
                g = self._mixed_graph(nb, b, T)
        self._fill_chunk(take, counts, rows, starts, b, T)
        if g is not None:
            g.replay()
        else:
            self._mixed_body(nb, b, T)
        out = self._after_decode(dec)
        self.inflight = (take, counts, self._clogits[:b], None)
        return out + self._finish_chunk()

    def _mixed_body(self, nb: int, b: int, T: int) -> None:
        """What a mixed graph runs: ``HybridLM.mixed`` on the static buffers (decode rows [0, nb), the chunk in
        ``_cx`` / ``_cmeta``); the decode tokens' next tokens to ``tokens``, the chunk's logits to ``_clogits``."""
        x = self._cx[:b * T].view(b, T, -1)
        rows, starts, counts = self._cmeta[0, :b], self._cmeta[1, :b], self._cmeta[2, :b]
        dec, pre = self.lm.mixed(self.tokens[:nb], self.state, self.active[:nb], x, rows, starts, counts)
        self._choose(dec, nb)
        self._clogits[:b].copy_(pre)

    def _mixed_graph(self, nb: int, b: int, T: int) -> torch.cuda.CUDAGraph:
        g = self.mixed_graphs.get((nb, b, T))
        if g is not None:
            return g
        t0 = time.perf_counter()
        with torch.inference_mode():
            tokens, active = self.tokens.clone(), self.active.clone()   # put back after (see the docstring)
            self.active.zero_()
            g = self._capture_static(b, lambda: self._mixed_body(nb, b, T), generator=True)
            self.tokens.copy_(tokens)
            self.active.copy_(active)
        self.mixed_graphs[(nb, b, T)] = g
        self.stats["mixed_captures"] += 1
        self.stats["capture_s"] += time.perf_counter() - t0
        return g

    def capture_mixed(self, shapes: list[tuple[int, int, int]]) -> None:
        """Capture the mixed graphs of these (decoding rows, chunk rows, chunk tokens) shapes now (each rounded to
        its bucket), e.g. at startup for the sizes a workload will meet; ``stats`` does not count them."""
        if not self.mixed or not self.cuda_graph:
            return
        before = (self.stats["mixed_captures"], self.stats["capture_s"])
        for n, b, t in shapes:
            shape = self._graph_shape(min(b, self.max_batch), min(t, self.prefill_tokens))
            if shape is not None:
                self._mixed_graph(self._step_batch(min(n, self.max_batch)), *shape)
        self.stats["mixed_captures"], self.stats["capture_s"] = before
