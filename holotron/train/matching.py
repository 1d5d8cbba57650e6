"""Reading as discrimination, aligned with the text side (``--stage match``, and beside grounding with
``--match-weight``): every element and free text of a screen is a query built from the language model's own word
embeddings, scored against the screen's image tokens; the image tokens are also asked which word lies under
them (logits against the same embedding table) and where the centre of their element is.

What each screen contributes (``match_targets``, from the generator's boxes):
  queries    one per element of a target role (its label's words + its role's name) and one per free visible
             text (role "text"); a label shown twice on a screen is left out (it would be ambiguous), and so is
             a control of a table row (its label is on every row; its box still carries its centre). The
             positives of a query are the image tokens on the element and on the texts that spell its label
             (``element_tokens.element_tokens``): a checkbox's caption, a field's label, a button's own text.
  words      per image token, the id of the word under its centre (-100 where no word is).
  centres    per image token, (f cx, f cy, f): the centre (0-1 of the screen) of the element whose box or label
             text holds the token's centre, f = 1 there and 0 elsewhere (everything 0). An attention that
             mixes these values and divides by f reads the element's centre, not the blend of token positions.

The losses (``match_loss``) run on the projector output (the image tokens as the language model receives
them), through the training-only ``MatchHeads``; the word classifier and the queries use
``model.language_model.backbone.embeddings``, so reading trains the text side's embeddings too."""

from __future__ import annotations

import functools
import math
import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .element_tokens import _first_hit, _label_texts, _sub_points, _tokens_in, element_tokens, token_cell
from .targets import IGNORE, _last_box

__all__ = ["MatchHeads", "match_targets", "collate_match", "match_loss", "word_codes", "MatchBatches",
           "match_stage_loss", "token_pairs"]

_WORD = re.compile(r"[A-Za-z]+|\d+")


class MatchHeads(nn.Module):
    """The matching stage's training-only heads (saved beside a checkpoint in aux_heads.pt with the others,
    never loaded by ``holotron.load``): query projections of a label's mean word embedding and of its role
    word, keys on the image tokens, a projection of the image tokens into the word-embedding space (the
    word classifier's logits are its product with the embedding table), and the element-centre head."""

    def __init__(self, hidden: int, dim: int = 128):
        super().__init__()
        self.q_words = nn.Linear(hidden, dim)
        self.q_role = nn.Linear(hidden, dim, bias=False)
        self.key = nn.Linear(hidden, dim)
        self.word = nn.Linear(hidden, hidden)
        self.centre = nn.Linear(hidden, 3)


# ----------------------------------------------------------------------------------------------
# targets (data workers)
# ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16384)
def _word_id(encode, word: str) -> int:
    ids = encode(word)
    return ids[0] if ids else IGNORE


@functools.lru_cache(maxsize=4)
def word_codes(encode):
    """``text -> per-character word ids`` for ``char_classes_at(..., codes=)``: each letter or digit gets the
    id of the word (a run of letters, or of digits) it belongs to, encoded alone (its first token, for a
    tokenizer that splits it), other characters -100."""
    @functools.lru_cache(maxsize=16384)
    def codes(text: str) -> np.ndarray:
        out = np.full(len(text), IGNORE, dtype=np.int64)
        for m in _WORD.finditer(text):
            out[m.start():m.end()] = _word_id(encode, m.group())
        return out
    return codes


