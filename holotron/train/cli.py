"""The command line of ``python -m holotron.train`` (holotron/train/__main__.py): ``parser()`` and ``main()``,
which checks the flags against each other before ``train`` (holotron/train/loop.py) starts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from .loop import train
from .presets import PRESETS, make_config
from .profiling import PROFILE_SKIP

__all__ = ["parser", "main", "check_args"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m holotron.train",
                                description="Train a holotron VL model on streamed synthetic GUI screens.")
    p.add_argument("--config", default="tiny-ui", help=f"architecture preset: {', '.join(PRESETS)} (default tiny-ui)")
    p.add_argument("--set", action="append", default=[], metavar="PART.FIELD=VALUE",
                   help="override a size, e.g. --set vision.image_size=448 --set text.hidden_size=256 (repeatable)")
    p.add_argument("--out", required=True, help="checkpoint folder (written at the end, and every --save-every steps)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32, help="screens per step")
    p.add_argument("--queries", type=int, default=1, help="questions per screen (turns of one conversation)")
    p.add_argument("--read-tile", type=int, default=None, metavar="PX",
                   help="--stage read: the side of the reading mosaics in px (default the config's tile); the text in "
                        "them keeps the scales the config's tiling shows screens at (e.g. 384 for tiny-ui: the cells "
                        "of a 1024 px mosaic attend to each other's unrelated text)")
    p.add_argument("--grid-aug", type=float, default=0.0, metavar="P",
                   help="grounding: the share of screens tiled on a random grid near their ratio instead of the "
                        "closest one (augmented_grid), so the tile count does not give the grid away (default 0)")
    p.add_argument("--layouts", nargs="+", metavar="LAYOUT",
                   help="grounding: the screen layouts to train on instead of the split's own (holotron.data.LAYOUTS; "
                        "e.g. the training five and 'mosaic', random panes in no split's defaults)")
    p.add_argument("--followups", default="full", choices=["full", "short"],
                   help="the 2nd..Nth questions of a screen: the whole localisation prompt (full, default) or the "
                        "target alone (short: about 10 tokens instead of 170, so more questions per screen for the "
                        "same tokens; the first question always has the whole prompt, as at inference)")
    p.add_argument("--stage", default="ground", choices=["ground", "read", "match"],
                   help="ground (default): the grounding task on whole screens; read: the vision tower, projector and "
                        "character and text-class heads alone, on tile mosaics of text crops; match: the vision "
                        "tower, projector and the language model's embedding table on whole screens, every element "
                        "and text a query of its label's word embeddings scored over the image tokens "
                        "(holotron/train/matching.py); start a ground run from either with --init-from")
    p.add_argument("--init-from", metavar="DIR",
                   help="start from this checkpoint's weights (and its aux_heads.pt), with a fresh optimizer "
                        "and schedule")
    p.add_argument("--init-parts", default="all", choices=["all", "vision"],
                   help="with --init-from: all its weights (default), or the vision tower and projector alone "
                        "(e.g. under a new tokenizer: the language model starts fresh)")
    p.add_argument("--match-weight", type=float, default=0.0,
                   help="grounding: weight of the matching losses beside the answer (scaled by --aux-weight; "
                        "holotron/train/matching.py); 0 (default): off")
    p.add_argument("--pad-aug", type=float, default=0.0, metavar="P",
                   help="the share of training screens padded on one axis by up to --pad-max of its side "
                        "(holotron/train/augment.py: whole-screen aspect ratios beyond the training sizes'); "
                        "default 0")
    p.add_argument("--pad-max", type=float, default=0.4, help="--pad-aug's largest padding, a fraction of the side")
    p.add_argument("--vocab", default="all", choices=["all", "train"],
                   help="labels the training screens draw from: all (default), or train: the held-out "
                        "vocabulary (holotron.data.heldout_vocab) never rendered, so the eval's held-out-"
                        "vocabulary screens test reading")
    p.add_argument("--fonts", default="default", choices=["default", "mixed"],
                   help="the font of the grounding and matching training screens: default (Pillow's Aileron, as "
                        "the evals' screens) or mixed (one face per screen: Aileron on 30%%, else one of the faces "
                        "bundled in holotron/data/fonts/, none a family of the real-browser set)")
    p.add_argument("--tables", default="off", choices=["off", "on"],
                   help="grounding and matching training screens: on draws a data table on about half of the app, "
                        "web and mobile screens, its rows' controls asked through the row's identifier "
                        "(holotron/data/tables.py); off (default): the screens as before. Never on the evals' screens")
    p.add_argument("--icon-places", default="off", choices=["off", "on"],
                   help="grounding and matching training screens: on moves the icons so that only their glyph tells "
                        "them apart (window controls at either end of the title bar, toolbar icons in a vertical "
                        "strip, a dialog's close icon in either corner; holotron/data/icon_places.py); off (default): "
                        "the screens as before. Never on the evals' screens")
    p.add_argument("--tab-places", default="off", choices=["off", "on"],
                   help="grounding and matching training screens: on draws tabs in a column now and then (an app's "
                        "sidebar as tabs, its tab row as a column (the sidebar, or beside the content), a web "
                        "page's settings-style column; holotron/data/tab_places.py); off (default): the screens as "
                        "before. Never on the evals' screens")
    p.add_argument("--tokenizer-kind", default="bpe", choices=["bpe", "word"],
                   help="the tokenizer a run trains when none is given: bpe (byte-level BPE, digits split; the "
                        "default) or word (one token per label word, coordinates 0..1000 as single tokens; "
                        "holotron/tokenizer.py)")
    p.add_argument("--char-weight", type=float, default=1.0,
                   help="weight of the per-patch character loss (the character under each patch: a local target the "
                        "vision tower learns fast); in a ground run it is further scaled by --aux-weight; 0: off")
    p.add_argument("--pointer-weight", type=float, default=0.0,
                   help="weight of the pointer loss (scaled by --aux-weight): from the position that answers a "
                        "question, score the image tokens and put the probability on the question's element "
                        "(the lookup the last attention layer must learn); 0 (default): off")
    p.add_argument("--pointer-heads", type=int, default=0, metavar="N",
                   help="put the pointer loss on the first N heads of the last attention layer itself, at every "
                        "position that writes an answer token, instead of on a training-only head: the "
                        "layer that feeds the digits then looks at the element (default 0: the training-only head)")
    p.add_argument("--pointer-element-heads", type=int, default=0, metavar="K",
                   help="the last K of the --pointer-heads put the probability on the element's own tokens, its "
                        "label text outside the box left out (a field's, a checkbox's): where a click must land; "
                        "the run's click pointer (generation_config.json) is then those K heads (default 0)")
    p.add_argument("--pointer-core", action="store_true",
                   help="the pointer's positives: only the image tokens whose centre lies on the asked element or on "
                        "its label text (default: every token one of whose 4 x 4 sub-points does, which includes a "
                        "row outside a one-row-tall box)")
    p.add_argument("--labels-after", type=float, default=None, metavar="FRACTION",
                   help="reading stage: train characters alone for this fraction of the run, then the label classes "
                        "beside them (default 0.5; 0 when --char-weight is 0)")
    p.add_argument("--colour-aug", default="auto", choices=["auto", "on", "off"],
                   help="colour augmentation (per tile in the reading stage, per screen in grounding: a random channel "
                        "order, inversion half the time, a random gain and offset); auto (default): reading stage only")
    p.add_argument("--aux-weight", type=float, default=0.0,
                   help="weight of the auxiliary image-token losses (text class under each token, its screen "
                        "position; training-only heads, not saved with the model); 0 (default): answer loss only")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.05, help="warm-up as a fraction of the run (default 0.05)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr of the decay")
    p.add_argument("--schedule", default="cosine", choices=["cosine", "wsd"],
                   help="cosine (default): warm-up then cosine decay; wsd: warm-up, constant peak, linear "
                        "cool-down over the last --cooldown of the run")
    p.add_argument("--cooldown", type=float, default=0.2, help="--schedule wsd: the cool-down's share of the run")
    p.add_argument("--schedule-minutes", type=float, default=None, metavar="MIN",
                   help="one schedule over several jobs: its length in training minutes, counted across "
                        "--resume (each job's --time-budget then only stops that job)")
    p.add_argument("--schedule-done", type=float, default=None, metavar="MIN",
                   help="with --schedule-minutes: training minutes of the schedule already behind a run that "
                        "starts with --init-from instead of --resume (a job whose optimiser state was lost); "
                        "--resume carries the resumed run's own")
    p.add_argument("--rewarm-steps", type=int, default=0, metavar="N",
                   help="ramp the learning rate up to the schedule's over this job's first N steps (a job that "
                        "starts a fresh optimiser mid-schedule, --schedule-done: Adam's first updates are as large "
                        "as the learning rate on every parameter; default 0: off)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0, help="seeds the initialisation and the data stream")
    p.add_argument("--time-budget", type=float,
                   help="minutes for this run, setup included: stop cleanly, eval and save before they run out; "
                        "the lr schedule then ends with whichever comes first, --steps or the minutes")
    p.add_argument("--workers", type=int, default=max(0, min(16, (os.cpu_count() or 1) - 1)),
                   help="data worker processes (0: render in the training process)")
    p.add_argument("--prefetch", type=int, default=4, help="batches each worker prepares ahead")
    p.add_argument("--reuse", type=int, default=1,
                   help="steps each data batch is used for (default 1): where rendering cannot keep up with the "
                        "device, e.g. the reading stage, whose colour augmentation draws anew at each use")
    p.add_argument("--split", default="train", help="holotron.data split the training screens come from")
    p.add_argument("--tokenizer", help="folder with tokenizer.json + tokenizer_config.json (default: the --resume or "
                   "--init-from checkpoint's own, else train one into OUT/tokenizer)")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--tokenizer-corpus", type=int, default=4000, help="screens in the tokenizer's corpus")
    p.add_argument("--eval-every", type=int, default=500, help="steps between evals (0: none)")
    p.add_argument("--eval-n", type=int, default=64, help="held-out screens per eval")
    p.add_argument("--eval-split", default="heldout")
    p.add_argument("--no-final-eval", dest="final_eval", action="store_false", help="skip the eval at the end")
    p.add_argument("--log-every", type=int, default=10, help="steps between entries of the loss log")
    p.add_argument("--log-seconds", type=float, default=15.0, help="seconds between progress lines off a terminal")
    p.add_argument("--save-every", type=int, default=0,
                   help="steps between checkpoints in OUT/checkpoint-STEP (0: only the final one in OUT)")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--save-optimizer", action="store_true", help="also write training_state.pt (for --resume)")
    p.add_argument("--max-shard-size", default="5GB", help="e.g. 14MB")
    p.add_argument("--resume", help="a checkpoint folder written with --save-optimizer: continue from its step")
    p.add_argument("--length-multiple", type=int, default=1, metavar="N",
                   help="right-pad each grounding batch's token rows to a multiple of N (default 1: the longest row): "
                        "the losses do not change, the shapes repeat (cuDNN attention plans, torch.compile graphs)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the ViT blocks, the projector and the language model's blocks (the Mamba "
                        "mixers' norms; the SSD scan stays outside): holotron/train/compiled.py")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help=f"profile N steps after the first {PROFILE_SKIP + 1} (torch.profiler) and write the busiest "
                        "operators to OUT/profile.txt (default 0: off)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m holotron.train``: parse and check the flags, train, print a one-line JSON summary."""
    args = parser().parse_args(argv)
    check_args(args)
    state = train(args)
    last = state["evals"][-1] if state["evals"] else None
    summary = {"step": state["step"], "status": state["status"], "train_seconds": state["train_seconds"],
               "loss": state["log"][-1]["loss_ema"] if state["log"] else None,
               "eval": last, "out": args.out}
    print(json.dumps(summary))
    return 0


