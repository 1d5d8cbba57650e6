"""The decode engine: static-shape decode, CUDA graphs, continuous batching and agent sessions.

    eng = Engine(model, max_batch=64, max_len=4096)                  # state preallocated; graphs captured on CUDA
    reqs = [eng.submit(ids, max_new_tokens=64) for ids in prompts]    # 1-d prompts (+ pixel_values=..., num_tiles=...)
    eng.run()                                                         # admit, prefill in chunks, decode until done
    reqs[0].tokens                                                    # the new ids of the first prompt

    s = eng.session()                                                 # an agent's conversation, kept between turns
    eng.submit(turn_ids, session=s, pixel_values=px, max_new_tokens=100); eng.run()
    eng.submit(next_ids, session=s, ...)                              # prefills only the new turn
    screen = eng.prefix(screen_ids, pixel_values=px)                  # a shared screenshot + system prompt, once
    a = eng.submit(task_a_ids, prefix=screen, max_new_tokens=32)      # each continuation starts from a copy of it

One engine step (``step()``): one decode token for every decoding row, then admissions (queued turns
get rows and their new tokens embedded, screenshots batched), then one prefill chunk of at most
``prefill_tokens`` tokens across the prefilling turns, written straight into their rows
(``holotron/engine_prefill.py``). Decoding never waits for more than one chunk. On CUDA every part of a
step replays a CUDA graph: the decode step per batch size, the chunk per (rows, tokens) bucket
(``holotron/engine_chunks.py``), the vision encoder per bucket of tiles (``holotron/engine_vision.py``) and
each exchange of two rows; an eager pass through the 12B model costs 25-65 ms of host time on the H200's
host whatever its size (docs/benchmarks.md, "The engine as graphs").

The decode step, ``_step(b)`` (``holotron/engine_step.py``): ``HybridLM.step`` on the first b rows of
the ``DecodeState`` -> greedy or sampled token, written back as the next step's input; static shapes,
no host sync; rows whose ``active`` is 0 (prefilling, idle sessions, free rows) keep their state. On
CUDA it is captured once per batch size in ``batch_sizes`` and replayed per token; elsewhere, or with
``cuda_graph=False``, it runs eagerly: the same code, which the CPU tests compare with ``generate``.

Rows: every turn runs in a session (``holotron/engine_sessions.py``; a plain ``submit`` opens a temporary
one, closed when its turn ends). A step runs on the smallest captured batch that covers the decoding rows;
they are moved or swapped into rows [0, n) only when that gives a smaller batch: finished rows stop costing
work. Requests, sessions and prefixes are ``holotron/engine_requests.py``'s. ``generate()`` uses this engine
on CUDA (``engine=False`` or HOLOTRON_ENGINE=0 opts out) through ``stream`` (``holotron/engine_generate.py``)
and ``engine_for``.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Iterator

import torch

from .engine_chunks import CapturedChunks
from .engine_generate import stream
from .engine_mixed import MixedSteps
from .engine_prefill import Admission
from .engine_replay import Replays
from .engine_requests import Prefix, Request, Session, default_batch_sizes
from .engine_sessions import Sessions, row_bytes
from .engine_step import CapturedStep
from .engine_vision import CapturedVision
from .kv_cache import kv_dtype_for
from .sampling import choose_tokens
from .state import DecodeState

__all__ = ["Engine", "Request", "Prefix", "Session", "EngineUnsupported", "engine_for", "release", "enabled",
           "choose_tokens", "row_bytes"]

log = logging.getLogger("holotron.engine")

_ALIGN = 64  # max_len is rounded up to this: aligned attention-mask rows for the fused SDPA kernels


class EngineUnsupported(RuntimeError):
    """The engine cannot serve this model / these arguments (``generate`` then takes the plain path)."""


class Engine(Admission, Sessions, Replays, CapturedStep, CapturedChunks, CapturedVision, MixedSteps):
    """Preallocated decode state for ``max_batch`` rows of at most ``max_len`` tokens, one decode step
    captured per batch size (CUDA), a queue of turns, chunked prefill mixed with decoding, sessions,
    prefix snapshots.

    ``sampling``: False for a greedy-only engine (argmax in the step); True adds per-row temperature /
    top-k / top-p to the step (``holotron/sampling.py``: top-k candidates, no sort of the vocabulary)
    and an own ``generator`` on the model's device. ``cuda_graph``: None = on when the model is on CUDA.
    ``prefill_tokens``: the most tokens (pads included) one engine step prefills. ``vision_tiles``: the
    most screenshot tiles per vision-encoder call. ``step_prompt_max``: a text-only turn of at most this
    many new tokens, admitted while other rows decode, is fed through the decode steps (one token a step,
    almost free next to the rows decoding) instead of a prefill chunk; 0 turns this off.
    ``prefill_graphs`` (None: on with ``cuda_graph`` and overlap off): chunks as CUDA graphs
    (``holotron/engine_chunks.py``; on a CPU the same buffers and bucketing, eagerly). ``mixed`` (off by
    default): a chunk and the decoding rows' next tokens in one pass (``HybridLM.mixed``: one read of the
    weights), a CUDA graph per shape (``holotron/engine_mixed.py``); a mixed engine reads no prompt through the
    decode steps unless ``step_prompt_max`` says so (None: 0 when mixed, else 32).
    ``prefill_min_tokens`` (0: off; not measured yet): while rows decode, a chunk starts only once this
    many prompt tokens wait or the oldest has waited ``prefill_max_wait`` steps (fewer, fuller chunks:
    each pays the whole weight read and the launch of every layer). ``overlap``
    (CUDA, off by default: measured slower, see docs/benchmarks.md): a prefill chunk runs on its own
    stream while the decode steps go on (``holotron/engine_prefill.py``). ``offload``: save idle
    sessions to host memory when a turn needs a row and none is free; ``host_limit`` (bytes, None: none): past
    it a session is dropped instead and replayed at its next turn (``holotron/engine_replay.py``). ``timing``:
    wait for the current stream after each phase of a step and add its seconds to ``stats`` (benchmarks; a chunk
    running on its own stream overlaps the decode phase).
    ``vision_stream`` (off by default; +1.5-2% at 100 one-tile agents on an H100, docs/benchmarks.md): admissions'
    screenshots on a stream of their own while the step's pass runs (``holotron/engine_vision.py``); their turns
    prefilled from the next step.
    ``keep_logits``: keep each step's logits in ``self.logits`` (tests). ``zero_state=False`` leaves the
    state uninitialised (benchmarks on synthetic states). ``ssm_dtype``: the Mamba state's dtype (default
    float32; bfloat16 halves the bytes each decode step reads and writes, the step still computes in fp32
    and rounds the stored state once per token). ``kv_dtype``: the attention layers' KV cache, None (the
    model's dtype) or ``torch.float8_e4m3fn``: e4m3 codes with one fp32 scale per (row, KV head, slot), about
    half the bytes of a bf16 cache (holotron/kv_cache.py; every write quantizes, the attention kernels read the
    codes; CUDA needs compute capability 8.9+). ``compile``: ``torch.compile`` the whole
    ``HybridLM.step`` (True, or the name of a torch.compile backend; off by default: the first capture
    then costs the compile); the Mamba kernels stay one opaque op (``mamba_step`` in
    ``holotron/mamba2.py``). A step that cannot be compiled falls back to the eager one, with a warning in
    ``note``.
    """

    def __init__(self, model, max_batch: int, max_len: int, *, sampling: bool = False,
                 cuda_graph: bool | None = None, batch_sizes: list[int] | None = None,
                 prefill_tokens: int = 8192, ssm_dtype: torch.dtype = torch.float32,
                 keep_logits: bool = False, zero_state: bool = True, compile: bool | str = False,
                 vision_tiles: int = 64, offload: bool = True, timing: bool = False,
                 step_prompt_max: int | None = None, overlap: bool = False, prefill_min_tokens: int = 0,
                 prefill_max_wait: int = 8, mixed: bool | None = None, prefill_graphs: bool | None = None,
                 kv_dtype: torch.dtype | None = None, vision_stream: bool = False, host_limit: int | None = None):
        if max_batch < 1 or max_len < 1:
            raise ValueError(f"Engine: max_batch and max_len must be >= 1, got {max_batch}, {max_len}")
        if prefill_tokens < 1 or vision_tiles < 1:
            raise ValueError(f"Engine: prefill_tokens and vision_tiles must be >= 1, got {prefill_tokens}, "
                             f"{vision_tiles}")
        self.model = model
        self.lm = getattr(model, "language_model", model)
        if not hasattr(self.lm, "backbone") or not hasattr(self.lm, "lm_head"):
            raise EngineUnsupported(f"Engine: {type(model).__name__} is neither a HybridLM nor a model with one "
                                    "as .language_model")
        self.device = self.lm.device
        self.kv_dtype = kv_dtype_for(kv_dtype, self.device, self.lm.dtype)  # None: the model's dtype
        self.vocab = self.lm.config.vocab_size
        self.max_len = -(-max_len // _ALIGN) * _ALIGN
        self.sampling = bool(sampling)
        self.ssm_dtype = ssm_dtype
        self.prefill_tokens = prefill_tokens
        self.vision_tiles = vision_tiles
        self.step_prompt_max = (0 if mixed else 32) if step_prompt_max is None else step_prompt_max
        self.prefill_min_tokens, self.prefill_max_wait = prefill_min_tokens, prefill_max_wait
        self.offload = offload
        self.timing = timing
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
        self.overlap = bool(overlap)
        if mixed and self.overlap:
            raise ValueError("Engine: mixed=True and overlap=True exclude each other (a mixed pass runs the chunk "
                             "and the decode rows together; overlap runs the chunk on its own stream)")
        self.mixed = bool(mixed)
        if prefill_graphs and self.overlap:
            raise ValueError("Engine: prefill_graphs=True and overlap=True exclude each other (a graph's chunk runs "
                             "on the current stream)")
        self.prefill_graphs = (self.cuda_graph and not self.overlap) if prefill_graphs is None else bool(prefill_graphs)
        self.prefill_stream = torch.cuda.Stream(self.device) if self.overlap and self.device.type == "cuda" else None
        self.inflight = None  # the prefill chunk running: (requests, counts, logits, event or None)
        self.vision_stream = bool(vision_stream)   # holotron/engine_vision.py
        self._vstream = torch.cuda.Stream(self.device) if vision_stream and self.device.type == "cuda" else None

        dev, R = self.device, max_batch
        with torch.inference_mode():
            self.state = DecodeState.allocate(self.lm, R, self.max_len, ssm_dtype, zero=zero_state,
                                              kv_dtype=self.kv_dtype)
            self.tokens = torch.zeros(R, dtype=torch.long, device=dev)       # each row's next input token
            self.active = torch.zeros(R, dtype=torch.long, device=dev)       # 1 on decoding rows
            self.temperature = torch.zeros(R, dtype=torch.float32, device=dev)
            self.top_k = torch.full((R,), self.vocab, dtype=torch.long, device=dev)
            self.top_p = torch.full((R,), 2.0, dtype=torch.float32, device=dev)
            self.logits = torch.zeros(R, self.vocab, dtype=torch.float32, device=dev) if keep_logits else None
        self.generator = torch.Generator(device=dev) if self.sampling else None
        self._rows = {b: self.state.rows(b) for b in self.batch_sizes}
        self._init_sessions(host_limit)   # rows, sessions, prefix loads; host_limit (holotron/engine_replay.py)
        self.queue: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.steps = 0
        self.reset_stats()
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
            self._capture_swap()
        self.vision_graphs, self._vision_seen, self._vx, self._vout = {}, {}, None, {}  # holotron/engine_vision.py
        self._vcap = None   # the vision graphs' capture stream (holotron/engine_vision.py)
        self.chunk_graphs, self._chunk_seen = {}, {}                                   # holotron/engine_chunks.py
        self.mixed_graphs, self._mixed_seen = {}, {}                                   # holotron/engine_mixed.py
        if self.prefill_graphs or self.mixed:   # the static chunk buffers both run on
            self._init_chunk_graphs()

    # ------------------------------------------------------------------ sizes
    @property
    def max_batch(self) -> int:
        return self.state.max_batch

    @property
    def live(self) -> int:
        """Rows serving a turn (prefilling or decoding)."""
        return sum(q is not None and q.busy for q in self.rows)

    @property
    def idle(self) -> bool:
        """Nothing queued, prefilling or decoding (idle sessions may still hold rows)."""
        return not self.queue and self.live == 0

    # ------------------------------------------------------------------ requests
    def submit(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               prefix: Prefix | None = None, session: Session | None = None, max_new_tokens: int = 32,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, eos_token_id=(),
               tag=None, **image_kw) -> Request:
        """Queue one turn: ``input_ids`` (T,) (or ``inputs_embeds`` (T, D)), no padding. ``session``: continue
        that conversation (its last generated token and then these T tokens are prefilled; T may be 0);
        without it the turn runs in a temporary session, closed when it ends. ``prefix``: start from that
        shared prefix (T may be 0). ``image_kw``: ``pixel_values`` / ``num_tiles`` / ``image_embeds`` of
        this turn's images (VL models). Returns the Request; its ``tokens`` fill as ``step`` / ``run`` go."""
        if input_ids is not None and inputs_embeds is not None:
            raise ValueError("submit: pass input_ids or inputs_embeds, not both")
        if input_ids is not None and not isinstance(input_ids, torch.Tensor):
            input_ids = torch.as_tensor(list(input_ids), dtype=torch.long)  # a list of ids
        if input_ids is not None and input_ids.dim() != 1:
            raise ValueError(f"submit: input_ids must be 1-d (one prompt, no padding), got {tuple(input_ids.shape)}")
        width = self.lm.config.hidden_size
        if inputs_embeds is not None and (inputs_embeds.dim() != 2 or inputs_embeds.shape[1] != width):
            raise ValueError(f"submit: inputs_embeds must be (T, {width}), got "
                             f"{tuple(inputs_embeds.shape)}")
        if image_kw and input_ids is None:
            raise ValueError(f"submit: {sorted(image_kw)} need input_ids (the prompt's <image> positions)")
        if image_kw and not hasattr(self.model, "embed_inputs"):
            raise ValueError(f"submit: {type(self.model).__name__} takes no images ({sorted(image_kw)})")
        unknown = set(image_kw) - {"pixel_values", "num_tiles", "image_embeds"}
        if unknown:
            raise ValueError(f"submit: unknown arguments {sorted(unknown)}")
        if max_new_tokens < 1:
            raise ValueError(f"submit: max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature > 0 and not self.sampling:
            raise ValueError("submit: temperature > 0 needs an Engine built with sampling=True")
        if session is not None:
            self._check_open(session, "submit")
            if session.busy:
                raise ValueError(f"submit: session {session.id} has a turn in flight; wait for it (or cancel it)")
            if prefix is not None and session.history:
                raise ValueError(f"submit: prefix= starts a conversation, session {session.id} already holds "
                                 f"{session.history} tokens")
        if image_kw:
            self._check_images(input_ids, image_kw)
        eos = (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id or ())
        req = Request(input_ids, inputs_embeds, dict(image_kw), prefix, max_new_tokens, float(temperature),
                      top_k, top_p, frozenset(int(i) for i in eos), tag)
        past = session.history if session is not None else 0
        if req.prompt_len + past == 0:
            raise ValueError("submit: empty prompt (no tokens, no prefix and no conversation to continue)")
        if past + req.prompt_len + max_new_tokens > self.max_len:
            held = f"session {session.id} holds {past} tokens; " if session is not None else ""
            raise ValueError(f"submit: {held}prompt ({req.prompt_len}) + max_new_tokens ({max_new_tokens}) exceed "
                             f"the engine's max_len {self.max_len}")
        if session is None:
            session = self.session()
            session.temporary = True
        self._remember(session, req)   # its turn, kept for a replay (host_limit)
        req.session, session.request = session, req
        session.last_used = self.steps
        self.queue.append(req)
        return req

    @torch.inference_mode()
    def cancel(self, req: Request) -> None:
        """Drop a turn: out of the queue, the prefill, or the decoding rows. Its session keeps what its
        state consumed so far (a temporary session is closed)."""
        if req.done:
            return
        self._forget(req)
        if req in self.queue:
            self.queue.remove(req)
        if req in self.prefilling:
            if req.session is not None and req.session.row is not None:
                self._order_after_chunk([req.session.row])
            self.prefilling.remove(req)
            req.x = None
        s = req.session
        if s is not None and s.row is not None:
            self.active[s.row] = 0
        self._finish(req)

    def step(self) -> list[tuple[Request, int]]:
        """Decode one token for every decoding row, admit queued turns into rows, prefill one chunk (a turn
        whose prompt completes yields its first token). Returns the (request, token) pairs produced."""
        if self.mixed:
            return self._step_mixed()
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self._decode()
            t1 = time.perf_counter()
            out += self._admit()
            self._sync()
            t2 = time.perf_counter()
            out += self._prefill_step()
            self._sync()
            t3 = time.perf_counter()
        st = self.stats
        st["decode_s"] += t1 - t0
        st["admit_s"] += t2 - t1
        st["prefill_s"] += t3 - t2
        self.steps += 1
        return out

    def reset_stats(self) -> None:
        """Zero the step counters and phase seconds in ``stats`` (benchmarks, after a warm-up)."""
        self.stats = {"decode_steps": 0, "decode_tokens": 0, "forced_tokens": 0, "mixed_steps": 0, "mixed_tokens": 0,
                      "chunk_captures": 0, "mixed_captures": 0, "capture_s": 0.0, "decode_s": 0.0,
                      "prefill_s": 0.0, "admit_s": 0.0, "mixed_s": 0.0, "vision_s": 0.0, "vision_tiles": 0,
                      "vision_calls": 0, "chunk_tokens": 0, "chunk_slots": 0,   # slots: a bucketed chunk's pads too
                      "sessions_dropped": 0, "replayed_turns": 0, "replayed_tokens": 0, "row_moves": 0}
        self.prefill_tokens_done = 0
        self._vision_events = []  # (start, end) CUDA events of vision calls, summed into vision_s at a sync

    def _sync(self) -> None:
        if self.timing and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
            left = []   # on the vision stream (``vision_stream``) a call may still run: read at a later sync
            for start, end in self._vision_events:
                if end.query():
                    self.stats["vision_s"] += start.elapsed_time(end) / 1e3
                else:
                    left.append((start, end))
            self._vision_events = left

    def run(self) -> None:
        """Step until the queue is empty and every turn has finished."""
        while not self.idle:
            self.step()
            self._check_progress()

    def stream(self, input_ids: torch.Tensor, max_new_tokens: int, **kwargs) -> Iterator[torch.Tensor]:
        """``generate.stream`` on this engine (``holotron/engine_generate.py``): (B,) new tokens per step."""
        return stream(self, input_ids, max_new_tokens, **kwargs)

    def __repr__(self) -> str:
        return (f"Engine(max_batch={self.max_batch}, max_len={self.max_len}, sampling={self.sampling}, "
                f"cuda_graph={self.cuda_graph}, batch_sizes={self.batch_sizes}, live={self.live}, "
                f"kv_dtype={self.kv_dtype}, state={self.state.nbytes() / 2**30:.2f} GiB)")


# ---------------------------------------------------------------------------- one engine per model

_engines: "weakref.WeakKeyDictionary[object, tuple[tuple, Engine]]" = weakref.WeakKeyDictionary()


def _fingerprint(model) -> tuple:
    """Where the weights live: a captured graph reads them by address, so a moved model needs a new engine."""
    return tuple(p.data_ptr() for p in model.parameters()) + (str(next(model.parameters()).device),)


def engine_for(model, batch: int, max_len: int, sampling: bool = False,
               ssm_dtype: torch.dtype = torch.float32, kv_dtype: torch.dtype | None = None) -> Engine:
    """The model's cached engine when it fits (batch, length, sampling, state and KV dtypes, weights unmoved),
    else a new one (the old one is released first). ``release(model)`` frees it."""
    fp = _fingerprint(model)
    hit = _engines.get(model)
    if hit is not None:
        key, eng = hit
        if (key == fp and eng.idle and eng.sampling == sampling and eng.ssm_dtype == ssm_dtype
                and eng.kv_dtype == kv_dtype_for(kv_dtype, eng.device, eng.lm.dtype)
                and eng.max_batch >= batch and eng.max_len >= max_len):
            return eng
        release(model)
    eng = Engine(model, max_batch=batch, max_len=-(-max_len // 256) * 256, sampling=sampling, ssm_dtype=ssm_dtype,
                 kv_dtype=kv_dtype)
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
