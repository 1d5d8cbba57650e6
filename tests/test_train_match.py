"""The v2 training signals (holotron/train/matching.py, losses.py's in-box answer, batches.py's coordinate
targets): matching queries and their positives, the word under each token, element centres, the matching
loss and its stage, the in-box loss against a brute-force reading of the metric, and the command line's
match -> ground -> resume chain on the micro preset."""

from __future__ import annotations

import json
import math
import random
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (chunked scan on the CPU, one thread)

from holotron.data import generate_sample
from holotron.data.instructions import ROLE_NAMES
from holotron.grounding import Box, Point, point_in_box
from holotron.model import Holotron
from holotron.processor import Processor
from holotron.tokenizer import coordinate_token_ids
from holotron.train import AuxHeads, ScreenBatches, image_token_targets, init_weights, loss_fn, main, make_config
from holotron.train.element_tokens import element_core_tokens, element_tokens, token_cell
from holotron.train.losses import GAUSS_WEIGHT
from holotron.train.matching import MatchBatches, match_loss, match_stage_loss, match_targets


@pytest.fixture(scope="module")
def micro(word_tok):
    return make_config("micro", Processor.from_pretrained(word_tok).vocab_size)


def _tiny_ui_vision(vocab: int):
    return make_config("tiny-ui", vocab).vision


def test_tokens_in_boxes_equals_testing_every_sub_point():
    """``_tokens_in`` tests only the tokens near the boxes: the same tokens as every sub-point of every token
    against every box, on real screens (with tiles and their thumbnail) and random boxes, boxes on token
    edges, slivers, boxes off the screen and several boxes at once."""
    from holotron.train.element_tokens import _sub_points, _tokens_in
    from holotron.train.targets import _last_box

    vis = _tiny_ui_vision(500)
    rng = random.Random(3)
    for seed in range(4):
        s = generate_sample(seed)
        cls, pos = image_token_targets(s, vis)
        cell = token_cell(s.size, vis)
        points = _sub_points(pos, s.size, cell)
        tile = cls != -100
        w, h = s.size
        boxes = [e.box for e in s.elements[:6]] + [(0, 0, cell[0], cell[1]), (w - 1, h - 1, w + 50, h + 50),
                                                   (-40, -40, -1, -1), (10, 10, 10.5, 300)]
        for _ in range(20):
            x0, y0 = rng.uniform(-20, w), rng.uniform(-20, h)
            boxes.append((x0, y0, x0 + rng.uniform(0.2, 300), y0 + rng.uniform(0.2, 120)))
        for k in (1, 2, 3):
            for i in range(0, len(boxes) - k + 1, k):
                group = boxes[i:i + k]
                last = _last_box(np.array(group, dtype=np.float64).reshape(-1, 4), *points).reshape(points[0].shape)
                want = torch.from_numpy((last >= 0).any(axis=1)) & tile
                assert torch.equal(_tokens_in(group, points, tile), want), (seed, group)


def test_queries_cover_each_unique_element_with_its_box_and_label_text(word_tok):
    p = Processor.from_pretrained(word_tok)
    vis = _tiny_ui_vision(p.vocab_size)
    for seed in range(6):
        s = generate_sample(seed)
        cls, pos = image_token_targets(s, vis)
        cell = token_cell(s.size, vis)
        t = match_targets(s, p.encode, pos, cls, ROLE_NAMES, cell)
        assert t["queries"], seed
        w, h = s.size
        for words, role, toks in t["queries"]:
            assert words and role >= 0 and len(toks)
            assert int(toks.max()) < len(cls)
        # a target-role element's query holds every token whose centre is on its box
        x, y = pos[:, 0] * w, pos[:, 1] * h
        for e in s.elements:
            toks = set(element_tokens(s, e, pos, cls, cell).tolist())
            assert toks
            if e.box[2] - e.box[0] >= cell[0] and e.box[3] - e.box[1] >= cell[1]:
                on_box = ((x >= e.box[0]) & (x < e.box[2]) & (y >= e.box[1]) & (y < e.box[3])).nonzero().squeeze(1)
                assert set(on_box.tolist()) <= toks
            for text in s.texts:  # and the tokens whose cell the texts that spell its label overlap
                if text.text.strip().lower() == e.label.strip().lower():
                    near = ((x + cell[0] / 2 > text.box[0]) & (x - cell[0] / 2 < text.box[2])
                            & (y + cell[1] / 2 > text.box[1]) & (y - cell[1] / 2 < text.box[3]))
                    assert toks <= set(range(len(cls)))
                    assert toks & set(near.nonzero().squeeze(1).tolist())
        # centres: f is 1 on tokens that carry an element centre, and the centre lies in that element's box
        c = t["centres"]
        on = c[:, 2] == 1
        assert bool(on.any()) and bool((c[~on] == 0).all())
        boxes = [e.box for e in s.elements]
        for cx, cy in c[on][:, :2].tolist():
            assert any(b[0] <= cx * w <= b[2] and b[1] <= cy * h <= b[3] for b in boxes)


