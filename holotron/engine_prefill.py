"""How queued turns enter the decode engine (``holotron/engine.py``) and get prefilled.

Admission (``_admit``): each queued request's session gets a row of the ``DecodeState`` (the one it
holds, a free one, or one an idle session gives up by being saved to host memory), its state there (restored
from the host, copied from a ``Prefix``: the rows of one step together, or empty), and its new tokens embedded:
the session's pending token first, then the prompt; the screenshots of every request admitted in one step go
through the vision encoder together (``vision_tiles`` tiles per call).

Prefill (``_prefill_step``): one chunk per engine step, at most ``prefill_tokens`` tokens (pads
included) taken from the prefilling requests in arrival order, several requests side by side
(right-padded), a long prompt over several steps; ``HybridLM.extend`` writes straight into their rows.
A request whose prompt is done gets its first token from the chunk's last logits. With ``overlap`` (CUDA)
the chunk runs on its own stream while the next engine steps decode on the current one: decoding rows
never wait for a chunk (the decode step is bandwidth-bound, a chunk is matmul-bound, and they share the
GPU). A short text-only turn admitted while rows decode skips the chunk: the decode steps read its
prompt one token a step (``step_prompt_max``).

``_prefill`` is the separate path of ``Engine.prefix``: a shared prefix prefilled once into its own
``InferenceState``. ``Admission`` is a base class of ``Engine``, written against its attributes.
"""

from __future__ import annotations

import time

import torch

from .engine_chunks import bucket_down
from .engine_requests import Prefix, Request, Session
from .engine_vision import _NextStep
from .sampling import choose_tokens
from .state import device_ints

__all__ = ["Admission"]


