"""The grounding loss (``loss_fn``): cross-entropy on the answer tokens, plus, with the auxiliary heads, the
image-token terms and the pointer (holotron/train/pointer.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model import Holotron
from .batches import step_indices
from .heads import AuxHeads
from .matching import match_loss
from .pointer import attention_pointer_loss, pointer_loss
from .targets import IGNORE
from .tiles import normalize_tiles

__all__ = ["loss_fn", "GAUSS_WEIGHT"]

GAUSS_WEIGHT = 0.1  # the pull toward the box centre beside the in-box term (_answer_with_boxes)


def loss_fn(model: Holotron, batch: dict, device: torch.device, aux: AuxHeads | None = None,
            aux_weight: float = 0.0, parts: dict | None = None, char_weight: float = 1.0,
            pointer_weight: float = 0.0, augment: torch.Generator | bool | None = None,
            pointer_heads: int = 0, match_weight: float = 0.0, pointer_element_heads: int = 0,
            coord_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the answer tokens of a (right-padded) batch; also their count.

    With ``aux`` and ``aux_weight > 0`` (and the batch's image-token targets) the loss adds
    ``aux_weight`` x (text-class cross-entropy on the projector output + the same and an L1 position loss
    (x 10) on the residual stream entering the last attention layer), averaged over image tokens, and,
    when the batch has "image_chars", ``char_weight`` x the character cross-entropy per patch on the
    projector output, and, when the batch has pointer targets, ``pointer_weight`` x ``pointer_loss`` (with
    ``pointer_heads`` > 0: ``attention_pointer_loss`` on that many heads of the last attention layer instead, the
    last ``pointer_element_heads`` of them on the element's own tokens).
    ``augment``: ``colour_aug`` each screen (all its tiles alike; True, or a torch.Generator for it).
    With ``coord_ids`` (the ids of the coordinate tokens 0..1000) and the batch's "coord_targets", the x and y
    tokens of each answer are scored by ``_answer_with_boxes`` (any value inside the box) instead of the
    cross-entropy toward the centre. With "image_centres" in the batch the position term becomes the element
    centre (``aux.centre_mid``) plus 0.2 x the token's own position; with ``match_weight`` > 0 and the batch's
    matching targets, ``aux_weight * match_weight`` x ``matching.match_loss`` on the projector output.
    ``parts`` (a dict) receives each term as a float. The positions of the answer and image tokens come from
    the batch's host-side indices (``batches.step_indices``, worked out in the data workers), so the step reads
    nothing back from the device but, with ``parts``, the terms (in two reads)."""
    if "answer_index" not in batch:  # a batch not made by batches.collate: its indices worked out here
        batch = {**batch, **step_indices(batch, model.config.image_token_id)}
    ids = batch["input_ids"].to(device, non_blocking=True)
    image_index = batch["image_index"].to(device, non_blocking=True)
    pixel_values = normalize_tiles(batch["pixel_values"].to(device, non_blocking=True), model.config.vision,
                                   augment, batch["num_tiles"])
    emb, img = _embed(model, ids, pixel_values, image_index)      # (B, T, D); the image tokens' rows (n, D)
    use_aux = aux is not None and aux_weight > 0 and "image_classes" in batch
    mid, hook = {}, None
    if use_aux:
        blk = model.language_model.backbone.layers[aux.layer]
        hook = blk.register_forward_hook(lambda mod, args, out: mid.__setitem__("h", out))
    try:
        h = model.language_model.hidden_states(inputs_embeds=emb)    # (B, T, D), plain causal
    finally:
        if hook is not None:
            hook.remove()
    # the positions that predict a labelled token (the rows of h[:, :-1][labels[:, 1:] != IGNORE]) and their labels
    answer = batch["answer_index"].to(device, non_blocking=True)
    target = batch["answer_labels"].to(device, non_blocking=True)
    logits = model.language_model.lm_head(h.flatten(0, 1).index_select(0, answer))   # (n, V)
    terms = {}
    if coord_ids is not None and "coord_targets" in batch and len(batch["coord_targets"]):
        loss = _answer_with_boxes(logits.float(), target, batch["coord_rows"].to(device, non_blocking=True),
                                  batch["coord_targets"].to(device, non_blocking=True), coord_ids,
                                  terms if parts is not None else None)
    else:
        loss = F.cross_entropy(logits.float(), target)
    terms["answer"] = loss
    if use_aux:
        cls = batch["image_classes"].to(device, non_blocking=True)
        pos = batch["image_positions"].to(device, non_blocking=True)
        if image_index.numel() != cls.numel():
            raise ValueError(f"{image_index.numel()} image tokens but {cls.numel()} image-token targets")
        l_in = F.cross_entropy(aux.label_in(img.to(aux.label_in.weight.dtype)).float(), cls, ignore_index=IGNORE)
        hm = mid["h"].flatten(0, 1).index_select(0, image_index).to(aux.label_mid.weight.dtype)
        l_mid = F.cross_entropy(aux.label_mid(hm).float(), cls, ignore_index=IGNORE)
        l_pos = 10 * F.l1_loss(aux.pos_mid(hm).float(), pos)
        if "image_centres" in batch:  # the element centre on the value path; own position as a weaker term
            centres = batch["image_centres"].to(device, non_blocking=True)
            l_pos = 0.2 * l_pos + 10 * F.l1_loss(aux.centre_mid(hm).float(), centres)
        loss = loss + aux_weight * (l_in + l_mid + l_pos)
        terms.update(label_in=l_in, label_mid=l_mid, position=l_pos)
        if match_weight > 0 and "match_words" in batch:
            sub = {} if parts is not None else None
            l_match = match_loss(aux.match, model.language_model.backbone.embeddings, img, batch, device, sub)
            loss = loss + aux_weight * match_weight * l_match
            if parts is not None:
                terms.update({k: v for k, v in sub.items() if k != "centre"})
        if "image_chars" in batch and char_weight > 0:
            chars = batch["image_chars"].to(device, non_blocking=True).reshape(-1)
            l_char = F.cross_entropy(aux.chars(img), chars, ignore_index=IGNORE)
            loss = loss + aux_weight * char_weight * l_char
            terms["char"] = l_char
        if "pointer_queries" in batch and pointer_weight > 0:
            if pointer_heads > 0:
                block = model.language_model.backbone.layers[aux.layer + 1]
                l_ptr, acc = attention_pointer_loss(block, mid["h"], batch, pointer_heads,  # (its layout)
                                                    pointer_element_heads)
            else:
                l_ptr, acc = pointer_loss(aux, mid["h"], ids == model.config.image_token_id,
                                          batch["pointer_queries"].to(device), batch["pointer_targets"].to(device))
            loss = loss + aux_weight * pointer_weight * l_ptr
            terms.update(pointer=l_ptr, pointer_acc=acc)
    if parts is not None:  # the device's terms in one read (the matching terms are read already)
        on_device = {k: v for k, v in terms.items() if isinstance(v, torch.Tensor)}
        read = dict(zip(on_device, torch.stack([v.detach().float() for v in on_device.values()]).tolist()))
        parts.update({k: read.get(k, v) for k, v in terms.items()})
    return loss, int(batch["answer_index"].numel())


