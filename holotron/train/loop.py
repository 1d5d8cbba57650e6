"""``train(args)``: the training run the command line describes (holotron/train/cli.py), top to bottom: check
the inputs, build the model and optimiser (or resume), stream the data, step, log, eval, save."""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from ..model import Holotron
from ..processor import Processor
from ..tokenizer import coordinate_token_ids
from .augment import pad_sample
from .batches import ScreenBatches
from .checkpoint import init_from, load_training_state, save_checkpoint, trainer_state, write_log_csv
from .coords import init_coordinate_embeddings
from .evals import make_evaluator
from .heads import AuxHeads
from .inputs import check_inputs, check_out, pick_device, prepare_tokenizer
from .losses import loss_fn
from .matching import MatchBatches, match_stage_loss
from .optim import lr_at, make_optimizer, schedule_progress
from .presets import init_weights, make_config
from .profiling import PROFILE_SKIP, start_profiler, write_profile
from .reading import ReadingBatches, reading_loss_fn

__all__ = ["train", "train_step"]


def log(message: str) -> None:
    """A line on stderr that does not get mixed into the progress bar."""
    tqdm.write(message, file=sys.stderr)


def format_seconds(s: float) -> str:
    """``MM:SS``, or ``H:MM:SS`` from an hour on."""
    return tqdm.format_interval(max(0, round(s)))