class Admission:
    """``Engine._admit``, ``_prefill_step``, ``_start_decode`` and ``_prefill``."""

    # ------------------------------------------------------------------ a shared prefix
    def _prefill(self, x: torch.Tensor, mask: torch.Tensor, prefix: Prefix | None):
        """Prefill (n, T, D) left-padded embeddings (mask (n, T)) into a new InferenceState in chunks of
        about ``prefill_tokens`` tokens. Returns the state and the last logits (n, V)."""
        n, T, _ = x.shape
        tmp = self.lm.new_state(n, capacity=T, kv_dtype=self.kv_dtype)  # the rows' KV format: copied as it is
        cs = self.lm.config.chunk_size
        chunk = max(cs, (self.prefill_tokens // n) // cs * cs)
        for c0 in range(0, T, chunk):
            c1 = min(T, c0 + chunk)
            logits = self.lm(inputs_embeds=x[:, c0:c1], state=tmp, attention_mask=mask[:, :c1], logits_to_keep=1)
        return tmp, logits[:, -1]

    # ------------------------------------------------------------------ a shared prefix, admission
    def prefix(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
               **image_kw) -> Prefix:
        """Prefill a shared prefix (e.g. system prompt + screenshot) once; ``submit(..., prefix=)`` copies
        it into each continuation's row instead of prefilling it again."""
        if image_kw:
            self._check_images(input_ids, image_kw)
        req = Request(input_ids, inputs_embeds, dict(image_kw), None, 1, session=Session(0))
        with torch.inference_mode():
            self._embed_new([req])
            x = req.x[None]
            tmp, logits = self._prefill(x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device), None)
        return Prefix(tmp, logits[0], x.shape[1], padless=True)

    def _check_images(self, input_ids: torch.Tensor, image_kw: dict) -> None:
        """The number of <image> tokens must match the images given (checked here, before the turn queues)."""
        cfg = self.model.config
        n_tok = int((input_ids == cfg.image_token_id).sum())
        px, emb = image_kw.get("pixel_values"), image_kw.get("image_embeds")
        if px is not None and emb is not None:
            raise ValueError("submit: pass pixel_values or image_embeds, not both")
        if px is None and emb is None:
            raise ValueError("submit: num_tiles needs pixel_values or image_embeds")
        if px is not None:
            if px.dim() != 4:
                raise ValueError(f"submit: pixel_values must be (tiles, 3, H, W), got {tuple(px.shape)}")
            n_img = px.shape[0] * cfg.tokens_per_tile
        else:
            n_img = emb.shape[0] * emb.shape[1] if emb.dim() == 3 else emb.shape[0]
        if n_tok != n_img:
            raise ValueError(f"submit: the prompt has {n_tok} <image> tokens but the images give {n_img} "
                             f"embeddings; build the prompt with the Processor for these images")
        nt = image_kw.get("num_tiles")
        if nt is not None and px is not None and int(torch.as_tensor(nt).sum()) != px.shape[0]:
            raise ValueError(f"submit: num_tiles sums to {int(torch.as_tensor(nt).sum())} but pixel_values holds "
                             f"{px.shape[0]} tiles")

    def _embed_new(self, reqs: list[Request], side: bool = False) -> None:
        """Set ``req.x``: (T, D) embeddings of what each request prefills (the pending token, the prompt);
        screenshots of all of them through the vision encoder in shared batches. ``side`` (admissions, with
        ``vision_stream``): the turns with screenshots are embedded on the vision stream and marked ``ready``
        (holotron/engine_vision.py)."""
        with_px = [r for r in reqs if r.image_kw.get("pixel_values") is not None]
        if not (side and with_px and self.vision_stream):
            return self._embed(reqs)
        mine = set(map(id, with_px))
        self._embed([r for r in reqs if id(r) not in mine])
        with self._on_vision_stream(self._stage(with_px)) as done:  # inputs copied first: no host wait inside
            self._embed(with_px)
        for r in with_px:
            r.ready = done[0] if done[0] is not None else _NextStep(self)  # off CUDA: done from the next step
            if r.x is not None and r.x.is_cuda:  # made on the vision stream, read on this one
                r.x.record_stream(torch.cuda.current_stream(self.device))

    def _embed(self, reqs: list[Request]) -> None:
        emb = self.lm.backbone.embeddings
        images: dict[int, torch.Tensor] = {}
        with_px = [r for r in reqs if r.image_kw.get("pixel_values") is not None]
        if with_px:
            tiles = [r.image_kw["pixel_values"] for r in with_px]
            flat, sizes = [], []
            for t in tiles:
                flat.append(t.to(self.device))
                sizes.append(t.shape[0])
            px = torch.cat(flat)
            # the vision encoder's own seconds (part of the admissions'): on CUDA with phase timing, between two
            # events read at the phase's sync (no extra wait); elsewhere the wall time
            events = self.timing and self.device.type == "cuda"
            if events:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t0 = time.perf_counter()
            feats = torch.cat([self._embed_images(px[i:i + self.vision_tiles])
                               for i in range(0, px.shape[0], self.vision_tiles)])
            if events:
                end.record()
                self._vision_events.append((start, end))
            else:
                self.stats["vision_s"] += time.perf_counter() - t0
            self.stats["vision_tiles"] += px.shape[0]
            self.stats["vision_calls"] += -(-px.shape[0] // self.vision_tiles)
            for r, part in zip(with_px, feats.split(sizes)):
                images[id(r)] = part
        for r in reqs:
            parts = self._staged_parts(r, images.get(id(r)))  # staged for the vision stream (engine_vision.py)
            if parts is not None:
                r.x, r.pos, r.staged = torch.cat(parts), 0, None
                continue
            parts = []
            if r.session.pending is not None:
                parts.append(emb(device_ints([r.session.pending], self.device)))
            if r.inputs_embeds is not None:
                parts.append(r.inputs_embeds.to(self.device))
            elif r.input_ids is not None and r.input_ids.numel():
                ids = r.input_ids.to(self.device)
                if r.image_kw:
                    kw = {k: v for k, v in r.image_kw.items() if k != "pixel_values"}
                    if id(r) in images:
                        kw["image_embeds"] = images[id(r)]
                    parts.append(self.model.embed_inputs(ids[None], **kw)[0])
                else:
                    parts.append(emb(ids))
            r.x = torch.cat(parts) if parts else None
            r.pos = 0
        for r in reqs:  # the images are in r.x now: drop the requests' references to them (an idle session
            # keeps its last request, which would otherwise hold a screenshot on the device)
            r.image_kw = {k: v for k, v in r.image_kw.items() if k == "num_tiles"}

    def _admit(self) -> list[tuple[Request, int]]:
        """Queued requests into rows, in arrival order, while rows can be had and the prefill backlog is
        below ``4 * prefill_tokens``; returns first tokens of those with nothing to prefill."""
        backlog, admitted, waiting = sum(r.x.shape[0] - r.pos for r in self.prefilling), [], []
        rows_left = True  # once no row can be had, only turns whose sessions hold one go on
        loads = []   # the rows that start from one prefix: loaded together (Sessions._load_prefixes)
        try:
            while self.queue:
                req = self.queue.popleft()
                if backlog >= 4 * self.prefill_tokens and (admitted or self.prefilling):
                    waiting.append(req)
                    continue
                s = req.session
                if s.row is None and not (rows_left and self._acquire_row(s, req, loads)):
                    rows_left = False
                    waiting.append(req)
                    continue
                self._set_row_sampling(s.row, req)
                admitted.append(req)
                backlog += req.suffix_len + (s.pending is not None)
        finally:
            self._load_prefixes(loads)
        self.queue.extendleft(reversed(waiting))
        if not admitted:
            return []
        admitted = self._feed_through_steps(admitted)
        if not admitted:
            return []
        good = admitted
        try:
            self._embed_new(good, side=True)
        except (ValueError, RuntimeError):  # find the culprit(s) one by one; the others go on
            good = []
            for req in admitted:
                try:
                    self._embed_new([req], side=True)
                    good.append(req)
                except (ValueError, RuntimeError) as e:
                    self._fail(req, e)
        out, instant = [], []
        for req in good:
            if req.x is None:  # a prefix and nothing more: its logits give the first token
                instant.append(req)
            else:
                req.phase, req.admitted_step = "prefill", self.steps
                self.prefilling.append(req)
        if instant:
            logits = torch.stack([r.prefix.logits for r in instant]).to(self.device)
            out += self._start_decode(instant, logits)
        return out

    def _feed_through_steps(self, reqs: list[Request]) -> list[Request]:
        """Short text-only turns, while other rows decode, read their prompt through the decode steps:
        their row joins the decoding ones with the first prompt token as input, and ``_decode`` feeds the
        rest one per step (the output after the last one is the first new token). Returns the others."""
        if self.step_prompt_max < 1 or not any(self._decoding(i) for i in range(self.max_batch)):
            return reqs
        rest, rows, first = [], [], []
        for req in reqs:
            ids = [] if req.input_ids is None else req.input_ids.tolist()
            s = req.session
            new = ([s.pending] if s.pending is not None else []) + ids
            if req.image_kw or req.inputs_embeds is not None or not new or len(new) > self.step_prompt_max:
                rest.append(req)
                continue
            req.forced, req.fpos, req.phase = new, 1, "decode"
            s.pending = None
            self.stats["forced_tokens"] += len(new)
            rows.append(s.row)
            first.append(new[0])
        if rows:
            idx = device_ints(rows, self.device)
            self.tokens[idx] = device_ints(first, self.device)
            self.active[idx] = 1
        return rest

    def _fail(self, req: Request, e: BaseException) -> None:
        self._forget(req)   # its kept turn (host_limit, holotron/engine_replay.py)
        req.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        req.done, req.phase, req.x = True, "done", None
        req.t_done = time.perf_counter()
        s = req.session
        s.request = None
        if s.temporary:
            self._close(s)

    # ------------------------------------------------------------------ prefill, one chunk per step
    def _prefill_step(self) -> list[tuple[Request, int]]:
        """Finish the chunk in flight (overlap) when it is done, then start the next one. Without overlap
        the chunk runs to its end here. With overlap it runs on ``prefill_stream`` while the next steps
        decode on the current stream: decode steps write nothing of rows that are not decoding, the
        rows' device lengths are set when the chunk is finished, ``Engine._decode`` finishes the chunk
        before it moves one of its rows, ``cancel`` orders its work after the chunk. Off CUDA, overlap
        runs the chunk at once but keeps it "in flight" until the next engine step (``_Ran``): the same
        bookkeeping, testable on a CPU."""
        out = []
        if self.inflight is not None:
            ev = self.inflight[-1]
            if not ev.query() and any(self._decoding(i) for i in range(self.max_batch)):
                return out  # the rows decoding go on meanwhile
            out += self._finish_chunk()
        chunk = self._pick_chunk()
        if chunk is None:
            return out
        take, counts, T, rows, starts = chunk
        if not self.overlap:
            self.inflight = (take, counts, self._chunk(take, counts, T, rows, starts, True), None)
            return out + self._finish_chunk()
        if self.prefill_stream is None:  # off CUDA: run now, finish at the next step
            self.inflight = (take, counts, self._chunk(take, counts, T, rows, starts, False), _Ran())
            return out
        main = torch.cuda.current_stream(self.device)
        self.prefill_stream.wait_stream(main)  # the rows' states and the embeddings are ready
        with torch.cuda.stream(self.prefill_stream):
            logits = self._chunk(take, counts, T, rows, starts, False)
            ev = torch.cuda.Event()
            ev.record()
        self.inflight = (take, counts, logits, ev)
        return out

    def _pick_chunk(self):
        """The next chunk: (requests, counts, T, rows, starts), at most ``prefill_tokens`` tokens (pads included)
        from the prefilling requests in arrival order; None when none is due (``_gathering``)."""
        if not self.prefilling or self._gathering():
            return None
        ready = self._ready(self.prefilling)
        if not ready:
            return None
        budget = self.prefill_tokens
        take, T = [], 0
        for req in ready:
            piece = min(req.x.shape[0] - req.pos, budget)
            t = max(T, piece)
            if take and t * (len(take) + 1) > budget:
                break
            take.append(req)
            T = t
        if self.prefill_graphs or self.mixed:  # as many requests as a bucket of rows holds (the others wait)
            take = take[:bucket_down(len(take), self._rows_b)]
            T = max(min(r.x.shape[0] - r.pos, budget) for r in take)
        counts = [min(r.x.shape[0] - r.pos, T) for r in take]
        return take, counts, T, [r.session.row for r in take], [r.session.length for r in take]

    def _gathering(self) -> bool:
        """Wait for a fuller chunk (``prefill_min_tokens``) while rows decode, at most ``prefill_max_wait`` steps."""
        if self.prefill_min_tokens < 1 or not any(self._decoding(i) for i in range(self.max_batch)):
            return False
        waiting = sum(r.x.shape[0] - r.pos for r in self.prefilling)
        oldest = min(r.admitted_step for r in self.prefilling)
        return waiting < self.prefill_min_tokens and self.steps - oldest < self.prefill_max_wait

    @staticmethod
    def _chunk_input(take, counts, T) -> torch.Tensor:
        """The chunk's embeddings (b, T, D), right-padded."""
        x = take[0].x.new_zeros(len(take), T, take[0].x.shape[-1])
        for i, (r, n) in enumerate(zip(take, counts)):
            x[i, :n] = r.x[r.pos:r.pos + n]
        return x

    def _chunk(self, take, counts, T, rows, starts, advance: bool) -> torch.Tensor:
        if self.prefill_graphs and advance:
            shape = self._graph_shape(len(take), T)
            if shape is not None and shape[0] == len(take):
                return self._chunk_graphed(take, counts, rows, starts, shape)
        return self.lm.extend(self._chunk_input(take, counts, T), self.state, rows, starts, counts, advance=advance)

    def _order_after_chunk(self, rows) -> None:
        """Work queued on the current stream from now on that touches ``rows`` waits for the chunk in flight."""
        if self.inflight is not None and isinstance(self.inflight[-1], torch.cuda.Event):
            mine = {r.session.row for r in self.inflight[0] if r.session is not None}
            if mine & set(rows):
                torch.cuda.current_stream(self.device).wait_event(self.inflight[-1])

    def _finish_chunk(self) -> list[tuple[Request, int]]:
        """Bookkeeping of the chunk just run: positions, lengths (on the device too with overlap), and the
        first token of each turn whose prompt is done."""
        take, counts, logits, ev = self.inflight
        self.inflight = None
        if isinstance(ev, torch.cuda.Event):
            torch.cuda.current_stream(self.device).wait_event(ev)
            logits.record_stream(torch.cuda.current_stream(self.device))
        finished, fin_logits, rows, lengths = [], [], [], []
        for i, (r, n) in enumerate(zip(take, counts)):
            r.session.length += n  # the state consumed them, even for a turn cancelled meanwhile
            if r.session.row is not None:
                rows.append(r.session.row)
                lengths.append(r.session.length)
            if r.done:
                continue
            r.pos += n
            if r.pos == r.x.shape[0]:
                r.session.pending = None
                finished.append(r)
                fin_logits.append(i)
        self.prefill_tokens_done += sum(counts)
        if ev is not None and rows:
            self.state.lengths[device_ints(rows, self.device)] = device_ints(lengths, self.device)
        done = set(map(id, finished)) | {id(r) for r in take if r.done}
        self.prefilling = [r for r in self.prefilling if id(r) not in done]
        if not finished:
            return []
        for r in finished:
            r.x = None
        return self._start_decode(finished, logits[fin_logits])

    def _start_decode(self, reqs: list[Request], logits: torch.Tensor) -> list[tuple[Request, int]]:
        """First tokens from each request's last prompt logits; the rows join the decoding ones."""
        rows = [r.session.row for r in reqs]
        rows_t = device_ints(rows, self.device)
        if self.sampling:
            first = choose_tokens(logits.float(), self.temperature[rows_t], self.top_k[rows_t], self.top_p[rows_t],
                                  self.generator)
        else:
            first = logits.argmax(-1)
        self.tokens[rows_t] = first
        self.active[rows_t] = 1
        out = []
        for req, tok in zip(reqs, first.tolist()):
            req.phase = "decode"
            req.session.pending = None
            out.append((req, tok))
            self._emit(req, tok)
        return out


class _Ran:
    """The "event" of a chunk run at once off CUDA under overlap: not done when first asked (the decode
    steps go on, as they would on a GPU), done after."""

    def __init__(self):
        self.asked = False

    def query(self) -> bool:
        done, self.asked = self.asked, True
        return done

    def synchronize(self) -> None:
        self.asked = True
