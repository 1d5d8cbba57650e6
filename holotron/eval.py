"""Grounding evaluation: point-in-box accuracy with a Wilson 95% interval, broken down per role and, on
synthetic screens, per screen-size family and per vocabulary (target label held out of training or not).

    python -m holotron.eval --model holotron-tiny-ui --n 1000                     # held-out synthetic screens
    python -m holotron.eval --model M --split train --n 200 --dev                 # training looks, dev seeds
    python -m holotron.eval --model M --ladder --n 200 --dev                      # the three rungs, one table
    python -m holotron.eval --model M --data screenspot.json --box-format xywh --box-space pixel
    python -m holotron.eval ... --json          # one JSON object on stdout
    python -m holotron.eval ... --out DIR       # a few annotated hits and misses as PNG + predictions.jsonl

A prediction scores when the click parsed from the answer (``grounding.parse_click``, model space
0-1000) falls inside the target box, edges included (``grounding.point_in_box``); an answer with no
parsable click is a miss. Examples go through ``holotron.Processor`` in left-padded batches and
greedy ``holotron.generate``, exactly as at inference.

Data:
  synthetic    ``holotron.data.generate_sample`` screens of ``--split`` (default "heldout": themes,
               hues, corners, font sizes, screen sizes and layouts the training split never shows)
               and ``--vocab`` (default "all"; "heldout": targets whose label training screens made
               with vocab="train" never show, holotron.data.heldout_vocab), seeds ``--seed0`` ..
               ``--seed0 + n - 1`` (training streams use seeds below 10**9 for their first seed, far
               under the default 10**9 + ...; see holotron.train).
  seeds        two ranges: DEV_SEED0 = 3 * 10**9 (``--dev``) is for every training-time eval and every
               decision (checkpoints, settings, ablations); EVAL_SEED0 = 10**9 (the default) gives the
               1,000 screens of the reported number only, looked at once a model is chosen, so the
               reported number was not used to pick it.
  ladder       ``--ladder``: the same model on (a) training looks on new seeds (split train, vocab all),
               (b) held-out looks (split heldout, vocab all), (c) held-out vocabulary (split train, vocab
               heldout), n screens each from the same first seed; one table, or one JSON object with the
               three reports. Rungs (a) and (c) share most screens (holotron.data.screens: a vocab="heldout"
               screen is the vocab="all" one of its seed, with a held-out-label target, when it has one).
  ScreenSpot   a JSON list of {"image": path relative to the JSON file, "instruction": text,
               "bbox": [4 numbers]} (``img_filename`` is read as ``image``); the box format (xyxy:
               corners, xywh: corner + size) and space (pixel, normalized 0-1, model 0-1000) are given
               explicitly; the role for the breakdown is the ``role`` field, else ``data_type``, else "all".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

from .data.eval_report import Prediction, Report, wilson_interval
from .data.eval_sets import DEV_SEED0, EVAL_SEED0, DataError, Example, read_screenspot, synthetic_examples
from .grounding import draw_click, localization_messages, parse_click, point_in_box

__all__ = ["Example", "Prediction", "Report", "wilson_interval", "synthetic_examples", "read_screenspot",
           "answer_batch", "evaluate", "ladder", "ladder_table", "draw_example", "main", "EVAL_SEED0", "DEV_SEED0",
           "LADDER"]

# the ladder's rungs: (name, split, vocab)
LADDER = (("train-look", "train", "all"), ("heldout-look", "heldout", "all"), ("heldout-vocab", "train", "heldout"))


# ----------------------------------------------------------------------------- running the model

def answer_batch(model, processor, images: list, instructions: list[str], *, max_new_tokens: int = 32,
                 device=None, dtype=None, pointer: bool = True) -> list[str]:
    """Greedy answers (special tokens dropped) to localisation prompts, one per (image, instruction),
    as one left-padded batch. ``pointer``: a checkpoint that declares a click pointer (holotron/click_pointer.py)
    writes its coordinates in the cell its attention points at; False: the plain greedy answer."""
    import torch

    from .click_pointer import constraint_for
    from .generation import generate, stop_ids
    from .vision.preprocess import load_image

    device = device if device is not None else model.device
    images = [load_image(im) for im in images]
    batch = processor([localization_messages(t) for t in instructions], images=[[im] for im in images])
    batch = batch.to(device, dtype if dtype is not None else model.dtype)
    stops = list(stop_ids(model, processor))
    constrain = constraint_for(model, processor, batch["input_ids"], [im.size for im in images]) if pointer else None
    try:
        with torch.inference_mode():
            new = generate(model, batch["input_ids"], max_new_tokens, attention_mask=batch["attention_mask"],
                           pixel_values=batch["pixel_values"], eos_token_id=stops,
                           pad_token_id=processor.pad_token_id, constrain=constrain)
    finally:
        if constrain is not None:
            constrain.close()
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
             n_draw: int = 8, pointer: bool = True) -> Report:
    """Score ``model`` on ``examples`` (``pointer`` as ``answer_batch``). With ``out_dir``: the first ``n_draw -
    n_draw // 2`` hits and the first ``n_draw // 2`` misses drawn as PNG (``draw_example``), and every prediction
    in predictions.jsonl."""
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
                                   max_new_tokens=max_new_tokens, device=device, dtype=dtype, pointer=pointer)
            for ex, im, ans in zip(chunk, images, answers):
                point = parse_click(ans)
                w, h = im.size
                p = Prediction(ex.id, ex.role, ex.instruction, ans, point, point_in_box(point, ex.box, w, h),
                               ex.box, (w, h), ex.family, ex.vocab)
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


def ladder(model, processor, n: int, *, seed0: int, out_dir=None, options: dict | None = None, workers: int = 0,
           **evaluate_kwargs) -> dict[str, Report]:
    """The ladder (LADDER): ``evaluate`` on ``n`` synthetic screens of each rung, seeds seed0 .. seed0 + n - 1
    (DEV_SEED0 for decisions, EVAL_SEED0 for the reported number), in order; {rung name: Report}.
    ``out_dir``: each rung's PNGs and predictions.jsonl in its own subfolder; ``options``: more
    ``generate_sample`` options for every rung; ``workers``: rendering processes (``synthetic_examples``);
    ``evaluate_kwargs`` as ``evaluate``."""
    reports = {}
    for name, split, vocab in LADDER:
        examples = synthetic_examples(n, split=split, seed0=seed0, vocab=vocab, workers=workers, **(options or {}))
        reports[name] = evaluate(model, processor, examples, total=n,
                                 out_dir=Path(out_dir) / name if out_dir else None, **evaluate_kwargs)
    return reports


def ladder_table(reports: dict[str, Report]) -> str:
    """One compact table: a column per rung, rows accuracy % (and n) overall, per role, per size family and
    per vocabulary; "-" where a rung has no such screen."""
    names = list(reports)
    rungs = {name: " / ".join(sv) for name, *sv in LADDER}
    width = max(16, *(len(nm) + 2 for nm in names), *(len(sv) + 2 for sv in rungs.values()))

    def row(title, cells):
        return f"{title:<22}" + "".join(f"{c:>{width}}" for c in cells)

    def cell(h, n):
        return "-" if not n else f"{100 * h / n:.1f} ({n})"

    lines = [row("", names),
             row("split / vocab", [rungs.get(nm, "?") for nm in names]),
             row("accuracy % (n)", [cell(r.hits, r.n) for r in reports.values()]),
             row("95% CI", [f"{100 * r.ci[0]:.1f}-{100 * r.ci[1]:.1f}" for r in reports.values()]),
             row("unparseable", [str(r.unparseable) for r in reports.values()])]
    for what, attr in (("role", "roles"), ("family", "families"), ("vocab", "vocabs")):
        keys = sorted({k for r in reports.values() for k in getattr(r, attr)})
        for k in keys:
            lines.append(row(f"{what} {k}", [cell(*getattr(r, attr).get(k, (0, 0))) for r in reports.values()]))
    return "\n".join(lines)


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
                                description="Point-in-box grounding accuracy of a holotron checkpoint.",
                                epilog=f"Seeds: --dev (first seed DEV_SEED0 = {DEV_SEED0}) for every training-time "
                                       f"eval and every decision; the default first seed EVAL_SEED0 = {EVAL_SEED0} "
                                       "only for the final, reported number.")
    p.add_argument("--model",
                   help="checkpoint folder, Hugging Face repo id or bundled name (default: the bundled model)")
    p.add_argument("--data",
                   help="ScreenSpot-style JSON list of {image, instruction, bbox} (default: synthetic screens)")
    p.add_argument("--box-format", choices=["xyxy", "xywh"], help="with --data: how bbox is written (required)")
    p.add_argument("--box-space", choices=["pixel", "normalized", "model"], help="with --data: bbox units (required)")
    p.add_argument("--n", type=int, default=1000,
                   help="synthetic screens (per rung with --ladder), or the first N entries of --data")
    p.add_argument("--split", help="synthetic split: heldout (default) or train (new seeds)")
    p.add_argument("--vocab", choices=["all", "train", "heldout"],
                   help="synthetic labels: all (default), train (no held-out label on the screen) or heldout "
                        "(targets with a held-out label)")
    p.add_argument("--seed0", type=int, help=f"first synthetic seed (default {EVAL_SEED0}, or {DEV_SEED0} with --dev)")
    p.add_argument("--dev", action="store_true",
                   help=f"the dev seeds (first seed DEV_SEED0 = {DEV_SEED0}): for decisions; the default seeds "
                        "are for the reported number only")
    p.add_argument("--ladder", action="store_true",
                   help="three rungs of --n synthetic screens each: training looks (split train), held-out looks "
                        "(split heldout), held-out vocabulary (split train, vocab heldout); one table")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0,
                   help="processes rendering the synthetic screens ahead of the model (default 0: in this one)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--out", help="folder for annotated example PNGs and predictions.jsonl (a subfolder per rung "
                                 "with --ladder)")
    p.add_argument("--examples", type=int, default=8, help="annotated PNGs to write with --out (hits and misses)")
    p.add_argument("--pointer", choices=["auto", "off"], default="auto",
                   help="auto: a checkpoint that declares a click pointer (generation_config.json click_pointer) "
                        "writes its coordinates in the cell its attention points at; off: plain greedy digits")
    p.add_argument("--no-progress", action="store_true")
    return p


def _flag_conflict(args) -> str | None:
    """The first flag that does not go with the others, as one line; None when they agree."""
    if args.data:
        for flag, given in (("--ladder", args.ladder), ("--vocab", args.vocab), ("--split", args.split),
                            ("--dev", args.dev), ("--seed0", args.seed0 is not None)):
            if given:
                return f"{flag} chooses synthetic screens and cannot go with --data {args.data}"
    if args.ladder:
        for flag, given in (("--split", args.split), ("--vocab", args.vocab)):
            if given:
                return f"{flag} cannot go with --ladder: the ladder runs every split and vocab of its rungs itself"
    if args.dev and args.seed0 is not None:
        return "--dev and --seed0 both choose the first seed: give one"
    return None


def main(argv: list[str] | None = None) -> int:
    from .cli_common import CLIError, check_out_dir, cli_device, cli_dtype
    from .model import Holotron
    from .processor import Processor
    from .weights import load

    args = _parser().parse_args(argv)
    conflict = _flag_conflict(args)
    if conflict:  # a usage error: argparse's exit code
        print(f"holotron.eval: error: {conflict}", file=sys.stderr)
        return 2
    split, vocab = args.split or "heldout", args.vocab or "all"
    seed0 = args.seed0 if args.seed0 is not None else DEV_SEED0 if args.dev else EVAL_SEED0
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
            examples = None if args.ladder else synthetic_examples(args.n, split=split, seed0=seed0, vocab=vocab,
                                                                   workers=args.workers)
            source = {"seed0": seed0, "dev": seed0 == DEV_SEED0} if args.ladder else \
                {"synthetic": split, "vocab": vocab, "seed0": seed0, "dev": seed0 == DEV_SEED0}
        model = load(model_id, dtype=dtype, device=device)
        if not isinstance(model, Holotron):
            raise CLIError(f"{model_id} is a text-only model: grounding needs a VL checkpoint")
        processor = Processor.from_pretrained(model_id)
        model.eval()
        common = dict(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, device=device, dtype=dtype,
                      progress=not args.no_progress, n_draw=args.examples, pointer=args.pointer == "auto")
        if args.ladder:
            reports = ladder(model, processor, args.n, seed0=seed0, out_dir=args.out, workers=args.workers, **common)
        else:
            rep = evaluate(model, processor, examples, total=min(args.n, len(examples)) if args.data else args.n,
                           out_dir=args.out, **common)
    except (CLIError, DataError, ValueError, FileNotFoundError, OSError) as e:
        print(f"holotron.eval: error: {e}", file=sys.stderr)
        return 1
    head = {"model": str(model_id), **source, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "pointer": args.pointer}
    kind = {DEV_SEED0: "the dev seeds, for decisions", EVAL_SEED0: "the reported seeds"}.get(seed0, "custom seeds")
    seeds = f"seeds {seed0}.. ({kind})"
    if args.ladder:
        if args.json:
            rungs = {name: {"split": sp, "vocab": vo, **reports[name].to_json()} for name, sp, vo in LADDER}
            print(json.dumps({**head, "n": args.n, "ladder": rungs}))
        else:
            secs = sum(r.seconds for r in reports.values())
            print(f"ladder: {len(reports)} x {args.n} synthetic screens, {seeds}")
            print(ladder_table(reports))
            print(f"{len(reports) * args.n} examples in {secs:.1f} s on {device}")
    elif args.json:
        print(json.dumps({**head, **rep.to_json()}))
    else:
        if not args.data:
            print(f"synthetic screens: split {split}, vocab {vocab}, {seeds}")
        print(rep.table())
        print(f"{rep.n} examples in {rep.seconds:.1f} s ({rep.n / max(rep.seconds, 1e-9):.2f} per second) on {device}")
    if args.out:
        print(f"wrote annotated examples and predictions.jsonl to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
