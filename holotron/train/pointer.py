"""The pointer: from the position that answers a question, put the probability on the image tokens of the
question's element, either through the training-only pointer head (``pointer_loss``) or on the last attention
layer's own heads at every answer position (``attention_pointer_loss``, ``--pointer-heads``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..click_pointer import head_scores
from .heads import AuxHeads

__all__ = ["pointer_loss", "answer_spans", "pointer_layout", "attention_scores", "attention_pointer_loss"]


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
    rows, t, _ = h.shape
    u = block.norm(h.to(block.norm.weight.dtype))                                            # (R, t, D)
    k = attn.k_proj(u).view(rows, t, attn.n_kv_heads, attn.head_dim)                        # (R, t, Hkv, hd)
    hq = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1]))                       # (R, P, D)
    scores = head_scores(block, hq, k, min(heads, attn.n_heads))                             # (R, heads, P, t)
    visible = torch.arange(t, device=h.device)[None, None, :] <= positions[..., None]       # (R, P, t)
    return scores.masked_fill(~visible[:, None], float("-inf"))


def pointer_layout(keep: torch.Tensor, queries: torch.Tensor, targets: torch.Tensor, is_img: torch.Tensor,
                   targets_el: torch.Tensor | None = None) -> dict:
    """Where ``attention_pointer_loss`` scores, worked out on the host from the batch alone (the data workers do
    it in ``batches.collate``): each row's answer positions (``answer_spans``) side by side, padded to the row
    with the most. ``keep`` (B, T - 1): position t predicts a labelled token; ``queries`` (Q, 2) and ``targets``
    (M, 2): the batch's "pointer_queries" / "pointer_targets"; ``is_img`` (B, T): the image tokens. Returns
    "pointer_rows" (R,): the rows with a question; "pointer_at" (R, P): each slot's sequence position (0 in the
    padding); "pointer_valid" (R, P); "pointer_on" (K,): the flat indices into (R, P, ``pointer_len``) of
    (slot, image token of its question's element, as a sequence position of the row); "pointer_len": the
    tokens each row is scored over (the last answer position + 1); "pointer_slots": the valid slots. With
    ``targets_el`` (the batch's "pointer_targets_el") also "pointer_on_el", the same for the element-only tokens."""
    keep, queries, targets, is_img = (t.detach().cpu() for t in (keep, queries, targets, is_img))
    qs, rows, pos = answer_spans(keep, queries)
    row_ids = sorted(set(rows))
    index = {b: i for i, b in enumerate(row_ids)}
    slot, filled = [], [0] * len(row_ids)
    for b in rows:                                                               # the position's slot in its row
        slot.append(filled[index[b]])
        filled[index[b]] += 1
    R, P, T = len(row_ids), max(filled, default=1), max(pos, default=0) + 1
    r_of, s_of = torch.tensor([index[b] for b in rows], dtype=torch.long), torch.tensor(slot, dtype=torch.long)
    at = torch.zeros(R, P, dtype=torch.long)
    at[r_of, s_of] = torch.tensor(pos, dtype=torch.long)
    valid = torch.zeros(R, P, dtype=torch.bool)
    valid[r_of, s_of] = True
    q_of = torch.tensor(qs, dtype=torch.long)
    img = is_img[torch.tensor(row_ids, dtype=torch.long), :T].nonzero()           # (n, 2): row, pos
    img_first = torch.searchsorted(img[:, 0].contiguous(), torch.arange(R))       # row -> its first image token

    def on_index(targets):  # per slot, the (question, token) pairs of its question: the targets sorted by question
        order = torch.argsort(targets[:, 0], stable=True)
        n = torch.bincount(targets[:, 0], minlength=queries.shape[0])
        first = torch.cumsum(n, 0) - n
        per_slot = n[q_of]
        slot_rep = torch.repeat_interleave(torch.arange(len(qs)), per_slot)
        k = torch.arange(int(per_slot.sum())) - torch.repeat_interleave(torch.cumsum(per_slot, 0) - per_slot,
                                                                         per_slot)
        token = targets[order[first[q_of[slot_rep]] + k], 1]                      # image token index in its row
        r, sl = r_of[slot_rep], s_of[slot_rep]
        return (r * P + sl) * T + img[img_first[r] + token, 1]

    out = {"pointer_rows": torch.tensor(row_ids, dtype=torch.long), "pointer_at": at, "pointer_valid": valid,
           "pointer_on": on_index(targets), "pointer_len": T, "pointer_slots": len(qs)}
    if targets_el is not None:
        out["pointer_on_el"] = on_index(targets_el.detach().cpu())
    return out


def attention_pointer_loss(block: nn.Module, h: torch.Tensor, layout: dict, heads: int,
                           element_heads: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The pointer on the model's own attention: for the first ``heads`` query heads of the attention
    layer ``block`` (whose input residual stream is ``h``, (B, T, D)), at every position that predicts a
    token of a question's answer (``answer_spans``), the softmax of that head's scores over the tokens the
    position sees (as the layer computes them: ``norm``, ``q_proj`` . ``k_proj`` / sqrt(head_dim), causal),
    and minus the log of the probability it puts on the image tokens of the question's element; mean over
    heads and positions. So the layer that feeds the answer attends to the element and its values carry
    the element's position (which one tile's ViT position code states) into the digits. Also the share of
    (head, position) pairs whose most-attended token is on the element (a 0-d device tensor).

    ``element_heads``: the last that many of the ``heads`` put the probability on the element's own tokens
    (``layout["pointer_on_el"]``: a label outside the box, a field's or a checkbox's, left out), where a click
    must land, while the others keep the element and its label text (where the reading happens).

    ``layout``: ``pointer_layout``'s, worked out on the host (in the data workers), its tensors on the host or
    on ``h``'s device. All rows at once, each row's answer positions side by side: a fixed number of kernels
    and no read of a device value whatever the batch size (the slots of a padded row count through masks)."""
    dev = h.device
    rows, at, valid, on_index = (layout[k].to(dev, non_blocking=True)
                                 for k in ("pointer_rows", "pointer_at", "pointer_valid", "pointer_on"))
    R, P = layout["pointer_at"].shape
    T, count = layout["pointer_len"], layout["pointer_slots"]
    heads = min(heads, block.mixer.n_heads)
    scores = attention_scores(block, h[:, :T].index_select(0, rows), at, heads)             # (R, heads, P, T)
    visible = torch.isfinite(scores[:, 0])                                                 # (R, P, T)
    def positives(index):
        on = torch.zeros(R * P * T, dtype=torch.bool, device=dev).index_fill_(0, index, True)
        return (on.view(R, P, T) & visible & valid[..., None])[:, None]                   # (R, 1, P, T)

    on = positives(on_index)
    element_heads = min(element_heads, heads)
    if element_heads:
        if "pointer_on_el" not in layout:
            raise ValueError("attention_pointer_loss: element_heads needs the batch's element-only positives "
                             "(ScreenBatches(pointer_element=True))")
        el = positives(layout["pointer_on_el"].to(dev, non_blocking=True))
        last = (torch.arange(heads, device=dev) >= heads - element_heads).view(1, heads, 1, 1)
        on = torch.where(last, el, on)                                                     # (R, heads, P, T)
    lse = torch.logsumexp(scores, -1)                                                      # (R, heads, P)
    lse_on = torch.logsumexp(scores.masked_fill(~on, float("-inf")), -1)
    padding = ~valid[:, None]                                                              # (R, 1, P)
    loss = (lse - lse_on).masked_fill(padding, 0.0).sum() / (heads * count)
    top = scores.argmax(-1, keepdim=True)                                                  # (R, heads, P, 1)
    hits = on.expand(-1, heads, -1, -1).gather(3, top).squeeze(3).masked_fill(padding, False)
    return loss, hits.sum() / (heads * count)