def check_args(args) -> None:
    """Exit with one line on flags out of range or that do not go together (before any work starts)."""
    if args.profile < 0:
        raise SystemExit(f"holotron.train: error: --profile must be >= 0, got {args.profile}")
    if args.length_multiple < 1:
        raise SystemExit(f"holotron.train: error: --length-multiple must be >= 1, got {args.length_multiple}")
    if args.steps < 1 or args.batch_size < 1 or args.queries < 1 or args.reuse < 1:
        raise SystemExit("holotron.train: error: --steps, --batch-size, --queries and --reuse must be >= 1")
    if args.labels_after is not None and not 0 <= args.labels_after < 1:
        raise SystemExit(f"holotron.train: error: --labels-after must be in [0, 1), got {args.labels_after}")
    if not 0 <= args.grid_aug <= 1:
        raise SystemExit(f"holotron.train: error: --grid-aug must be in [0, 1], got {args.grid_aug}")
    if args.layouts:
        from ..data import LAYOUTS, SPLITS

        bad = [name for name in args.layouts if name not in LAYOUTS]
        if bad:
            raise SystemExit(f"holotron.train: error: --layouts: unknown layout {bad[0]!r} "
                             f"(known: {', '.join(LAYOUTS)})")
        if args.stage == "read":
            raise SystemExit("holotron.train: error: --layouts picks grounding screens; leave it out of --stage read")
        scored = SPLITS[args.eval_split].layouts if args.eval_split in SPLITS and args.eval_split != args.split else ()
        held = [name for name in args.layouts if name in scored]
        if held:
            raise SystemExit(f"holotron.train: error: --layouts: {held[0]!r} is a layout of the "
                             f"{args.eval_split} split, which the evals score: training on it would void them")
    # the training screens' options: grounding and matching screens only; tables, icon and tab places: train split
    for flag, on, train_only in (("--fonts", args.fonts != "default", False), ("--tables", args.tables == "on", True),
                                 ("--icon-places", args.icon_places == "on", True),
                                 ("--tab-places", args.tab_places == "on", True)):
        if on and args.stage == "read":
            raise SystemExit(f"holotron.train: error: {flag} changes the grounding and matching screens; the reading "
                             "stage's screens stay as they are: leave it out of --stage read")
        if on and train_only and args.split != "train":
            raise SystemExit(f"holotron.train: error: {flag} changes training screens only (--split train), not "
                             f"--split {args.split}")
    if args.tables == "on" and args.layouts:
        from ..data.tables import TABLE_LAYOUTS

        if not set(args.layouts) & set(TABLE_LAYOUTS):
            raise SystemExit(f"holotron.train: error: --tables: none of the --layouts draws tables (those that do: "
                             f"{', '.join(TABLE_LAYOUTS)})")
    if args.grid_aug and args.stage == "read":
        raise SystemExit("holotron.train: error: --grid-aug tiles grounding screens; the reading stage's mosaics "
                         "have no grid: leave it out of --stage read")
    if args.read_tile is not None:
        if args.stage != "read":
            raise SystemExit("holotron.train: error: --read-tile sizes the reading stage's mosaics: "
                             "use it with --stage read")
        try:
            dataclasses.replace(make_config(args.config, 256, args.set).vision, image_size=args.read_tile)
        except ValueError as e:
            raise SystemExit(f"holotron.train: error: --read-tile {args.read_tile}: {e}") from None
    if args.grid_aug:
        try:
            vision = make_config(args.config, 256, args.set).vision
        except ValueError:
            vision = None  # train() reports a bad --config / --set
        if vision is not None and vision.max_num_tiles < 2:
            raise SystemExit(f"holotron.train: error: --grid-aug draws tiling grids, and --config {args.config} "
                             "shows a screen as one tile: use a tiled preset (tiny-ui-tiles) or leave --grid-aug out")
    if args.stage == "match" and args.queries != 1:
        raise SystemExit("holotron.train: error: --queries asks questions of the language model; the matching "
                         "stage has none: leave it out of --stage match")
    if not 0 <= args.pad_aug <= 1 or not 0 < args.pad_max <= 2:
        raise SystemExit(f"holotron.train: error: --pad-aug must be in [0, 1] and --pad-max in (0, 2], got "
                         f"{args.pad_aug} and {args.pad_max}")
    if args.match_weight < 0:
        raise SystemExit(f"holotron.train: error: --match-weight must be >= 0, got {args.match_weight}")
    if args.init_parts != "all" and not args.init_from:
        raise SystemExit("holotron.train: error: --init-parts says which weights --init-from gives: give --init-from")
    if args.schedule_done is not None and args.resume:
        raise SystemExit("holotron.train: error: --schedule-done is for a run that starts with --init-from; "
                         "--resume carries the minutes its run started with: leave --schedule-done out")
    args.schedule_done = args.schedule_done or 0.0
    if args.schedule_done < 0 or (args.schedule_done and not args.schedule_minutes):
        raise SystemExit("holotron.train: error: --schedule-done must be >= 0 and needs --schedule-minutes")
    if args.rewarm_steps < 0:
        raise SystemExit(f"holotron.train: error: --rewarm-steps must be >= 0, got {args.rewarm_steps}")
    if args.schedule_minutes is not None and args.schedule_minutes <= 0:
        raise SystemExit(f"holotron.train: error: --schedule-minutes must be > 0, got {args.schedule_minutes}")
    if args.pointer_heads < 0:
        raise SystemExit(f"holotron.train: error: --pointer-heads must be >= 0, got {args.pointer_heads}")
    if not 0 <= args.pointer_element_heads <= args.pointer_heads:
        raise SystemExit(f"holotron.train: error: --pointer-element-heads must be between 0 and --pointer-heads "
                         f"({args.pointer_heads}), got {args.pointer_element_heads}")
    if args.pointer_core and not args.pointer_weight:
        raise SystemExit("holotron.train: error: --pointer-core chooses the pointer loss's positives: it needs "
                         "--pointer-weight > 0")
    if args.pointer_heads and not args.pointer_weight:
        raise SystemExit("holotron.train: error: --pointer-heads moves the pointer loss onto attention heads: "
                         "give it a --pointer-weight > 0 (and an --aux-weight > 0) too")
    if args.pointer_weight < 0:
        raise SystemExit(f"holotron.train: error: --pointer-weight must be >= 0, got {args.pointer_weight}")
    if args.char_weight < 0:
        raise SystemExit(f"holotron.train: error: --char-weight must be >= 0, got {args.char_weight}")

