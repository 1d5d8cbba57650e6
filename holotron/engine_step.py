"""The decode engine's one step (``holotron/engine.py``): ``HybridLM.step`` on the first b rows of the
``DecodeState``, eager, ``torch.compile``d, or captured in a CUDA graph per batch size.

``_step(b)`` reads each row's next input token (``tokens``), writes the chosen next token back (argmax,
or ``holotron/sampling.py`` on a sampling engine), and keeps the logits when asked; every shape is
fixed by b and ``max_len``; nothing reads a value back to the host. ``_capture_all`` warms every batch
size up on a side stream and captures them, largest first, into one memory pool; a step that cannot be
captured is captured again through the naive torch Mamba path (said in ``note``). ``_decode`` is the decode
phase of an engine step: the decoding rows moved to rows [0, n) when that gives a smaller batch, the step for
the smallest captured batch that covers them, one read-back of their tokens, then the host's bookkeeping
(lengths, prompts read by the steps, emitted tokens, finished turns). ``CapturedStep`` is a base class of
``Engine``, written against its attributes.
"""

from __future__ import annotations

import logging
import time

import torch

from . import kernels
from .devices import CAPTURE_MODE
from .engine_requests import Request
from .sampling import choose_tokens
from .state import device_ints

__all__ = ["CapturedStep"]

log = logging.getLogger("holotron.engine")


class CapturedStep:
    """``Engine._step``, ``_capture_all``, ``_decode`` (the decode phase of an engine step), ``_step_batch``,
    ``_emit``, ``_finish``."""

    def _step(self, b: int) -> None:
        """One token for rows [0, b): reads ``tokens``, writes the next ``tokens``; static shapes, no sync."""
        if self.naive_step:
            with kernels.use_backend("naive"):
                return self._step_once(b)
        return self._step_once(b)

    def _step_once(self, b: int) -> None:
        try:
            logits = self._model_step(self.tokens[:b], self._rows[b], self.active[:b])
        except Exception as e:  # noqa: BLE001 - a step torch.compile cannot build: the eager one, said once
            if self._model_step == self.lm.step:
                raise
            self._model_step = self.lm.step
            self.note = f"torch.compile of the step failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); eager"
            log.warning("holotron.engine: %s", self.note)
            logits = self._model_step(self.tokens[:b], self._rows[b], self.active[:b])
        self._choose(logits, b)

    def _choose(self, logits: torch.Tensor, b: int) -> None:
        """The next input token of rows [0, b) from their logits (b, V): argmax, or sampled."""
        if self.logits is not None:
            self.logits[:b].copy_(logits)
        if self.sampling:
            nxt = choose_tokens(logits, self.temperature[:b], self.top_k[:b], self.top_p[:b], self.generator)
        else:
            nxt = logits.argmax(-1)
        self.tokens[:b].copy_(nxt)

    def _capture_all(self) -> None:
        if self.live:
            raise RuntimeError("Engine: graphs are captured while the engine is empty")
        try:
            self._capture()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - a kernel that cannot be captured: retry on the naive step
            self.graphs.clear()
            torch.cuda.synchronize(self.device)
            self.naive_step = True
            self.note = (f"capturing the decode step failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                         "the Mamba step is captured through the naive torch path instead")
            log.warning("holotron.engine: %s", self.note)
            self._capture()

    def _capture(self) -> None:
        """Warm up every batch size on a side stream (Triton JIT, cuBLAS workspaces; the rows are empty,
        so the steps change nothing that matters), then capture, largest first, into one pool."""
        with torch.inference_mode():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for b in self.batch_sizes:
                    for _ in range(2):
                        self._step(b)
            torch.cuda.current_stream(self.device).wait_stream(side)
            pool = torch.cuda.graph_pool_handle()
            for b in sorted(self.batch_sizes, reverse=True):
                g = torch.cuda.CUDAGraph()
                if self.generator is not None:
                    g.register_generator_state(self.generator)
                with torch.cuda.graph(g, pool=pool, capture_error_mode=CAPTURE_MODE):
                    self._step(b)
                self.graphs[b] = g
            torch.cuda.synchronize(self.device)

    def _decode(self) -> list[tuple[Request, int]]:
        pre = []
        if self.inflight is not None:
            target = self._compaction_target(self._decoding_rows())
            if target is not None and any(r.session.row is not None and r.session.row < target
                                          for r in self.inflight[0] if not r.done):
                # a row of the chunk in flight would be moved: finish the chunk first (its rows' lengths)
                self.inflight[-1].synchronize()
                pre = self._finish_chunk()
        dec = self._compact()
        if not dec:
            return pre
        b = self._step_batch(dec[-1] + 1)
        if self.cuda_graph:
            self.graphs[b].replay()
        else:
            self._step(b)
        return pre + self._after_decode(dec)

    def _step_batch(self, n: int) -> int:
        """The captured batch size a step of n decoding rows runs at: the smallest one >= n."""
        return next(s for s in self.batch_sizes if s >= n)

    def _after_decode(self, dec: list[int]) -> list[tuple[Request, int]]:
        """Host bookkeeping of a decode token of the decoding rows ``dec`` (ascending): lengths, prompts read by
        the steps, emitted tokens."""
        toks = self.tokens[:dec[-1] + 1].tolist()  # the one host sync per step
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += len(dec)
        out, feed = [], []
        for r in dec:
            s = self.rows[r]
            s.length += 1  # the step consumed the row's input token
            req = s.request
            if req.forced is not None and req.fpos < len(req.forced):  # still reading its prompt
                feed.append((r, req.forced[req.fpos]))
                req.fpos += 1
                continue
            out.append((req, toks[r]))
            self._emit(req, toks[r])
        if feed:
            rows, ids = zip(*feed)
            self.tokens[device_ints(rows, self.device)] = device_ints(ids, self.device)
        return out

    def _emit(self, req: Request, tok: int) -> None:
        if req.t_first is None:
            req.t_first = time.perf_counter()
        req.tokens.append(tok)
        req.session.pending = tok
        if tok in req.eos or len(req.tokens) >= req.max_new_tokens:
            if req.session.row is not None:
                self.active[req.session.row] = 0
            self._finish(req)

    def _finish(self, req: Request) -> None:
        req.done, req.phase, req.t_done = True, "done", time.perf_counter()
        s = req.session
        if s is not None:
            s.last_used = self.steps
            if s.temporary:
                self._close(s)
