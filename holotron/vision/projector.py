"""Pixel shuffle ("v2", InternVL) and the ``mlp1`` projector into the language model (docs/architecture.md,
section 4).

For downsample ratio 1/k (k = 2 here) a tile's gh x gw grid of D-wide patch features becomes a
(gh/k) x (gw/k) grid of k*k*D-wide tokens. Output token (i, j), row-major i * (gw/k) + j, carries

    [ x(k i, k j) | x(k i, k j + 1) | ... | x(k i + 1, k j) | ... | x(k i + k-1, k j + k-1) ]

i.e. the k x k block read row by row (for k = 2: (2i,2j), (2i,2j+1), (2i+1,2j), (2i+1,2j+1)).
Then ``mlp1 = RMSNorm -> Linear -> relu^2 -> Linear`` (no biases), names ``mlp1.0`` / ``mlp1.1`` / ``mlp1.3``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from holotron.layers import RMSNorm

from .config import VisionConfig

__all__ = ["pixel_shuffle", "ReLU2", "Projector", "embed_tiles"]


def pixel_shuffle(x: torch.Tensor, gh: int, gw: int, k: int = 2) -> torch.Tensor:
    """(T, gh*gw, D) row-major patch features -> (T, (gh/k)*(gw/k), k*k*D) tokens (see module docstring)."""
    T, N, D = x.shape
    if N != gh * gw:
        raise ValueError(f"pixel_shuffle: {N} features do not form a {gh}x{gw} grid")
    if gh % k or gw % k:
        raise ValueError(f"pixel_shuffle: a {gh}x{gw} patch grid is not divisible into {k}x{k} blocks")
    # patch (k i + dy, k j + dx) goes to token (i, j), channel block dy k + dx: the k x k block read row by row
    return rearrange(x, "t (i dy j dx) d -> t (i j) (dy dx d)", i=gh // k, dy=k, dx=k)


class ReLU2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


class Projector(nn.Sequential):
    """``mlp1``: RMSNorm(k^2 D) -> Linear(k^2 D -> hidden) -> relu^2 -> Linear(hidden -> LM width)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, eps: float = 1e-5):
        super().__init__(
            RMSNorm(in_dim, eps=eps),                   # mlp1.0
            nn.Linear(in_dim, hidden, bias=False),      # mlp1.1
            ReLU2(),                                    # mlp1.2 (no parameters)
            nn.Linear(hidden, out_dim, bias=False),     # mlp1.3
        )

    @classmethod
    def from_config(cls, cfg: VisionConfig) -> "Projector":
        return cls(cfg.projector_input_size, cfg.projector_hidden_size, cfg.projector_output_size,
                   cfg.projector_norm_eps)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> "Projector":
        """A from-scratch initialisation drawn from ``generator`` in ``named_parameters`` order: the
        linear weights N(0, 0.02), the norm's weight 1, biases (none by default) 0."""
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:  # the RMSNorm weight
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
        return self


def embed_tiles(vision_model: nn.Module, mlp1: nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """Normalised tiles (T, 3, H, W) -> language-model embeddings (T, (H/P/k) * (W/P/k), LM width),
    P and k = 1 / downsample_ratio from ``vision_model.config``."""
    P, k = vision_model.config.patch_size, vision_model.config.merge
    feats = vision_model(pixel_values)  # (T, gh*gw, D)
    tokens = pixel_shuffle(feats, pixel_values.shape[-2] // P, pixel_values.shape[-1] // P, k)
    return mlp1(tokens)
