"""The grounding stream: ``ScreenBatches[step]`` is the whole batch of a step (a batch depends only on
(seed, step), so runs and resumed runs see the same data), rows put together by ``collate``."""

from __future__ import annotations

import random

import torch

from ..processor import Processor
from ..vision.config import VisionConfig
from .element_tokens import _sub_points, element_core_tokens, element_tokens, token_cell
from .matching import collate_match, match_targets, token_pairs
from .pointer import pointer_layout
from .questions import answer_ids, extra_targets, followup_text
from .targets import IGNORE, image_token_targets, pointer_tokens
from .tiles import augmented_grid, uint8_tiles

__all__ = ["ScreenBatches", "collate", "step_indices"]


class ScreenBatches(torch.utils.data.Dataset):
    """Map-style dataset whose item ``step`` is the whole training batch of that step (see holotron/train/__init__.py's
    docstring): a dict with input_ids and labels (B, T) right-padded, pixel_values (tiles, 3, S, S) uint8,
    num_tiles (images,), and counts. Workers build their own Processor from ``tokenizer_dir``.
    ``chars``: also the character under each patch of each image token ("image_chars");
    ``short_followups``: the later questions of a screen as the target alone, not the whole prompt;
    ``grid_aug``: the share of screens tiled on a grid drawn by ``augmented_grid`` instead of the closest one;
    ``match``: also the matching targets (``matching.match_targets``: queries, the word under each token, the
    element centre each token carries); ``pad``: a function (sample, rng) -> sample applied to each screen
    (``augment.pad_sample``); ``seeds``: fixed screen seeds (the batch of every step), e.g. for a dev batch;
    ``pointer_core``: a question's pointer tokens are those whose centre lies on its element or the element's
    label text (``element_tokens.element_core_tokens``) instead of those one of whose sub-points does;
    ``length_multiple``: each batch's rows right-padded to a multiple of it (``collate``); ``pointer_element``:
    also each question's element tokens without its label text ("pointer_tokens_el", for the element-only pointer
    heads, ``--pointer-element-heads``).
    With a tokenizer that has single-token coordinates (``holotron.tokenizer.coordinate_token_ids``) each
    answer also carries, for its x and y tokens, the range of values that land in the element's box
    ("coord_targets": row, label position, lo, hi, centre; ``coords.coordinate_box_range``)."""

    def __init__(self, tokenizer_dir, vision: VisionConfig, batch_size: int, seed: int = 0, queries: int = 1,
                 split: str = "train", options: dict | None = None, *, chars: bool = False,
                 short_followups: bool = False, grid_aug: float = 0.0, match: bool = False, pad=None,
                 seeds: list[int] | None = None, pointer_core: bool = False, length_multiple: int = 1,
                 pointer_element: bool = False):
        if not 0.0 <= grid_aug <= 1.0:
            raise ValueError(f"grid_aug must be in [0, 1], got {grid_aug}")
        self.tokenizer_dir, self.vision, self.batch_size = str(tokenizer_dir), vision, batch_size
        self.seed, self.queries, self.split, self.options = seed, queries, split, dict(options or {})
        self.chars, self.short_followups, self.grid_aug = chars, short_followups, grid_aug
        self.match, self.pad, self.seeds, self.pointer_core = match, pad, seeds, pointer_core
        if length_multiple < 1:
            raise ValueError(f"length_multiple must be >= 1, got {length_multiple}")
        self.length_multiple, self.pointer_element = length_multiple, pointer_element
        self._processor, self._grid, self._coords = None, None, None

    def __len__(self) -> int:
        return 2**62

    def __getstate__(self):  # workers (spawned or forked) build their own Processor
        return {**self.__dict__, "_processor": None}

    @property
    def processor(self) -> Processor:
        if self._processor is None:
            vis = self.vision
            self._processor = Processor.from_pretrained(self.tokenizer_dir,
                                                        image_processor=lambda im: uint8_tiles(im, vis, self._grid))
        return self._processor

    def sample_seed(self, step: int, i: int) -> int:
        return self.seed * 10**12 + step * self.batch_size + i

    def row(self, sample, rng: random.Random) -> tuple:
        """One screen -> (ids, labels, uint8 tiles, tiles per image, targets): targets holds the image-token
        classes and positions (``image_token_targets``; with ``chars`` the characters too) and, per
        question, the sequence position that predicts its answer's first token ("pointer_pos") and the
        image tokens on its element ("pointer_tokens", ``pointer_tokens``)."""
        from ..data import to_messages

        p = self.processor
        messages = to_messages(sample)
        grid = None
        if self.grid_aug and rng.random() < self.grid_aug:
            grid = augmented_grid(sample.size, self.vision, rng)
        self._grid = grid  # read by the processor's image_processor
        try:
            prompt = p(messages[:-1], add_generation_prompt=True)  # the inference prompt, image expanded
        finally:
            self._grid = None
        ids = prompt["input_ids"][0].tolist()
        labels = [IGNORE] * len(ids)
        q_pos, boxes = [len(ids) - 1], [sample.target.box]
        ans = answer_ids(p, messages[-1]["content"])
        coords = self._coord_targets(len(ids), ans, sample.target.box, sample.size)
        ids, labels = ids + ans, labels + ans
        for instruction, answer, box in extra_targets(sample, self.queries - 1, rng, boxes=True):
            follow = p.encode(followup_text(instruction, short=self.short_followups))
            ans = answer_ids(p, answer)
            q_pos.append(len(ids) + len(follow) - 1)
            boxes.append(box)
            coords += self._coord_targets(len(ids) + len(follow), ans, box, sample.size)
            ids += follow + ans
            labels += [IGNORE] * len(follow) + ans
        cls, pos, *chars = image_token_targets(sample, self.vision, chars=self.chars, grid=grid)
        owner = {tuple(e.box): e for e in sample.elements}
        cell = token_cell(sample.size, self.vision, grid)
        points = _sub_points(pos, sample.size, cell)  # once per screen, not per question

        def on_element(b, labels=True):  # the image tokens a question's pointer puts its probability on
            if tuple(b) not in owner:
                return pointer_tokens(b, sample.size, pos, cls)
            if self.pointer_core:
                return element_core_tokens(sample, owner[tuple(b)], pos, cls, labels=labels)
            return element_tokens(sample, owner[tuple(b)], pos, cls, cell, points, labels=labels)

        targets = {"image_classes": cls, "image_positions": pos, "pointer_pos": q_pos,
                   "pointer_tokens": [on_element(b) for b in boxes], "coords": coords}
        if self.pointer_element:
            targets["pointer_tokens_el"] = [on_element(b, labels=False) for b in boxes]
        if chars:
            targets["image_chars"] = chars[0]
        if self.match:
            from ..data.instructions import ROLE_NAMES

            targets["match"] = match_targets(sample, p.encode, pos, cls, ROLE_NAMES, cell)
        return ids, labels, prompt["pixel_values"], prompt["num_tiles"].tolist(), targets

    def __getitem__(self, step: int) -> dict:
        from ..data import generate_sample

        rows = []
        for i in range(self.batch_size):
            seed = self.seeds[i] if self.seeds is not None else self.sample_seed(step, i)
            sample = generate_sample(seed, split=self.split, **self.options)
            if self.pad is not None:
                sample = self.pad(sample, random.Random(seed + 1))
            rows.append(self.row(sample, random.Random(seed)))
        return collate(rows, self.processor.pad_token_id, self.processor.image_token_id, self.length_multiple)

    def _coord_targets(self, start: int, ans: list[int], box, size) -> list[tuple]:
        """(label position, lo, hi, centre) for the coordinate tokens of an answer whose tokens ``ans`` start at
        sequence position ``start``: the first is x, the second y; [] when the tokenizer has no coordinate
        tokens."""
        if self._coords is None:
            from ..tokenizer import coordinate_token_ids

            ids = coordinate_token_ids(self.processor)
            self._coords = {t: k for k, t in enumerate(ids)} if ids else {}
        if not self._coords:
            return []
        from .coords import coordinate_box_range

        x_lo, x_hi, y_lo, y_hi = coordinate_box_range(box, size)
        at = [(start + i, self._coords[t]) for i, t in enumerate(ans) if t in self._coords][:2]
        if len(at) < 2:
            return []
        (px, x), (py, y) = at
        # an axis no value lands on (a box under a unit wide) keeps the answer's own value
        return [(px, min(x_lo, x), max(x_hi, x), x), (py, min(y_lo, y), max(y_hi, y), y)]


