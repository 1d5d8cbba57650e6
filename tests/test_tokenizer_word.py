"""The "word" tokenizer (holotron/tokenizer.py): one token per label word and per coordinate 0 .. 1000, the
reserved special ids of the "bpe" kind; and holotron/train/coords.py (number-token embeddings, the values
that hit a box)."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
import torch
from tiny_tokenizer import build_tokenizer
from tokenizers import Tokenizer

from holotron.data import all_labels, generate_sample
from holotron.data.instructions import answer_text, click_point, to_messages
from holotron.grounding import Box, Point, localization_messages, parse_click, point_in_box
from holotron.model import Holotron
from holotron.processor import Processor
from holotron.tokenizer import (
    SPECIAL_IDS,
    build_task_tokenizer,
    coordinate_token_ids,
    label_words,
    main,
    split_label_words,
    train_tokenizer,
    train_word_tokenizer,
)
from holotron.train.coords import coordinate_box_range, coordinate_features, init_coordinate_embeddings
from holotron.train.inputs import prepare_tokenizer
from holotron.train.presets import make_config

N_CORPUS = 200
TILE_TOKENS = 4


def _stub_preprocess(image):
    """One tile of TILE_TOKENS image tokens, whatever the image."""
    return torch.zeros(1, 3, 8, 8), TILE_TOKENS


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_task_tokenizer(tmp_path_factory.mktemp("word"), None, N_CORPUS, kind="word")


@pytest.fixture(scope="module")
def proc(folder):
    return Processor.from_pretrained(folder, image_processor=_stub_preprocess)


@pytest.fixture(scope="module")
def cids(proc):
    return coordinate_token_ids(proc)


def _random_points(n: int, seed: int = 0) -> list[Point]:
    rng = random.Random(seed)
    corners = [Point(0, 0), Point(1000, 1000), Point(0, 1000), Point(1000, 0), Point(9, 10), Point(99, 100)]
    return corners + [Point(rng.randint(0, 1000), rng.randint(0, 1000)) for _ in range(n)]


# ------------------------------------------------------------------------------------------------
# the tokenizer
# ------------------------------------------------------------------------------------------------

def test_reserved_special_ids_are_unchanged(proc):
    tok = proc.tokenizer
    for token, i in SPECIAL_IDS.items():
        assert tok.token_to_id(token) == i and proc.encode(token) == [i]
    assert list(range(32)) == sorted(SPECIAL_IDS.values())
    assert proc.eos_token_id == 12 and proc.image_token_id == 18 and proc.pad_token_id == 0


def test_one_id_per_coordinate(proc, cids):
    assert cids is not None and len(cids) == 1001 and len(set(cids)) == 1001
    for k, i in enumerate(cids):
        assert proc.encode(str(k)) == [i] and proc.decode([i], skip_special_tokens=True) == str(k)
    # "0" .. "9" keep their byte symbols' ids; "10" .. "1000" follow the trained vocabulary, in order
    n = proc.vocab_size
    assert cids[10:] == list(range(n - 991, n)) and all(32 <= i < 288 for i in cids[:10])
    assert coordinate_token_ids(proc.tokenizer) == cids
    # any digit run is still written, longest numbers first
    assert proc.decode(proc.encode("2024 10000 007")) == "2024 10000 007"
    assert proc.encode("2024") == [cids[202], cids[4]]


def test_answer_round_trip(proc, cids):
    eot = SPECIAL_IDS["<SPECIAL_12>"]
    for p in _random_points(500):
        text = answer_text(p)
        ids = proc.encode(text)
        assert len(ids) == 9 and ids[3] == cids[int(p.x)] and ids[7] == cids[int(p.y)], (text, ids)
        assert proc.decode(ids) == text == proc.decode(ids, skip_special_tokens=True)
        assert proc.decode(ids + [eot], skip_special_tokens=True) == text
        assert parse_click(proc.decode(ids)) == p


def test_stream_decoding_gives_the_same_text(proc):
    eot = SPECIAL_IDS["<SPECIAL_12>"]
    for p in _random_points(100, seed=1):
        text = answer_text(p)
        ids = proc.encode(text) + [eot]
        d = proc.stream_decoder()
        chunks = [d.put(i) for i in ids] + [d.flush()]
        assert "".join(chunks) == d.text == text
        raw = proc.stream_decoder(skip_special_tokens=False)
        assert "".join([raw.put(i) for i in ids] + [raw.flush()]) == text + "<SPECIAL_12>"
        whole = proc.stream_decoder()
        assert whole.put(torch.tensor(ids)) + whole.flush() == text


def test_every_label_word_is_one_token_in_every_context(proc):
    assert split_label_words(proc) == []
    tok = proc.tokenizer
    word_id: dict[str, int] = {}
    for label in all_labels():
        for text in (label, f" {label}", f"'{label}'", f'"{label}"', f"the {label} button", f"click '{label}'"):
            enc = tok.encode(text, add_special_tokens=False)
            by_span = dict(zip(enc.offsets, enc.ids))
            for m in re.finditer(r"[^\W\d_]+", text):
                assert m.span() in by_span, (label, text, enc.tokens)
                assert word_id.setdefault(m.group(), by_span[m.span()]) == by_span[m.span()], (m.group(), text)
    assert set(label_words()) <= set(word_id)
    save = tok.token_to_id("Save")
    assert all(save in tok.encode(t).ids for t in ("Save", " Save", "'Save'", '"Save"'))


def test_chat_template_renders_a_grounding_prompt(proc, cids):
    msgs = localization_messages("the 'Save' button", object())
    text = proc.apply_chat_template(msgs)
    ids = proc.encode(text)
    assert ids[0] == SPECIAL_IDS["<SPECIAL_10>"] and ids.count(SPECIAL_IDS["<SPECIAL_11>"]) == 2
    assert ids.count(SPECIAL_IDS["<image>"]) == 1 and ids[-2:] == [SPECIAL_IDS["<think>"], SPECIAL_IDS["</think>"]]
    assert max(ids) < proc.vocab_size and proc.token_to_id("<unk>") not in ids
    assert proc.decode(ids) == text
    out = proc(msgs)  # the image placeholder expanded: <img> <image> x 4 </img>
    row = out.input_ids[0].tolist()
    img = SPECIAL_IDS["<image>"]
    start = row.index(SPECIAL_IDS["<img>"])
    assert row[start:start + TILE_TOKENS + 2] == [SPECIAL_IDS["<img>"]] + [img] * TILE_TOKENS + [SPECIAL_IDS["</img>"]]
    # a training sample: the answer's 9 tokens then the end of turn, as rendered by the template
    sample = generate_sample(3, render=False)
    full = proc.encode(proc.apply_chat_template(to_messages(sample, image=False), add_generation_prompt=False))
    answer = proc.encode(sample.answer)
    at = next(i for i in range(len(full)) if full[i:i + len(answer)] == answer)
    assert full[at + len(answer):at + len(answer) + 2] == proc.encode("\n<SPECIAL_12>")
    assert answer[3] == cids[int(sample.point.x)] and answer[7] == cids[int(sample.point.y)]


def test_bpe_kind_has_no_coordinate_tokens(folder):
    assert coordinate_token_ids(build_tokenizer()) is None
    assert coordinate_token_ids(train_tokenizer(["{\"x\": 624, \"y\": 646}"] * 5, 300, split_digits=True)) is None
    with pytest.raises(TypeError, match="tokenizers.Tokenizer or a holotron.Processor"):
        coordinate_token_ids("tokenizer.json")
    assert coordinate_token_ids(Tokenizer.from_file(str(folder / "tokenizer.json"))) is not None


def test_word_tokenizer_cap_and_kinds(tmp_path):
    capped = train_word_tokenizer(["Save Settings Cancel"] * 3, vocab_size=300, coordinates=False)
    assert capped.get_vocab_size() == 300 and capped.token_to_id("100") is None
    with pytest.raises(ValueError, match="at least 288"):
        train_word_tokenizer(["x"], vocab_size=100)
    with pytest.raises(ValueError, match="leaves .* label words in pieces"):
        build_task_tokenizer(tmp_path / "small", 1000, 5, kind="word")
    with pytest.raises(ValueError, match="unknown tokenizer kind 'wordpiece'"):
        build_task_tokenizer(tmp_path / "x", None, 5, kind="wordpiece")


def test_command_line_and_prepare_tokenizer(tmp_path, capsys):
    assert main(["--kind", "word", "--out", str(tmp_path / "cli"), "--n", "20"]) == 0
    err = capsys.readouterr().err
    assert f"{len(label_words())} of {len(label_words())} label words one token" in err
    assert "a click answer 9 tokens" in err
    args = SimpleNamespace(tokenizer=None, resume=None, init_from=None, vocab_size=2048, tokenizer_corpus=20,
                           tokenizer_kind="word")
    logged = []
    folder = prepare_tokenizer(args, tmp_path / "run", logged.append)
    assert coordinate_token_ids(Tokenizer.from_file(str(folder / "tokenizer.json"))) is not None
    assert "trained the word tokenizer" in logged[0]
    assert prepare_tokenizer(args, tmp_path / "run", logged.append) == folder and len(logged) == 1  # reused
    with pytest.raises(SystemExit, match="holds a word tokenizer but the run asks for --tokenizer-kind bpe"):
        prepare_tokenizer(SimpleNamespace(**{**vars(args), "tokenizer_kind": "bpe"}), tmp_path / "run", print)


# ------------------------------------------------------------------------------------------------
# number-token embeddings
# ------------------------------------------------------------------------------------------------

def _micro_model(vocab_size: int) -> Holotron:
    torch.manual_seed(0)
    return Holotron(make_config("micro", vocab_size)).init_weights(0)


def _cos_pairs(rows: torch.Tensor, pairs: list[tuple[int, int]]) -> float:
    a, b = rows[[i for i, _ in pairs]], rows[[j for _, j in pairs]]
    return float(torch.nn.functional.cosine_similarity(a, b, dim=1).mean())


def test_init_coordinate_embeddings(proc, cids):
    model = _micro_model(proc.vocab_size)
    lm = model.language_model
    emb, head = lm.backbone.embeddings.weight, lm.lm_head.weight
    emb0, head0 = emb.detach().clone(), head.detach().clone()
    assert init_coordinate_embeddings(model, cids, seed=0) is model
    index = torch.tensor(cids)
    others = torch.ones(emb.shape[0], dtype=torch.bool)
    others[index] = False
    assert torch.equal(emb[others], emb0[others]) and torch.equal(head[others], head0[others])
    assert not torch.equal(emb[index], emb0[index]) and not torch.equal(head[index], head0[index])
    for new, old in ((emb[index], emb0), (head[index], head0)):  # the norm of the other rows
        assert torch.allclose(new.norm(dim=1), old[others].norm(dim=1).mean().expand(1001), rtol=1e-4)
    # lm_head rows: the same directions as the embedding's
    assert torch.allclose(torch.nn.functional.cosine_similarity(emb[index], head[index], dim=1),
                          torch.ones(1001), atol=1e-5)
    rows = emb[index].detach()
    rng = random.Random(0)
    near = [(k, k + 1) for k in range(1000)]
    far = [(a, b) for a, b in ((rng.randint(0, 1000), rng.randint(0, 1000)) for _ in range(3000)) if abs(a - b) > 100]
    assert _cos_pairs(rows, near) > 0.5 > _cos_pairs(rows, far) + 0.25
    # the same seed gives the same rows; a fixed scale sets the norm
    again = _micro_model(proc.vocab_size)
    init_coordinate_embeddings(again, cids, seed=0, scale=2.0)
    arows = again.language_model.backbone.embeddings.weight[index].detach()
    assert torch.allclose(arows, rows / rows.norm(dim=1, keepdim=True) * 2.0, atol=1e-5)


def test_init_coordinate_embeddings_tied_and_errors(proc, cids):
    model = _micro_model(proc.vocab_size)
    lm = model.language_model
    lm.lm_head.weight = lm.backbone.embeddings.weight  # tied: one tensor, written once
    before = lm.backbone.embeddings.weight.detach().clone()
    init_coordinate_embeddings(model, cids)
    index = torch.tensor(cids)
    keep = torch.ones(before.shape[0], dtype=torch.bool)
    keep[index] = False
    w = lm.backbone.embeddings.weight.detach()
    assert lm.lm_head.weight is lm.backbone.embeddings.weight and torch.equal(w[keep], before[keep])
    assert torch.allclose(w[index].norm(dim=1), before[keep].norm(dim=1).mean().expand(1001), rtol=1e-4)
    with pytest.raises(ValueError, match="must hold 1001 distinct token ids"):
        init_coordinate_embeddings(model, cids[:-1])
    with pytest.raises(ValueError, match="must lie in 0 .. 99"):
        init_coordinate_embeddings(_micro_model(100), cids)
    with pytest.raises(TypeError, match="expected a holotron Holotron"):
        init_coordinate_embeddings(torch.nn.Linear(2, 2), cids)
    feats = coordinate_features()
    assert feats.shape == (1001, 19) and feats[1000, -1] == 1.0 and feats[0, -1] == 0.0


# ------------------------------------------------------------------------------------------------
# values that hit a box
# ------------------------------------------------------------------------------------------------

def _random_case(rng: random.Random):
    if rng.random() < 0.7:
        w, h = rng.randint(20, 4000), rng.randint(20, 4000)
    else:
        w, h = rng.uniform(20, 4000), rng.uniform(20, 4000)
    small = rng.random() < 0.3  # small boxes: some have no value at all on an axis

    def edges(size):
        a = rng.uniform(0, size) if rng.random() < 0.3 else rng.randint(0, int(size) - 1)
        span = rng.uniform(0, 4) if small else rng.uniform(0, size - a)
        return a, min(size, a + (span if isinstance(a, float) or small else round(span)))

    (x0, x1), (y0, y1) = edges(w), edges(h)
    return (x0, y0, x1, y1), (w, h)


def test_coordinate_box_range_is_the_scorers_rule():
    rng = random.Random(0)
    empty = 0
    for case in range(3000):
        box_px, (w, h) = _random_case(rng)
        box = Box(*box_px)
        x_lo, x_hi, y_lo, y_hi = coordinate_box_range(box_px, (w, h))
        assert coordinate_box_range(box, (w, h)) == (x_lo, x_hi, y_lo, y_hi)
        if x_lo > x_hi or y_lo > y_hi:
            empty += 1
            assert (x_lo == x_hi + 1 or y_lo == y_hi + 1)
            # no click lands: every value of an empty axis misses, the other axis at a value of its own range
            if x_lo > x_hi:
                y = y_lo if y_lo <= y_hi else 0
                assert not any(point_in_box(Point(x, 0), Box(box.x0, 0, box.x1, 0), w, 1) for x in range(1001))
                assert not any(point_in_box(Point(x, y), box, w, h) for x in range(1001))
            if y_lo > y_hi:
                x = x_lo if x_lo <= x_hi else 0
                assert not any(point_in_box(Point(0, y), Box(0, box.y0, 0, box.y1), 1, h) for y in range(1001))
                assert not any(point_in_box(Point(x, y), box, w, h) for y in range(1001))
            continue
        ym, xm = (y_lo + y_hi) // 2, (x_lo + x_hi) // 2
        for x in {x_lo, x_hi, xm}:
            assert point_in_box(Point(x, ym), box, w, h), (box_px, w, h, x)
        for y in {y_lo, y_hi, ym}:
            assert point_in_box(Point(xm, y), box, w, h), (box_px, w, h, y)
        for x in (x_lo - 1, x_hi + 1):
            assert not (0 <= x <= 1000 and point_in_box(Point(x, ym), box, w, h)), (box_px, w, h, x)
        for y in (y_lo - 1, y_hi + 1):
            assert not (0 <= y <= 1000 and point_in_box(Point(xm, y), box, w, h)), (box_px, w, h, y)
        if case < 40:  # every value, both axes
            assert [point_in_box(Point(x, ym), box, w, h) for x in range(1001)] == [
                x_lo <= x <= x_hi for x in range(1001)]
            assert [point_in_box(Point(xm, y), box, w, h) for y in range(1001)] == [
                y_lo <= y <= y_hi for y in range(1001)]
    assert 0 < empty < 3000


def test_coordinate_box_range_edges():
    # 1000 px wide: value k is pixel k, and both edges count (x1 included, as the scorer does)
    assert coordinate_box_range((10, 20, 30, 40), (1000, 1000)) == (10, 30, 20, 40)
    assert coordinate_box_range((10, 20, 30, 40), (1000, 1000), rule="answer") == (10, 29, 20, 39)
    assert coordinate_box_range((0, 0, 1000, 1000), (1000, 1000)) == (0, 1000, 0, 1000)
    # 1920 px: 1.92 px a value; a 1 px box between two values holds none
    lo, hi, _, _ = coordinate_box_range((1, 0, 1.5, 10), (1920, 1080))
    assert lo == hi + 1
    with pytest.raises(ValueError, match="unknown rule"):
        coordinate_box_range((0, 0, 1, 1), (10, 10), rule="centre")
    with pytest.raises(ValueError, match="must be in pixels"):
        coordinate_box_range(Box(0, 0, 1, 1, space="normalized"), (10, 10))
    with pytest.raises(ValueError, match="positive"):
        coordinate_box_range((0, 0, 1, 1), (0, 10))


def test_coordinate_box_range_answer_rule_matches_the_training_answers():
    rng = random.Random(1)
    for _ in range(2000):
        box_px, (w, h) = _random_case(rng)
        w, h = int(w), int(h)
        box_px = tuple(float(round(v)) for v in box_px)
        x_lo, x_hi, y_lo, y_hi = coordinate_box_range(box_px, (w, h), rule="answer")
        score = coordinate_box_range(box_px, (w, h))
        x0, y0, x1, y1 = box_px
        try:
            p = click_point(box_px, w, h)
        except ValueError:  # too small for click_point's centre: then no value, or the centre misses it
            continue
        assert x_lo <= p.x <= x_hi and y_lo <= p.y <= y_hi
        assert score[0] <= x_lo and x_hi <= score[1] and score[2] <= y_lo and y_hi <= score[3]
        for x in (x_lo, x_hi):
            assert x0 <= x * w / 1000 <= x1 - 1
        for x in (x_lo - 1, x_hi + 1):
            assert not (0 <= x <= 1000 and x0 <= x * w / 1000 <= x1 - 1)
        for y in (y_lo - 1, y_hi + 1):
            assert not (0 <= y <= 1000 and y0 <= y * h / 1000 <= y1 - 1)
    for seed in range(20):  # generated screens: the answer lies in both ranges of its target
        s = generate_sample(seed, render=False)
        for rule in ("answer", "score"):
            x_lo, x_hi, y_lo, y_hi = coordinate_box_range(s.target.box, s.size, rule=rule)
            assert x_lo <= s.point.x <= x_hi and y_lo <= s.point.y <= y_hi
