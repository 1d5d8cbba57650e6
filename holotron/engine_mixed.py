"""The decode engine's mixed passes (``holotron/engine.py``, ``Engine(mixed=True)``; off by default).

A mixed engine step runs admissions, then one ``HybridLM.mixed`` pass for the decoding rows' next tokens and
the next prefill chunk together (every linear layer reads its weights once for both; the decode tokens go
through the decode step's kernels, the chunk through the prefill's), then admissions again into the rows
the step's turns gave up. When no chunk is due the captured decode step runs alone; when no row decodes,
the chunk alone. The pass is eager: on the H200 it costs 44-83 ms of host time at 12B, so the chunk graphs
(holotron/engine_chunks.py) beat it (docs/benchmarks.md, "The engine as graphs"). ``MixedSteps`` is a
base class of ``Engine``, written against its attributes.
"""

from __future__ import annotations

import time

import torch

from .engine_requests import Request

__all__ = ["MixedSteps"]


class MixedSteps:
    """``Engine._step_mixed``, ``_mixed_pass``."""

    def _step_mixed(self) -> list[tuple[Request, int]]:
        """``step`` of a mixed engine: admissions, then one pass for the decoding rows and the next chunk
        together (``HybridLM.mixed``), or the captured decode step alone when no chunk is due, or the chunk
        alone when no row decodes; then admissions again, into the rows this step's turns gave up (as in a
        separate step: a turn that waits for a row gets one before the sessions that just finished a turn
        send their next one)."""
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self._admit()
            self._sync()
            t1 = time.perf_counter()
            n = self._compact()
            chunk = self._pick_chunk() if n else None
            if chunk is not None:
                out += self._mixed_pass(n, chunk)
                self.stats["mixed_steps"] += 1
                self.stats["mixed_tokens"] += n
            else:
                out += self._decode()
            self._sync()
            t2 = time.perf_counter()
            if chunk is None:
                out += self._prefill_step()
                self._sync()
            t3 = time.perf_counter()
            if self.queue:
                out += self._admit()
                self._sync()
            t4 = time.perf_counter()
        st = self.stats
        st["admit_s"] += t1 - t0 + t4 - t3
        st["mixed_s" if chunk is not None else "decode_s"] += t2 - t1
        st["prefill_s"] += t3 - t2
        self.steps += 1
        return out

    def _mixed_pass(self, n: int, chunk) -> list[tuple[Request, int]]:
        """One ``HybridLM.mixed`` pass: the next token of decoding rows [0, n) and the chunk, one read of the
        weights (``Engine(mixed=True)``); then the bookkeeping of both, as ``_decode`` and ``_finish_chunk``."""
        take, counts, T, rows, starts = chunk
        dec, pre = self.lm.mixed(self.tokens[:n], self.state, self._chunk_input(take, counts, T), rows, starts,
                                 counts, active=self.active[:n])
        self._choose(dec, n)
        out = self._after_decode(n)
        self.inflight = (take, counts, pre, None)
        return out + self._finish_chunk()
