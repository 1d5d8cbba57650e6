"""``--compile``: the training step's elementwise-heavy modules through ``torch.compile``.

A grounding step of the tiny model is bound by the memory traffic of narrow elementwise work, not by its
matrix products (dev/LOG.md, "Where a grounding step's time goes": on the H200, copies and dtype casts 25% of
the kernel time, multiplies 21%, matrix products under 7%; about 5,300 aten calls a step). Inductor fuses
such chains into a few kernels. Compiled here, each in place (``Module.compile``: parameter names, state
dicts and checkpoints unchanged):
- every ViT block and the projector (norms, attention, MLP, residuals, layer scales);
- every language-model block but the Mamba ones whole (norm, attention or relu^2 MLP, residual);
- of a Mamba block, its pre-norm and its gated output norm (y * silu(z), the group RMS norm, the weight): the
  mixer itself calls the SSD scan, whose Triton kernels and autograd function stay outside the graphs.
Shapes that change between batches (the question tokens per batch) make torch.compile recompile once with
dynamic sizes. Off by default: not yet timed on a GPU.
"""

from __future__ import annotations

from torch import nn

__all__ = ["compile_modules"]


def compile_modules(model: nn.Module) -> int:
    """Compile the modules above in place; returns how many."""
    mods: list[nn.Module] = list(model.vision_model.radio_model.model.blocks) + [model.mlp1]
    for blk in model.language_model.backbone.layers:
        if blk.kind == "mamba":
            mods += [blk.norm, blk.mixer.norm]
        else:
            mods.append(blk)
    for m in mods:
        m.compile()
    return len(mods)