def match_targets(sample, encode, positions: torch.Tensor, classes: torch.Tensor, role_names: dict,
                  cell: tuple[float, float]) -> dict:
    """The matching targets of one screen (see the module docstring). ``encode``: text -> token ids (a
    hashable callable, e.g. ``Processor.encode``); ``positions`` / ``classes``: ``image_token_targets``';
    ``role_names``: role -> the word that names it in instructions; ``cell``: ``token_cell``. A token's
    word and centre are those of the hit nearest its centre among its sub-points. Returns {"queries": [(word
    ids, role id, token indices)], "words": (tokens,), "centres": (tokens, 3)}."""
    from ..data import ROLES
    from .targets import char_classes_at, char_table

    w, h = sample.size
    n = positions.shape[0]
    tile = classes != IGNORE
    points = _sub_points(positions, sample.size, cell)
    labels = [e.label.strip().lower() for e in sample.elements]
    count = {lab: labels.count(lab) for lab in labels}
    queries, owners = [], []
    for e in sample.elements:
        lab = e.label.strip().lower()
        if getattr(e, "row", None) is not None:  # a table row's control (holotron/data/tables.py): no query
            if e.role in ROLES:
                owners.append(e)
            continue
        if e.role not in ROLES or not lab or count[lab] > 1:
            continue
        words = [i for i in encode(e.label.strip()) if i >= 0]
        role = encode(role_names.get(e.role, e.role))
        if not words or not role:
            continue
        queries.append((words, role[0], element_tokens(sample, e, positions, classes, cell, points)))
        owners.append(e)
    text_role = encode("text")
    seen = {}
    for t in sample.texts:
        seen[t.text.strip().lower()] = seen.get(t.text.strip().lower(), 0) + 1
    for t in sample.texts:
        lab = t.text.strip().lower()
        if not lab or lab in count or seen[lab] > 1:
            continue
        toks = _tokens_in([t.box], points, tile).nonzero().squeeze(1)
        words = [i for i in encode(t.text.strip()) if i >= 0]
        if len(toks) and words and text_role:
            queries.append((words[:16], text_role[0], toks))
    # the word nearest each token's centre (0 from char_classes_at: no text there)
    px, py = points
    words = char_classes_at(sample, px, py, char_table(sample), codes=word_codes(encode)).reshape(px.shape)
    words = _first_hit(np.where(words == 0, IGNORE, words), IGNORE)
    words = torch.from_numpy(words).masked_fill(~tile, IGNORE)
    # the element centre each token carries: elements (and their label texts) in paint order
    boxes, centre = [], []
    for e in owners:
        c = ((e.box[0] + e.box[2]) / (2 * w), (e.box[1] + e.box[3]) / (2 * h))
        for b in [t.box for t in _label_texts(sample, e, row=False)] + [e.box]:
            boxes.append(b)
            centre.append(c)
    centres = torch.zeros(n, 3)
    if boxes:
        last = _last_box(np.array(boxes, dtype=np.float64).reshape(-1, 4), px, py).reshape(px.shape)
        last = _first_hit(last, -1)
        on = torch.from_numpy(last >= 0) & tile
        c = torch.tensor(centre, dtype=torch.float32)[torch.from_numpy(np.maximum(last, 0))]
        centres[on] = torch.cat([c[on], torch.ones(int(on.sum()), 1)], dim=1)
    return {"queries": queries, "words": words, "centres": centres}


def token_pairs(tokens: list) -> torch.Tensor:
    """(M, 2) long: (query, token) for each token of each query's ``tokens[q]`` (index tensors or arrays),
    queries in order: the positives of the matching's and the pointer's softmaxes as one tensor."""
    parts = [torch.zeros(0, 2, dtype=torch.long)]
    for q, toks in enumerate(tokens):
        toks = torch.as_tensor(toks, dtype=torch.long).reshape(-1)
        parts.append(torch.stack([torch.full_like(toks, q), toks], 1))
    return torch.cat(parts)


def collate_match(targets: list[dict], tokens_per_screen: list[int]) -> dict:
    """Screens' ``match_targets`` -> batch tensors: "match_words" (Q, L) padded with -1, "match_role" (Q,),
    "match_screen" (Q,), "match_pairs" (M, 2) (query, token index within its screen), "image_words" (n,),
    "image_centres" (n, 3) over all image tokens in batch order."""
    qs = [(b, q) for b, t in enumerate(targets) for q in t["queries"]]
    L = max([len(q[0]) for _, q in qs], default=1)
    words = torch.full((len(qs), L), -1, dtype=torch.long)
    slots, per = [], [0] * len(targets)
    for j, (b, (ids, _, _)) in enumerate(qs):
        words[j, :len(ids)] = torch.tensor(ids)
        slots.append(per[b])  # the query's place among its screen's
        per[b] += 1
    image_words = torch.cat([t["words"] for t in targets])
    n_max = max(tokens_per_screen, default=0)
    return {"match_words": words, "match_role": torch.tensor([q[1] for _, q in qs], dtype=torch.long),
            "match_screen": torch.tensor([b for b, _ in qs], dtype=torch.long),
            "match_slot": torch.tensor(slots, dtype=torch.long), "match_slots": max(per, default=0),
            "match_pairs": token_pairs([toks for _, (_, _, toks) in qs]),
            "match_tokens": torch.tensor(tokens_per_screen, dtype=torch.long),
            # each image token's place in the (screens, n_max) grid of match_loss's keys
            "match_token_at": torch.cat([b * n_max + torch.arange(n, dtype=torch.long)
                                         for b, n in enumerate(tokens_per_screen)]),
            "image_words": image_words, "word_index": (image_words != IGNORE).nonzero().squeeze(1),
            "image_centres": torch.cat([t["centres"] for t in targets])}


