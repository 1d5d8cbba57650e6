"""C-RADIO vision encoder: a ViT with CPE ("cropped position embedding") positions (docs/architecture.md, section 3).

The module tree is the checkpoint's, so the real tensors load by name:

    vision_model                       RadioVisionModel   forward: tiles -> patch features
      radio_model                      RadioModel         (+ input_conditioner, summary_idxs when the checkpoint
                                                           has them)
        model                          RadioViT
          patch_generator              PatchGenerator
            embedder                   Linear(3 P^2 -> D, no bias) on (c, yy, xx)-flattened patches
            pos_embed                  [1, G*G, D]  learned G x G grid (G = max_img_size / P = 128)
            cls_token.token            [n_prefix, D]  CLS + register tokens; n_prefix comes from the checkpoint
            video_embedder             Linear, only when the checkpoint has one (unused for images)
          blocks.{j}                   Block: norm1, attn.{qkv, proj}, norm2, mlp.{fc1, fc2} (+ layer_scale{1,2})
          norm                         LayerNorm, only when the config asks for a final norm (C-RADIO: none)

Tensors a checkpoint may or may not hold (layer scales, the video embedder, the input conditioner,
`summary_idxs`), and the CLS/register count, are shaped after the checkpoint by
``RadioVisionModel.adapt_to_checkpoint`` (which ``load_state_dict`` calls itself), so loading stays strict
both ways; any other name is an error that names it (``holotron.load`` is the one loader).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .config import VisionConfig

__all__ = ["RadioVisionModel", "RadioModel", "RadioViT", "PatchGenerator", "Block", "interpolate_pos_embed", "patchify"]


def patchify(pixel_values: torch.Tensor, patch: int) -> torch.Tensor:
    """(T, C, H, W) -> (T, gh*gw, C*P*P): patches row-major (index = row*gw + col), each flattened (c, yy, xx)."""
    T, C, H, W = pixel_values.shape
    if H % patch or W % patch:
        raise ValueError(f"tile size {H}x{W} is not a multiple of the patch size {patch}")
    gh, gw = H // patch, W // patch
    x = pixel_values.reshape(T, C, gh, patch, gw, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(T, gh * gw, C * patch * patch)


def interpolate_pos_embed(pos_embed: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    """CPE positions for a gh x gw patch grid: [1, G*G, D] -> [1, gh*gw, D].

    The G x G table is resized bilinearly (align_corners=False, no antialias, in fp32) to m x m with
    m = max(gh, gw), then the top-left gh x gw window is kept, row-major.
    """
    n, D = pos_embed.shape[-2:]
    G = math.isqrt(n)
    if G * G != n:
        raise ValueError(f"pos_embed holds {n} positions, not a square grid")
    grid = pos_embed.reshape(1, G, G, D).permute(0, 3, 1, 2).float()  # (1, D, G, G)
    m = max(gh, gw)
    if m != G:
        grid = F.interpolate(grid, size=(m, m), mode="bilinear", align_corners=False, antialias=False)
    grid = grid[:, :, :gh, :gw]
    return grid.flatten(2).transpose(1, 2).to(pos_embed.dtype)  # (1, gh*gw, D)


class ClsToken(nn.Module):
    """The CLS + register rows prepended to every tile. Their count is read from the checkpoint."""

    def __init__(self, n_prefix: int, dim: int):
        super().__init__()
        self.token = nn.Parameter(torch.zeros(n_prefix, dim))


class PatchGenerator(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        P, D, G = cfg.patch_size, cfg.hidden_size, cfg.pos_grid
        self.patch_size = P
        self.embedder = nn.Linear(3 * P * P, D, bias=False)
        self.pos_embed = nn.Parameter(torch.zeros(1, G * G, D))
        self.cls_token = ClsToken(cfg.num_prefix_tokens or 0, D)
        self.video_embedder = None  # a Linear(3 T P^2 -> D) when the checkpoint has one; unused for images

    @property
    def num_prefix(self) -> int:
        return self.cls_token.token.shape[0]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # (T, 3, H, W) -> (T, n_prefix + gh*gw, D)
        P = self.patch_size
        gh, gw = pixel_values.shape[-2] // P, pixel_values.shape[-1] // P
        x = self.embedder(patchify(pixel_values, P))  # (T, gh*gw, D)
        x = x + interpolate_pos_embed(self.pos_embed, gh, gw).to(x.dtype)
        prefix = self.cls_token.token.to(x.dtype).unsqueeze(0).expand(x.shape[0], -1, -1)
        return torch.cat([prefix, x], dim=1)


class Attention(nn.Module):
    """Bidirectional multi-head attention over one tile; fused qkv whose rows are q | k | v."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, N, D)
        T, N, D = x.shape
        q, k, v = self.qkv(x).view(T, N, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (T, H, N, hd)
        y = F.scaled_dot_product_attention(q, k, v)  # scale 1/sqrt(hd), no mask
        return self.proj(y.transpose(1, 2).reshape(T, N, D))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class LayerScale(nn.Module):
    def __init__(self, dim: int, device=None, dtype=None):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1


class Block(nn.Module):
    """Pre-norm ViT block: x += attn(norm1(x)); x += mlp(norm2(x)) (layer scales only if the checkpoint has them)."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        D = cfg.hidden_size
        self.norm1 = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.attn = Attention(D, cfg.num_attention_heads)
        self.norm2 = nn.LayerNorm(D, eps=cfg.layer_norm_eps)
        self.mlp = Mlp(D, cfg.intermediate_size)
        self.layer_scale1 = None
        self.layer_scale2 = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attn(self.norm1(x))
        x = x + (a if self.layer_scale1 is None else self.layer_scale1(a))
        m = self.mlp(self.norm2(x))
        return x + (m if self.layer_scale2 is None else self.layer_scale2(m))


class RadioViT(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.patch_generator = PatchGenerator(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if cfg.final_norm else None

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # (T, 3, H, W) -> (T, n_prefix + gh*gw, D)
        x = self.patch_generator(pixel_values)
        for block in self.blocks:
            x = block(x)
        return x if self.norm is None else self.norm(x)


class InputConditioner(nn.Module):
    """RADIO's own (x - mean) / std. Kept for loading only: holotron normalises in preprocessing
    (the VL model runs RADIO with the conditioner made external), so forward never calls it."""

    keep_fp32 = ("input_conditioner.norm_mean", "input_conditioner.norm_std")  # for holotron.weights

    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("norm_mean", mean)
        self.register_buffer("norm_std", std)


class RadioModel(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.model = RadioViT(cfg)
        self.input_conditioner = None
        self.register_buffer("summary_idxs", None)  # (k,) int64 when the checkpoint has it; unused for images


class RadioVisionModel(nn.Module):
    """``vision_model``: normalised tiles (T, 3, H, W), H and W multiples of the patch size, ->
    patch features (T, (H/P) * (W/P), D) row-major, the CLS/register rows dropped."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.config = cfg
        self.radio_model = RadioModel(cfg)

    @property
    def num_prefix(self) -> int:
        return self.radio_model.model.patch_generator.num_prefix

    def adapt_to_checkpoint(self, shapes: Mapping[str, Sequence[int] | torch.Tensor], prefix: str = "") -> list[str]:
        """Shape the checkpoint-dependent parts of the tree after a checkpoint's tensor names and shapes.

        ``shapes``: {name: shape (or tensor)}; names start with ``prefix`` (e.g. "vision_model."), others
        are ignored. Sets the CLS/register row count from ``cls_token.token`` and creates the optional
        tensors the checkpoint holds (layer scales, video embedder, input conditioner, summary_idxs) on
        this model's device, so a strict name-and-shape check (``holotron.weights``) or ``load_state_dict``
        then accepts exactly the checkpoint. Returns the optional names created. Called by
        ``load_state_dict`` itself; call it before other loaders that check names against ``state_dict()``.
        """
        sh = {k[len(prefix):]: tuple(v.shape if isinstance(v, torch.Tensor) else v)
              for k, v in shapes.items() if k.startswith(prefix)}
        rm, pg = self.radio_model, self.radio_model.model.patch_generator
        ref = pg.pos_embed
        dev, dt = ref.device, ref.dtype
        created = []
        s = sh.get("radio_model.model.patch_generator.cls_token.token")
        if s is not None and len(s) == 2 and s[1] == ref.shape[-1] and s[0] != pg.num_prefix:
            pg.cls_token.token = nn.Parameter(torch.zeros(s, device=dev, dtype=dt))
        s = sh.get("radio_model.model.patch_generator.video_embedder.weight")
        if s is not None and len(s) == 2 and pg.video_embedder is None:
            pg.video_embedder = nn.Linear(s[1], s[0], bias=False, device=dev, dtype=dt)
            created.append("radio_model.model.patch_generator.video_embedder")
        for j, blk in enumerate(rm.model.blocks):
            for name in ("layer_scale1", "layer_scale2"):
                if f"radio_model.model.blocks.{j}.{name}.lambda1" in sh and getattr(blk, name) is None:
                    setattr(blk, name, LayerScale(ref.shape[-1], device=dev, dtype=dt))
                    created.append(f"radio_model.model.blocks.{j}.{name}")
        mean, std = sh.get("radio_model.input_conditioner.norm_mean"), sh.get("radio_model.input_conditioner.norm_std")
        if mean is not None and std is not None and rm.input_conditioner is None:
            rm.input_conditioner = InputConditioner(torch.zeros(mean, device=dev), torch.zeros(std, device=dev))
            created.append("radio_model.input_conditioner")
        s = sh.get("radio_model.summary_idxs")
        if s is not None and rm.summary_idxs is None:
            rm.summary_idxs = torch.zeros(s, dtype=torch.long, device=dev)
            created.append("radio_model.summary_idxs")
        return created

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> "RadioVisionModel":
        """A from-scratch initialisation (the constructor leaves zero position embeddings), drawn from
        ``generator`` parameter by parameter in ``named_parameters`` order: weights (patch embedder,
        position embeddings, CLS/register tokens, linear layers) N(0, 0.02), the residual output projections
        (attn.proj, mlp.fc2) scaled by 1 / sqrt(2 * layers); norms and layer scales 1, biases 0."""
        n_layers = self.config.num_hidden_layers
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm weights, layer scales
                p.fill_(1.0)
            else:
                std = 0.02
                if name.endswith(("attn.proj.weight", "mlp.fc2.weight")):
                    std /= math.sqrt(2 * n_layers)
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.adapt_to_checkpoint(state_dict, prefix)  # before the children load (torch loads parents first)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
            raise ValueError(f"pixel_values: expected (tiles, 3, H, W), got {tuple(pixel_values.shape)}")
        w = self.radio_model.model.patch_generator.embedder.weight
        x = self.radio_model.model(pixel_values.to(device=w.device, dtype=w.dtype))
        return x[:, self.num_prefix:]
