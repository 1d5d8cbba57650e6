"""Give the word tokens that training never showed an embedding read from their spelling (the tiny model).

The word tokenizer (holotron/tokenizer.py, ``train_word_tokenizer``) holds every label word of the generator's
vocabulary as one token, the held-out vocabulary's too (holotron/data/vocab.py); training screens draw only the
training labels (``--vocab train``), so the words found in held-out labels alone (and in no training question)
never appear in a training instruction or on a training screen, and their embedding rows keep what
initialisation and weight decay left.
This script fits a ridge regression from a word's spelling (its character 1- to 3-grams with word-edge marks, a
capital-letter flag and a length bucket, L2-normalised) to the embeddings the training gave the words of the
training labels, and writes the prediction into the rows of the unseen words. Nothing of a held-out screen is
read: only the trained weights and the words' letters. Every other tensor stays bit for bit.

    python scripts/impute_unseen_words.py MODEL OUT [--lam 1.0] [--scale train-norm|none] [--folds 5] [--screens 2000]

MODEL: a checkpoint folder or bundled name (holotron-tiny-ui); OUT: a new folder (an existing one is refused),
the checkpoint with the rows replaced, bf16 shards of at most 8 MB as the bundled model ships, and
``impute_words.json`` (the words, the fit's cross-validated agreement on held-back training words: cosine to the
true row and the true word's rank among all training words). ``--scale train-norm`` rescales each predicted row
to the training words' mean norm (ridge shrinks towards their mean); ``none`` keeps the prediction.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

import holotron
from holotron import Processor
from holotron.atomic_folder import atomic_folder
from holotron.bundled import bundled_path
from holotron.data import all_labels
from holotron.data.vocab import heldout_vocab

WORD = re.compile(r"[^\W\d_]+")


def question_tokens(tokenizer, screens: int) -> set[int]:
    """The token ids of the training questions of ``screens`` training screens (the inference prompt and the
    short and long follow-ups of 15 more targets each, as the ground stage asks them)."""
    from holotron.data import generate_sample
    from holotron.data.screens import localization_prompt
    from holotron.train.questions import extra_targets, followup_text

    seen: set[int] = set()
    for seed in range(screens):
        s = generate_sample(seed, split="train", vocab="train", render=False)
        texts = [localization_prompt(s.instruction)]
        for instruction, _, _ in extra_targets(s, 15, random.Random(seed), boxes=True):
            texts += [followup_text(instruction, short=True), followup_text(instruction, short=False)]
        for t in texts:
            seen.update(tokenizer.encode(t, add_special_tokens=False).ids)
    return seen


def split_words(tokenizer, screens: int = 2000) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """((word, token id) of the training labels' words, the same of the words only held-out labels contain and
    no training question uses (``question_tokens``: "bar" and "input" of "the search bar", "the ... input" are
    trained there)); words that are not one token after a space are left out of both."""
    held = heldout_vocab()
    trained = {w for label in all_labels() if label.lower() not in held for w in WORD.findall(label)}
    unseen = {w for label in all_labels() if label.lower() in held for w in WORD.findall(label)} - trained

    def one_token(word: str) -> int | None:
        ids = tokenizer.encode(" " + word, add_special_tokens=False).ids
        ids = [i for i in ids if tokenizer.decode([i]).strip()]  # the space's own token, if any, is not the word
        return ids[0] if len(ids) == 1 and tokenizer.decode(ids).strip() == word else None

    pairs = [[(w, one_token(w)) for w in sorted(s)] for s in (trained, unseen)]
    trained_ids, unseen_ids = ([(w, i) for w, i in p if i is not None] for p in pairs)
    asked = question_tokens(tokenizer, screens) if screens else set()
    return trained_ids, [(w, i) for w, i in unseen_ids if i not in asked]


def spelling(word: str) -> list[str]:
    """The features of a word: character 1- to 3-grams of "<word>", its capitalisation, its length (to 12)."""
    s = f"<{word}>"
    grams = [s[i:i + n] for n in (1, 2, 3) for i in range(len(s) - n + 1)]
    return grams + ["^CAP" if word[:1].isupper() else "^low", f"^len{min(len(word), 12)}"]


def features(words: list[str], index: dict[str, int]) -> np.ndarray:
    x = np.zeros((len(words), len(index)))
    for r, w in enumerate(words):
        for g in spelling(w):
            if g in index:
                x[r, index[g]] += 1
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def ridge(x: np.ndarray, y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(weights, mean): y ~ mean + x @ weights, the regression on the centred rows."""
    mean = y.mean(0)
    return np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ (y - mean)), mean