def train(args) -> dict:
    """Run training as ``args`` (the parsed command line) says; returns the final trainer state."""
    t_start = time.perf_counter()
    out = check_out(args.out)  # checked now; made once the setup below has passed its checks
    init_src = check_inputs(args)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    tok_dir = prepare_tokenizer(args, out, log)
    processor = Processor.from_pretrained(tok_dir)
    config = make_config(args.config, processor.vocab_size, args.set)
    coords = coordinate_token_ids(processor)
    model, aux, trainable = _build_model(args, config, device, init_src, coords)
    if args.compile:
        from .compiled import compile_modules

        log(f"torch.compile: {compile_modules(model)} modules (compiled at their first calls)")
    coord_ids = torch.tensor(coords, device=device) if coords else None
    n_params = model.num_parameters()
    opt = make_optimizer(trainable, args.lr, args.weight_decay, fused=device.type == "cuda")
    step, history, evals, elapsed_before = 0, [], [], 0.0
    if args.resume:
        # the schedule's minutes before the resumed run began travel with it (a resumed job that dropped them
        # ran its schedule from the run's own start: dev/LOG.md, 2026-12-05)
        step, history, evals, elapsed_before, args.schedule_done = load_training_state(
            args.resume, args.stage, model, aux, opt)
        log(f"resumed from {args.resume} at step {step}")

    out.mkdir(parents=True, exist_ok=True)
    log(_describe(args, model, device))
    reading, matching = args.stage == "read", args.stage == "match"
    loader = _loader(args, _dataset(args, config.vision, tok_dir, aux), step, device)
    # the reading stage: characters alone for the first --labels-after of the run, then label classes beside them
    labels_after = 0.0
    if reading and args.char_weight > 0:
        labels_after = 0.5 if args.labels_after is None else args.labels_after
    aug_gen = None
    if args.colour_aug == "on" or (args.colour_aug == "auto" and (reading or matching)):
        aug_gen = torch.Generator(device=device).manual_seed(args.seed)
    if device.type == "cuda":
        amp = torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        amp = torch.autocast("cpu", enabled=False)
    evaluator = make_evaluator(args, model, aux, tok_dir, device, amp, log, coord_ids)

    # the attention pointer a grounding run trains (holotron/train/losses.py): decoding may use it
    pointer = None
    if args.stage == "ground" and aux is not None and args.pointer_weight > 0 and args.pointer_heads > 0:
        heads = model.language_model.backbone.layers[aux.layer + 1].mixer.n_heads
        pointer = {"layer": aux.layer + 1, "heads": min(args.pointer_heads, heads)}
        if args.pointer_element_heads:  # decoding points with the element-only heads
            k = min(args.pointer_element_heads, pointer["heads"])
            pointer = {"layer": aux.layer + 1, "heads": k, "first": pointer["heads"] - k}

    def save(folder: Path, status: str, seconds: float) -> dict:
        state = trainer_state(args, step, history, evals, n_params, seconds, status)
        save_checkpoint(model, folder, tok_dir, dtype=getattr(torch, args.save_dtype),
                        max_shard_size=args.max_shard_size, state=state,
                        optimizer=opt if args.save_optimizer else None, aux=aux, click_pointer=pointer)
        return state

    budget_s = args.time_budget * 60 if args.time_budget else None
    stop_reason, save_s, eval_s = "steps", 0.0, 0.0
    meter = _Meter(history, elapsed_before, args.batch_size)
    bar, first = _progress_bar(args, step), step
    prof, prof_end = start_profiler(args.profile, device), step + PROFILE_SKIP + 1 + args.profile
    model.train()
    try:
        with _sigterm_flag() as stop:  # the scan's backend: ssd_scan's choice (Triton + its backward on CUDA)
            t_ready = time.perf_counter()
            for batch in _repeat(loader, args.reuse, skip=step % args.reuse):
                meter.waited(time.perf_counter() - t_ready)  # time the GPU / CPU sat waiting for data
                if args.schedule_minutes:  # one schedule over several jobs: their training seconds together
                    progress = schedule_progress(step, args.steps, meter.seconds() + 60 * args.schedule_done,
                                                 args.schedule_minutes * 60)
                else:
                    progress = step / args.steps
                    if budget_s:  # the schedule ends with whichever comes first: the steps or this run's minutes
                        progress = max(progress, (time.perf_counter() - t_start) / budget_s)
                lr = lr_at(progress, args.lr, args.warmup, args.min_lr_ratio, schedule=args.schedule,
                           cooldown=args.cooldown)
                if step - first < args.rewarm_steps:  # a fresh optimiser mid-schedule: ramp up to the schedule
                    lr *= (step - first + 1) / args.rewarm_steps
                for group in opt.param_groups:
                    group["lr"] = lr
                parts = {} if (step + 1) % args.log_every == 0 or step + 1 == args.steps else None
                loss, gnorm = train_step(args, model, aux, trainable, opt, batch, device, amp, parts,
                                         aug_gen=aug_gen, coord_ids=coord_ids,
                                         label_weight=float(progress >= labels_after))
                step += 1
                if prof is not None:
                    prof.step()
                    if step == prof_end:
                        write_profile(prof, out / "profile.txt", device, args.profile, log)
                        prof = None
                meter.add(step, loss, lr, gnorm, batch["tokens"], parts,
                          logged=step % args.log_every == 0 or step == args.steps)
                _show(bar, step, meter, lr, "tiles/s" if reading else "screens/s",
                      t_start + budget_s if budget_s else None)
                if evaluator is not None and step % args.eval_every == 0:
                    t = time.perf_counter()
                    evals.append(evaluator(step))
                    eval_s = time.perf_counter() - t
                if args.save_every and step % args.save_every == 0 and step < args.steps:
                    t = time.perf_counter()
                    folder = out / f"checkpoint-{step}"
                    save(folder, "running", meter.seconds(meter.now))
                    for old in out.glob("checkpoint-*"):  # keep the latest only
                        if old != folder and old.is_dir():
                            shutil.rmtree(old)
                    save_s = time.perf_counter() - t
                if step >= args.steps:  # (with --reuse the last batch's repeats may run past it)
                    break
                if stop["flag"]:
                    stop_reason = "signal"
                    break
                # leave room for the final save (and the final eval) within this run's budget
                reserve = 2 * save_s + 5 + (eval_s if args.final_eval else 0.0)
                if budget_s and time.perf_counter() - t_start + reserve >= budget_s:
                    stop_reason = "time budget"
                    break
                t_ready = time.perf_counter()
    except KeyboardInterrupt:
        stop_reason = "interrupted"
    finally:
        if prof is not None:  # the run ended before the profiled steps did: nothing is written
            prof.stop()
        bar.close()
    train_s = meter.seconds()
    if evaluator is not None and (not evals or evals[-1]["step"] != step) and stop_reason != "interrupted" \
            and args.final_eval:
        evals.append(evaluator(step))
    state = save(out, stop_reason, train_s)
    write_log_csv(out / "train_log.csv", history)
    log(f"stopped after step {step} ({stop_reason}); {format_seconds(train_s)} training, {meter.tokens_seen:,} tokens; "
        f"checkpoint in {out}")
    return state


