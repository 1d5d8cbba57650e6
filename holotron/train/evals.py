"""The evals a run makes every ``--eval-every`` steps and at the end: point-in-box accuracy on held-out screens
by greedy generation (``holotron.eval``), or, in the reading stage, the share of text tokens and characters
read right on fixed held-out mosaics. ``make_evaluator`` returns the run's one, or None."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..processor import Processor
from ..vision.preprocess import preprocess_image
from .reading import ReadingBatches, reading_loss_fn

__all__ = ["make_evaluator", "grounding_eval", "reading_eval"]


def make_evaluator(args, model, aux, tok_dir, device: torch.device, amp, log) -> Callable[[int], dict] | None:
    """``evaluator(step) -> dict`` (an entry of trainer_state.json's "evals") for this run, or None when it has
    no evals (``--eval-every 0``, or ``--eval-n 0`` outside the reading stage). Leaves the model in train mode."""
    vcfg = model.config.vision
    if args.stage == "read" and args.eval_every:  # fixed tiles from screens of the eval split
        batch = ReadingBatches(vcfg, max(8, args.eval_n), seed=10**6, split=args.eval_split, tile=args.read_tile)[0]
        return lambda step: reading_eval(model, aux, batch, device, step, log, amp)
    if args.stage != "read" and args.eval_every and args.eval_n:
        from ..eval import synthetic_examples

        examples = list(synthetic_examples(args.eval_n, split=args.eval_split))
        processor = Processor.from_pretrained(tok_dir, image_processor=lambda im: preprocess_image(im, vcfg))
        return lambda step: grounding_eval(model, processor, examples, device, step, log)
    return None


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