def cross_validate(x: np.ndarray, y: np.ndarray, lam: float, folds: int) -> dict:
    """Cosine of each held-back training word's predicted row to its own, against the training mean's; and its
    rank among all training words' rows by cosine (0: the nearest)."""
    order = np.random.default_rng(0).permutation(len(y))
    unit = y / np.linalg.norm(y, axis=1, keepdims=True)
    cos, cos_mean, ranks = [], [], []
    for part in np.array_split(order, folds):
        rest = np.setdiff1d(order, part)
        w, mean = ridge(x[rest], y[rest], lam)
        pred = x[part] @ w + mean
        pred /= np.linalg.norm(pred, axis=1, keepdims=True)
        cos += list((pred * unit[part]).sum(1))
        cos_mean += list(unit[part] @ (mean / np.linalg.norm(mean)))
        sims = pred @ unit.T
        ranks += [int((sims[j] > sims[j, k]).sum()) for j, k in enumerate(part)]
    return {"words": len(y), "folds": folds, "cosine": float(np.mean(cos)),
            "cosine_of_the_mean": float(np.mean(cos_mean)), "top1": float(np.mean(np.array(ranks) == 0)),
            "median_rank": float(np.median(ranks))}


def spelling_rows(emb: torch.Tensor, trained: list[tuple[str, int]], unseen: list[tuple[str, int]],
                  lam: float = 1.0, scale: str = "train-norm") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the trained words' features, their rows, the unseen words' predicted rows) for the embedding matrix
    ``emb``: the ridge fit on the trained words applied to the unseen words' spelling; with ``scale``
    "train-norm" each predicted row scaled to the trained rows' mean norm."""
    index = {g: k for k, g in enumerate(sorted({g for w, _ in trained + unseen for g in spelling(w)}))}
    x_t = features([w for w, _ in trained], index)
    y_t = emb.detach()[[i for _, i in trained]].double().numpy()
    w, mean = ridge(x_t, y_t, lam)
    pred = features([wd for wd, _ in unseen], index) @ w + mean
    if scale == "train-norm":
        pred *= np.linalg.norm(y_t, axis=1).mean() / np.linalg.norm(pred, axis=1, keepdims=True)
    return x_t, y_t, pred


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a checkpoint folder or a bundled name (holotron-tiny-ui)")
    ap.add_argument("out", help="the new checkpoint folder (must not exist)")
    ap.add_argument("--lam", type=float, default=1.0, help="the ridge penalty (default 1.0)")
    ap.add_argument("--scale", choices=["train-norm", "none"], default="train-norm")
    ap.add_argument("--folds", type=int, default=5, help="cross-validation folds on the training words (>= 2)")
    ap.add_argument("--screens", type=int, default=2000,
                    help="training screens whose questions' tokens count as trained (default 2000)")
    a = ap.parse_args(argv)
    if a.lam <= 0 or a.folds < 2 or a.screens < 0:
        ap.error(f"--lam must be > 0, --folds >= 2 and --screens >= 0, got {a.lam}, {a.folds} and {a.screens}")
    src = bundled_path(a.model) or Path(a.model)
    out = Path(a.out)
    if not (src / "config.json").is_file():
        ap.error(f"{a.model}: not a checkpoint folder (no config.json) nor a bundled model name")
    if out.exists():
        ap.error(f"{out} exists: give a new folder")
    tokenizer = Processor.from_pretrained(src).tokenizer
    trained, unseen = split_words(tokenizer, a.screens)
    if not trained or not unseen:
        ap.error(f"{a.model}: its tokenizer has {len(trained)} training and {len(unseen)} unseen label words as "
                 "single tokens: this works on the word tokenizer's checkpoints (tiny-ui)")
    model = holotron.load(src, dtype=torch.float32, device="cpu")
    emb = model.language_model.backbone.embeddings.weight
    x_t, y_t, pred = spelling_rows(emb, trained, unseen, a.lam, a.scale)
    norm = float(np.linalg.norm(y_t, axis=1).mean())
    report = {"model": str(a.model), "lam": a.lam, "scale": a.scale, "question_screens": a.screens,
              "cross_validation": cross_validate(x_t, y_t, a.lam, a.folds)}
    rows = [i for _, i in unseen]
    before = emb.detach()[rows].norm(dim=1).mean().item()
    with torch.no_grad():
        emb[rows] = torch.from_numpy(pred).to(emb.dtype)
    report.update(trained_words=len(trained), unseen_words=[wd for wd, _ in unseen], training_rows_norm=norm,
                  unseen_rows_norm_before=before, unseen_rows_norm_after=emb.detach()[rows].norm(dim=1).mean().item())
    with atomic_folder(out, who="impute_unseen_words") as tmp:
        holotron.save_pretrained(model.to(torch.bfloat16), tmp, max_shard_size="8MB")
        for f in src.iterdir():   # the source's configs and tokenizer as they were, over save_pretrained's
            if f.is_file() and not f.name.startswith("model") and f.name != "README.md":
                shutil.copy2(f, tmp / f.name)
        (tmp / "impute_words.json").write_text(json.dumps(report, indent=1) + "\n")
    cv = report["cross_validation"]
    print(f"{len(rows)} unseen words given spelling embeddings in {out}; on held-back training words the fit's "
          f"cosine {cv['cosine']:.3f} (the mean row: {cv['cosine_of_the_mean']:.3f}), the true word first among "
          f"{len(trained)} in {cv['top1']:.1%}, median rank {cv['median_rank']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