def test_core_pointer_tokens_have_their_centre_on_the_element_or_its_label_and_batches_use_them(word_tok):
    p = Processor.from_pretrained(word_tok)
    vis = _tiny_ui_vision(p.vocab_size)
    fewer = 0
    for seed in range(4):
        s = generate_sample(seed)
        cls, pos = image_token_targets(s, vis)
        cell = token_cell(s.size, vis)
        w, h = s.size
        x, y = pos[:, 0] * w, pos[:, 1] * h
        for e in s.elements:
            core = element_core_tokens(s, e, pos, cls)
            wide = set(element_tokens(s, e, pos, cls, cell).tolist())
            assert core.numel()
            boxes = [e.box] + [t.box for t in s.texts if t.text.strip().lower() == e.label.strip().lower()]
            for b in boxes:
                inside = ((x >= b[0]) & (x < b[2]) & (y >= b[1]) & (y < b[3])).nonzero().squeeze(1)
                assert set(inside.tolist()) <= set(core.tolist())  # every token centred on a box is in
            for i in core.tolist():  # and each one is centred on a box, or is a small box's nearest token
                on = any(b[0] <= x[i] < b[2] and b[1] <= y[i] < b[3] for b in boxes)
                assert on or not all(bool(((x >= b[0]) & (x < b[2]) & (y >= b[1]) & (y < b[3])).any()) for b in boxes)
            fewer += len(wide) > core.numel()
    assert fewer > 0  # the sub-point rule takes in tokens the centre rule leaves out
    # a batch with pointer_core: each question's tokens are its element's core tokens
    data = ScreenBatches(word_tok, make_config("micro", p.vocab_size).vision, batch_size=2, seed=5, queries=3,
                         short_followups=True, pointer_core=True)
    batch, plain = data[0], ScreenBatches(word_tok, data.vision, batch_size=2, seed=5, queries=3,
                                          short_followups=True)[0]
    assert torch.equal(batch["pointer_queries"], plain["pointer_queries"])
    assert batch["pointer_targets"].shape[0] <= plain["pointer_targets"].shape[0]
    assert set(batch["pointer_targets"][:, 0].tolist()) == set(range(batch["pointer_queries"].shape[0]))
    s = generate_sample(data.sample_seed(0, 0), split="train")
    cls, pos = image_token_targets(s, data.vision)
    first = batch["pointer_targets"][batch["pointer_targets"][:, 0] == 0, 1]
    assert torch.equal(first, element_core_tokens(s, s.target, pos, cls))
    with pytest.raises(SystemExit, match="--pointer-core"):
        main(["--config", "micro", "--pointer-core", "--out", "unused"])


def test_the_word_under_a_token_is_the_id_of_the_word_the_token_centre_falls_on(word_tok):
    p = Processor.from_pretrained(word_tok)
    vis = _tiny_ui_vision(p.vocab_size)
    s = generate_sample(3)
    cls, pos = image_token_targets(s, vis)
    cell = token_cell(s.size, vis)
    t = match_targets(s, p.encode, pos, cls, ROLE_NAMES, cell)
    words = t["words"]
    assert int((words >= 0).sum()) > 25
    w, h = s.size
    for i in (words >= 0).nonzero().squeeze(1).tolist():
        x, y = float(pos[i, 0]) * w, float(pos[i, 1]) * h
        holders = [tx for tx in s.texts if tx.box[0] < x + cell[0] / 2 and x - cell[0] / 2 < tx.box[2]
                   and tx.box[1] < y + cell[1] / 2 and y - cell[1] / 2 < tx.box[3]]
        ids = {int(p.encode(word)[0]) for tx in holders for word in re.findall(r"[A-Za-z]+|\d+", tx.text)}
        assert int(words[i]) in ids
    # tokens whose cell no text overlaps carry none
    x, y = pos[:, 0] * w, pos[:, 1] * h
    near = torch.zeros(len(words), dtype=torch.bool)
    for tx in s.texts:
        near |= ((x + cell[0] / 2 > tx.box[0]) & (x - cell[0] / 2 < tx.box[2])
                 & (y + cell[1] / 2 > tx.box[1]) & (y - cell[1] / 2 < tx.box[3]))
    assert int((~near).sum()) > 500 and bool((words[~near] == -100).all())


