"""The data workers' fast paths give what their plain definitions give: ``_last_box`` (the last box in paint
order holding each point) painted on the grid of the points' coordinates against every point tested against
every box; the (question, token) pairs of a batch built as tensors against the pairs listed one by one; the
characters' edges composed from advances and kernings against ``getlength`` of every prefix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from holotron.data.canvas import font
from holotron.data.faces import FACES, canvas_face
from holotron.train.matching import collate_match, token_pairs
from holotron.train.targets import _face_metrics, _last_box, _prefix_widths


def _last_box_reference(boxes, px, py):
    out = np.full(px.size, -1, dtype=np.int64)
    for k, (x, y) in enumerate(zip(px.reshape(-1), py.reshape(-1))):
        for i, b in enumerate(boxes):
            if b[0] <= x < b[2] and b[1] <= y < b[3]:
                out[k] = i
    return out


def _boxes(rng, n, w, h):
    x0, y0 = rng.integers(0, w, n), rng.integers(0, h, n)
    return np.stack([x0, y0, x0 + rng.integers(0, w // 3, n), y0 + rng.integers(0, h // 3, n)], 1).astype(float)


@pytest.mark.parametrize("seed", range(4))
def test_last_box_on_a_grid_and_on_scattered_points_equals_testing_every_box(seed):
    rng = np.random.default_rng(seed)
    w, h = 97, 61
    boxes = _boxes(rng, 40, w, h)                                   # overlapping, some empty, edges on points
    gx, gy = np.meshgrid(np.arange(0, w, 3.0), np.arange(0, h, 2.0))  # a grid (integer points: edges matter)
    sx, sy = rng.uniform(0, w, 300), rng.uniform(0, h, 300)          # scattered: the point-by-box path
    for px, py in ((gx, gy), (gx[:, :, None] + 0.5 * np.arange(2), gy[:, :, None] + 0 * np.arange(2)), (sx, sy)):
        got = _last_box(boxes, px, py)
        assert got.dtype == np.int64 and got.shape == (px.size,)
        assert np.array_equal(got, _last_box_reference(boxes, px, py))
        assert (got >= 0).any() and (got == -1).any()
    for px, py in ((gx, gy), (sx, sy)):
        assert np.array_equal(_last_box(boxes[:0], px, py), np.full(px.size, -1))


def test_question_token_pairs_equal_the_pairs_listed_one_by_one():
    toks = [torch.tensor([5, 2, 9]), torch.tensor([], dtype=torch.long), np.array([7]), torch.tensor([1, 1])]
    want = [(q, int(i)) for q, t in enumerate(toks) for i in t]
    got = token_pairs(toks)
    assert got.dtype == torch.long and got.tolist() == [list(p) for p in want]
    assert token_pairs([]).shape == (0, 2)
    targets = [{"queries": [([3, 4], 1, torch.tensor([0, 2])), ([5], 2, torch.tensor([1]))],
                "words": torch.tensor([3, -100, 4]), "centres": torch.zeros(3, 3)},
               {"queries": [([6], 1, torch.tensor([2, 0, 1]))], "words": torch.tensor([-100, 6, 6]),
                "centres": torch.zeros(3, 3)}]
    out = collate_match(targets, [3, 3])
    assert out["match_pairs"].tolist() == [[0, 0], [0, 2], [1, 1], [2, 2], [2, 0], [2, 1]]
    assert out["match_slot"].tolist() == [0, 1, 0] and out["match_screen"].tolist() == [0, 0, 1]


class _SharedCat(torch.utils.data.Dataset):
    """Items of ``batches._cat_shared``: its result, whether it was in shared memory before the trip to the main
    process, and the plain ``torch.cat`` of the same parts."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        from holotron.train.batches import _cat_shared

        g = torch.Generator().manual_seed(i)
        parts = [torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8, generator=g) for n in (1, 2, 1)]
        out = _cat_shared(parts)
        return out, out.is_shared(), torch.cat(parts)


def test_batch_tiles_are_concatenated_into_shared_memory_in_a_worker_and_equal_a_plain_cat():
    from holotron.train.batches import _cat_shared

    parts = [torch.arange(12, dtype=torch.uint8).view(1, 3, 2, 2), torch.zeros(2, 3, 2, 2, dtype=torch.uint8)]
    assert torch.equal(_cat_shared(parts), torch.cat(parts))   # outside a worker: torch.cat itself
    loader = torch.utils.data.DataLoader(_SharedCat(), batch_size=None, num_workers=1)
    for out, shared, want in loader:
        assert shared, "the worker's concatenation was not in shared memory"
        assert out.shape == (4, 3, 4, 4) and torch.equal(out, want)


@pytest.mark.parametrize("name", sorted(FACES))
def test_prefix_widths_from_advances_and_kernings_equal_getlength_of_every_prefix(name):
    face = canvas_face(name)
    rng = np.random.default_rng(len(name))
    alphabet = list("AVTWYLPFoaeyrvw.,'-/() 0123456789") + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    texts = ["AV To Ty LT Wa Yo P. F,", "Invoice INV-20417", "notes_v2.pdf", "x"]
    texts += ["".join(rng.choice(alphabet, int(rng.integers(1, 25)))) for _ in range(300)]
    f = font(64, face)
    for text in texts:
        assert _prefix_widths(text, face) == [f.getlength(text[:i + 1]) for i in range(len(text))], text
    assert _face_metrics(face)[1], "the advances were not cached"


def test_some_bundled_face_kerns_so_the_composition_is_tested_with_kernings():
    kerned = []
    for name in FACES:
        face = canvas_face(name)
        _prefix_widths("AV To Ty LT Wa Yo P. F,", face)
        kerned += [k for k in _face_metrics(face)[2].values() if k != 0]
    assert kerned
