"""The decode engine's vision encoder calls (``holotron/engine.py``) as CUDA graphs, one per bucket of tiles.

Admissions embed the screenshots of the turns admitted in one step together (``vision_tiles`` tiles per
call). Agents fall out of step, so most calls carry one to three tiles, and an eager RADIO ViT-H + mlp1
call is host-bound there, as the language model's chunks are (holotron/engine_chunks.py). On CUDA each
call runs a graph captured for its tile count rounded up to a bucket (1, 2, 3, 4, 6, 8, 12, ...), on a
static input buffer, from the second call of that bucket on (or ahead, ``capture_vision``); the pad tiles'
outputs are dropped. A tile size other than the model's, or a graph
that cannot be captured, runs eagerly (said in ``note``). ``CapturedVision`` is a base class of ``Engine``.

``vision_stream`` (off by default): the screenshots admitted in a step, and the embeddings of their turns, are
computed on a stream of their own while the step's pass runs on the current one (the vision encoder is
matmul-bound at a few tiles a call and leaves the GPU part idle; the pass does too). Such a turn enters the
prefill as usual but a chunk takes it only once its event is done (``_ready``), usually the next step; a step
with nothing else to run waits for it. Off CUDA the same bookkeeping runs with a stand-in event that is done
from the next engine step on (``_NextStep``), so the CPU tests see turns wait a step.

The vision graphs are captured on a stream of their own, not on ``torch.cuda.graph``'s default capture stream
where the engine's other graphs are. PyTorch keeps a cuBLAS workspace per stream and a graph keeps the one of
the stream it was captured on; with the vision stream a vision graph replays while a pass's graph runs, and two
graphs from one capture stream then share a workspace. On an H100 (2026-12-06, docs/benchmarks.md, "The
twelve-tile hang") that stopped the GPU for good: a cuBLAS matrix product with one block per SM never finished,
in the first steps of 100 twelve-tile agents with vision graphs and the vision stream on; with the vision
encoder eager, or its graphs captured on their own stream, the same runs finished. A vision call off the vision
stream (``prefix``) first waits for the vision stream's calls: they share the capture stream too.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from .devices import CAPTURE_MODE
from .engine_chunks import bucket_up, row_buckets

__all__ = ["CapturedVision"]

log = logging.getLogger("holotron.engine")


class CapturedVision:
    """``Engine._embed_images``, ``capture_vision``, and the vision stream's ``_on_vision_stream`` / ``_ready``."""

    @contextmanager
    def _on_vision_stream(self, tensors):
        """Work queued inside runs on the vision stream, after what the current stream has queued so far (the
        pixels, ``tensors``, are ready). Yields a list; on exit it holds the event that marks the work done
        (None off CUDA)."""
        done = []
        if self._vstream is None:  # off CUDA: run now; each turn gets its own stand-in (``_embed_new``)
            yield done
            done.append(None)
            return
        main = torch.cuda.current_stream(self.device)
        self._vstream.wait_stream(main)
        for t in tensors:  # made on the current stream, read on the vision stream: not reused before it has
            if t.is_cuda:
                t.record_stream(self._vstream)
        with torch.cuda.stream(self._vstream):
            yield done
            ev = torch.cuda.Event()
            ev.record()
        done.append(ev)

    def _stage(self, reqs: list) -> list:
        """Before a request's screenshot work goes to the vision stream: its pixels, prompt ids, pending token and
        the positions of its image tokens (found on the host: ``submit`` checked their count) go to the device on
        the current stream, so that nothing inside waits for the host (a copy from pageable memory, or a read of
        a device value, on the vision stream would make the host wait for the vision encoder). Returns the
        device tensors the vision stream reads."""
        from .state import device_ints

        out = []
        image_id = self.model.config.image_token_id
        for r in reqs:
            px = r.image_kw["pixel_values"].to(self.device)
            ids = r.input_ids.cpu()
            r.image_kw = {**r.image_kw, "pixel_values": px}
            r.staged = {"ids": ids.to(self.device), "pos": (ids == image_id).nonzero().squeeze(1).to(self.device),
                        "pending": (None if r.session.pending is None
                                    else device_ints([r.session.pending], self.device))}
            out += [px] + [t for t in r.staged.values() if t is not None]
        return out

    def _staged_parts(self, r, image: torch.Tensor | None) -> list | None:
        """The embeddings of a staged request (``_stage``): the pending token's, then the prompt's with its image
        tokens' rows replaced (index_copy: no read of the device); None for a request not staged."""
        st = r.staged
        if st is None or image is None:
            return None
        emb = self.lm.backbone.embeddings
        x = emb(st["ids"])
        x = x.index_copy(0, st["pos"], image.reshape(-1, x.shape[-1]).to(x.dtype))
        return ([emb(st["pending"])] if st["pending"] is not None else []) + [x]

    def _ready(self, reqs: list) -> list:
        """The requests of ``reqs`` whose embeddings are done (those made on the vision stream once their event
        is); the current stream is ordered after each such event. When none is done and no row decodes, wait
        for the oldest one's (nothing else would run this step)."""
        if all(r.ready is None for r in reqs):
            return reqs
        out = []
        for r in reqs:
            if r.ready is not None and r.ready.query():
                self._took_ready(r)
            if r.ready is None:
                out.append(r)
        if not out and not any(self._decoding(i) for i in range(self.max_batch)):
            reqs[0].ready.synchronize()
            self._took_ready(reqs[0])
            out.append(reqs[0])
        return out

    def _took_ready(self, r) -> None:
        if isinstance(r.ready, torch.cuda.Event):
            torch.cuda.current_stream(self.device).wait_event(r.ready)
        r.ready = None

    def _embed_images(self, px: torch.Tensor) -> torch.Tensor:
        """Tiles (n, 3, S, S), n <= ``vision_tiles`` -> (n, tokens per tile, D) language-model embeddings."""
        n = px.shape[0]
        vcfg = getattr(getattr(self.model, "config", None), "vision", None)
        S = getattr(vcfg, "image_size", None)
        if not self.cuda_graph or self.vision_graphs is None or tuple(px.shape[1:]) != (3, S, S) or n < 1:
            return self.model.embed_images(px)
        b = bucket_up(n, row_buckets(self.vision_tiles))
        seen = self._vision_seen.get(b, 0)
        self._vision_seen[b] = seen + 1
        g = self._vision_graph(b, S) if b in self.vision_graphs or seen >= 1 else None
        if g is None:  # a bucket met once (a one-off generate) stays eager
            return self.model.embed_images(px)
        cur = torch.cuda.current_stream(self.device)
        if self._vstream is not None and cur != self._vstream:
            # a call off the vision stream (``prefix``) while admissions' calls may still run there: they share
            # the input buffer, the output buffers and the capture stream's cuBLAS workspace
            cur.wait_stream(self._vstream)
        self._vx[:n].copy_(px)   # in the vision weights' dtype, to which embed_images casts pixels anyway
        g.replay()
        return self._vout[b][:n].clone()  # the next replay of this bucket (the admission's next call) overwrites it

    def _vision_graph(self, b: int, S: int):
        if self.vision_graphs is None:  # an earlier capture failed: eager
            return None
        g = self.vision_graphs.get(b)
        if g is not None:
            return g
        try:
            with torch.inference_mode():
                if self._vx is None:  # one input buffer for every bucket (its first b tiles)
                    dtype = next(self.model.vision_model.parameters()).dtype
                    self._vx = torch.zeros(self.vision_tiles, 3, S, S, device=self.device, dtype=dtype)
                    self._vpool = torch.cuda.graph_pool_handle()
                    self._vcap = torch.cuda.Stream(self.device)   # see the module docstring: own cuBLAS workspace
                x = self._vx[:b]
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        self.model.embed_images(x)
                torch.cuda.current_stream(self.device).wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self._vpool, stream=self._vcap, capture_error_mode=CAPTURE_MODE):
                    out = self.model.embed_images(x)
                torch.cuda.synchronize(self.device)
        except Exception as e:  # noqa: BLE001 - a vision model that cannot be captured: eager from now on
            self.vision_graphs = None
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self.note = f"capturing the vision encoder failed ({why}); eager"
            log.warning("holotron.engine: %s", self.note)
            return None
        self._vout[b] = out   # the graph's output tensor (its pool keeps it; overwritten by each replay)
        self.vision_graphs[b] = g
        return g

    def capture_vision(self, tiles: list[int]) -> None:
        """Capture the vision graphs for these tile counts now (rounded up to their buckets), e.g. at startup."""
        vcfg = getattr(getattr(self.model, "config", None), "vision", None)
        if not self.cuda_graph or self.vision_graphs is None or vcfg is None:
            return
        for n in tiles:
            self._vision_graph(bucket_up(min(max(n, 1), self.vision_tiles), row_buckets(self.vision_tiles)),
                               vcfg.image_size)


class _NextStep:
    """Off CUDA, the "event" of a turn's screenshot work under ``vision_stream``: done once the engine has moved
    past the step that admitted it (the work itself ran at once)."""

    def __init__(self, engine):
        self.engine, self.step = engine, engine.steps

    def query(self) -> bool:
        return self.engine.steps > self.step

    def synchronize(self) -> None:
        """Nothing to wait for: the work ran when it was queued."""
