"""What one grounding training step asks of the host: the aten ops it dispatches and the times it makes the
host wait for the device, counted on the CPU around the loop's own step (``holotron.train.loop.train_step``
and the loss log's ``_Meter.add``) with the recipe's ground options (scripts/train_tiny_ui_v2.sh: --queries 16
--followups short --aux-weight 0.5 --pointer-weight 1 --pointer-heads 2 --match-weight 0.5 --pad-aug 0.5
--colour-aug on --vocab train, a word tokenizer), on the tiny-ui preset at random weights, at each batch size.

On the H200 the tiny model's step is short enough that the host's side of it sets the pace: every op is a
kernel launch, and every read of a device value (``.item()``, ``float()``, ``.tolist()``, ``.cpu()``, an op whose
output size depends on the data: ``nonzero``, boolean-mask indexing, ``unique``, ``repeat_interleave`` without
``output_size``, ``bincount``) or blocking copy to the device (``.to(device)`` without ``non_blocking``,
``torch.tensor(list, device=...)``) waits for every kernel queued before it. The CPU run tells the tensors that
would live on the device from those that stay on the host (the batch as the data workers made it, and what the
step computes from it alone): each batch tensor's ``.to(device)`` counts as the copy and yields a new (device)
tensor. Pinned batch tensors copied with ``non_blocking=True`` do not wait; copies of unpinned host tensors count
as waits whether or not they ask for ``non_blocking``.

    python dev/probes/ground_step_ops.py [--batch 4 8] [--queries 16] [--image-size 1024] [--logged] [--json]
                                         [--config tiny-ui] [--tokenizer DIR]

Prints per batch size: the ops in the forward's modules, outside them (the loss code, the glue), in the backward, in the
clipping and the optimiser step, the ops on host tensors, the waits by cause (with the source line that caused
them), and the host-to-device copies. ``--logged``: a step that fills the loss log's parts (every --log-every
steps) instead of a plain one. ``--image-size`` tiles the screens at another side (a multiple of 32; a faster
CPU run: the counts of the loss code do not depend on it, the chunked scan's on the CPU do). The model's own
ops are those of the CPU path (the chunked scan runs chunk by chunk on the CPU, in Triton kernels on CUDA).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from holotron.processor import Processor
from holotron.tokenizer import build_task_tokenizer, coordinate_token_ids
from holotron.train.cli import check_args, parser
from holotron.train.loop import _build_model, _dataset, _Meter, train_step
from holotron.train.optim import make_optimizer
from holotron.train.presets import PRESETS, make_config

GROUND = ["--queries", "16", "--followups", "short", "--aux-weight", "0.5", "--pointer-weight", "1",
          "--pointer-heads", "2", "--match-weight", "0.5", "--pad-aug", "0.5", "--colour-aug", "on",
          "--vocab", "train", "--workers", "0", "--device", "cpu"]

# ops whose output size depends on the data: on CUDA they read a device value back
DATA_SIZED = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
              "bincount", "histc", "_local_scalar_dense"}
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}  # with a bool mask: a nonzero inside
READS = {"tolist", "numpy", "cpu", "item", "__bool__", "__int__", "__float__", "__index__"}
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint",
             "linspace", "eye"}


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _on_host(t: torch.Tensor) -> bool:
    return getattr(t, "_probe_host", False)


def _mark(t, host: bool, pinned: bool = False):
    for x in _tensors(t):
        x._probe_host, x._probe_pinned = host, pinned
    return t


def _caller() -> str:
    """The innermost holotron source line on the stack (what to change to avoid this wait)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/holotron/" in frame.filename and "/probes/" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} {frame.line}"
    return "(outside holotron)"


