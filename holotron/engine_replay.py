"""Sessions dropped for host memory and replayed (``Engine(host_limit=)``, holotron/engine.py).

Without a limit, a session evicted from its row is saved to host memory (``Sessions.save``,
holotron/engine_sessions.py), however many there are. With ``host_limit`` (bytes) an eviction that would take the
host memory held past it drops the session's state instead: its turns are kept (ids, screenshots on the host,
tokens: ``Turn``, holotron/engine_requests.py) and its next turn prefills the whole conversation again before its
own tokens, as serving engines do when they preempt by recomputing. The memory held is, for a CUDA engine, every
pinned host byte of the process as torch's pinned allocator counts it (``torch.cuda.host_memory_stats``): the
snapshots' pages and the free pages kept for the next ones (holotron/state_snapshot.py), the kept turns, and the
freed blocks the allocator caches for reuse. Before a session is dropped the free pages and the cached blocks are
given back (``free_cached_pinned``) and the memory measured again. For a CPU engine
it is the snapshots' bytes and the kept turns' (each tensor once).

A session one of whose turns cannot be replayed (given as embeddings, or cancelled part-way through its prompt)
is saved even past the limit, as is one given to ``save`` or made by ``fork`` (the limit bounds the engine's own
evictions). ``Replays`` is a base class of ``Engine``, written against its attributes and ``Sessions``' methods.
"""

from __future__ import annotations

import weakref

import torch

from .engine_requests import Request, Session, Turn
from .state_snapshot import free_cached_pinned, paged_bytes, pinned_held, pooled_bytes

__all__ = ["Replays"]


