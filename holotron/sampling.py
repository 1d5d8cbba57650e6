"""The one token chooser of generation (``holotron/generation.py``'s loop and the decode engine's step,
``holotron/engine.py``): greedy, or a draw from softmax(logits / temperature) restricted by top-k and top-p.

    tok = choose_tokens(logits, temperature, top_k, top_p, generator)   # per-row tensors, no host sync
    tok = sample(logits, temperature=0.7, top_p=0.9, generator=g)        # one setting for every row

No sort of the vocabulary: the draw is Gumbel-max, argmax(logits / t - log E) with E ~ Exp(1) i.i.d.
per token (a sample from the softmax). With top-k / top-p the candidates are the ``torch.topk`` of the
row (at most ``candidates``, default ``TOP_CANDIDATES``), already in order, so top-p is a cumulative sum
over them with probabilities normalised over the whole vocabulary; the same noise, gathered at the
candidates, picks among those kept. A top-p nucleus larger than the candidates is cut at them, and a
top_k above ``candidates`` counts as ``candidates`` (in ``choose_tokens``; ``sample`` takes top_k as given).
"""

from __future__ import annotations

import torch

__all__ = ["choose_tokens", "sample", "TOP_CANDIDATES"]

TOP_CANDIDATES = 1024


def choose_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  generator: torch.Generator | None, candidates: int = TOP_CANDIDATES) -> torch.Tensor:
    """Per row, with tensors only (static shapes, CUDA-graph safe): logits (B, V); temperature (B,) (0 =
    greedy); top_k (B,) int (>= V = off); top_p (B,) (>= 1 = off). Returns (B,) int64."""
    logits = logits.float()
    greedy = logits.argmax(-1)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).to(logits.dtype)
    scaled = logits / t[:, None]
    noise = -torch.empty_like(scaled).exponential_(generator=generator).log()   # Gumbel(0, 1)
    free = (scaled + noise).argmax(-1)                                           # unrestricted draw
    k = min(candidates, scaled.shape[-1])
    vals, idx = scaled.topk(k, dim=-1)                                           # (B, k), largest first
    p = (vals - scaled.logsumexp(-1, keepdim=True)).exp()
    rank = torch.arange(k, device=logits.device)
    top_p = torch.where(top_p >= 1, torch.full_like(top_p, float("inf")), top_p).to(p.dtype)
    drop = (rank[None, :] >= top_k[:, None]) | (p.cumsum(-1) - p >= top_p[:, None])  # the first always stays
    pick = (vals + noise.gather(1, idx)).masked_fill(drop, float("-inf")).argmax(-1, keepdim=True)
    kept = idx.gather(1, pick)[:, 0]
    restricted = (top_k < scaled.shape[-1]) | (top_p < 1)
    tok = torch.where(restricted, kept, free)
    return torch.where(temperature > 0, tok, greedy)


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V): argmax when ``temperature`` is 0, else a draw from
    softmax(logits / temperature) restricted to the ``top_k`` largest and to the smallest set whose
    probability reaches ``top_p``."""
    if temperature == 0:
        return logits.argmax(-1)
    b, v = logits.shape
    full = lambda x, dt: torch.full((b,), x, dtype=dt, device=logits.device)  # noqa: E731
    return choose_tokens(logits, full(float(temperature), torch.float32),
                         full(v if top_k is None else top_k, torch.long),
                         full(2.0 if top_p is None else float(top_p), torch.float32), generator,
                         candidates=top_k if top_k is not None and top_p is None else TOP_CANDIDATES)
