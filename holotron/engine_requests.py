"""What the decode engine (``holotron/engine.py``) serves: requests and shared prefixes.

``Request``: one prompt (ids or embeddings, no padding), its sampling settings and the tokens so far.
``Prefix``: the state after a shared prompt prefix, which ``Engine.submit(..., prefix=)`` copies into each
continuation's row. ``default_batch_sizes``: the batch sizes a step is captured for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .state import InferenceState

__all__ = ["Prefix", "Request", "default_batch_sizes"]


@dataclass(eq=False)
class Prefix:
    """The state after a shared prompt prefix (batch 1, no pads) and the logits at its last position."""

    state: InferenceState
    logits: torch.Tensor  # (V,) fp32
    length: int

    def nbytes(self) -> int:
        return self.state.nbytes()["total"]


@dataclass(eq=False)
class Request:
    """One sequence: its prompt (ids or embeddings, no padding), sampling settings, and the tokens so far."""

    input_ids: torch.Tensor | None        # (T,)
    inputs_embeds: torch.Tensor | None    # (T, D)
    image_kw: dict
    prefix: Prefix | None
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    eos: frozenset = frozenset()
    tag: object = None                    # caller's label (generate() puts the batch row here)
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    row: int | None = None

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