class Replays:
    """Turns kept for replays, the host limit's evictions, and the replays themselves (mixed into ``Engine``)."""

    def _evict(self) -> bool:
        """Free a row: save the least recently used idle session to host memory, or drop it past ``host_limit``;
        False when every row is busy."""
        idle = [q for q in self.rows if q is not None and not q.busy]
        if not idle:
            return False
        q = min(idle, key=lambda q: q.last_used)
        if self.host_limit is not None and q.turns is not None:
            need = self.state.bytes_per_row(q.length)["total"]
            if self.device.type == "cuda":
                need = paged_bytes(need)
            # free pages are taken before new memory is pinned: only what they do not cover adds to the memory held
            over = self._host_held() + max(0, need - pooled_bytes()) > self.host_limit
            if over:
                # free pages and freed blocks torch caches until given back; torch counts a freed block as in use
                # until it next looks at it, so this is not asked first (nothing cached: cheap)
                free_cached_pinned()
                over = self._host_held() + need > self.host_limit
            if over:
                self._release(q.row)   # dropped: its next turn replays its turns (_replay_into)
                q.dropped = True
                self.stats["sessions_dropped"] += 1
                return True
        self.save(q)
        return True

    def _host_held(self) -> int:
        """Host bytes held against ``host_limit``: of a CUDA engine, every pinned byte of the process as torch's
        pinned allocator counts it (snapshots, kept turns, the pool and freed blocks it caches); else the
        snapshots' bytes and the kept turns'."""
        held = pinned_held() if self.device.type == "cuda" else None
        if held is not None:
            return held
        return pooled_bytes() + sum(x.snapshot.host_bytes() for x in self.sessions.values()
                                    if x.snapshot is not None) + self._turns_bytes()

    def _turns_bytes(self) -> int:
        """Host bytes of the turns kept for replays, each tensor counted once (turns share screenshots)."""
        seen: dict[int, int] = {}
        for s in self.sessions.values():
            for t in s.turns or ():
                for x in (t.ids, t.pixel_values):
                    if x is not None:
                        st = x.untyped_storage()
                        seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())

    # ------------------------------------------------------------------ turns kept for a replay (host_limit)
    def _init_replays(self, host_limit: int | None) -> None:
        if host_limit is not None and (isinstance(host_limit, bool) or not isinstance(host_limit, int)
                                       or host_limit < 0):
            raise ValueError(f"Engine: host_limit must be None or bytes >= 0 (an int), got {host_limit!r}")
        if host_limit is not None and not self.offload:
            raise ValueError("Engine: host_limit bounds the sessions saved to host memory, which offload=False "
                             "turns off; pass offload=True or no host_limit")
        self.host_limit = host_limit
        self._host_copies: dict[int, tuple] = {}   # id(device tensor) -> (weakref, version, host copy, event)

    def _remember(self, s: Session, req: Request) -> None:
        """Keep what ``req`` reads (and, as it decodes, writes) for a later replay of ``s``."""
        if s.temporary:
            s.turns = None
        if s.turns is None:
            return
        if req.inputs_embeds is not None or "image_embeds" in req.image_kw:
            if s.dropped:
                raise ValueError(f"submit: session {s.id} was dropped for host memory and is replayed from its "
                                 "turns' ids and screenshots; pass input_ids and pixel_values, not embeddings")
            s.turns = None   # embeddings given by the caller are not kept: this session is saved, not dropped
            return
        if req.prefix is not None:
            s.prefix = req.prefix
        px = req.image_kw.get("pixel_values")
        nt = req.image_kw.get("num_tiles")
        ids, ev_ids = (self._host_copy(req.input_ids) if req.input_ids is not None
                       else (torch.zeros(0, dtype=torch.long), None))
        px, ev_px = (None, None) if px is None else self._host_copy(px)
        s.turns.append(Turn(ids, px, None if nt is None else torch.as_tensor(nt).reshape(-1).tolist(), req.tokens,
                            [e for e in (ev_ids, ev_px) if e is not None]))

    def _host_copy(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """``t`` on the host, and the event after which it may be read there (None: at once): itself when it is
        there, else a copy into pinned memory queued on the current stream (no wait for the device). One copy per
        device tensor while it lives and is not written to (the same screenshot sent by many turns is kept
        once)."""
        if t.device.type != "cuda":
            return (t if t.device.type == "cpu" else t.cpu()), None
        key = id(t)
        hit = self._host_copies.get(key)
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2], hit[3]
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._host_copies[key] = (weakref.ref(t, lambda _, k=key: self._host_copies.pop(k, None)), t._version,
                                  out, ev)
        return out, ev

    def _forget(self, req: Request) -> None:
        """``req`` ends unserved (cancelled, or failed before its prefill): its kept turn goes. Not admitted yet:
        it never happened (a replay begun for it is undone: the session is dropped again, its row freed). Part
        of its prompt prefilled: the session cannot be replayed any more. Decoding: the turn stays as it is
        (the state consumed its prompt and its tokens but the last, which is the pending one)."""
        s = req.session
        if s is None or not s.turns or s.turns[-1].tokens is not req.tokens:
            return
        if req.phase == "queued" or req.replay_of is not None and (req.phase == "prefill" or req.forced):
            s.turns.pop()
            if req.replay_of is not None:
                s.length, s.pending = req.replay_of
                s.dropped, req.replay_of = True, None
                if s.row is not None:
                    self._release(s.row)
        elif req.phase == "prefill" or req.forced and req.fpos < len(req.forced):
            s.turns = None

    def _replay_into(self, s: Session, req: Request) -> None:
        """``req`` (the turn of dropped session ``s``) made to prefill the conversation so far first: the
        earlier turns' prompts and tokens (the last of them the pending token), their screenshots, then its own;
        ``s`` starts from its prefix or empty again."""
        past = s.turns[:-1]   # the last one is req's own (_remember at submit)
        for x in s.turns:     # their copies to the host are done before the host reads them
            for ev in x.ready:
                ev.synchronize()
        ids = [t for x in past for t in (x.ids, torch.tensor(x.tokens, dtype=torch.long))]
        shots = [x for x in past if x.pixel_values is not None]
        own = s.turns[-1]
        if own.pixel_values is not None:
            shots.append(own)
        n_past = sum(t.numel() for t in ids)
        req.input_ids = torch.cat(ids + [own.ids])
        if shots:
            kw = {"pixel_values": torch.cat([x.pixel_values for x in shots])}
            if all(x.num_tiles is not None for x in shots):
                kw["num_tiles"] = [n for x in shots for n in x.num_tiles]
            req.image_kw = kw
        req.prefix = s.prefix
        req.replay_of = (s.length, s.pending)
        s.length, s.pending, s.dropped = 0, None, False
        self.stats["replayed_turns"] += 1
        self.stats["replayed_tokens"] += n_past
