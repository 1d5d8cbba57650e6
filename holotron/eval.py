"""Grounding evaluation: point-in-box accuracy with a Wilson 95% interval and a per-role breakdown.

    python -m holotron.eval --model holotron-tiny-ui --n 1000                     # held-out synthetic screens
    python -m holotron.eval --model M --split train --n 200                       # training looks, new seeds
    python -m holotron.eval --model M --data screenspot.json --box-format xywh --box-space pixel
    python -m holotron.eval ... --json          # one JSON object on stdout
    python -m holotron.eval ... --out DIR       # a few annotated hits and misses as PNG + predictions.jsonl

A prediction scores when the click parsed from the answer (``grounding.parse_click``, model space
0-1000) falls inside the target box, edges included (``grounding.point_in_box``); an answer with no
parsable click is a miss. Examples go through ``holotron.Processor`` in left-padded batches and
greedy ``holotron.generate``, exactly as at inference.

Data:
  synthetic    ``holotron.data.generate_sample`` screens of ``--split`` (default "heldout": themes,
               hues, corners, font sizes, screen sizes and layouts the training split never shows),
               seeds ``--seed0`` .. ``--seed0 + n - 1`` (training streams use seeds below 10**9 for
               their first seed, far under the default 10**9 + ...; see holotron.train).
  ScreenSpot   a JSON list of {"image": path relative to the JSON file, "instruction": text,
               "bbox": [4 numbers]} (``img_filename`` is read as ``image``); the box format (xyxy:
               corners, xywh: corner + size) and space (pixel, normalized 0-1, model 0-1000) are given
               explicitly; the role for the breakdown is the ``role`` field, else ``data_type``, else "all".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from .grounding import Box, Point, draw_click, localization_messages, parse_click, point_in_box

__all__ = ["Example", "Prediction", "Report", "wilson_interval", "synthetic_examples", "read_screenspot",
           "answer_batch", "evaluate", "draw_example", "main", "EVAL_SEED0"]

EVAL_SEED0 = 10**9
Z95 = 1.959963984540054  # the normal quantile of 0.975


def wilson_interval(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion hits / n (95% with the default z); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= hits <= n:
        raise ValueError(f"hits must be in [0, n={n}], got {hits}")
    p = hits / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo = 0.0 if hits == 0 else max(0.0, centre - half)  # exact at the edges (rounding would leave 1 - 1e-16)
    hi = 1.0 if hits == n else min(1.0, centre + half)
    return lo, hi


@dataclass
class Example:
    image: Any          # a path or a PIL image
    instruction: str
    box: Box            # the target; "pixel" boxes are in the original image's pixels
    role: str = "all"
    id: str = ""


@dataclass
class Prediction:
    id: str
    role: str
    instruction: str
    answer: str
    point: Point | None
    hit: bool
    box: Box
    size: tuple[int, int]

    def to_json(self) -> dict:
        return {"id": self.id, "role": self.role, "instruction": self.instruction, "answer": self.answer,
                "click": None if self.point is None else [self.point.x, self.point.y], "hit": self.hit,
                "box": [self.box.x0, self.box.y0, self.box.x1, self.box.y1], "box_space": self.box.space,
                "image_size": list(self.size)}


@dataclass
class Report:
    n: int = 0
    hits: int = 0
    unparseable: int = 0
    seconds: float = 0.0
    roles: dict[str, list[int]] = field(default_factory=dict)  # role -> [hits, n]
    predictions: list[Prediction] = field(default_factory=list, repr=False)

    @property
    def accuracy(self) -> float:
        return self.hits / self.n if self.n else 0.0

    @property
    def ci(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.n)

    def add(self, p: Prediction) -> None:
        self.n += 1
        self.hits += p.hit
        self.unparseable += p.point is None
        r = self.roles.setdefault(p.role, [0, 0])
        r[0] += p.hit
        r[1] += 1
        self.predictions.append(p)

    def per_role(self) -> dict[str, dict]:
        out = {}
        for role in sorted(self.roles):
            h, n = self.roles[role]
            lo, hi = wilson_interval(h, n)
            out[role] = {"n": n, "hits": h, "accuracy": h / n, "ci95": [lo, hi]}
        return out

    def to_json(self) -> dict:
        lo, hi = self.ci
        return {"n": self.n, "hits": self.hits, "accuracy": self.accuracy, "ci95": [lo, hi],
                "unparseable": self.unparseable, "seconds": round(self.seconds, 2), "per_role": self.per_role()}

    def table(self) -> str:
        lo, hi = self.ci
        lines = [f"point-in-box accuracy: {self.hits}/{self.n} = {100 * self.accuracy:.1f}% "
                 f"(95% Wilson CI {100 * lo:.1f}-{100 * hi:.1f}); unparseable answers: {self.unparseable}",
                 f"{'role':<12} {'n':>6} {'hits':>6} {'acc %':>7}  95% CI"]
        for role, r in self.per_role().items():
            lines.append(f"{role:<12} {r['n']:>6} {r['hits']:>6} {100 * r['accuracy']:>7.1f}  "
                         f"{100 * r['ci95'][0]:.1f}-{100 * r['ci95'][1]:.1f}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- data

def synthetic_examples(n: int, *, split: str = "heldout", seed0: int = EVAL_SEED0, **options) -> Iterator[Example]:
    """``n`` synthetic screens (rendered one by one as the iterator is read)."""
    from .data import generate_sample

    for seed in range(seed0, seed0 + n):
        s = generate_sample(seed, split=split, **options)
        yield Example(s.image, s.instruction, s.target_box, s.target.role, f"{split}-{seed}")


class DataError(ValueError):
    """A ScreenSpot-style file that cannot be read; the message names the file and the entry."""


def _check_box_range(box: Box, img: Path, where: str, raw) -> None:
    """A box more than 1% outside its space (0-1, 0-1000, or the image's pixels) was given in another space:
    say so rather than score every answer a miss."""
    if box.space == "pixel":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(img) as im:  # reads the header only
                w, h = im.size
        except (OSError, UnidentifiedImageError) as e:
            raise DataError(f"{where}: image {img} cannot be read ({type(e).__name__}: {e})") from None
    else:
        w = h = 1.0 if box.space == "normalized" else 1000.0
    if min(box.x0, box.y0) < -0.01 * max(w, h) or box.x1 > 1.01 * w or box.y1 > 1.01 * h:
        where_to = f"the {w}x{h} image" if box.space == "pixel" else f"0-{w:g}"
        raise DataError(f"{where}: bbox {raw!r} lies outside {where_to} (--box-space {box.space}): "
                        "is --box-space right (pixel, normalized 0-1, model 0-1000)?")


def read_screenspot(path, *, box_format: str, box_space: str) -> list[Example]:
    """Examples from a JSON list of {"image", "instruction", "bbox"} (see the module docstring)."""
    path = Path(path)
    if box_format not in ("xyxy", "xywh"):
        raise DataError(f"--box-format must be xyxy or xywh, got {box_format!r}")
    if box_space not in ("pixel", "normalized", "model"):
        raise DataError(f"--box-space must be pixel, normalized or model, got {box_space!r}")
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of examples, found {type(items).__name__}")
    out = []
    for i, it in enumerate(items):
        where = f"{path}, entry {i}"
        if not isinstance(it, dict):
            raise DataError(f"{where}: expected an object, found {type(it).__name__}")
        image = it.get("image", it.get("img_filename"))
        missing = [k for k, v in (("image", image), ("instruction", it.get("instruction")), ("bbox", it.get("bbox")))
                   if v is None]
        if missing:
            raise DataError(f"{where}: missing {', '.join(missing)}")
        img = (path.parent / image) if not Path(image).is_absolute() else Path(image)
        if not img.is_file():
            raise DataError(f"{where}: image {img} not found")
        try:
            box = Box.from_values(it["bbox"], box_format, box_space)
        except (TypeError, ValueError) as e:
            raise DataError(f"{where}: bbox {it['bbox']!r}: {e}") from None
        _check_box_range(box, img, where, it["bbox"])
        role = it.get("role", it.get("data_type", "all"))
        out.append(Example(str(img), str(it["instruction"]), box, str(role), str(it.get("id", i))))
    return out


# ----------------------------------------------------------------------------- running the model

def answer_batch(model, processor, images: list, instructions: list[str], *, max_new_tokens: int = 32,
                 device=None, dtype=None) -> list[str]:
    """Greedy answers (special tokens dropped) to localisation prompts, one per (image, instruction),
    as one left-padded batch."""
    import torch

    from .generation import generate, stop_ids

    device = device if device is not None else model.device
    batch = processor([localization_messages(t) for t in instructions], images=[[im] for im in images])
    batch = batch.to(device, dtype if dtype is not None else model.dtype)
    stops = list(stop_ids(model, processor))
    with torch.inference_mode():
        new = generate(model, batch["input_ids"], max_new_tokens, attention_mask=batch["attention_mask"],
                       pixel_values=batch["pixel_values"], eos_token_id=stops, pad_token_id=processor.pad_token_id)
    texts = []
    for row in new.tolist():
        cut = next((k for k, t in enumerate(row) if t in stops), len(row))
        texts.append(processor.decode(row[:cut], skip_special_tokens=True))
    return texts


def _batches(items: Iterable, size: int) -> Iterator[list]:
    chunk = []
    for it in items:
        chunk.append(it)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def evaluate(model, processor, examples: Iterable[Example], *, batch_size: int = 8, max_new_tokens: int = 32,
             device=None, dtype=None, total: int | None = None, progress: bool = True, out_dir=None,
             n_draw: int = 8) -> Report:
    """Score ``model`` on ``examples``. With ``out_dir``: the first ``n_draw - n_draw // 2`` hits and the
    first ``n_draw // 2`` misses drawn as PNG (``draw_example``), and every prediction in predictions.jsonl."""
    from tqdm.auto import tqdm

    from .vision.preprocess import load_image

    if total is None and hasattr(examples, "__len__"):
        total = len(examples)
    bar = tqdm(total=total, desc="eval", unit="ex", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    rep = Report()
    t0 = time.perf_counter()
    drawn = {True: 0, False: 0}
    want = {True: n_draw - n_draw // 2, False: n_draw // 2}
    out = Path(out_dir) if out_dir else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        jsonl = open(out / "predictions.jsonl", "w", encoding="utf-8")
    try:
        for chunk in _batches(examples, batch_size):
            images = [load_image(ex.image) for ex in chunk]
            answers = answer_batch(model, processor, images, [ex.instruction for ex in chunk],
                                   max_new_tokens=max_new_tokens, device=device, dtype=dtype)
            for ex, im, ans in zip(chunk, images, answers):
                point = parse_click(ans)
                w, h = im.size
                p = Prediction(ex.id, ex.role, ex.instruction, ans, point, point_in_box(point, ex.box, w, h),
                               ex.box, (w, h))
                rep.add(p)
                if out is not None:
                    jsonl.write(json.dumps(p.to_json()) + "\n")
                    if drawn[p.hit] < want[p.hit]:
                        name = f"{rep.n - 1:04d}-{'hit' if p.hit else 'miss'}-{p.role.replace(' ', '_')}.png"
                        draw_example(im, p).save(out / name)
                        drawn[p.hit] += 1
            bar.update(rep.n - bar.n)
            bar.set_postfix(acc=f"{100 * rep.accuracy:.1f}%", refresh=False)
    finally:
        bar.close()
        if out is not None:
            jsonl.close()
    rep.seconds = time.perf_counter() - t0
    return rep


def draw_example(image, p: Prediction):
    """A copy of the screenshot with the target box (green) and the click (red), and a caption strip."""
    from PIL import Image, ImageDraw, ImageFont

    im = image.convert("RGB") if image.mode != "RGB" else image.copy()
    w, h = im.size
    box = p.box.convert("pixel", w, h)
    d = ImageDraw.Draw(im)
    lw = max(2, round(min(w, h) / 300))
    d.rectangle([box.x0, box.y0, box.x1, box.y1], outline=(0, 200, 0), width=lw)
    if p.point is not None:
        im = draw_click(im, p.point)
    size = max(12, round(min(w, h) / 45))
    font = ImageFont.load_default(size=size)
    caption = f"{'HIT' if p.hit else 'MISS'} [{p.role}] {p.instruction!r} -> {p.answer.strip()[:80]!r}"
    strip = Image.new("RGB", (w, size * 2), (0, 120, 0) if p.hit else (170, 0, 0))
    ImageDraw.Draw(strip).text((size // 2, size // 2), caption, fill=(255, 255, 255), font=font)
    canvas = Image.new("RGB", (w, h + strip.height))
    canvas.paste(strip, (0, 0))
    canvas.paste(im, (0, strip.height))
    return canvas


# ----------------------------------------------------------------------------- the command line

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m holotron.eval",
                                description="Point-in-box grounding accuracy of a holotron checkpoint.")
    p.add_argument("--model",
                   help="checkpoint folder, Hugging Face repo id or bundled name (default: the bundled model)")
    p.add_argument("--data",
                   help="ScreenSpot-style JSON list of {image, instruction, bbox} (default: synthetic screens)")
    p.add_argument("--box-format", choices=["xyxy", "xywh"], help="with --data: how bbox is written (required)")
    p.add_argument("--box-space", choices=["pixel", "normalized", "model"], help="with --data: bbox units (required)")
    p.add_argument("--n", type=int, default=1000, help="synthetic screens (or the first N entries of --data)")
    p.add_argument("--split", default="heldout", help="synthetic split: heldout (default) or train (new seeds)")
    p.add_argument("--seed0", type=int, default=EVAL_SEED0, help=f"first synthetic seed (default {EVAL_SEED0})")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--out", help="folder for annotated example PNGs and predictions.jsonl")
    p.add_argument("--examples", type=int, default=8, help="annotated PNGs to write with --out (hits and misses)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    from .cli_common import CLIError, check_out_dir, cli_device, cli_dtype
    from .model import Holotron
    from .processor import Processor
    from .weights import load

    args = _parser().parse_args(argv)
    try:
        if args.data and (args.box_format is None or args.box_space is None):
            raise CLIError("--data needs --box-format (xyxy or xywh) and --box-space (pixel, normalized or model)")
        if not args.data and (args.box_format or args.box_space):
            raise CLIError("--box-format / --box-space describe --data: give the file too")
        if args.n < 1 or args.batch_size < 1:
            raise CLIError("--n and --batch-size must be >= 1")
        model_id = args.model
        if model_id is None:
            from .bundled import DEFAULT_MODEL, default_model

            model_id = default_model()
            if model_id is None:
                raise CLIError(f"no --model given and this build has no bundled model ({DEFAULT_MODEL})")
        device = cli_device(args.device)
        dtype = cli_dtype(args.dtype, device)
        if args.out:
            check_out_dir(args.out)  # before the model is loaded, not after the whole run
        if args.data:
            examples = read_screenspot(args.data, box_format=args.box_format, box_space=args.box_space)[:args.n]
            source = {"data": args.data, "box_format": args.box_format, "box_space": args.box_space}
        else:
            examples = synthetic_examples(args.n, split=args.split, seed0=args.seed0)
            source = {"synthetic": args.split, "seed0": args.seed0}
        model = load(model_id, dtype=dtype, device=device)
        if not isinstance(model, Holotron):
            raise CLIError(f"{model_id} is a text-only model: grounding needs a VL checkpoint")
        processor = Processor.from_pretrained(model_id)
        model.eval()
        rep = evaluate(model, processor, examples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                       device=device, dtype=dtype, total=min(args.n, len(examples)) if args.data else args.n,
                       progress=not args.no_progress, out_dir=args.out, n_draw=args.examples)
    except (CLIError, DataError, ValueError, FileNotFoundError, OSError) as e:
        print(f"holotron.eval: error: {e}", file=sys.stderr)
        return 1
    result = {"model": str(model_id), **source, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
              **rep.to_json()}
    if args.json:
        print(json.dumps(result))
    else:
        print(rep.table())
        print(f"{rep.n} examples in {rep.seconds:.1f} s ({rep.n / max(rep.seconds, 1e-9):.2f} per second) on {device}")
    if args.out:
        print(f"wrote annotated examples and predictions.jsonl to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