def _batch(word_tok, n=2, seed=0):
    p = Processor.from_pretrained(word_tok)
    cfg = make_config("micro", p.vocab_size)
    return cfg, MatchBatches(word_tok, cfg.vision, n, seed=seed)[0]


def test_match_loss_is_the_query_softmax_over_its_screens_tokens(word_tok):
    cfg, batch = _batch(word_tok)
    torch.manual_seed(0)
    heads = AuxHeads(cfg).match
    emb = torch.nn.Embedding(cfg.text.vocab_size, cfg.text.hidden_size)
    n = int(batch["match_tokens"].sum())
    img = torch.randn(n, cfg.text.hidden_size)
    parts = {}
    loss = match_loss(heads, emb, img, batch, "cpu", parts)
    # brute force: query by query
    counts = batch["match_tokens"].tolist()
    starts = np.cumsum([0] + counts)
    total, hits = [], 0
    for j in range(batch["match_words"].shape[0]):
        b = int(batch["match_screen"][j])
        ids = [i for i in batch["match_words"][j].tolist() if i >= 0]
        q = heads.q_words(emb.weight[ids].mean(0)) + heads.q_role(emb.weight[int(batch["match_role"][j])])
        k = heads.key(img[starts[b]:starts[b + 1]])
        s = (k @ q) / math.sqrt(q.numel())
        pos = batch["match_pairs"][batch["match_pairs"][:, 0] == j, 1]
        total.append(torch.logsumexp(s, 0) - torch.logsumexp(s[pos], 0))
        hits += int(int(s.argmax()) in set(pos.tolist()))
    assert parts["match"] == pytest.approx(float(torch.stack(total).mean().detach()), rel=1e-4)
    assert parts["match_acc"] == pytest.approx(hits / len(total))
    assert {"word", "word_acc", "centre"} <= set(parts)
    loss.backward()
    assert emb.weight.grad is not None and float(emb.weight.grad.abs().sum()) > 0


