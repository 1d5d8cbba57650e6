"""The decode engine's one step (``holotron/engine.py``): ``HybridLM.step`` on the first b rows of the
``DecodeState``, eager, ``torch.compile``d, or captured in a CUDA graph per batch size.

``_step(b)`` reads each row's next input token (``tokens``), writes the chosen next token back (argmax,
or ``holotron/sampling.py`` on a sampling engine), and keeps the logits when asked; every shape is
fixed by b and ``max_len``; nothing reads a value back to the host. ``_capture_all`` warms every batch
size up on a side stream and captures them, largest first, into one memory pool; a step that cannot be
captured is captured again through the naive torch Mamba path (said in ``note``). ``CapturedStep`` is a
base class of ``Engine``, written against its attributes.
"""

from __future__ import annotations

import logging

import torch

from . import kernels
from .sampling import choose_tokens

__all__ = ["CapturedStep"]

log = logging.getLogger("holotron.engine")


class CapturedStep:
    """``Engine._step``, ``_capture_all``."""

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
                with torch.cuda.graph(g, pool=pool):
                    self._step(b)
                self.graphs[b] = g
            torch.cuda.synchronize(self.device)

