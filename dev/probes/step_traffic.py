"""Where a grounding step moves its bytes: every aten call of one forward + backward of the training loss
(``holotron.train.losses.loss_fn``, the recipe's options), counted on the CPU by the bytes of the tensors it reads
and writes (views left out), under bf16 autocast as on the GPU, and attributed to the module that ran it.

The training step on the H200 is bound by memory traffic of elementwise work (``--profile``: about a quarter
of its kernel time in copies, a fifth in ``mul``, 7% in matrix products), so bytes moved per module are a
proxy for where its time goes that a CPU can measure. Backward calls are attributed to the module whose
forward made their autograd node (each module's forward hook claims the nodes behind its outputs that no
inner module claimed).

    python dev/probes/step_traffic.py [--model holotron-tiny-ui] [--batch 4] [--queries 8] [--grouped] [--image-size PX]

``--grouped`` gives the chunked scan the chunk grouping it has on CUDA (the CPU default scans chunk by chunk).
``--image-size`` tiles the screens at another side than the checkpoint's (a cheaper, smaller step: the shares
shift towards the language model).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import re
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import holotron
from holotron.bundled import bundled_path
from holotron.kernels.ssd_chunked import CHUNKED_CONFIG
from holotron.train.batches import ScreenBatches
from holotron.train.heads import AuxHeads
from holotron.train.losses import loss_fn
from holotron.weights import CheckpointError

VIEWS = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "select", "slice", "unsqueeze",
         "squeeze", "as_strided", "alias", "detach", "split", "split_with_sizes", "unbind", "chunk", "narrow",
         "diagonal", "unfold", "_reshape_alias", "lift_fresh"}


def _kind(module: torch.nn.Module, name: str) -> str:
    """A label for a module: its class and its name with layer indices folded (``layers.3.mixer`` ->
    ``layers.N.mixer``)."""
    return f"{type(module).__name__} {re.sub(r'[.][0-9]+', '.N', name)}"


class _Count(TorchDispatchMode):
    """Bytes of the tensors each aten call reads and writes (views left out), per (where, op)."""

    def __init__(self, where):
        super().__init__()
        self.where, self.bytes = where, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = func.overloadpacket.__name__
        if op not in VIEWS:
            self.bytes[(self.where(), op)] += sum(t.numel() * t.element_size()
                                                  for t in tree_flatten((args, kwargs, out))[0]
                                                  if isinstance(t, torch.Tensor))
        return out


def _seq_now() -> int:
    """The autograd engine's node counter now (each node records its creation number)."""
    with torch.enable_grad():
        return (torch.zeros((), requires_grad=True) * 1).grad_fn._sequence_nr()


def _claim(outputs, label: str, start: int, owner: dict) -> None:
    """Tie to ``label`` every autograd node behind ``outputs`` made since ``start`` (during this module's
    forward) that an inner module has not claimed."""
    todo = [t.grad_fn for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen = set()
    while todo:
        node = todo.pop()
        if node is None or node in seen or node._sequence_nr() < start:
            continue
        seen.add(node)
        owner.setdefault(node, label)  # an inner module's claim stands; walk on through its nodes
        todo.extend(n for n, _ in node.next_functions)


def _enter(module, args, *, stack: list, label: str) -> None:
    stack.append((label, _seq_now()))


def _leave(module, args, out, *, stack: list, owner: dict) -> None:
    """Forward hook: the module is done; claim its autograd nodes (returns None: the output stays as it is)."""
    label, start = stack.pop()
    _claim(out, label, start, owner)


def _leaf_or_block(name: str, module: torch.nn.Module) -> bool:
    return bool(name) and (not list(module.children()) or re.search(r"(mixer|blocks[.][0-9]+|mlp1)$", name) is not None)


def measure(model_name: str = "holotron-tiny-ui", batch: int = 4, queries: int = 8, grouped: bool = False,
            seed: int = 5, image_size: int | None = None) -> dict:
    model = holotron.load(model_name, dtype=torch.float32, device="cpu").train()
    aux = AuxHeads(model.config)
    folder = bundled_path(model_name) or model_name
    vision = (model.config.vision if image_size is None
              else dataclasses.replace(model.config.vision, image_size=image_size))
    b = ScreenBatches(folder, vision, batch, seed=seed, queries=queries, chars=True)[0]
    stack, owner, phase = [], {}, ["forward"]
    hooks = []
    for name, m in model.named_modules():
        if _leaf_or_block(name, m):
            label = _kind(m, name)
            hooks.append(m.register_forward_pre_hook(functools.partial(_enter, stack=stack, label=label)))
            hooks.append(m.register_forward_hook(functools.partial(_leave, stack=stack, owner=owner)))

    def where():
        if phase[0] == "forward":
            return "forward", stack[-1][0] if stack else "(loss, heads, inputs)"
        node = torch._C._current_autograd_node()
        return "backward", owner.get(node, "(loss, heads, inputs)")

    old = dict(CHUNKED_CONFIG["group_bytes"])
    if grouped:
        CHUNKED_CONFIG["group_bytes"]["cpu"] = CHUNKED_CONFIG["group_bytes"]["cuda"]
    count = _Count(where)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16), count:
            loss, _ = loss_fn(model, b, torch.device("cpu"), aux, aux_weight=0.5, pointer_weight=1.0)
            phase[0] = "backward"
            loss.backward()
    finally:
        CHUNKED_CONFIG["group_bytes"].clear()
        CHUNKED_CONFIG["group_bytes"].update(old)
        for h in hooks:
            h.remove()
    by_module, by_op = collections.Counter(), collections.Counter()
    for ((ph, mod), op), v in count.bytes.items():
        by_module[mod] += v
        by_op[(ph, op)] += v
    return {"screens": batch, "token_slots": int(b["input_ids"].numel()), "tokens": int(b["tokens"]),
            "tiles": int(b["pixel_values"].shape[0]), "tile_px": int(b["pixel_values"].shape[-1]),
            "total_bytes": sum(count.bytes.values()),
            "by_module": by_module, "by_op": by_op}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="holotron-tiny-ui")
    ap.add_argument("--batch", type=int, default=4, help="screens")
    ap.add_argument("--queries", type=int, default=8, help="questions per screen")
    ap.add_argument("--grouped", action="store_true", help="the chunked scan's CUDA chunk grouping")
    ap.add_argument("--image-size", type=int, default=None, metavar="PX",
                    help="tile side in px instead of the checkpoint's (a multiple of 32)")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    if a.batch < 1 or a.queries < 1:
        ap.error("--batch and --queries must be >= 1")
    if a.image_size is not None and (a.image_size < 32 or a.image_size % 32):
        ap.error(f"--image-size must be a positive multiple of 32 (patch 16, pixel shuffle 2), got {a.image_size}")
    try:
        r = measure(a.model, a.batch, a.queries, a.grouped, image_size=a.image_size)
    except CheckpointError as e:  # a missing or broken checkpoint: one line, not a traceback
        raise SystemExit(f"step_traffic: error: {e}") from None
    tot = r["total_bytes"]
    print(f"{r['screens']} screens, {r['token_slots']:,} token slots ({r['tokens']:,} not padding), "
          f"{r['tiles']} tiles of {r['tile_px']} px: {tot / 1e9:.2f} GB read + written by one forward + backward")
    print("by module, forward + backward (all layers of a kind together):")
    for mod, v in r["by_module"].most_common(a.top):
        print(f"  {100 * v / tot:5.1f}%  {mod}")
    print("by op:")
    for (ph, op), v in r["by_op"].most_common(a.top):
        print(f"  {100 * v / tot:5.1f}%  {ph:8s} {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
