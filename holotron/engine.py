"""The decode engine: static-shape decode, CUDA graphs and continuous batching for HybridLM / Holotron.

    eng = Engine(model, max_batch=64, max_len=4096)                  # state preallocated; graphs captured on CUDA
    reqs = [eng.submit(ids, max_new_tokens=64) for ids in prompts]    # 1-d prompts (+ pixel_values=..., num_tiles=...)
    eng.run()                                                         # prefill in chunks, decode until every row ends
    reqs[0].tokens                                                    # the new ids of the first prompt

    screen = eng.prefix(screen_ids, pixel_values=px)                  # prefill a shared screenshot + system prompt once
    a = eng.submit(task_a_ids, prefix=screen, max_new_tokens=32)      # each continuation starts from a copy of it
    b = eng.submit(task_b_ids, prefix=screen, max_new_tokens=32)

One decode step, ``_step(b)``: ``HybridLM.step`` on the first b rows of the ``DecodeState`` (every
layer's own one-token ``step``; ``torch.compile``d as a whole with ``compile=True``) -> greedy or sampled
token (``holotron/sampling.py``), written back as the next step's input. Every shape is fixed by ``b``
and ``max_len``; positions are the ``lengths`` tensor; nothing reads a value back to the host. On CUDA
``_step(b)`` is captured once per batch size in ``batch_sizes`` (a torch.cuda.CUDAGraph each, one
memory pool) and replayed per token; elsewhere, or with ``cuda_graph=False``, it runs eagerly: the
same code, which is what the CPU tests compare with ``holotron.generate``.

Rows: a request gets a free row of the ``DecodeState``, its prompt prefilled in chunks and copied in
(``holotron/engine_prefill.py``). A finished row is freed, refilled from the queue, or filled by moving
the last live row into it, so the live rows are always rows [0, n) and a step runs on the smallest
captured batch >= n: finished rows stop costing work. Requests, prefixes and the per-row token choice
are ``holotron/engine_requests.py``'s.
``generate()`` uses this engine on CUDA (``engine=False`` or HOLOTRON_ENGINE=0 opts out).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections import deque
from collections.abc import Iterator

import torch

from . import kernels
from .engine_prefill import Admission
from .engine_requests import Prefix, Request, default_batch_sizes
from .sampling import choose_tokens
from .state import DecodeState

__all__ = ["Engine", "Request", "Prefix", "EngineUnsupported", "engine_for", "release", "choose_tokens"]

log = logging.getLogger("holotron.engine")

_ALIGN = 64  # max_len is rounded up to this: aligned attention-mask rows for the fused SDPA kernels


class EngineUnsupported(RuntimeError):
    """The engine cannot serve this model / these arguments (``generate`` then takes the plain path)."""


class Engine(Admission):
    """Preallocated decode state for ``max_batch`` rows of at most ``max_len`` tokens, one decode step
    captured per batch size (CUDA), a queue of requests, chunked prefill, prefix snapshots.

    ``sampling``: False for a greedy-only engine (argmax in the step); True adds per-row temperature /
    top-k / top-p to the step (``holotron/sampling.py``: top-k candidates, no sort of the vocabulary)
    and an own ``generator`` on the model's device. ``cuda_graph``: None = on when the model is on CUDA.
    ``keep_logits``: keep each step's logits in ``self.logits`` (tests). ``zero_state=False`` leaves the
    state uninitialised (benchmarks on synthetic states). ``ssm_dtype``: the Mamba state's dtype (default float32;
    bfloat16 halves the bytes each decode step reads and writes, the step still computes in fp32 and
    rounds the stored state once per token). ``compile``: ``torch.compile`` the whole ``HybridLM.step``
    (True, or the name of a torch.compile backend; off by default: the first capture then costs the
    compile); the Mamba kernels stay one opaque op (``mamba_step`` in ``holotron/mamba2.py``). A step that
    cannot be compiled falls back to the eager one, with a warning in ``note``.
    """

    def __init__(self, model, max_batch: int, max_len: int, *, sampling: bool = False,
                 cuda_graph: bool | None = None, batch_sizes: list[int] | None = None,
                 prefill_tokens: int = 8192, ssm_dtype: torch.dtype = torch.float32,
                 keep_logits: bool = False, zero_state: bool = True, compile: bool | str = False):
        if max_batch < 1 or max_len < 1:
            raise ValueError(f"Engine: max_batch and max_len must be >= 1, got {max_batch}, {max_len}")
        self.model = model
        self.lm = getattr(model, "language_model", model)
        if not hasattr(self.lm, "backbone") or not hasattr(self.lm, "lm_head"):
            raise EngineUnsupported(f"Engine: {type(model).__name__} is neither a HybridLM nor a model with one "
                                    "as .language_model")
        self.device = self.lm.device
        self.vocab = self.lm.config.vocab_size
        self.max_len = -(-max_len // _ALIGN) * _ALIGN
        self.sampling = bool(sampling)
        self.ssm_dtype = ssm_dtype
        self.prefill_tokens = prefill_tokens
        self.cuda_graph = (self.device.type == "cuda") if cuda_graph is None else bool(cuda_graph)
        if self.cuda_graph and self.device.type != "cuda":
            raise ValueError(f"Engine: cuda_graph=True needs the model on a CUDA device, it is on {self.device}")
        if self.cuda_graph and self.sampling and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
            raise EngineUnsupported("Engine: sampling under CUDA graphs needs CUDAGraph.register_generator_state "
                                    f"(torch >= 2.5), this is torch {torch.__version__}")
        sizes = sorted(set(batch_sizes or default_batch_sizes(max_batch)))
        if sizes[0] < 1 or sizes[-1] > max_batch:
            raise ValueError(f"Engine: batch_sizes must lie in [1, max_batch={max_batch}], got {sizes}")
        if sizes[-1] != max_batch:
            sizes.append(max_batch)
        self.batch_sizes = sizes

        dev, R = self.device, max_batch
        with torch.inference_mode():
            self.state = DecodeState.allocate(self.lm, R, self.max_len, ssm_dtype, zero=zero_state)
            self.tokens = torch.zeros(R, dtype=torch.long, device=dev)       # each row's next input token
            self.active = torch.zeros(R, dtype=torch.long, device=dev)       # 1 on live rows: their length grows
            self.temperature = torch.zeros(R, dtype=torch.float32, device=dev)
            self.top_k = torch.full((R,), self.vocab, dtype=torch.long, device=dev)
            self.top_p = torch.full((R,), 2.0, dtype=torch.float32, device=dev)
            self.logits = torch.zeros(R, self.vocab, dtype=torch.float32, device=dev) if keep_logits else None
        self.generator = torch.Generator(device=dev) if self.sampling else None
        self._rows = {b: self.state.rows(b) for b in self.batch_sizes}
        self.rows: list[Request | None] = [None] * R   # host side: the request in each row
        self.lens = [0] * R                            # host mirror of state.lengths
        self.queue: deque[Request] = deque()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.naive_step = False   # True when the Mamba step had to be captured through the naive torch path
        self.note: str | None = None
        self.compile = compile
        self._model_step = self.lm.step
        if compile:
            backend = compile if isinstance(compile, str) else "inductor"
            self._model_step = torch.compile(self.lm.step, backend=backend, dynamic=True)
        if self.cuda_graph:
            self._capture_all()

    # ------------------------------------------------------------------ sizes
    @property
    def max_batch(self) -> int:
        return self.state.max_batch

    @property
    def live(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def idle(self) -> bool:
        return not self.queue and self.live == 0

    # ------------------------------------------------------------------ the step
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

    # ------------------------------------------------------------------ requests
    def submit(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               prefix: Prefix | None = None, max_new_tokens: int = 32, temperature: float = 0.0,
               top_k: int | None = None, top_p: float | None = None, eos_token_id=(), tag=None,
               **image_kw) -> Request:
        """Queue one prompt: ``input_ids`` (T,) (or ``inputs_embeds`` (T, D)), no padding; with ``prefix``
        it continues that prefix (T may be 0). ``image_kw``: ``pixel_values`` / ``num_tiles`` /
        ``image_embeds`` of this prompt's images (VL models). Returns the Request; its ``tokens`` fill
        as ``step`` / ``run`` proceed."""
        if input_ids is not None and inputs_embeds is not None:
            raise ValueError("submit: pass input_ids or inputs_embeds, not both")
        if input_ids is not None and input_ids.dim() != 1:
            raise ValueError(f"submit: input_ids must be 1-d (one prompt, no padding), got {tuple(input_ids.shape)}")
        if inputs_embeds is not None and inputs_embeds.dim() != 2:
            raise ValueError(f"submit: inputs_embeds must be (T, hidden), got {tuple(inputs_embeds.shape)}")
        if image_kw and input_ids is None:
            raise ValueError(f"submit: {sorted(image_kw)} need input_ids (the prompt's <image> positions)")
        if image_kw and not hasattr(self.model, "embed_inputs"):
            raise ValueError(f"submit: {type(self.model).__name__} takes no images ({sorted(image_kw)})")
        if max_new_tokens < 1:
            raise ValueError(f"submit: max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature > 0 and not self.sampling:
            raise ValueError("submit: temperature > 0 needs an Engine built with sampling=True")
        eos = (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id or ())
        req = Request(input_ids, inputs_embeds, dict(image_kw), prefix, max_new_tokens, float(temperature),
                      top_k, top_p, frozenset(int(i) for i in eos), tag)
        if req.prompt_len == 0:
            raise ValueError("submit: empty prompt (no tokens and no prefix)")
        if req.prompt_len + max_new_tokens > self.max_len:
            raise ValueError(f"submit: prompt ({req.prompt_len}) + max_new_tokens ({max_new_tokens}) exceed the "
                             f"engine's max_len {self.max_len}")
        self.queue.append(req)
        return req

    def prefix(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               **image_kw) -> Prefix:
        """Prefill a shared prefix (e.g. system prompt + screenshot) once; ``submit(..., prefix=)`` copies
        it into each continuation's row instead of prefilling it again."""
        req = Request(input_ids, inputs_embeds, dict(image_kw), None, 1)
        with torch.inference_mode():
            x = self._embeds(req)[None]
            tmp, logits = self._prefill(x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device), None)
        return Prefix(tmp, logits[0], x.shape[1])

    def cancel(self, req: Request) -> None:
        """Drop a request: out of the queue, or its row freed."""
        if req.row is not None:
            with torch.inference_mode():
                self._free(req)
        elif req in self.queue:
            self.queue.remove(req)
        req.done = True

    def step(self) -> list[tuple[Request, int]]:
        """Decode one token for every live row, then admit queued requests into free rows (prefill; each
        yields its first token). Returns the (request, token) pairs produced, live rows first."""
        with torch.inference_mode():
            out = self._decode()
            out += self._admit()
        return out

    def run(self) -> None:
        """Step until the queue is empty and every row has finished."""
        while not self.idle:
            self.step()

    # ------------------------------------------------------------------ decode
    def _decode(self) -> list[tuple[Request, int]]:
        n = self._compact()
        if n == 0:
            return []
        b = next(s for s in self.batch_sizes if s >= n)
        if self.cuda_graph:
            self.graphs[b].replay()
        else:
            self._step(b)
        toks = self.tokens[:n].tolist()  # the one host sync per step
        out = []
        for r in range(n):
            req = self.rows[r]
            self.lens[r] += 1
            out.append((req, toks[r]))
            self._emit(req, toks[r])
        return out

    def _emit(self, req: Request, tok: int) -> None:
        req.tokens.append(tok)
        if tok in req.eos or len(req.tokens) >= req.max_new_tokens:
            self._free(req)
            req.done = True

    def _free(self, req: Request) -> None:
        r = req.row
        self.rows[r], req.row = None, None
        self.active[r] = 0

    def _compact(self) -> int:
        """Move the highest live rows into the holes below, so that rows [0, n) are the live ones."""
        live = [i for i, q in enumerate(self.rows) if q is not None]
        n = len(live)
        holes = [i for i in range(n) if self.rows[i] is None]
        for dst, src in zip(holes, [i for i in live if i >= n]):
            self.state.move(src, dst, self.lens[src])
            for t in (self.tokens, self.active, self.temperature, self.top_k, self.top_p):
                t[dst] = t[src]
            self.active[src] = 0
            self.rows[dst], self.rows[src] = self.rows[src], None
            self.rows[dst].row = dst
            self.lens[dst] = self.lens[src]
        return n

    # ------------------------------------------------------------------ generate()
    def stream(self, input_ids: torch.Tensor, max_new_tokens: int, *, attention_mask: torch.Tensor | None = None,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
               eos_token_id=(), pad_token_id: int = 0, **prefill_kwargs) -> Iterator[torch.Tensor]:
        """``generate.stream`` on this engine: (B,) new tokens per step, ``pad_token_id`` for finished
        rows, ending early when every row has finished. The engine must be idle; the prompt batch
        is prefilled as one padded group, as the plain path does."""
        if not self.idle:
            raise RuntimeError("Engine.stream: the engine is serving other requests")
        b, t = input_ids.shape
        if b > self.max_batch:
            raise ValueError(f"Engine.stream: batch {b} exceeds max_batch {self.max_batch}")
        with torch.inference_mode():
            if hasattr(self.model, "embed_inputs"):
                x = self.model.embed_inputs(input_ids, **prefill_kwargs)
            elif prefill_kwargs:
                raise ValueError(f"{type(self.model).__name__} takes no {sorted(prefill_kwargs)}")
            else:
                x = self.lm.backbone.embeddings(input_ids)
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        reqs = [self.submit(inputs_embeds=x[i][mask[i]], max_new_tokens=max_new_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, tag=i) for i in range(b)]
        try:
            for _ in range(max_new_tokens):
                out = [pad_token_id] * b
                for req, tok in self.step():
                    out[req.tag] = tok
                yield torch.tensor(out, dtype=torch.long, device=input_ids.device)
                if all(r.done for r in reqs):
                    return
        finally:
            for r in reqs:
                if not r.done:
                    self.cancel(r)

    def __repr__(self) -> str:
        return (f"Engine(max_batch={self.max_batch}, max_len={self.max_len}, sampling={self.sampling}, "
                f"cuda_graph={self.cuda_graph}, batch_sizes={self.batch_sizes}, live={self.live}, "
                f"state={self.state.nbytes() / 2**30:.2f} GiB)")