class _Places(TorchFunctionMode):
    """Python-level calls: which tensors are host tensors, the copies to the device and the reads back."""

    def __init__(self, waits: collections.Counter, copies: collections.Counter):
        super().__init__()
        self.waits, self.copies = waits, copies

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in ("to", "cuda") and src is not None and _on_host(src) and (
                name == "cuda" or any(isinstance(a, (torch.device, str)) for a in (*args[1:], *kwargs.values()))):
            pinned = getattr(src, "_probe_pinned", False)
            blocking = not kwargs.get("non_blocking", len(args) > 2 and args[2] is True)
            kind = "pinned, non-blocking" if pinned and not blocking else (
                "pinned, blocking" if pinned else "unpinned")
            self.copies[kind] += 1
            if blocking or not pinned:
                self.waits[("copy to the device (" + kind + ")", _caller())] += 1
            out = func(*args, **kwargs)
            if out is src:  # (on the CPU .to is the tensor itself: a copy stands for the device's)
                with _disable_current_modes():
                    out = out.clone()
            return _mark(out, host=False)
        if name in READS and src is not None and not _on_host(src):
            if name in ("tolist", "numpy", "cpu"):  # (item and the scalar conversions: _local_scalar_dense)
                self.waits[(f".{name}() of a device tensor", _caller())] += 1
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                with _disable_current_modes():
                    out = out.clone()
                _mark(out, host=True)
            return out
        out = func(*args, **kwargs)
        if name in FACTORIES and not any(isinstance(a, torch.Tensor) for a in args):
            on_device = kwargs.get("device") is not None
            if on_device and name in ("tensor", "as_tensor"):
                self.copies["unpinned"] += 1
                self.waits[("torch.tensor(data, device=...)", _caller())] += 1
            _mark(out, host=not on_device)
        return out


class _Ops(TorchDispatchMode):
    """aten calls: counted per phase, host or device, and those that read a device value."""

    def __init__(self, waits: collections.Counter):
        super().__init__()
        self.phase, self.depth, self.waits = "forward", 0, waits
        self.ops, self.host_ops = collections.Counter(), collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = _tensors((args, kwargs))
        host = bool(ins) and all(_on_host(t) for t in ins)
        if host:
            _mark(out, host=True)
            self.host_ops[func.overloadpacket.__name__] += 1
            return out
        where = self.phase
        if where == "forward":
            where = "forward, modules" if self.depth else "forward, outside modules"
        self.ops[where] += 1
        op = func.overloadpacket.__name__
        bool_index = op in INDEXING and any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                                            for t in (args[1] if len(args) > 1 else ()))
        sized_repeat = func is torch.ops.aten.repeat_interleave.Tensor and (kwargs or {}).get("output_size") is None
        if op in DATA_SIZED or bool_index or sized_repeat:
            what = "boolean-mask indexing" if bool_index else op
            src = "(backward)" if self.phase == "backward" else _caller()
            self.waits[(what, src)] += 1
        return out


def _hooks(modules, mode: _Ops) -> list:
    """Forward pre / post hooks that tell ``mode`` when a module's forward runs (its ops: "forward, modules")."""
    def enter(*_):
        mode.depth += 1

    def leave(*_):
        mode.depth -= 1

    handles = []
    for m in modules:
        handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    return handles


def measure(batch: int, queries: int = 16, image_size: int | None = None, logged: bool = False,
            tokenizer=None, config: str = "tiny-ui") -> dict:
    """One counted step (the second: the first builds the optimiser's state) at ``batch`` screens."""
    tok = Path(tokenizer) if tokenizer else build_task_tokenizer(Path(tempfile.mkdtemp()) / "tok", n=200, kind="word")
    args = parser().parse_args([*GROUND, "--queries", str(queries), "--batch-size", str(batch), "--out", "unused",
                                "--tokenizer", str(tok), "--config", config])
    check_args(args)
    processor = Processor.from_pretrained(tok)
    config = make_config(args.config, processor.vocab_size, args.set)
    if image_size:
        config = dataclasses.replace(config, vision=dataclasses.replace(config.vision, image_size=image_size))
    coords = coordinate_token_ids(processor)
    device = torch.device("cpu")
    model, aux, trainable = _build_model(args, config, device, None, coords)
    coord_ids = _mark(torch.tensor(coords), host=False)
    opt = make_optimizer(trainable, args.lr, args.weight_decay, fused=True)  # as on CUDA
    data = _dataset(args, config.vision, tok, aux)
    meter = _Meter([], 0.0, batch)
    gen = torch.Generator().manual_seed(0)
    model.train()
    result = {}
    for step in range(2):  # the first step builds the optimiser's state: the second one is counted
        b = data[step]
        _mark(list(b.values()), host=True, pinned=True)  # as the loader hands them over (pin_memory on CUDA)
        waits, copies = collections.Counter(), collections.Counter()
        ops = _Ops(waits)
        handles = _hooks([m for m in (*model.modules(), *aux.modules()) if m is not model], ops)
        parts = {} if logged else None
        try:
            with _Places(waits, copies), ops:
                ops.phase = "forward"
                loss, gnorm = _counted_step(args, model, aux, trainable, opt, b, device, parts, gen, coord_ids, ops)
                ops.phase = "loss log"
                meter.add(step + 1, loss, 1e-3, gnorm, b["tokens"], parts, logged=logged)
        finally:
            for h in handles:
                h.remove()
        result = {"screens": batch, "queries": queries, "tokens": int(b["tokens"]),
                  "image_size": config.vision.image_size, "logged": logged, "ops": dict(ops.ops),
                  "device_ops": sum(ops.ops.values()), "host_ops": sum(ops.host_ops.values()),
                  "host_ops_by_op": dict(ops.host_ops.most_common()),
                  "waits": sum(waits.values()), "waits_by_cause": [[w, s, n] for (w, s), n in waits.most_common()],
                  "copies": dict(copies)}
    return result


