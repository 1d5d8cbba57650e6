"""The pointer: from the position that answers a question, put the probability on the image tokens of the
question's element, either through the training-only pointer head (``pointer_loss``) or on the last attention
layer's own heads at every answer position (``attention_pointer_loss``, ``--pointer-heads``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .heads import AuxHeads

__all__ = ["pointer_loss", "answer_spans", "attention_scores", "attention_pointer_loss"]


def pointer_loss(aux: AuxHeads, h: torch.Tensor, is_img: torch.Tensor, queries: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The pointer's loss: for each question, a softmax over its row's image tokens of
    ptr_q(h at the question's answering position) . ptr_k(h at the token) / sqrt(dim), and minus the log of
    the probability it puts on the tokens of the question's element; mean over questions. Also the share of
    questions whose best-scored token is on their element. h: (B, T, D) residual stream; is_img (B, T)."""
    dtype = aux.ptr_q.weight.dtype
    qv = aux.ptr_q(h[queries[:, 0], queries[:, 1]].to(dtype)).float()          # (Q, dim)
    losses, hits = [], 0
    for b in torch.unique(queries[:, 0]).tolist():
        qi = (queries[:, 0] == b).nonzero().squeeze(1)                            # this row's questions
        kv = aux.ptr_k(h[b][is_img[b]].to(dtype)).float()                         # (n_img, dim)
        scores = qv[qi] @ kv.T / math.sqrt(kv.shape[1])                           # (q_b, n_img)
        on = torch.zeros_like(scores, dtype=torch.bool)
        sel = torch.isin(targets[:, 0], qi)
        local = torch.searchsorted(qi, targets[sel, 0])                           # question -> row of scores
        on[local, targets[sel, 1]] = True
        losses.append(torch.logsumexp(scores, 1) - torch.logsumexp(scores.masked_fill(~on, float("-inf")), 1))
        hits += int(on.gather(1, scores.argmax(1, keepdim=True)).sum())
    loss = torch.cat(losses).mean()
    return loss, hits / max(1, queries.shape[0])


def answer_spans(keep: torch.Tensor, queries: torch.Tensor) -> tuple[list[int], list[int], list[int]]:
    """Per question (row, position that predicts its answer's first token), the positions that predict its
    answer's tokens: the run of ``keep`` (B, T - 1; position t predicts a labelled token) from that position.
    Returns flat lists (question, row, position)."""
    k = keep.detach().cpu().numpy()
    qs, rows, pos = [], [], []
    for j, (b, t) in enumerate(queries.tolist()):
        run = k[b, t:]
        n = int(run.argmin()) if not run.all() else len(run)
        qs += [j] * max(n, 1)
        rows += [b] * max(n, 1)
        pos += list(range(t, t + max(n, 1)))
    return qs, rows, pos


def attention_scores(block: nn.Module, h: torch.Tensor, positions: torch.Tensor, heads: int) -> torch.Tensor:
    """The pre-softmax scores of the first ``heads`` query heads of the attention layer ``block`` (whose input
    residual stream for one row is ``h``, (t, D)), from each of ``positions`` (P,) over the tokens ``h[:t]``,
    as the layer computes them (``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), grouped KV heads), the
    tokens after each position masked to -inf (causal). Returns (heads, P, t), float32."""
    attn = block.mixer
    hd, r = attn.head_dim, attn.n_heads // attn.n_kv_heads
    heads = min(heads, attn.n_heads)
    t = h.shape[0]
    u = block.norm(h.to(block.norm.weight.dtype))                                          # (t, D)
    q = attn.q_proj(u[positions]).view(len(positions), attn.n_heads, hd)[:, :heads].float()  # (P, heads, hd)
    k = attn.k_proj(u).view(t, attn.n_kv_heads, hd).float()                                 # (t, Hkv, hd)
    kv = torch.arange(heads, device=h.device) // r
    scores = torch.einsum("phd,thd->hpt", q, k[:, kv]) / math.sqrt(hd)                      # (heads, P, t)
    visible = torch.arange(t, device=h.device)[None, :] <= positions[:, None]               # (P, t)
    return scores.masked_fill(~visible, float("-inf"))


def attention_pointer_loss(block: nn.Module, h: torch.Tensor, is_img: torch.Tensor, queries: torch.Tensor,
                           targets: torch.Tensor, keep: torch.Tensor, heads: int) -> tuple[torch.Tensor, float]:
    """The pointer on the model's own attention: for the first ``heads`` query heads of the attention
    layer ``block`` (whose input residual stream is ``h``, (B, T, D)), at every position that predicts a
    token of a question's answer (``answer_spans``), the softmax of that head's scores over the tokens the
    position sees (as the layer computes them: ``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), causal),
    and minus the log of the probability it puts on the image tokens of the question's element; mean over
    heads and positions. So the layer that feeds the answer attends to the element and its values carry
    the element's position (which one tile's ViT position code states) into the digits. Also the share of
    (head, position) pairs whose most-attended token is on the element."""
    qs, rows, pos = answer_spans(keep, queries)
    dev = h.device
    qs_t, rows_t, pos_t = (torch.tensor(v, device=dev) for v in (qs, rows, pos))
    losses, hits, total = [], 0, 0
    for b in torch.unique(rows_t).tolist():
        sel = (rows_t == b).nonzero().squeeze(1)
        p, qj = pos_t[sel], qs_t[sel]
        t_max = int(p.max()) + 1
        scores = attention_scores(block, h[b, :t_max], p, heads)                  # (heads, P, t), causal
        visible = torch.isfinite(scores[0])                                        # (P, t)
        img_pos = is_img[b, :t_max].nonzero().squeeze(1)                          # image token -> position
        on = torch.zeros(len(p), t_max, dtype=torch.bool, device=dev)
        tq = targets[torch.isin(targets[:, 0], qj)]                                # (question, image token)
        match = (qj[:, None] == tq[None, :, 0])                                    # (P, pairs)
        pi, ti = match.nonzero(as_tuple=True)
        on[pi, img_pos[tq[ti, 1]]] = True
        on &= visible
        losses.append((torch.logsumexp(scores, -1)
                       - torch.logsumexp(scores.masked_fill(~on, float("-inf")), -1)).reshape(-1))
        hits += int(on[None].expand_as(scores).gather(2, scores.argmax(-1, keepdim=True)).sum())
        total += scores.shape[0] * scores.shape[1]
    return torch.cat(losses).mean(), hits / max(1, total)
