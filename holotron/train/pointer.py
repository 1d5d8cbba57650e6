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
    residual stream is ``h``, (R, t, D) for R rows), from each row's ``positions`` (R, P) over that row's tokens
    ``h[:, :t]``, as the layer computes them (``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), grouped KV
    heads), the tokens after each position masked to -inf (causal). Returns (R, heads, P, t), float32."""
    attn = block.mixer
    hd, r = attn.head_dim, attn.n_heads // attn.n_kv_heads
    heads = min(heads, attn.n_heads)
    rows, t, _ = h.shape
    n = positions.shape[1]
    u = block.norm(h.to(block.norm.weight.dtype))                                            # (R, t, D)
    uq = u.gather(1, positions[..., None].expand(-1, -1, u.shape[-1]))                       # (R, P, D)
    q = attn.q_proj(uq).view(rows, n, attn.n_heads, hd)[:, :, :heads].float()               # (R, P, heads, hd)
    k = attn.k_proj(u).view(rows, t, attn.n_kv_heads, hd).float()                           # (R, t, Hkv, hd)
    kv = torch.arange(heads, device=h.device) // r
    scores = torch.einsum("rphd,rthd->rhpt", q, k[:, :, kv]) / math.sqrt(hd)                # (R, heads, P, t)
    visible = torch.arange(t, device=h.device)[None, None, :] <= positions[..., None]       # (R, P, t)
    return scores.masked_fill(~visible[:, None], float("-inf"))


def attention_pointer_loss(block: nn.Module, h: torch.Tensor, is_img: torch.Tensor, queries: torch.Tensor,
                           targets: torch.Tensor, keep: torch.Tensor, heads: int) -> tuple[torch.Tensor, float]:
    """The pointer on the model's own attention: for the first ``heads`` query heads of the attention
    layer ``block`` (whose input residual stream is ``h``, (B, T, D)), at every position that predicts a
    token of a question's answer (``answer_spans``), the softmax of that head's scores over the tokens the
    position sees (as the layer computes them: ``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), causal),
    and minus the log of the probability it puts on the image tokens of the question's element; mean over
    heads and positions. So the layer that feeds the answer attends to the element and its values carry
    the element's position (which one tile's ViT position code states) into the digits. Also the share of
    (head, position) pairs whose most-attended token is on the element.

    All rows at once: each row's answer positions side by side (padded to the row with the most), scored
    against that row's tokens up to the last of them, so the work is a fixed number of kernels and four reads
    of device values (the answer spans, the image tokens, the question-token pairs, the hit count) whatever
    the batch size, where a loop over the rows read two more per row."""
    qs, rows, pos = answer_spans(keep, queries)                                  # host lists
    dev = h.device
    row_ids = sorted(set(rows))
    index = {b: i for i, b in enumerate(row_ids)}
    slot, filled = [], [0] * len(row_ids)
    for b in rows:                                                               # the position's slot in its row
        slot.append(filled[index[b]])
        filled[index[b]] += 1
    R, P, T = len(row_ids), max(filled), max(pos) + 1
    r_of = torch.tensor([index[b] for b in rows], device=dev)
    s_of = torch.tensor(slot, device=dev)
    at = torch.zeros(R, P, dtype=torch.long, device=dev)                          # slot -> sequence position
    at[r_of, s_of] = torch.tensor(pos, device=dev)
    valid = torch.zeros(R, P, dtype=torch.bool, device=dev)
    valid[r_of, s_of] = True
    question = torch.full((R, P), -1, dtype=torch.long, device=dev)
    question[r_of, s_of] = torch.tensor(qs, device=dev)

    heads = min(heads, block.mixer.n_heads)
    row_t = torch.tensor(row_ids, device=dev)
    scores = attention_scores(block, h[row_t, :T], at, heads)                                  # (R, heads, P, T)
    visible = torch.isfinite(scores[:, 0])                                                     # (R, P, T)

    # the element's image tokens of each position's question, as sequence positions of its row
    img = is_img[row_t, :T].nonzero()                                                          # (n, 2): row, pos
    first = torch.searchsorted(img[:, 0].contiguous(), torch.arange(R, device=dev))             # row -> its first
    flat_q = question.reshape(-1)
    pi, ti = (flat_q[:, None] == targets[None, :, 0]).nonzero(as_tuple=True)                   # (slot, pair)
    pr = torch.div(pi, P, rounding_mode="floor")
    on = torch.zeros(R * P, T, dtype=torch.bool, device=dev)
    on[pi, img[first[pr] + targets[ti, 1], 1]] = True
    on = on.view(R, P, T) & visible & valid[..., None]

    lse = torch.logsumexp(scores, -1)                                                          # (R, heads, P)
    lse_on = torch.logsumexp(scores.masked_fill(~on[:, None], float("-inf")), -1)
    keep_slot = valid[:, None].expand(-1, heads, -1)
    loss = (lse - lse_on)[keep_slot].mean()
    top = scores.argmax(-1, keepdim=True)                                                      # (R, heads, P, 1)
    hits = on[:, None].expand(-1, heads, -1, -1).gather(3, top).squeeze(3)[keep_slot]
    return loss, int(hits.sum()) / hits.numel()