def _counted_step(args, model, aux, trainable, opt, batch, device, parts, gen, coord_ids, ops: _Ops):
    """``train_step``, with the phase of each op marked: the backward, the clipping and the optimiser step."""
    backward, clip, step = torch.Tensor.backward, torch.nn.utils.clip_grad_norm_, opt.step

    def phased(fn, phase):
        def run(*a, **k):
            before, ops.phase = ops.phase, phase
            try:
                return fn(*a, **k)
            finally:
                ops.phase = before
        return run

    torch.Tensor.backward = phased(backward, "backward")
    torch.nn.utils.clip_grad_norm_ = phased(clip, "clip + optimiser")
    opt.step = phased(step, "clip + optimiser")
    try:
        return train_step(args, model, aux, trainable, opt, batch, device, torch.autocast("cpu", enabled=False),
                          parts, aug_gen=gen, coord_ids=coord_ids)
    finally:
        torch.Tensor.backward, torch.nn.utils.clip_grad_norm_ = backward, clip
        del opt.step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8], help="screens per step (one run each)")
    ap.add_argument("--queries", type=int, default=16, help="questions per screen")
    ap.add_argument("--image-size", type=int, default=None, metavar="PX", help="tile side (default the preset's)")
    ap.add_argument("--logged", action="store_true", help="a step that fills the loss log's parts")
    ap.add_argument("--tokenizer", help="a word tokenizer folder (default: one trained into a temporary folder)")
    ap.add_argument("--config", default="tiny-ui", choices=sorted(PRESETS), help="the model preset (default tiny-ui)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if min(a.batch) < 1 or a.queries < 1:
        ap.error("--batch and --queries must be >= 1")
    if a.image_size is not None and (a.image_size < 32 or a.image_size % 32):
        ap.error(f"--image-size must be a positive multiple of 32 (patch 16, pixel shuffle 2), got {a.image_size}")
    tok = a.tokenizer or build_task_tokenizer(Path(tempfile.mkdtemp()) / "tok", n=200, kind="word")
    rows = [measure(b, a.queries, a.image_size, a.logged, tok, a.config) for b in a.batch]
    if a.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        kind = "logged" if r["logged"] else "plain"
        print(f"{r['screens']} screens x {r['queries']} questions ({r['tokens']:,} tokens, {r['image_size']} px), "
              f"a {kind} step: {r['device_ops']:,} device ops, {r['host_ops']:,} host ops, {r['waits']} waits")
        for where, n in r["ops"].items():
            print(f"  {n:6,d}  {where}")
        print("  host ops: " + ", ".join(f"{n} {k}" for k, n in r["host_ops_by_op"].items()))
        print("  copies to the device: " + ", ".join(f"{n} {k}" for k, n in r["copies"].items()))
        for what, src, n in r["waits_by_cause"]:
            print(f"  wait x{n:<3d} {what:40s} {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