def test_the_match_stage_learns_a_fixed_batch_on_the_micro_preset(word_tok):
    cfg, batch = _batch(word_tok, n=2, seed=1)
    torch.manual_seed(0)
    model = init_weights(Holotron(cfg), 0)
    aux = AuxHeads(cfg)
    params = [*model.vision_model.parameters(), *model.mlp1.parameters(), *aux.match.parameters(),
              *model.language_model.backbone.embeddings.parameters(), *aux.char_in.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    first = last = None
    for _ in range(40):
        parts = {}
        loss, _ = match_stage_loss(model, aux, batch, "cpu", parts)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = first if first is not None else parts["match"]
        last = parts["match"]
    assert last < 0.75 * first


def _logits_for(coords, V, coord_ids, value_at):
    logits = torch.full((len(coords), V), -20.0)
    for r, v in enumerate(value_at):
        logits[r, coord_ids[v]] = 10.0
    return logits


def test_the_in_box_answer_loss_is_the_mass_of_every_value_in_the_box_plus_a_pull_to_the_centre():
    from holotron.train.losses import _answer_with_boxes

    torch.manual_seed(0)
    V = 1100
    coord_ids = torch.arange(50, 1051)
    # one row, two questions' x / y tokens at label positions 3, 4 and 9, 10
    target = torch.full((1, 12), -100, dtype=torch.long)
    for t, v in ((2, 100), (3, 200), (8, 300), (9, 400)):  # target index = label position - 1
        target[0, t] = int(coord_ids[v])
    target[0, 5] = 7
    keep = target != -100
    coords = torch.tensor([[0, 3, 90, 110, 100], [0, 4, 195, 205, 200], [0, 9, 280, 330, 300], [0, 10, 400, 400, 400]])
    logits = torch.randn(int(keep.sum()), V) * 3
    parts = {}
    at = torch.tensor([0, 1, 3, 4])  # the coordinates' rows among the labelled positions 2, 3, 5, 8, 9
    loss = _answer_with_boxes(logits, target[keep], at, coords, coord_ids, parts)
    # brute force
    rows = {2: 0, 3: 1, 5: 2, 8: 3, 9: 4}
    terms = []
    for t, r in sorted(rows.items(), key=lambda kv: kv[1]):
        lp = torch.log_softmax(logits[r], -1)
        c = [c for c in coords.tolist() if c[1] - 1 == t]
        if not c:
            terms.append(-lp[target[0, t]])
            continue
        _, _, lo, hi, centre = c[0]
        inside = sum(math.exp(float(lp[coord_ids[k]])) for k in range(lo, hi + 1))
        sigma = max(1.0, (hi - lo) / 8)
        w = torch.tensor([math.exp(-((k - centre) ** 2) / (2 * sigma**2)) for k in range(1001)])
        w = w / w.sum()
        terms.append(-math.log(inside) + GAUSS_WEIGHT * -(w * lp[coord_ids]).sum())
    assert float(loss) == pytest.approx(float(torch.stack([torch.as_tensor(x) for x in terms]).mean()), rel=1e-4)
    # teacher-forced in-box: the best token inside the range on both axes
    sure = torch.full_like(logits, -20.0)
    for r, v in ((0, 105), (1, 150), (3, 300), (4, 400)):
        sure[r, coord_ids[v]] = 10.0
    parts = {}
    _answer_with_boxes(sure, target[keep], at, coords, coord_ids, parts)
    assert float(parts["inbox_x"]) == 1.0 and float(parts["inbox_y"]) == 0.5 and float(parts["inbox"]) == 0.5


def test_coordinate_targets_of_a_batch_are_the_values_the_scorer_accepts(word_tok):
    p = Processor.from_pretrained(word_tok)
    vis = make_config("micro", p.vocab_size).vision
    sb = ScreenBatches(word_tok, vis, 3, seed=2, queries=4, short_followups=True)
    batch = sb[0]
    ids = coordinate_token_ids(p)
    value = {t: k for k, t in enumerate(ids)}
    ct = batch["coord_targets"]
    assert len(ct) >= 6 and len(ct) % 2 == 0
    for b, pos, lo, hi, centre in ct.tolist():
        tok = int(batch["labels"][b, pos])
        assert value[tok] == centre and lo <= centre <= hi
    # each (x, y) pair: every value in the ranges is a hit for the question's box, one past either end is not
    rng = random.Random(0)
    sample = generate_sample(sb.sample_seed(0, 0))
    b0 = [c for c in ct.tolist() if c[0] == 0][:2]
    (_, _, xlo, xhi, _), (_, _, ylo, yhi, _) = b0
    w, h = sample.size
    box = Box(*sample.target.box, space="pixel")
    for _ in range(20):
        x, y = rng.randint(xlo, xhi), rng.randint(ylo, yhi)
        assert point_in_box(Point(x, y), box, w, h)
    assert not point_in_box(Point(xlo - 1, (ylo + yhi) // 2), box, w, h)
    assert not point_in_box(Point(xhi + 1, (ylo + yhi) // 2), box, w, h)


def test_the_grounding_loss_with_boxes_centres_and_matching_runs_and_reports_each_term(word_tok):
    p = Processor.from_pretrained(word_tok)
    cfg = make_config("micro", p.vocab_size)
    batch = ScreenBatches(word_tok, cfg.vision, 2, seed=3, queries=3, short_followups=True, chars=True, match=True)[0]
    torch.manual_seed(0)
    model = init_weights(Holotron(cfg), 0)
    aux = AuxHeads(cfg)
    parts = {}
    coord_ids = torch.tensor(coordinate_token_ids(p))
    loss, n = loss_fn(model, batch, "cpu", aux, 0.5, parts, 1.0, 1.0, pointer_heads=2, match_weight=0.5,
                      coord_ids=coord_ids)
    assert torch.isfinite(loss) and n > 0
    assert {"answer", "inbox", "inbox_x", "inbox_y", "position", "pointer", "match", "match_acc", "word"} <= set(parts)
    loss.backward()
    assert float(aux.centre_mid.weight.grad.abs().sum()) > 0 and float(aux.match.key.weight.grad.abs().sum()) > 0
    # without coordinate ids, the answer is the plain cross-entropy
    plain = {}
    loss_fn(model, batch, "cpu", parts=plain)
    labels = batch["labels"][:, 1:]
    assert "inbox" not in plain and plain["answer"] > 0 and int((labels != -100).sum()) == n


def _run(*argv):
    return main([str(a) for a in argv])


def test_match_then_ground_then_resume_on_the_micro_preset(tmp_path, word_tok, capsys):
    base = ["--config", "micro", "--device", "cpu", "--workers", "0", "--batch-size", "2", "--log-every", "1",
            "--eval-n", "2", "--max-shard-size", "8MB", "--vocab", "train", "--pad-aug", "0.5"]
    match = tmp_path / "match"
    _run(*base, "--stage", "match", "--tokenizer", word_tok, "--steps", "2", "--eval-every", "2", "--out", match,
         "--schedule", "wsd")
    state = json.loads((match / "trainer_state.json").read_text())
    assert state["step"] == 2 and "match_acc" in state["evals"][-1]
    assert (match / "aux_heads.pt").is_file()
    ground = tmp_path / "ground"
    g = [*base, "--queries", "3", "--followups", "short", "--aux-weight", "0.5", "--pointer-weight", "1",
         "--pointer-heads", "2", "--match-weight", "0.5", "--schedule", "wsd", "--schedule-minutes", "10",
         "--save-optimizer", "--eval-every", "2", "--out", ground]
    _run(*g, "--init-from", match, "--steps", "2")
    state = json.loads((ground / "trainer_state.json").read_text())
    assert state["step"] == 2 and "tf_inbox" in state["evals"][-1] and "accuracy" in state["evals"][-1]
    assert "inbox" in state["log"][-1] and "match_acc" in state["log"][-1]
    _run(*g, "--resume", ground, "--steps", "3")
    state = json.loads((ground / "trainer_state.json").read_text())
    assert state["step"] == 3
    # the last of the two pointer heads on the element's own tokens: the run's click pointer is that head
    _run(*g, "--init-from", match, "--steps", "1", "--pointer-element-heads", "1", "--out", tmp_path / "el")
    gc = json.loads((tmp_path / "el" / "generation_config.json").read_text())
    assert gc["click_pointer"]["heads"] == 1 and gc["click_pointer"]["first"] == 1
    with pytest.raises(SystemExit, match="--pointer-element-heads"):
        _run(*g, "--steps", "1", "--pointer-element-heads", "3", "--out", tmp_path / "bad")


def test_rewarm_steps_ramp_a_fresh_optimiser_up_to_the_schedule(tmp_path, word_tok, capsys):
    """--rewarm-steps N: this job's first N steps take (k / N) of the schedule's rate (a fresh optimiser picked up
    mid-schedule, as scripts/train_tiny_ui_v2.sh does after --schedule-done), then the schedule's own."""
    base = ["--config", "micro", "--device", "cpu", "--workers", "0", "--batch-size", "1", "--log-every", "1",
            "--eval-every", "0", "--no-final-eval", "--stage", "match", "--tokenizer", word_tok, "--lr", "1e-3",
            "--warmup", "0", "--schedule", "wsd", "--cooldown", "0.01", "--steps", "5"]
    _run(*base, "--rewarm-steps", "4", "--out", tmp_path / "a")
    lrs = [r["lr"] for r in json.loads((tmp_path / "a" / "trainer_state.json").read_text())["log"]]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    with pytest.raises(SystemExit, match="--rewarm-steps"):
        _run(*base, "--rewarm-steps", "-1", "--out", tmp_path / "b")


def test_resume_keeps_the_schedule_minutes_its_run_started_with(tmp_path, word_tok, capsys):
    """A run started mid-schedule (--schedule-done) and then resumed stays where its schedule is: the resumed job
    reads the minutes done from the checkpoint (it once restarted from the run's own seconds, at the peak)."""
    base = ["--config", "micro", "--device", "cpu", "--workers", "0", "--batch-size", "1", "--log-every", "1",
            "--eval-every", "0", "--no-final-eval", "--stage", "match", "--tokenizer", word_tok, "--lr", "1e-3",
            "--warmup", "0", "--schedule", "wsd", "--cooldown", "0.2", "--schedule-minutes", "10",
            "--save-optimizer", "--out", tmp_path / "a"]
    _run(*base, "--schedule-done", "12", "--steps", "1")
    _run(*base, "--resume", tmp_path / "a", "--steps", "2")
    state = json.loads((tmp_path / "a" / "trainer_state.json").read_text())
    assert state["args"]["schedule_done"] == 12
    # past the schedule's end: the cool-down's floor (lr x --min-lr-ratio) on both jobs' steps, not the peak
    assert [r["lr"] for r in state["log"]] == pytest.approx([1e-4, 1e-4], rel=1e-3)
    with pytest.raises(SystemExit, match="--schedule-done"):
        _run(*base, "--resume", tmp_path / "a", "--steps", "3", "--schedule-done", "1")


def test_init_parts_vision_takes_the_vision_side_alone_under_a_new_tokenizer(tmp_path, word_tok, capsys):
    from holotron.tokenizer import build_task_tokenizer as build

    bpe = build(tmp_path / "bpe", vocab_size=600, n=20)
    base = ["--config", "micro", "--device", "cpu", "--workers", "0", "--batch-size", "2", "--steps", "1",
            "--eval-every", "0", "--no-final-eval"]
    _run(*base, "--stage", "read", "--tokenizer", bpe, "--out", tmp_path / "read")
    # lr 0: the match run's step changes nothing, so what it saves is what it started from
    _run(*base, "--stage", "match", "--tokenizer", word_tok, "--init-from", tmp_path / "read", "--init-parts",
         "vision", "--out", tmp_path / "m", "--lr", "0", "--weight-decay", "0")
    import holotron

    a = holotron.load(tmp_path / "read", dtype=torch.float32)
    b = holotron.load(tmp_path / "m", dtype=torch.float32)
    assert a.config.text.vocab_size != b.config.text.vocab_size
    sa, sb = a.state_dict(), b.state_dict()
    vision = [k for k in sa if k.startswith(("vision_model.", "mlp1."))]
    assert vision and all(torch.equal(sa[k], sb[k]) for k in vision)
    assert (tmp_path / "m" / "tokenizer.json").read_text() == (word_tok / "tokenizer.json").read_text()
    with pytest.raises(SystemExit, match="--init-parts"):
        _run(*base, "--stage", "match", "--tokenizer", word_tok, "--init-parts", "vision", "--out", tmp_path / "x")


def test_colour_and_pad_augmented_match_batches_keep_targets_on_the_padded_screen(word_tok):
    from holotron.train.augment import pad_sample

    p = Processor.from_pretrained(word_tok)
    vis = make_config("micro", p.vocab_size).vision
    plain = MatchBatches(word_tok, vis, 4, seed=5)[0]
    padded = MatchBatches(word_tok, vis, 4, seed=5, pad=lambda s, r: pad_sample(s, r, p=1.0))[0]
    assert plain["pixel_values"].shape == padded["pixel_values"].shape
    assert not torch.equal(plain["pixel_values"], padded["pixel_values"])
    assert padded["match_words"].shape[0] > 0
    assert F.one_hot(padded["match_screen"]).sum(0).min() > 0


# ------------------------------------------------------------------- the step's positions, found on the host

def _ground_batch(word_tok, n=3, seed=3):
    p = Processor.from_pretrained(word_tok)
    cfg = make_config("micro", p.vocab_size)
    sb = ScreenBatches(word_tok, cfg.vision, n, seed=seed, queries=3, short_followups=True, chars=True, match=True)
    return p, cfg, sb[0]


def test_element_only_pointer_positives_and_heads(word_tok):
    """``pointer_element``: each question also gets its element's tokens without its label text (a label outside
    the box left out), in the same slots; ``attention_pointer_loss(element_heads=1)`` scores its last head on
    those and the first on the element and its label, each as if alone."""
    from holotron.train import IGNORE, attention_pointer_loss, normalize_tiles, pointer_layout
    from holotron.train.batches import step_indices

    p = Processor.from_pretrained(word_tok)
    # the tiny model's 1,024 px tiles (32 px tokens: a field's label and its box lie on different tokens)
    vision = make_config("tiny-ui", p.vocab_size).vision
    data = ScreenBatches(word_tok, vision, 2, seed=7, queries=8, short_followups=True, pointer_element=True)
    batch = data[0]
    plain = ScreenBatches(word_tok, vision, 2, seed=7, queries=8, short_followups=True)[0]
    for k in ("pointer_queries", "pointer_targets", "pointer_on", "pointer_at"):
        assert torch.equal(batch[k], plain[k]), k
    el, full = batch["pointer_targets_el"], batch["pointer_targets"]
    assert set(el[:, 0].tolist()) == set(range(batch["pointer_queries"].shape[0]))
    s = generate_sample(data.sample_seed(0, 0), split="train")
    cls, pos = image_token_targets(s, vision)
    assert torch.equal(el[el[:, 0] == 0, 1], element_tokens(s, s.target, pos, cls, token_cell(s.size, vision),
                                                            labels=False))
    smaller = [q for q in range(batch["pointer_queries"].shape[0])
               if set(el[el[:, 0] == q, 1].tolist()) < set(full[full[:, 0] == q, 1].tolist())]
    assert smaller  # some asked elements have their label outside their box
    assert torch.equal(step_indices(batch, data.processor.image_token_id)["pointer_on_el"],
                       batch["pointer_on_el"])

    # the loss, on a micro batch, element-only positives made up: each question's first token alone
    cfg = make_config("micro", p.vocab_size)
    batch = ScreenBatches(word_tok, cfg.vision, 3, seed=7, queries=4, short_followups=True)[0]
    full = batch["pointer_targets"]
    el = full[torch.cat([torch.tensor([True]), full[1:, 0] != full[:-1, 0]])]
    assert len(el) < len(full)
    torch.manual_seed(0)
    model = init_weights(Holotron(cfg), 0)
    aux = AuxHeads(cfg)
    ids, labels = batch["input_ids"], batch["labels"]
    seen = {}
    hook = model.language_model.backbone.layers[aux.layer].register_forward_hook(
        lambda m, a, o: seen.__setitem__("h", o))
    with torch.no_grad():
        model.language_model.hidden_states(inputs_embeds=model.embed_inputs(
            ids, normalize_tiles(batch["pixel_values"], cfg.vision, None, batch["num_tiles"])))
    hook.remove()
    keep, is_img = labels[:, 1:] != IGNORE, ids == cfg.image_token_id
    block = model.language_model.backbone.layers[aux.layer + 1]
    lay = pointer_layout(keep, batch["pointer_queries"], full, is_img)
    lay_el = dict(lay, pointer_on=pointer_layout(keep, batch["pointer_queries"], el, is_img)["pointer_on"])
    lay["pointer_on_el"] = lay_el["pointer_on"]
    assert torch.equal(pointer_layout(keep, batch["pointer_queries"], full, is_img, el)["pointer_on_el"],
                       lay_el["pointer_on"])  # the element-only positives in the same slots
    with torch.no_grad():
        one = {k: float(attention_pointer_loss(block, seen["h"], v, 1)[0]) for k, v in (("full", lay), ("el", lay_el))}
        two = {k: float(attention_pointer_loss(block, seen["h"], v, 2)[0]) for k, v in (("full", lay), ("el", lay_el))}
        head1_el = 2 * two["el"] - one["el"]              # the second head's own loss on the element-only positives
        mixed = float(attention_pointer_loss(block, seen["h"], lay, 2, element_heads=1)[0])
        both = float(attention_pointer_loss(block, seen["h"], lay, 2, element_heads=2)[0])
    assert mixed == pytest.approx((one["full"] + head1_el) / 2, rel=1e-5)
    assert both == pytest.approx(two["el"], rel=1e-6) and two["el"] != pytest.approx(two["full"], rel=1e-3)
    with pytest.raises(ValueError, match="element"):
        attention_pointer_loss(block, seen["h"], {k: v for k, v in lay.items() if k != "pointer_on_el"}, 2, 1)


def test_the_batchs_host_side_indices_are_the_positions_the_boolean_masks_pick_row_by_row(word_tok):
    from holotron.train.batches import step_indices

    p, cfg, batch = _ground_batch(word_tok)
    ids, labels = batch["input_ids"], batch["labels"]
    B, T = ids.shape
    answer, image = [], []
    for b in range(B):  # row by row, position by position
        answer += [(b, t) for t in range(T - 1) if int(labels[b, t + 1]) != -100]
        image += [b * T + t for t in range(T) if int(ids[b, t]) == cfg.image_token_id]
    assert batch["answer_index"].tolist() == [b * T + t for b, t in answer]
    assert batch["answer_labels"].tolist() == [int(labels[b, t + 1]) for b, t in answer]
    assert batch["image_index"].tolist() == image
    coords = batch["coord_targets"].tolist()
    assert batch["coord_rows"].tolist() == [answer.index((b, pos - 1)) for b, pos, *_ in coords]
    # the same from the batch alone (a batch made by hand): what loss_fn works out when they are missing
    again = step_indices({k: v for k, v in batch.items() if k in ("input_ids", "labels", "coord_targets",
                                                                    "pointer_queries", "pointer_targets")}, 18)
    for k, v in again.items():
        assert torch.equal(torch.as_tensor(v), torch.as_tensor(batch[k])), k
    # matching: each query's place among its screen's queries, each token's place in the padded keys, the words
    slot, seen = [], {}
    for b in batch["match_screen"].tolist():
        slot.append(seen.get(b, 0))
        seen[b] = slot[-1] + 1
    assert batch["match_slot"].tolist() == slot and batch["match_slots"] == max(seen.values())
    n_max = int(batch["match_tokens"].max())
    assert batch["match_token_at"].tolist() == [b * n_max + j for b, n in enumerate(batch["match_tokens"].tolist())
                                                for j in range(n)]
    assert batch["word_index"].tolist() == [i for i, w in enumerate(batch["image_words"].tolist()) if w != -100]


def test_the_grounding_loss_equals_its_boolean_mask_reference_terms_and_gradients(word_tok):
    """The loss with the host-side indices against the same terms found with boolean masks on the device
    (``embed_inputs``, ``h[:, :-1][keep]``, ``x[is_img]``, row by row for the coordinates' rows)."""
    from holotron.train import IGNORE, attention_pointer_loss, normalize_tiles, pointer_layout
    from holotron.train.losses import _answer_with_boxes

    p, cfg, batch = _ground_batch(word_tok)
    coord_ids = torch.tensor(coordinate_token_ids(p))
    torch.manual_seed(0)
    model = init_weights(Holotron(cfg), 0)
    aux = AuxHeads(cfg)
    parts = {}
    loss, n = loss_fn(model, batch, "cpu", aux, 0.5, parts, 1.0, 1.0, pointer_heads=2, match_weight=0.5,
                      coord_ids=coord_ids)
    loss.backward()
    grads = [prm.grad.clone() for prm in (*model.parameters(), *aux.parameters()) if prm.grad is not None]
    model.zero_grad(), aux.zero_grad()

    # the reference
    ids, labels = batch["input_ids"], batch["labels"]
    emb = model.embed_inputs(ids, normalize_tiles(batch["pixel_values"], cfg.vision, None, batch["num_tiles"]))
    seen = {}
    hook = model.language_model.backbone.layers[aux.layer].register_forward_hook(
        lambda m, a, o: seen.__setitem__("h", o))
    h = model.language_model.hidden_states(inputs_embeds=emb)
    hook.remove()
    keep, is_img = labels[:, 1:] != IGNORE, ids == cfg.image_token_id
    rows = []  # the row of h[:, :-1][keep] of each coordinate, counted row by row
    for b, pos, *_ in batch["coord_targets"].tolist():
        rows.append(int(keep[:b].sum()) + int(keep[b, :pos - 1].sum()))
    logits = model.language_model.lm_head(h[:, :-1][keep]).float()
    answer = _answer_with_boxes(logits, labels[:, 1:][keep], torch.tensor(rows), batch["coord_targets"], coord_ids,
                                None)
    img, hm = emb[is_img], seen["h"][is_img]
    cls = batch["image_classes"]
    l_in = F.cross_entropy(aux.label_in(img), cls, ignore_index=IGNORE)
    l_mid = F.cross_entropy(aux.label_mid(hm), cls, ignore_index=IGNORE)
    l_pos = 0.2 * 10 * F.l1_loss(aux.pos_mid(hm), batch["image_positions"]) + 10 * F.l1_loss(
        aux.centre_mid(hm), batch["image_centres"])
    bare = {k: v for k, v in batch.items() if k not in ("match_slot", "match_slots", "match_token_at", "word_index")}
    l_match = match_loss(aux.match, model.language_model.backbone.embeddings, img, bare, "cpu")
    l_char = F.cross_entropy(aux.chars(img), batch["image_chars"].reshape(-1), ignore_index=IGNORE)
    block = model.language_model.backbone.layers[aux.layer + 1]
    layout = pointer_layout(keep, batch["pointer_queries"], batch["pointer_targets"], is_img)
    l_ptr, _ = attention_pointer_loss(block, seen["h"], layout, 2)
    want = {"answer": answer, "label_in": l_in, "label_mid": l_mid, "position": l_pos, "char": l_char,
            "pointer": l_ptr}
    for k, v in want.items():
        assert parts[k] == pytest.approx(float(v.detach()), rel=1e-5, abs=1e-6), k
    total = answer + 0.5 * (l_in + l_mid + l_pos) + 0.25 * l_match + 0.5 * l_char + 0.5 * l_ptr
    assert float(loss.detach()) == pytest.approx(float(total.detach()), rel=1e-5)
    assert n == int(keep.sum())
    total.backward()
    ref = [prm.grad for prm in (*model.parameters(), *aux.parameters()) if prm.grad is not None]
    assert len(ref) == len(grads)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_match_loss_words_and_centres_equal_their_boolean_mask_reference(word_tok):
    cfg, batch = _batch(word_tok, n=3, seed=4)
    torch.manual_seed(1)
    heads = AuxHeads(cfg).match
    emb = torch.nn.Embedding(cfg.text.vocab_size, cfg.text.hidden_size)
    img = torch.randn(int(batch["match_tokens"].sum()), cfg.text.hidden_size)
    parts = {}
    match_loss(heads, emb, img, batch, "cpu", parts)
    words = batch["image_words"]
    has = words != -100
    logits = (heads.word(img[has]) @ emb.weight.T).detach()
    assert parts["word"] == pytest.approx(float(F.cross_entropy(logits, words[has])), rel=1e-5)
    assert parts["word_acc"] == pytest.approx(float((logits.argmax(-1) == words[has]).float().mean()))
    want = 5 * F.l1_loss(heads.centre(img), batch["image_centres"])
    assert parts["centre"] == pytest.approx(float(want.detach()), rel=1e-5)
    # the keys padded screen by screen, as the loop over the screens padded them
    counts = batch["match_tokens"].tolist()
    kpad = torch.zeros(len(counts), max(counts), heads.key.out_features)
    start = 0
    for b, c in enumerate(counts):
        kpad[b, :c] = heads.key(img[start:start + c])
        start += c
    flat = torch.zeros(len(counts) * max(counts), heads.key.out_features).index_copy(
        0, batch["match_token_at"], heads.key(img))
    torch.testing.assert_close(flat.view_as(kpad), kpad)
