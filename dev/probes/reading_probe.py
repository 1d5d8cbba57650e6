"""How fast does a vision tower learn to read the synthetic screens? A side-by-side probe for the
reading stage of ``holotron.train``, run on one GPU in a few minutes.

It renders a fixed set of reading mosaics once (``holotron.train.reading.reading_tile``, in worker processes),
at the scale tiling shows screens (0.65-1.05) and, to ask whether resolution is what stops reading,
at 1.3-2.0; then trains each variant (learning rate, colour augmentation, text scale) for the same
number of seconds from fresh weights on those tensors, so data generation does not set the pace, and
reports the share of text tokens whose class is read right, on the training tiles and on held-out
tiles (held-out split: other themes, font sizes and hues).

    PYTHONPATH=. python3 dev/probes/reading_probe.py --tiles 40000 --seconds 60 --out $OUT

The variants are in ``VARIANTS``; ``--only`` picks some by name. Writes reading_probe.json to --out.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import os
import random
import re
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NORMAL, LARGE = (0.65, 1.05), (1.3, 2.0)
config_name = "tiny-ui"

# the training stage's own definitions
from holotron.train.targets import N_CHAR  # noqa: E402
from holotron.train.tiles import normalize_tiles  # noqa: E402

# name -> settings; "scale" selects the tile set, "aug" the colour augmentation
VARIANTS = {
    "lr2e-3": dict(lr=2e-3, aug=False, scale="normal"),
    "lr5e-4": dict(lr=5e-4, aug=False, scale="normal"),
    "lr5e-4+aug": dict(lr=5e-4, aug=True, scale="normal"),
    "lr1e-3+aug": dict(lr=1e-3, aug=True, scale="normal"),
    "lr5e-4+aug+large": dict(lr=5e-4, aug=True, scale="large"),
    "vit384+lr1e-3+aug": dict(lr=1e-3, aug=True, scale="normal",
                              set=("vision.hidden_size=384", "vision.num_attention_heads=6")),
    # per-patch character targets (the character under each 16 px patch's centre), alone or beside
    # the label classes: is a local target learned faster, and does it speed up reading whole labels?
    "chars-only+lr1e-3+aug": dict(lr=1e-3, aug=True, scale="normal", char=True, label=False),
    "chars+labels+lr1e-3+aug": dict(lr=1e-3, aug=True, scale="normal", char=True),
    # a curriculum: characters alone for the first half of the time, then labels beside them
    "chars-then-labels+lr1e-3+aug": dict(lr=1e-3, aug=True, scale="normal", char=True, label=False, label_after=0.5),
    # the same curriculum with word classes (the word under each token, hashed) in place of label classes
    "chars-then-words+lr1e-3+aug": dict(lr=1e-3, aug=True, scale="normal", char=True, label=False, label_after=0.5,
                                        word=True),
}


@functools.lru_cache(maxsize=8192)
def _word_codes(text: str) -> np.ndarray:
    """Per character of ``text``: the class (``label_class``) of the word it belongs to; 0 off words."""
    from holotron.train.targets import label_class

    out = np.zeros(len(text), dtype=np.int64)
    for m in re.finditer(r"[A-Za-z0-9]+", text):
        out[m.start():m.end()] = label_class(m.group(0))
    return out


def _chars_and_words(sample, px, py):
    """Both per-patch targets in one integer (reading_tile takes one extra target): word * 64 + character."""
    from holotron.train.targets import char_classes_at

    return char_classes_at(sample, px, py, codes=_word_codes) * 64 + char_classes_at(sample, px, py)

def _render(job):
    from holotron.data import generate_sample
    from holotron.train.reading import reading_tile

    split, seed, n, scale, vcfg = job
    samples = [generate_sample(seed * 1000 + i, split=split) for i in range(max(1, n // 8))]
    rng = random.Random(seed)
    tiles, cls, both = zip(*(reading_tile(samples, vcfg, rng, scale=scale, extra=_chars_and_words) for _ in range(n)))
    both = np.stack(both)                                   # (tiles, tokens, 4): word * 64 + character
    chars, words = both % 64, both // 64
    # a token's word: the one under most of its patches (0 where none is)
    counts = (words[..., :, None] == words[..., None, :]).sum(-1) * (words > 0)
    word = np.take_along_axis(words, counts.argmax(-1)[..., None], -1)[..., 0]
    return np.stack(tiles), np.stack(cls), chars, word


def render_set(pool, split, n, scale, vcfg, seed0, chunk=64):
    jobs = [(split, seed0 + i, min(chunk, n - i * chunk), scale, vcfg) for i in range(math.ceil(n / chunk))]
    parts = pool.map(_render, jobs)
    x = torch.from_numpy(np.concatenate([p[0] for p in parts])).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    ch = torch.from_numpy(np.concatenate([p[2] for p in parts]))  # (tiles, tokens, 4)
    wd = torch.from_numpy(np.concatenate([p[3] for p in parts]))  # (tiles, tokens)
    return x, y, ch, wd


def _forward(model, heads, xb, vcfg, dev, augment=None):
    """uint8 tiles (colour-augmented with ``augment``, a generator) -> projector output -> (label logits
    (tokens, classes), char logits (tokens, 4, N_CHAR) or None)."""
    from holotron.vision.projector import embed_tiles

    x = normalize_tiles(xb, vcfg, augment)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
        emb = embed_tiles(model.vision_model, model.mlp1, x).reshape(-1, model.config.text.hidden_size)
        logits = heads["label"](emb).float()
        chars = heads["char"](emb).float().reshape(emb.shape[0], -1, N_CHAR) if "char" in heads else None
    return logits, chars


def _char_hits(chars, cb) -> tuple[int, int]:
    """Hits and count on points that show a letter, digit or mark (class >= 2)."""
    ink = cb >= 2
    return int((chars.argmax(-1)[ink] == cb[ink]).sum()), int(ink.sum())


@torch.no_grad()
def accuracy(model, heads, x, y, ch, vcfg, dev, bs=256) -> dict:
    hits = total = c_hits = c_total = 0
    loss = 0.0
    for i in range(0, len(x), bs):
        yb = y[i:i + bs].to(dev).reshape(-1)
        logits, chars = _forward(model, heads, x[i:i + bs].to(dev), vcfg, dev)
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        text = yb > 0
        hits += int((logits[text].argmax(-1) == yb[text]).sum())
        total += int(text.sum())
        if chars is not None:
            h, t = _char_hits(chars, ch[i:i + bs].to(dev).reshape(chars.shape[0], -1))
            c_hits, c_total = c_hits + h, c_total + t
    out = dict(read_acc=round(hits / max(1, total), 4), loss=round(loss / y.numel(), 4))
    if c_total:
        out["char_acc"] = round(c_hits / c_total, 4)
    return out


def run_variant(name, v, sets, config, dev, seconds, batch, seed=0, base_set=()):
    from holotron.model import Holotron
    from holotron.train.heads import AuxHeads
    from holotron.train.optim import lr_at, make_optimizer
    from holotron.train.presets import make_config

    if v.get("set"):
        config = make_config(config_name, 2048, list(base_set) + list(v["set"]))
    torch.manual_seed(seed)
    model = Holotron(config).init_weights(seed).to(dev)
    aux = AuxHeads(config)
    heads = nn.ModuleDict({"label": aux.label_in, **({"char": aux.char_in} if v.get("char") else {})})
    heads = heads.to(dev)
    params = nn.ModuleList([model.vision_model, model.mlp1, heads])
    opt = make_optimizer(params, v["lr"], 0.05, fused=dev.type == "cuda")
    x, y, ch, wd = sets[f"train_{v['scale']}"]
    if v.get("word"):  # the class head reads words instead of labels
        y = wd
    n = len(x)
    gen = torch.Generator(device=dev).manual_seed(seed)
    vcfg = config.vision
    t0 = time.perf_counter()
    step, curve = 0, []
    model.train()
    while True:
        el = time.perf_counter() - t0
        if el > seconds:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(el / seconds, v["lr"], 0.05)
        idx = torch.randint(0, n, (batch,), device=x.device)
        xb = x[idx].to(dev, non_blocking=True)
        yb = y[idx].to(dev, non_blocking=True).reshape(-1)
        logits, chars = _forward(model, heads, xb, vcfg, dev, gen if v["aug"] else None)
        use_label = v.get("label", True) or ("label_after" in v and el > v["label_after"] * seconds)
        loss = F.cross_entropy(logits, yb) if use_label else logits.sum() * 0.0
        if chars is not None:
            cb = ch[idx].to(dev, non_blocking=True).reshape(chars.shape[0], -1)
            loss = loss + F.cross_entropy(chars.reshape(-1, N_CHAR), cb.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            text = yb > 0
            acc = float((logits[text].argmax(-1) == yb[text]).float().mean())
            row = dict(step=step, s=round(time.perf_counter() - t0, 1), loss=round(float(loss.detach()), 4),
                       acc=round(acc, 4))
            if chars is not None:
                h, t = _char_hits(chars.detach(), cb)
                row["char_acc"] = round(h / max(1, t), 4)
            curve.append(row)
            print(f"  {name} " + " ".join(f"{k} {val}" for k, val in row.items()), flush=True)
    model.eval()
    out = dict(name=name, **v, params=sum(p.numel() for p in params.parameters()), steps=step, tiles_seen=step * batch,
               seconds=round(time.perf_counter() - t0, 1), curve=curve)
    for label, key in (("train", f"train_{v['scale']}_check"), ("heldout", f"heldout_{v['scale']}")):
        xs, ys, chs, wds = sets[key]
        out[label] = accuracy(model, heads, xs, wds if v.get("word") else ys, chs, vcfg, dev)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", type=int, default=40000, help="training tiles per scale")
    ap.add_argument("--eval-tiles", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=60.0, help="training time per variant")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--only", nargs="*", default=None, help="variant names (default all)")
    ap.add_argument("--config", default="tiny-ui")
    ap.add_argument("--set", action="append", default=[], help="config overrides as holotron.train --set")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)

    from holotron.train.presets import make_config

    global config_name
    config_name = args.config
    config = make_config(args.config, 2048, args.set)
    vcfg = config.vision
    dev = torch.device(args.device)
    names = args.only or list(VARIANTS)
    scales = {VARIANTS[n]["scale"] for n in names}
    t0 = time.perf_counter()
    sets = {}
    with mp.get_context("fork").Pool(args.workers) as pool:
        for sc in sorted(scales):
            rng_scale = NORMAL if sc == "normal" else LARGE
            sets[f"train_{sc}"] = render_set(pool, "train", args.tiles, rng_scale, vcfg, 0)
            sets[f"train_{sc}_check"] = render_set(pool, "train", args.eval_tiles, rng_scale, vcfg, 10**6)
            sets[f"heldout_{sc}"] = render_set(pool, "heldout", args.eval_tiles, rng_scale, vcfg, 2 * 10**6)
    for k, (x, y, ch, wd) in sets.items():
        print(f"{k}: {tuple(x.shape)} tiles, {100 * float((y > 0).float().mean()):.1f}% text tokens, "
              f"{100 * float((ch >= 2).float().mean()):.1f}% patches on a character", flush=True)
        if dev.type == "cuda" and k.startswith("train_") and not k.endswith("_check"):
            sets[k] = (x.to(dev), y.to(dev), ch.to(dev), wd.to(dev))  # on the GPU: batches are gathered there
    render_s = time.perf_counter() - t0
    print(f"rendered in {render_s:.0f} s", flush=True)
    results = []
    for name in names:
        results.append(run_variant(name, VARIANTS[name], sets, config, dev, args.seconds, args.batch,
                                   base_set=args.set))
    print("\nvariant | steps | tiles seen | train tiles read | held-out read | held-out loss | train chars | "
          "held-out chars")
    for r in results:
        cc = " | ".join(f"{100 * r[s]['char_acc']:.1f}%" if "char_acc" in r[s] else "-" for s in ("train", "heldout"))
        print(f"{r['name']} | {r['steps']} | {r['tiles_seen']:,} | {100 * r['train']['read_acc']:.1f}% | "
              f"{100 * r['heldout']['read_acc']:.1f}% | {r['heldout']['loss']:.3f} | {cc}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "reading_probe.json").write_text(json.dumps(
        dict(device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", torch=torch.__version__,
             tiles=args.tiles, seconds=args.seconds, batch=args.batch, render_s=round(render_s, 1),
             results=results), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
