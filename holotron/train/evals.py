"""The evals a run makes every ``--eval-every`` steps and at the end: point-in-box accuracy on held-out screens
by greedy generation (``holotron.eval``) and the teacher-forced in-box rate, or, in the reading stage, the
share of text tokens and characters read right on fixed held-out mosaics, or, in the matching stage, the
matching accuracy. ``make_evaluator`` returns the run's one, or None."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from ..processor import Processor
from ..vision.preprocess import preprocess_image
from .reading import ReadingBatches, reading_loss_fn

__all__ = ["make_evaluator", "grounding_eval", "reading_eval", "match_eval", "teacher_forced_eval"]


def make_evaluator(args, model, aux, tok_dir, device: torch.device, amp, log,
                   coord_ids: torch.Tensor | None = None) -> Callable[[int], dict] | None:
    """``evaluator(step) -> dict`` (an entry of trainer_state.json's "evals") for this run, or None when it has
    no evals (``--eval-every 0``, or ``--eval-n 0`` outside the reading stage). Screens of ``--eval-split``
    from the dev seeds (``holotron.eval.DEV_SEED0``), never the reported ones. Matching stage: the matching
    accuracy and the word and character reading on a fixed dev batch (``match_eval``). Grounding: greedy
    point-in-box (``grounding_eval``) and, with coordinate tokens, the teacher-forced in-box rate on a fixed
    dev batch (``teacher_forced_eval``). Leaves the model in train mode."""
    from ..eval import DEV_SEED0

    vcfg = model.config.vision
    if args.stage == "read" and args.eval_every:  # fixed tiles from screens of the eval split
        batch = ReadingBatches(vcfg, max(8, args.eval_n), seed=10**6, split=args.eval_split, tile=args.read_tile)[0]
        return lambda step: reading_eval(model, aux, batch, device, step, log, amp)
    seeds = [DEV_SEED0 + i for i in range(args.eval_n)]
    if args.stage == "match" and args.eval_every and args.eval_n:
        from .matching import MatchBatches

        batch = MatchBatches(tok_dir, vcfg, len(seeds), split=args.eval_split, seeds=seeds)[0]
        return lambda step: match_eval(model, aux, batch, device, step, log, amp)
    if args.stage != "read" and args.eval_every and args.eval_n:
        from ..eval import synthetic_examples
        from .batches import ScreenBatches

        examples = list(synthetic_examples(args.eval_n, split=args.eval_split, seed0=DEV_SEED0))
        processor = Processor.from_pretrained(tok_dir, image_processor=lambda im: preprocess_image(im, vcfg))
        forced = None
        if coord_ids is not None:
            forced = ScreenBatches(tok_dir, vcfg, len(seeds), queries=args.queries, split=args.eval_split,
                                   short_followups=args.followups == "short", seeds=seeds)[0]

        def evaluator(step: int) -> dict:
            with _eager():
                out = grounding_eval(model, processor, examples, device, step, log)
            if forced is not None:
                out.update(teacher_forced_eval(model, forced, device, step, log, amp, coord_ids))
            return out
        return evaluator
    return None


def _eager():
    """``--compile`` is for the training step: the grounding eval generates through the engine, whose Triton
    kernels inductor must not trace (torch.compile's stance "force_eager", torch >= 2.6; before it the modules
    stay compiled)."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


@torch.no_grad()
def match_eval(model, aux, batch, device, step, log, amp) -> dict:
    """The matching stage's losses and accuracies (``matching.match_stage_loss``) on a fixed dev batch: the
    share of queries whose best-scored image token is on their element or its label ("match_acc", the
    recipe's first gate), of words and characters read right."""
    from .matching import match_stage_loss

    model.eval()
    parts = {}
    with amp:
        match_stage_loss(model, aux, batch, device, parts)
    model.train()
    log(f"match eval at step {step}: {100 * parts.get('match_acc', 0):.1f}% of queries matched, "
        f"{100 * parts.get('word_acc', 0):.1f}% of words, {100 * parts.get('char_acc', 0):.1f}% of characters")
    return {"step": step, **{k: round(v, 5) for k, v in parts.items()}}


@torch.no_grad()
def teacher_forced_eval(model, batch, device, step, log, amp, coord_ids) -> dict:
    """The teacher-forced answer on a fixed dev batch (``losses.loss_fn`` with the coordinate targets): the
    share of x, y and both coordinates whose most likely token lands in the element's box (the recipe's
    second gate), and the answer loss."""
    from .losses import loss_fn

    model.eval()
    parts = {}
    with amp:
        loss_fn(model, batch, device, parts=parts, coord_ids=coord_ids)
    model.train()
    log(f"teacher-forced at step {step}: {100 * parts.get('inbox', 0):.1f}% in the box "
        f"(x {100 * parts.get('inbox_x', 0):.1f}%, y {100 * parts.get('inbox_y', 0):.1f}%)")
    return {"tf_" + k: round(v, 5) for k, v in parts.items()}


def grounding_eval(model, processor, examples, device, step, log) -> dict:
    """Point-in-box accuracy of greedy answers on ``examples`` (``holotron.eval.evaluate``), logged."""
    from ..eval import evaluate

    model.eval()
    rep = evaluate(model, processor, examples, batch_size=16, device=device, progress=False)
    model.train()
    log(f"eval at step {step}: {rep.hits}/{rep.n} = {100 * rep.accuracy:.1f}% point-in-box "
        f"(95% CI {100 * rep.ci[0]:.1f}-{100 * rep.ci[1]:.1f}), {rep.unparseable} unparseable")
    return {"step": step, "n": rep.n, "hits": rep.hits, "accuracy": rep.accuracy, "ci": list(rep.ci),
            "unparseable": rep.unparseable}


@torch.no_grad()
def reading_eval(model, aux, batch, device, step, log, amp) -> dict:
    """The reading loss and accuracies (``reading_loss_fn``) on a fixed batch of mosaics, logged."""
    model.eval()
    parts = {}
    with amp:
        reading_loss_fn(model, aux, batch, device, parts)
    chars = f", {100 * parts['char_acc']:.1f}% of characters" if "char_acc" in parts else ""
    log(f"reading eval at step {step}: {100 * parts['read_acc']:.1f}% of text tokens read right{chars}, "
        f"loss {parts['read']:.3f}")
    model.train()
    return {"step": step, "read_acc": parts["read_acc"], "read_loss": parts["read"],
            **({"char_acc": parts["char_acc"], "char_loss": parts["char"]} if "char_acc" in parts else {})}