# ----------------------------------------------------------------------------------------------
# the losses (device)
# ----------------------------------------------------------------------------------------------

def match_loss(heads: MatchHeads, embeddings: nn.Embedding, img: torch.Tensor, batch: dict, device,
               parts: dict | None = None, centre_from: torch.Tensor | None = None) -> torch.Tensor:
    """The matching losses on image tokens ``img`` (n, D), all screens' tokens in batch order (each screen
    ``match_tokens`` of them): the query softmax over its screen's tokens (minus the log of the mass on its
    positives, mean over queries), the word under each token (cross-entropy of ``heads.word(img) .
    embeddings^T``, tokens with a word), and an L1 on the element centre (``heads.centre`` of ``centre_from``,
    default ``img``; x 5). Sum of the three; ``parts`` gets each and the accuracies ("match_acc": queries
    whose best token is a positive; "word_acc")."""
    E = embeddings.weight
    dt = heads.key.weight.dtype
    if "match_token_at" not in batch:  # a batch not made by collate_match: its indices worked out here
        batch = {**batch, **_match_indices(batch)}
    counts = batch["match_tokens"]                                             # (host)
    B, n_max = len(counts), int(counts.max())
    x = img.to(dt)
    # keys per screen, padded to the longest screen: (B, n_max, dim), each token at its place worked out by the host
    keys = heads.key(x)
    at = batch["match_token_at"].to(device, non_blocking=True)
    kpad = keys.new_zeros(B * n_max, keys.shape[1]).index_copy(0, at, keys).view(B, n_max, -1)
    valid = torch.arange(n_max, device=x.device) < counts.to(device, non_blocking=True)[:, None]
    words = batch["match_words"].to(device, non_blocking=True)
    mask = words >= 0
    wemb = E[words.clamp(min=0)] * mask[..., None]
    mean = wemb.sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
    q = heads.q_words(mean.to(dt)) + heads.q_role(E[batch["match_role"].to(device, non_blocking=True)].to(dt))
    terms = {}
    if q.shape[0]:
        # queries grouped by screen (padded), one batched product with their screen's keys: (Q, n_max)
        screen = batch["match_screen"].to(device, non_blocking=True)
        slot = batch["match_slot"].to(device, non_blocking=True)
        qpad = q.new_zeros(B, batch["match_slots"], q.shape[1])
        qpad[screen, slot] = q
        scores = torch.bmm(qpad.float(), kpad.float().transpose(1, 2))[screen, slot] / math.sqrt(q.shape[1])
        scores = scores.masked_fill(~valid[screen], float("-inf"))
        pairs = batch["match_pairs"].to(device, non_blocking=True)
        on = torch.zeros_like(scores, dtype=torch.bool)
        on[pairs[:, 0], pairs[:, 1]] = True
        l_match = (torch.logsumexp(scores, 1) - torch.logsumexp(scores.masked_fill(~on, float("-inf")), 1)).mean()
        terms["match"] = l_match
        if parts is not None:
            terms["match_acc"] = on.gather(1, scores.argmax(1, keepdim=True)).float().mean()
    has = batch["word_index"]                                                  # the tokens with a word (host)
    if len(has):
        has = has.to(device, non_blocking=True)
        target = batch["image_words"].to(device, non_blocking=True).index_select(0, has)
        logits = heads.word(x.index_select(0, has)).float() @ E.float().T
        l_word = F.cross_entropy(logits, target)
        terms["word"] = l_word
        if parts is not None:
            terms["word_acc"] = (logits.argmax(-1) == target).float().mean()
    src = x if centre_from is None else centre_from.to(dt)
    l_ctr = 5 * F.l1_loss(heads.centre(src).float(), batch["image_centres"].to(device, non_blocking=True))
    terms["centre"] = l_ctr
    if parts is not None:  # one read of the device for all of them
        parts.update(zip(terms, torch.stack([v.detach().float() for v in terms.values()]).tolist()))
    return sum(v for k, v in terms.items() if not k.endswith("_acc"))


