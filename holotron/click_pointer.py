"""Clicks written where the answer's attention points: a checkpoint's ``click_pointer``.

A grounding checkpoint trained with an attention pointer (``holotron.train --pointer-weight``, holotron/train/
pointer.py) has the first few query heads of one attention layer trained to put their attention, from the
answer's positions, on the image tokens of the element asked for. Its generation_config.json then says so:

    "click_pointer": {"layer": 8, "heads": 2}       # backbone.layers[8], query heads 0 and 1 (the bundled model)
    "click_pointer": {"layer": 8, "heads": 1, "first": 1}   # query head 1 alone (``--pointer-element-heads 1``)

With single-token coordinates (the word tokenizer's one token per value 0..1000, holotron/tokenizer.py), decoding
can use that pointer (``PointerConstraint``, the ``constrain`` of ``generation.stream``): when the greedy next
token is a coordinate, the pointer heads' attention at that position (softmax per head over the visible
positions, averaged over the heads) picks its most-attended image token, and the coordinate is the model's own
best value inside that token's cell on the coordinate's axis (the first coordinate of an answer is x, the
second y; a cell is the token's centre +- half the token grid's spacing, in the 0-1000 units of the answer). The
model still writes every token; its attention chooses the cell it may write in. What it changes on the v2
checkpoint (dev screens, the held-out screens, the browser set): docs/tiny-model.md.

Where the image tokens lie: ``vision.preprocess.token_centres`` (tiles row-major, the tokens of a tile row-major,
the thumbnail last: the order the model sees them in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .vision.preprocess import token_centres

__all__ = ["ClickPointer", "pointer_of", "head_scores", "PointerConstraint", "constraint_for"]


@dataclass(frozen=True)
class ClickPointer:
    layer: int      # index into the language model's backbone.layers: an attention layer
    heads: int      # ``heads`` of its query heads,
    first: int = 0  # from this one


def pointer_of(model) -> ClickPointer | None:
    """The ``click_pointer`` of the checkpoint ``model`` was loaded from (its generation_config.json, which
    ``holotron.load`` keeps as ``model.generation_config``), checked against the model; None when it has none (a
    model built in memory, e.g. one being trained). A malformed entry is a ValueError naming it. The pointer
    belongs to the weights, not to a tokenizer folder: a processor's generation_config is not read."""
    spec = (getattr(model, "generation_config", None) or {}).get("click_pointer")
    if spec is None:
        return None
    lm = getattr(model, "language_model", model)
    layers = lm.backbone.layers
    ok = (isinstance(spec, dict) and {"layer", "heads"} <= set(spec) <= {"layer", "heads", "first"}
          and all(isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in spec))
    if ok:
        layer, heads, first = spec["layer"], spec["heads"], spec.get("first", 0)
        ok = (1 <= layer < len(layers) and layers[layer].kind == "attention"
              and heads >= 1 and first >= 0 and first + heads <= layers[layer].mixer.n_heads)
    if not ok:
        raise ValueError(f"generation_config.json: click_pointer must be {{\"layer\": L, \"heads\": H}} (and "
                         f"optionally \"first\": F) naming an attention layer (1 <= L < {len(layers)}) and query heads "
                         f"F .. F + H - 1 among its own, got {spec!r}")
    return ClickPointer(spec["layer"], spec["heads"], spec.get("first", 0))


def head_scores(block, h_q: torch.Tensor, k: torch.Tensor, heads: int, first: int = 0) -> torch.Tensor:
    """The pre-softmax scores of query heads ``first`` .. ``first + heads - 1`` of the attention block ``block``,
    as the layer computes them: ``h_q`` (R, P, D) the residual stream entering the block at the query positions
    (``norm``, ``q_proj``), ``k`` (R, t, Hkv, hd) the layer's keys, grouped KV heads, / sqrt(head_dim). Returns
    (R, heads, P, t), float32, nothing masked. The training loss's scores (``train.pointer.attention_scores``)
    and the decoding constraint's (keys from the decode state's cache) are both this."""
    attn = block.mixer
    hd, r = attn.head_dim, attn.n_heads // attn.n_kv_heads
    u = block.norm(h_q.to(block.norm.weight.dtype))
    q = attn.q_proj(u).view(*h_q.shape[:2], attn.n_heads, hd)[:, :, first:first + heads].float()  # (R, P, heads, hd)
    kv = torch.arange(first, first + heads, device=q.device) // r
    return torch.einsum("rphd,rthd->rhpt", q, k[:, :, kv].float()) / math.sqrt(hd)