# ---------------------------------------------------------------------------- one engine per model

_engines: "weakref.WeakKeyDictionary[object, tuple[tuple, Engine]]" = weakref.WeakKeyDictionary()


def _fingerprint(model) -> tuple:
    """Where the weights live: a captured graph reads them by address, so a moved model needs a new engine."""
    return tuple(p.data_ptr() for p in model.parameters()) + (str(next(model.parameters()).device),)


def engine_for(model, batch: int, max_len: int, sampling: bool = False,
               ssm_dtype: torch.dtype = torch.float32) -> Engine:
    """The model's cached engine when it fits (batch, length, sampling, state dtype, weights unmoved), else
    a new one (the old one is released first). ``release(model)`` frees it."""
    fp = _fingerprint(model)
    hit = _engines.get(model)
    if hit is not None:
        key, eng = hit
        if (key == fp and eng.idle and eng.sampling == sampling and eng.ssm_dtype == ssm_dtype
                and eng.max_batch >= batch and eng.max_len >= max_len):
            return eng
        release(model)
    eng = Engine(model, max_batch=batch, max_len=-(-max_len // 256) * 256, sampling=sampling, ssm_dtype=ssm_dtype)
    _engines[model] = (fp, eng)
    return eng


def release(model) -> None:
    """Free the engine (state, graphs) ``generate`` keeps for ``model``."""
    hit = _engines.pop(model, None)
    if hit is not None:
        del hit
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def enabled() -> bool:
    """HOLOTRON_ENGINE=0 turns the automatic CUDA fast path of ``generate`` off."""
    return os.environ.get("HOLOTRON_ENGINE", "1") not in ("0", "", "false", "off")
