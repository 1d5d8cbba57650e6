"""The architectures training builds: named presets of sizes (``PRESETS``), ``make_config`` (a preset with
``--set`` overrides) and ``init_weights`` (a fresh model's seeded initialisation, ``Holotron.init_weights``)."""

from __future__ import annotations

import dataclasses
import json

from ..config import TextConfig
from ..model import Holotron, HolotronConfig
from ..vision.config import VisionConfig

__all__ = ["PRESETS", "make_config", "init_weights"]

# the tiny model's sizes; its presets differ only in how a screen is cut into tiles
_TINY_VISION = dict(hidden_size=192, num_hidden_layers=8, num_attention_heads=3, patch_size=16, mlp_ratio=4.0,
                    max_img_size=384, num_prefix_tokens=4, projector_hidden_size=1280)
_TINY_TEXT = dict(hidden_size=320, hybrid_override_pattern="M-M*-M-M*-", num_attention_heads=8, num_key_value_heads=2,
                  head_dim=40, intermediate_size=1280, mamba_num_heads=10, mamba_head_dim=64, ssm_state_size=32,
                  n_groups=2, conv_kernel=4, chunk_size=128)

# name -> (VisionConfig fields, TextConfig fields); vocab_size comes from the tokenizer
PRESETS: dict[str, tuple[dict, dict]] = {
    # the shipped model (holotron/models/holotron-tiny-ui/README.md says why these sizes): one 1024 px tile
    "tiny-ui": (dict(_TINY_VISION, image_size=1024, max_num_tiles=1, use_thumbnail=False), _TINY_TEXT),
    # the 12B model's tiling at the tiny size: 384 px tiles, up to 12 and a thumbnail (shipped until 2026-12-03)
    "tiny-ui-tiles": (dict(_TINY_VISION, image_size=384, max_num_tiles=12, use_thumbnail=True), _TINY_TEXT),
    # a few-second CPU configuration for tests and smoke runs: same layer kinds, toy sizes
    "micro": (
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=16, mlp_ratio=2.0,
             max_img_size=64, num_prefix_tokens=2, image_size=64, max_num_tiles=2, use_thumbnail=True,
             projector_hidden_size=64),
        dict(hidden_size=64, hybrid_override_pattern="M*-", num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=128, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16,
             n_groups=1, conv_kernel=4, chunk_size=64),
    ),
}


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def make_config(preset: str, vocab_size: int, overrides: list[str] | tuple[str, ...] = ()) -> HolotronConfig:
    """The HolotronConfig of a preset, with ``overrides`` such as ``"vision.image_size=448"`` or
    ``"text.hybrid_override_pattern=M*M-"`` (values are JSON, else strings)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown --config {preset!r}: use one of {', '.join(PRESETS)}")
    vis, txt = (dict(d) for d in PRESETS[preset])
    for item in overrides:
        key, sep, value = item.partition("=")
        part, _, name = key.strip().partition(".")
        target = {"vision": vis, "text": txt}.get(part)
        fields = {"vision": VisionConfig, "text": TextConfig}.get(part)
        if not sep or target is None or name not in {f.name for f in dataclasses.fields(fields)}:
            raise ValueError(f"--set {item!r}: expected vision.FIELD=VALUE or text.FIELD=VALUE with a field of "
                             "VisionConfig / TextConfig")
        target[name] = _parse_value(value)
    if isinstance(vis.get("norm_mean"), list):
        vis["norm_mean"] = tuple(vis["norm_mean"])
    text = TextConfig(**{**txt, "vocab_size": vocab_size, "bos_token_id": 1, "eos_token_id": (2, 12),
                         "pad_token_id": 0})
    vision = VisionConfig(**{**vis, "projector_output_size": text.hidden_size})
    return HolotronConfig(text=text, vision=vision, image_token_id=18)


def init_weights(model: Holotron, seed: int = 0) -> Holotron:
    """A from-scratch initialisation of ``model`` from ``seed``: ``Holotron.init_weights`` (holotron/model.py,
    which calls each part's own). Returns the model."""
    return model.init_weights(seed)
