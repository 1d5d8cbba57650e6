"""What the decode engine (``holotron/engine.py``) serves: requests, shared prefixes, and the per-row
token choice of its step.

``Request``: one prompt (ids or embeddings, no padding), its sampling settings and the tokens so far.
``Prefix``: the state after a shared prompt prefix, which ``Engine.submit(..., prefix=)`` copies into each
continuation's row. ``choose_tokens``: greedy or sampled tokens per row with tensors only (no host sync),
so it can run inside a captured CUDA graph. ``default_batch_sizes``: the batch sizes a step is captured for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .state import InferenceState

__all__ = ["Prefix", "Request", "default_batch_sizes", "choose_tokens"]


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


def choose_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Per-row sampling with tensors only (no host sync): logits (B, V) fp32; temperature (B,) (0 =
    greedy), top_k (B,) int (V = off), top_p (B,) (> 1 = off). The same filters as ``generate.sample``;
    the draw is argmax(p / E) with E ~ Exp(1) i.i.d., a sample from p."""
    greedy = logits.argmax(-1)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    srt, idx = (logits / t[:, None]).sort(-1, descending=True)          # (B, V)
    p = srt.softmax(-1)
    rank = torch.arange(srt.shape[-1], device=srt.device)
    drop = (rank[None, :] >= top_k[:, None]) | (p.cumsum(-1) - p >= top_p[:, None])  # the first always stays
    p = srt.masked_fill(drop, float("-inf")).softmax(-1)
    e = torch.empty_like(p).exponential_(generator=generator)
    tok = idx.gather(1, (p / e).argmax(-1, keepdim=True))[:, 0]
    return torch.where(temperature > 0, tok, greedy)
