"""What the decode engine (``holotron/engine.py``) serves: requests, sessions and shared prefixes.

``Request``: one turn: its new prompt (ids or embeddings, no padding), sampling settings, the tokens so
far, its phase (queued -> prefill -> decode -> done) and host timestamps (submitted, first token, done).
``Session``: a conversation whose state the engine keeps between turns (a row of the decode state, or a
snapshot in host memory): turn k+1 prefills only its own new tokens. ``Prefix``: the state after a shared
prompt prefix, which ``Engine.submit(..., prefix=)`` copies into each continuation's row.
``default_batch_sizes``: the batch sizes a step is captured for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .state import InferenceState, RowSnapshot

__all__ = ["Prefix", "Request", "Session", "Turn", "default_batch_sizes"]


@dataclass(eq=False)
class Prefix:
    """The state after a shared prompt prefix (batch 1) and the logits at its last position. ``padless``: its state
    holds no pads (``Engine.prefix`` makes it so), which lets a row load it without reading the device."""

    state: InferenceState
    logits: torch.Tensor  # (V,) fp32
    length: int
    padless: bool = False

    def nbytes(self) -> int:
        return self.state.nbytes()["total"]


@dataclass(eq=False)
class Turn:
    """What a session's turn read and wrote, kept (``Engine(host_limit=)``) so that a session dropped for host
    memory can prefill its conversation again: the prompt's ids, its screenshots (on the host) and tiles per
    image (None: not given), the turn's tokens (the request's own list, filled as it decodes), and the events
    after which the host copies of device tensors may be read (copied without a wait)."""

    ids: torch.Tensor
    pixel_values: torch.Tensor | None
    num_tiles: list[int] | None
    tokens: list[int]
    ready: list = field(default_factory=list)


@dataclass(eq=False)
class Session:
    """A conversation kept by one engine between turns (``Engine.session()``).

    Its state (Mamba states, the KV of every token so far) lives in a row of the engine's decode state
    (``row``) or, after ``Engine.save`` or when its row was needed by another, in host memory
    (``snapshot``). ``length``: the tokens its state holds. ``pending``: the last generated token, which
    the state has not consumed yet: the next turn starts with it, then its own new tokens. ``turns``: with
    ``Engine(host_limit=)``, what each turn read and wrote (None: not kept, or a turn that cannot be replayed);
    ``dropped``: its state was given up for host memory and its next turn prefills ``turns`` again first.
    """

    id: int
    row: int | None = None
    length: int = 0
    pending: int | None = None
    snapshot: RowSnapshot | None = None
    request: "Request | None" = None
    closed: bool = False
    temporary: bool = False  # opened by a submit() without session=: closed when its request ends
    last_used: int = 0       # the engine step of its last activity (the least recent is saved first)
    turns: list[Turn] | None = None
    prefix: Prefix | None = None   # the shared prefix its first turn started from (replayed with ``turns``)
    dropped: bool = False

    @property
    def busy(self) -> bool:
        """A turn is queued or running."""
        return self.request is not None and not self.request.done

    @property
    def on_host(self) -> bool:
        return self.snapshot is not None

    @property
    def history(self) -> int:
        """Tokens of the conversation so far (the state's plus the pending one)."""
        return self.length + (self.pending is not None)

    def __repr__(self) -> str:
        where = (f"row {self.row}" if self.row is not None else "host" if self.on_host
                 else "dropped" if self.dropped else "empty")
        return f"Session(id={self.id}, length={self.length}, {where}{', closed' if self.closed else ''})"


@dataclass(eq=False)
class Request:
    """One turn: its new prompt (ids or embeddings, no padding), sampling settings, and the tokens so far."""

    input_ids: torch.Tensor | None        # (T,); a replayed turn (replay_of): the conversation, then them
    inputs_embeds: torch.Tensor | None    # (T, D)
    image_kw: dict
    prefix: Prefix | None
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    eos: frozenset = frozenset()
    tag: object = None                    # caller's label (generate() puts the batch row here)
    session: Session | None = None
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    error: str | None = None              # why the engine dropped it (the others keep being served)
    phase: str = "queued"                 # queued | prefill | decode | done
    t_submit: float = field(default_factory=time.perf_counter)
    t_first: float | None = None          # host time of the first new token
    t_done: float | None = None
    x: torch.Tensor | None = None         # (T, D) embeddings to prefill (while in the prefill phase)
    pos: int = 0                          # how many of them are prefilled
    admitted_step: int = 0                # the engine step it entered the prefill at
    forced: list[int] | None = None       # a short prompt fed through decode steps instead (its ids)
    fpos: int = 0                         # how many of them the decode steps have been given
    ready: object = None                  # the event of embeddings made on the vision stream, until taken
    staged: dict | None = None            # its inputs on the device for the vision stream (engine_vision._stage)
    replay_of: tuple | None = None        # (length, pending) of its dropped session, replayed first (host_limit)

    @property
    def row(self) -> int | None:
        return self.session.row if self.session is not None and not self.done else None

    @property
    def suffix_len(self) -> int:
        x = self.inputs_embeds if self.inputs_embeds is not None else self.input_ids
        return 0 if x is None else x.shape[0]

    @property
    def prompt_len(self) -> int:
        return (self.prefix.length if self.prefix is not None else 0) + self.suffix_len


def default_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 16 up to 64, of 32 up to 256, of 64 beyond; max_batch included."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b = b * 2 if b < 16 else b + (16 if b < 64 else 32 if b < 256 else 64)
    return sorted(set(sizes + [max_batch]))