def collate(rows, pad_id: int, image_token_id: int | None = None, multiple: int = 1) -> dict:
    """Right-pad rows of (ids, labels, tiles, num_tiles[, targets]) into one batch (targets as
    ``ScreenBatches.row``'s; the pointer's become "pointer_queries" (Q, 2): (row, sequence position) per
    question, and "pointer_targets" (M, 2): (question, image token of its row) per token on its element).
    With ``image_token_id`` also ``step_indices``' tensors, so the loss finds its positions without reading
    the device (they are worked out here, in the data workers). ``multiple``: the rows' length rounded up to a
    multiple of it (more pads, whose labels are ignored and which no real token attends to: the losses do not
    change; the batches' shapes repeat, so cuDNN's attention plans and torch.compile's graphs are reused)."""
    T = -(-max(len(r[0]) for r in rows) // multiple) * multiple
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    for b, (i, l, *_) in enumerate(rows):
        ids[b, :len(i)] = torch.tensor(i)
        labels[b, :len(l)] = torch.tensor(l)
    out = {
        "input_ids": ids, "labels": labels,
        "pixel_values": _cat_shared([r[2] for r in rows]),
        "num_tiles": torch.tensor([n for r in rows for n in r[3]], dtype=torch.long),
        "tokens": int(sum(len(r[0]) for r in rows)),
        **_collate_targets([r[4] for r in rows] if all(len(r) > 4 for r in rows) else []),
    }
    if image_token_id is not None:
        out.update(step_indices(out, image_token_id))
    return out


def _cat_shared(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)``; in a DataLoader worker into shared memory, as ``default_collate`` does, so that the
    batch's largest tensor is not copied once more on its way to the main process."""
    if torch.utils.data.get_worker_info() is None:
        return torch.cat(parts)
    first = parts[0]
    shared = first._typed_storage()._new_shared(sum(p.numel() for p in parts), device=first.device)
    return torch.cat(parts, out=first.new(shared).view(-1, *first.shape[1:]))


def step_indices(batch: dict, image_token_id: int) -> dict:
    """What the grounding loss (holotron/train/losses.py) would otherwise find on the device with boolean masks
    (each a wait for the device), from the batch's host tensors: "answer_index", the flat positions b * T + t of
    ``input_ids`` (B, T) that predict a labelled token (t < T - 1, row-major: the order of ``h[:, :-1][keep]``),
    and "answer_labels", those labels; "image_index", the flat positions of the image tokens (row-major);
    with "coord_targets", "coord_rows": the answer position of each coordinate (its row among "answer_index");
    with the pointer's targets, ``pointer.pointer_layout``'s tensors."""
    ids, labels = batch["input_ids"], batch["labels"]
    keep = labels[:, 1:] != IGNORE
    T = ids.shape[1]
    flat = (torch.arange(ids.shape[0])[:, None] * T + torch.arange(T - 1)[None, :])[keep]
    out = {"answer_index": flat, "answer_labels": labels.reshape(-1)[flat + 1],
           "image_index": (ids.reshape(-1) == image_token_id).nonzero().squeeze(1)}
    if "coord_targets" in batch:
        c = batch["coord_targets"]
        out["coord_rows"] = torch.searchsorted(flat, c[:, 0] * T + c[:, 1] - 1)
    if "pointer_queries" in batch:
        out.update(pointer_layout(keep, batch["pointer_queries"], batch["pointer_targets"], ids == image_token_id,
                                  batch.get("pointer_targets_el")))
    return out


def _collate_targets(targets: list[dict]) -> dict:
    out = {}
    if not targets:
        return out
    for key in ("image_classes", "image_positions", "image_chars"):
        if all(key in t for t in targets):
            out[key] = torch.cat([t[key] for t in targets])
    if all("coords" in t for t in targets):
        out["coord_targets"] = torch.tensor([(b, *c) for b, t in enumerate(targets) for c in t["coords"]],
                                            dtype=torch.long).reshape(-1, 5)
    if all("match" in t for t in targets):
        out.update(collate_match([t["match"] for t in targets], [len(t["image_classes"]) for t in targets]))
    if all("pointer_pos" in t for t in targets):
        queries = [(b, pos) for b, t in enumerate(targets) for pos in t["pointer_pos"]]
        out["pointer_queries"] = torch.tensor(queries, dtype=torch.long).reshape(-1, 2)
        out["pointer_targets"] = token_pairs([tk for t in targets for tk in t["pointer_tokens"]])
        if all("pointer_tokens_el" in t for t in targets):
            out["pointer_targets_el"] = token_pairs([tk for t in targets for tk in t["pointer_tokens_el"]])
    return out