def _match_indices(batch: dict) -> dict:
    """``collate_match``'s host-side indices of a batch that lacks them: each query's place among its screen's,
    each image token's place in the (screens, longest screen) grid, the image tokens with a word."""
    screen, counts = batch["match_screen"], batch["match_tokens"]
    per = torch.bincount(screen, minlength=len(counts))
    n_max = int(counts.max())
    return {"match_slot": torch.arange(len(screen)) - (torch.cumsum(per, 0) - per)[screen],
            "match_slots": int(per.max()) if len(screen) else 0,
            "match_token_at": torch.cat([b * n_max + torch.arange(int(n)) for b, n in enumerate(counts)]),
            "word_index": (batch["image_words"] != IGNORE).nonzero().squeeze(1)}


# ----------------------------------------------------------------------------------------------
# the matching stage (--stage match): the vision side and the embedding table, no language model
# ----------------------------------------------------------------------------------------------

class MatchBatches(torch.utils.data.Dataset):
    """The matching stage's stream: item ``step`` is ``batch_size`` whole screens (seeds as ``ScreenBatches``,
    ``options`` passed to ``generate_sample``, e.g. layouts or vocab), each optionally padded
    (``pad``: a function (sample, rng) -> sample, e.g. ``augment.pad_sample``), as the preprocessing tiles
    them, with their image-token targets: {"pixel_values" uint8, "num_tiles", "image_classes", "image_chars",
    the ``collate_match`` tensors, "tokens"}."""

    def __init__(self, tokenizer_dir, vision, batch_size: int, seed: int = 0, split: str = "train",
                 options: dict | None = None, pad=None, seeds: list[int] | None = None):
        self.tokenizer_dir, self.vision, self.batch_size = str(tokenizer_dir), vision, batch_size
        self.seed, self.split, self.options, self.pad, self.seeds = seed, split, dict(options or {}), pad, seeds
        self._processor = None

    def __len__(self) -> int:
        return 2**62

    def __getstate__(self):
        return {**self.__dict__, "_processor": None}

    @property
    def processor(self):
        if self._processor is None:
            from ..processor import Processor

            self._processor = Processor.from_pretrained(self.tokenizer_dir)
        return self._processor

    def __getitem__(self, step: int) -> dict:
        import random

        from ..data import generate_sample
        from ..data.instructions import ROLE_NAMES
        from .targets import image_token_targets
        from .tiles import uint8_tiles

        tiles, n_tiles, cls, chars, targets, counts = [], [], [], [], [], []
        for i in range(self.batch_size):
            seed = self.seeds[i] if self.seeds is not None else self.seed * 10**12 + step * self.batch_size + i
            sample = generate_sample(seed, split=self.split, **self.options)
            if self.pad is not None:
                sample = self.pad(sample, random.Random(seed + 1))
            x, _ = uint8_tiles(sample.image, self.vision)
            c, pos, ch = image_token_targets(sample, self.vision, chars=True)
            targets.append(match_targets(sample, self.processor.encode, pos, c, ROLE_NAMES,
                                         token_cell(sample.size, self.vision)))
            tiles.append(x)
            n_tiles.append(x.shape[0])
            cls.append(c)
            chars.append(ch)
            counts.append(c.shape[0])
        x = torch.cat(tiles)
        return {"pixel_values": x, "num_tiles": torch.tensor(n_tiles), "image_classes": torch.cat(cls),
                "image_chars": torch.cat(chars), **collate_match(targets, counts),
                "tokens": int(sum(counts))}


def match_stage_loss(model, aux, batch: dict, device, parts: dict | None = None, char_weight: float = 1.0,
                     augment=None) -> tuple[torch.Tensor, int]:
    """The matching stage's loss from the projector output (vision tower + pixel shuffle + mlp1; the language
    model's blocks do not run): ``match_loss`` through ``aux.match`` and the LM's embedding table, plus
    ``char_weight`` x the character cross-entropy per patch. ``augment``: ``colour_aug`` per screen."""
    from .tiles import normalize_tiles

    x = normalize_tiles(batch["pixel_values"].to(device, non_blocking=True), model.config.vision, augment,
                        batch["num_tiles"])
    img = model.embed_images(x).reshape(-1, model.config.text.hidden_size)
    loss = match_loss(aux.match, model.language_model.backbone.embeddings, img, batch, device, parts)
    if char_weight > 0:
        chars = batch["image_chars"].to(device, non_blocking=True).reshape(-1)
        logits = aux.chars(img)
        l_char = F.cross_entropy(logits, chars, ignore_index=IGNORE)
        loss = loss + char_weight * l_char
        if parts is not None:
            ink = chars >= 2
            parts["char"] = float(l_char.detach())
            parts["char_acc"] = float((logits[ink].argmax(-1) == chars[ink]).float().mean()) if bool(ink.any()) else 0.
    return loss, int(img.shape[0])