def train_step(args, model: Holotron, aux: AuxHeads | None, trainable: nn.Module, opt, batch: dict,
               device: torch.device, amp, parts: dict | None = None, *, aug_gen: torch.Generator | None = None,
               coord_ids: torch.Tensor | None = None, label_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step of the stage ``args.stage`` on ``batch``: its loss under ``amp`` (``parts`` receives
    the terms), backward, gradient clipping, the optimiser's step. Returns the loss (detached) and the gradient
    norm as device tensors, so the step itself reads nothing back from the device (the loss log reads them).
    ``label_weight``: the reading stage's label term (0 during its characters-only start)."""
    with amp:
        if args.stage == "read":
            loss, _ = reading_loss_fn(model, aux, batch, device, parts, label_weight=label_weight,
                                      char_weight=args.char_weight, augment=aug_gen)
        elif args.stage == "match":
            loss, _ = match_stage_loss(model, aux, batch, device, parts, args.char_weight, aug_gen)
        else:
            loss, _ = loss_fn(model, batch, device, aux, args.aux_weight, parts, args.char_weight,
                              args.pointer_weight, augment=aug_gen, pointer_heads=args.pointer_heads,
                              match_weight=args.match_weight, coord_ids=coord_ids,
                              pointer_element_heads=args.pointer_element_heads)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(trainable.parameters(), args.grad_clip)
    opt.step()
    return loss.detach(), gnorm


# ----------------------------------------------------------------------------------------------
# setup
# ----------------------------------------------------------------------------------------------

def _build_model(args, config, device: torch.device, init_src,
                 coords: list[int] | None = None) -> tuple[Holotron, AuxHeads | None, nn.Module]:
    """The model (seeded initialisation, or --init-from's weights: all of them, or with ``--init-parts vision``
    the vision tower and projector alone), the auxiliary heads when a loss needs them, and the part that
    trains: everything; in the reading stage the vision tower, the projector and the heads that read (the
    language model waits); in the matching stage those and the language model's embedding table. A fresh
    embedding table with coordinate tokens (``coords``) starts them on ``init_coordinate_embeddings``."""
    model = init_weights(Holotron(config), args.seed)
    if coords and (not args.init_from or args.init_parts == "vision"):
        init_coordinate_embeddings(model, coords, args.seed)
    model = model.to(device)
    reading, matching = args.stage == "read", args.stage == "match"
    aux = AuxHeads(config).to(device) if (args.aux_weight > 0 or reading or matching) else None
    if args.init_from:
        init_from(model, aux, init_src, args.init_from, log, parts=args.init_parts)
    if reading:
        trainable = nn.ModuleList([model.vision_model, model.mlp1, aux.label_in, aux.char_in])
    elif matching:
        trainable = nn.ModuleList([model.vision_model, model.mlp1, model.language_model.backbone.embeddings,
                                   aux.match, aux.char_in])
    else:
        trainable = model if aux is None else nn.ModuleList([model, aux])
    return model, aux, trainable


def _describe(args, model: Holotron, device: torch.device) -> str:
    vcfg = model.config.vision
    vision = sum(p.numel() for p in model.vision_model.parameters())
    mlp1 = sum(p.numel() for p in model.mlp1.parameters())
    thumb = "+ thumbnail" if vcfg.use_thumbnail and vcfg.max_num_tiles > 1 else "(no thumbnail)"
    return (f"model {args.config}: {model.num_parameters() / 1e6:.2f} M parameters (vision {vision / 1e6:.2f} M, "
            f"mlp1 {mlp1 / 1e6:.2f} M, language model {model.language_model.num_parameters() / 1e6:.2f} M); "
            f"tiles {vcfg.image_size} px, up to {vcfg.max_num_tiles} {thumb}, {vcfg.tokens_per_tile} tokens each; "
            f"device {device}")


def _dataset(args, vision, tok_dir, aux) -> torch.utils.data.Dataset:
    """The stream: reading mosaics (--stage read) or grounding screens, item ``step`` the batch of that step."""
    if args.stage == "read":
        return ReadingBatches(vision, args.batch_size, args.seed, max(1, args.batch_size // 8), args.split,
                              args.read_tile)
    options = screen_options(args)
    pad = functools.partial(pad_sample, max_frac=args.pad_max, p=args.pad_aug) if args.pad_aug > 0 else None
    if args.stage == "match":
        return MatchBatches(tok_dir, vision, args.batch_size, args.seed, args.split, options, pad)
    return ScreenBatches(tok_dir, vision, args.batch_size, args.seed, args.queries, args.split,
                         chars=aux is not None and args.char_weight > 0, options=options,
                         short_followups=args.followups == "short", grid_aug=args.grid_aug,
                         match=aux is not None and args.match_weight > 0, pad=pad, pointer_core=args.pointer_core,
                         length_multiple=args.length_multiple, pointer_element=args.pointer_element_heads > 0)


def screen_options(args) -> dict:
    """``generate_sample`` options of the training screens: --layouts, --vocab (train: the held-out
    vocabulary never drawn), --fonts (mixed: each screen's text in one of several faces,
    holotron/data/faces.py; the evals' screens keep the default font), --tables (on: data tables on about
    half of the training screens, holotron/data/tables.py; never on the evals' screens) and --icon-places (on: the
    icons moved so that only their glyph tells them apart, holotron/data/icon_places.py; never on the evals') and
    --tab-places (on: now and then tabs in a column, holotron/data/tab_places.py; never on the evals')."""
    options = {}
    if args.layouts:
        options["layout"] = tuple(args.layouts)
    if args.vocab != "all":
        options["vocab"] = args.vocab
    if getattr(args, "fonts", "default") != "default":
        options["font"] = args.fonts
    if getattr(args, "tables", "off") == "on":
        options["tables"] = True
    if getattr(args, "icon_places", "off") == "on":
        options["icon_places"] = True
    if getattr(args, "tab_places", "off") == "on":
        options["tab_places"] = True
    return options


def _loader(args, data, step: int, device: torch.device) -> torch.utils.data.DataLoader:
    """The batches from ``step`` on (each used --reuse times), rendered in --workers processes."""
    return torch.utils.data.DataLoader(
        data, batch_size=None, sampler=range(step // args.reuse, -(-args.steps // args.reuse)),
        num_workers=args.workers, pin_memory=device.type == "cuda",
        prefetch_factor=args.prefetch if args.workers else None, persistent_workers=False)


def _repeat(batches, times: int, skip: int = 0):
    """Each batch ``times`` times in a row (``--reuse``), the first one ``skip`` times fewer (a resumed run
    picks up in the middle of a batch's repeats)."""
    for i, batch in enumerate(batches):
        for _ in range(times - (skip if i == 0 else 0)):
            yield batch


@contextlib.contextmanager
def _sigterm_flag():
    """A dict whose "flag" turns True on SIGTERM (a job scheduler's stop: the loop finishes the step, saves and
    exits); the previous handler comes back afterwards. Off the main thread no handler can be set: Ctrl-C and
    the time budget still stop cleanly."""
    stop = {"flag": False}

    def on_term(signum, frame):
        stop["flag"] = True

    try:
        old = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        old = None
    try:
        yield stop
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


# ----------------------------------------------------------------------------------------------
# the loss log and the progress bar
# ----------------------------------------------------------------------------------------------

class _Meter:
    """The loss log: a bias-corrected moving average of the loss, and per log entry the throughput and the
    share of the time spent waiting for data since the previous entry. Appends to ``history``. The average
    is kept on the loss's device and read with the log entries alone (``ema`` is the one of the last entry):
    a read of the device every step would make the host wait for each step to finish before queueing the next."""

    def __init__(self, history: list[dict], elapsed_before: float, batch_size: int):
        self.history, self.elapsed_before, self.batch_size = history, elapsed_before, batch_size
        self.ema, self.ema_sum, self.n = 0.0, 0.0, 0
        self.t_loop = self.t_prev = self.now = time.perf_counter()
        self.tokens_seen = 0
        self.w_tokens, self.w_samples, self.w_wait = 0, 0, 0.0

    def seconds(self, now: float | None = None) -> float:
        """Training seconds so far, resumed runs' included."""
        return (time.perf_counter() if now is None else now) - self.t_loop + self.elapsed_before

    def waited(self, seconds: float) -> None:
        self.w_wait += seconds

    def add(self, step: int, loss: torch.Tensor, lr: float, gnorm: torch.Tensor, tokens: int, parts: dict | None,
            logged: bool) -> None:
        """One step's loss and gradient norm (0-d tensors, on the device)."""
        self.ema_sum = 0.95 * self.ema_sum + 0.05 * loss.detach().double()
        self.n += 1
        self.tokens_seen += tokens
        self.w_tokens += tokens
        self.w_samples += self.batch_size
        self.now = now = time.perf_counter()
        if not logged:
            return
        dt = now - self.t_prev
        loss, ema_sum, gnorm = torch.stack([loss.detach().double(), self.ema_sum, gnorm.double()]).tolist()
        self.ema = ema_sum / (1 - 0.95**self.n)
        self.history.append({"step": step, "loss": round(loss, 5), "loss_ema": round(self.ema, 5), "lr": lr,
                             "grad_norm": round(gnorm, 4), "tokens_per_s": round(self.w_tokens / dt),
                             "screens_per_s": round(self.w_samples / dt, 2), "data_wait": round(self.w_wait / dt, 3),
                             **{k: round(v, 5) for k, v in (parts or {}).items()},
                             "seconds": round(self.seconds(now), 2)})
        self.t_prev, self.w_tokens, self.w_samples, self.w_wait = now, 0, 0, 0.0


def _progress_bar(args, step: int) -> tqdm:
    """The progress bar on stderr: redrawn at most every 0.1 s on a terminal, every --log-seconds elsewhere
    (a log file, a notebook's captured output)."""
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return tqdm(total=args.steps, initial=step, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True,
                mininterval=0.1 if tty else args.log_seconds)


def _show(bar: tqdm, step: int, meter: _Meter, lr: float, rate: str, deadline: float | None) -> None:
    """Move the bar to ``step`` with the latest log entry's numbers (the batch's items per second: screens, or
    mosaic tiles in the reading stage); with a time budget also the minutes left of it."""
    last = meter.history[-1] if meter.history else {}
    fields = {"loss": f"{meter.ema:.4f}", "lr": f"{lr:.2e}", "tok/s": f"{last.get('tokens_per_s', 0):,}",
              rate: f"{last.get('screens_per_s', 0)}", "data wait": f"{last.get('data_wait', 0):.0%}"}
    if deadline is not None:
        fields["budget left"] = format_seconds(deadline - time.perf_counter())
    bar.set_postfix(fields, refresh=False)
    bar.update(step - bar.n)