class PointerConstraint:
    """``constrain(logits, state, rows) -> logits`` for ``generation.stream``'s plain loop (see the module
    docstring). ``input_ids`` (B, T) the prompts as prefilled (left pads allowed: the decode state's ``valid``
    masks them), each with the image tokens of one image of size ``sizes[b]``; ``coord_ids`` the ids of the values
    0..1000.
    A row's third and later coordinates are left as they are. ``close()`` removes the hook it sets."""

    def __init__(self, model, pointer: ClickPointer, coord_ids: list[int], input_ids: torch.Tensor,
                 sizes: list[tuple[int, int]]):
        lm = getattr(model, "language_model", model)
        self.layer, self.heads, self.first = pointer.layer, pointer.heads, pointer.first
        self.block = lm.backbone.layers[pointer.layer]
        self.coord_ids = torch.tensor(coord_ids, device=input_ids.device)
        self.is_coord = torch.zeros(lm.config.vocab_size, dtype=torch.bool, device=input_ids.device)
        self.is_coord[self.coord_ids] = True
        cfg = model.config.vision
        image_id = model.config.image_token_id
        self.slots, self.centres, self.cells = [], [], []
        for b, size in enumerate(sizes):
            slots = (input_ids[b] == image_id).nonzero().squeeze(1)
            pos, cell = token_centres(size, cfg)
            if len(pos) != len(slots):
                raise ValueError(f"PointerConstraint: prompt {b} has {len(slots)} image tokens, an image of "
                                 f"{size[0]}x{size[1]} gives {len(pos)}: one image per prompt")
            self.slots.append(slots)
            self.centres.append(torch.from_numpy(pos).float())
            self.cells.append(torch.from_numpy(cell).float())
        self.written = [0] * len(sizes)
        self._h = None
        self._hook = lm.backbone.layers[pointer.layer - 1].register_forward_hook(self._keep)

    def _keep(self, module, args, out):
        self._h = out[:, -1]  # the residual entering the pointer layer at each row's latest position

    def close(self) -> None:
        self._hook.remove()

    def __call__(self, logits: torch.Tensor, state, rows: torch.Tensor) -> torch.Tensor:
        pick = logits.argmax(-1)
        todo = [i for i, r in enumerate(rows.tolist()) if self.is_coord[pick[i]] and self.written[r] < 2]
        if not todo:
            return logits
        logits = logits.clone()
        probs = self._attention(state, todo)                                     # (len(todo), n keys)
        for j, i in enumerate(todo):
            r = int(rows[i])
            p = probs[j, self.slots[r]]
            top = int(p.argmax())
            axis = self.written[r]
            c = 1000 * float(self.centres[r][top, axis])
            half = 500 * float(self.cells[r][top, axis])
            lo, hi = max(0, math.floor(c - half)), min(1000, math.ceil(c + half))
            keep = logits[i, self.coord_ids[lo: hi + 1]]
            logits[i] = float("-inf")
            logits[i, self.coord_ids[lo: hi + 1]] = keep
            self.written[r] += 1
        return logits

    def _attention(self, state, todo: list[int]) -> torch.Tensor:
        """The pointer heads' attention (averaged over them) of the rows ``todo`` of ``state`` at their latest
        position, over every position so far (pads masked): (len(todo), seqlen)."""
        idx = torch.tensor(todo, device=self._h.device)
        cache, n = state.layers[self.layer], state.seqlen
        if cache.quantized:
            k = cache.read((idx, slice(None), slice(0, n)), torch.float32)[0]
        else:
            k = cache.k[idx, :, :n]                                                             # (n, Hkv, seqlen, hd)
        scores = head_scores(self.block, self._h[idx][:, None], k.transpose(1, 2), self.heads, self.first)[:, :, 0]
        scores = scores.masked_fill(~state.valid[idx, :n][:, None], float("-inf"))
        return torch.softmax(scores, -1).mean(1)


def constraint_for(model, processor, input_ids: torch.Tensor, sizes: list[tuple[int, int]]
                   ) -> PointerConstraint | None:
    """The ``constrain`` of a batch of click prompts (one image each, of ``sizes``) when ``model``'s checkpoint
    declares a click pointer and ``processor`` writes single-token coordinates; else None. Close it after
    decoding."""
    from .tokenizer import coordinate_token_ids

    ptr = pointer_of(model)
    coords = coordinate_token_ids(processor) if ptr is not None else None
    if not coords:
        return None
    return PointerConstraint(model, ptr, coords, input_ids, sizes)
