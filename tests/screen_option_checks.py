"""Checks shared by the tests of the training screens' options (tests/test_data_tables.py,
tests/test_data_icon_places.py, tests/test_data_tab_places.py, tests/test_data_fonts.py): digests of screens and
batches, which hold an option's "off" to what the generator drew before the option existed, the training command
line's checks of an option's flag, and a two-step micro ground run with the option on."""

from __future__ import annotations

import hashlib
import json

import PIL
import pytest
import torch


def text_digest(s) -> str:
    """A sample's elements, texts, instruction, answer and settings (not its pixels)."""
    return hashlib.sha256(repr((s.elements, s.texts, s.instruction, s.answer,
                                sorted(s.settings.items()))).encode()).hexdigest()[:16]


def batch_digest(batch: dict) -> str:
    """Every tensor (dtype, shape, bytes) and value of a training batch."""
    h = hashlib.sha256()
    for k in sorted(batch):
        v = batch[k]
        h.update(k.encode())
        if isinstance(v, torch.Tensor):
            h.update(str((v.dtype, tuple(v.shape))).encode())
            h.update(v.contiguous().numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


def check_recorded_batches(word_tok, tokenizer: str, pillow: str, batches, match: str) -> None:
    """The ground batches (``ScreenBatches(word_tok, vision, 3, seed=5, **kw)``, batches 0 and 1 for each ``(kw,
    digests)`` of ``batches``) and one match batch are the recorded ones; skipped under another tokenizers or
    Pillow build (``tokenizer``: the digest of the word tokenizer they were recorded with)."""
    from holotron.processor import Processor
    from holotron.train import ScreenBatches, make_config
    from holotron.train.matching import MatchBatches

    if hashlib.sha256((word_tok / "tokenizer.json").read_bytes()).hexdigest()[:16] != tokenizer or \
            PIL.__version__ != pillow:
        pytest.skip("another tokenizers or Pillow build: the recorded batches do not apply")
    vision = make_config("micro", Processor.from_pretrained(word_tok).vocab_size).vision
    for kw, want in batches:
        data = ScreenBatches(word_tok, vision, 3, seed=5, **kw)
        assert [batch_digest(data[i]) for i in (0, 1)] == want, kw
    assert batch_digest(MatchBatches(word_tok, vision, 2, seed=3, options={"vocab": "train"})[0]) == match


def micro_ground_run(tmp_path, word_tok, monkeypatch, *flags: str):
    """Two steps of the ground stage (questions, pointer heads, matching, in-box answer) on the micro preset with
    the training options ``flags``; returns the run's trainer_state.json and the samples its screens came from."""
    import holotron.data
    from holotron.train.cli import main

    made = []
    real = holotron.data.generate_sample

    def generate(seed, **kw):
        made.append(real(seed, **kw))
        return made[-1]

    monkeypatch.setattr(holotron.data, "generate_sample", generate)
    out = tmp_path / "ground"
    assert main(["--config", "micro", "--device", "cpu", "--workers", "0", "--batch-size", "4", "--steps", "2",
                 "--queries", "4", "--followups", "short", "--aux-weight", "0.5", "--pointer-weight", "1",
                 "--pointer-heads", "2", "--match-weight", "0.5", "--vocab", "train", *flags,
                 "--tokenizer", str(word_tok), "--eval-every", "0", "--no-final-eval", "--log-every", "1",
                 "--max-shard-size", "8MB", "--out", str(out)]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] == 2 and all(torch.isfinite(torch.tensor(e["loss"])) for e in state["log"])
    return state, made


def train_args(*flags: str):
    """``python -m holotron.train``'s arguments for ``flags`` (with ``--out unused``), checked as the CLI does."""
    from holotron.train.cli import check_args, parser

    args = parser().parse_args(["--out", "unused", *flags])
    check_args(args)
    return args


def check_train_split_flag(flag: str) -> None:
    """An on/off option of the training screens only: ``flag on`` is refused with the reading stage and with
    another split than train, and a value other than on / off is refused."""
    with pytest.raises(SystemExit, match=f"{flag} changes the grounding and matching screens"):
        train_args(flag, "on", "--stage", "read")
    with pytest.raises(SystemExit, match=r"training screens only \(--split train\)"):
        train_args(flag, "on", "--split", "heldout")
    with pytest.raises(SystemExit):
        train_args(flag, "yes")