def _embed(model: Holotron, ids: torch.Tensor, pixel_values: torch.Tensor,
           image_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.embed_inputs(ids, pixel_values)`` (B, T, D) with the image positions given as flat indices
    (``batches.step_indices``' "image_index") instead of found with a boolean mask, and the image tokens' rows
    of it (n, D): the same values, no read of the device."""
    x = model.language_model.backbone.embeddings(ids)
    feats = model.embed_images(pixel_values).reshape(-1, x.shape[-1]).to(x.dtype)
    if feats.shape[0] != image_index.numel():
        raise ValueError(f"input_ids hold {image_index.numel()} <image> positions but the images give "
                         f"{feats.shape[0]} embeddings: build the batch with holotron.train.batches")
    return x.flatten(0, 1).index_copy(0, image_index, feats).view_as(x), feats


def _answer_with_boxes(logits: torch.Tensor, target: torch.Tensor, at: torch.Tensor, coords: torch.Tensor,
                       coord_ids: torch.Tensor, parts: dict | None) -> torch.Tensor:
    """The answer loss with the coordinates scored as the metric scores them: mean over answer tokens (``logits``
    (n, V), their labels ``target`` (n,)) of the cross-entropy, except at an x or y token (``coords`` rows:
    batch row, label position, lo, hi, centre; ``at``: the row of ``logits`` of each, ``batches.step_indices``'
    "coord_rows"), where it is minus the log of the probability of all values lo..hi (every one lands in the
    box) plus ``GAUSS_WEIGHT`` x the cross-entropy toward a Gaussian around the centre (sigma a quarter of the
    box's half-size, at least 1 unit), so the answer prefers the middle of the box without being punished for
    another point inside it. ``parts`` gets "inbox_x", "inbox_y" and "inbox" (both): the teacher-forced share
    of coordinates whose most likely token lies in the range, as 0-d device tensors (read by the caller)."""
    ce = F.cross_entropy(logits, target, reduction="none")                         # (n,)
    lo, hi, centre = coords[:, 2:3], coords[:, 3:4], coords[:, 4:5]
    logp = torch.log_softmax(logits[at], -1)[:, coord_ids]                         # (K, 1001)
    k = torch.arange(coord_ids.numel(), device=logits.device)[None, :]
    inside = (k >= lo) & (k <= hi)
    l_in = -torch.logsumexp(logp.masked_fill(~inside, float("-inf")), -1)
    sigma = ((hi - lo).float() / 8).clamp(min=1.0)
    w = torch.softmax(-((k - centre).float() ** 2) / (2 * sigma**2), -1)
    l_g = -(w * logp).sum(-1)
    ce = ce.index_put((at,), l_in + GAUSS_WEIGHT * l_g)
    if parts is not None:
        value = torch.full((logits.shape[1],), -1, dtype=torch.long, device=logits.device)
        value[coord_ids] = torch.arange(coord_ids.numel(), device=logits.device)
        v = value[logits[at].argmax(-1)]                                           # -1: not a coordinate
        hit = (v >= lo[:, 0]) & (v <= hi[:, 0])
        parts["inbox_x"], parts["inbox_y"] = hit[0::2].float().mean(), hit[1::2].float().mean()
        parts["inbox"] = (hit[0::2] & hit[1::2]).float().mean()
    return ce.mean()

