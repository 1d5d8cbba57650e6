"""Tiny Holotron vision-language models and checkpoints for tests (no download, random weights).

    cfg = tiny_vl_config()                          # a HolotronConfig: tiny RADIO + tiny Nemotron-H
    model = tiny_vl(seed=0)                         # a randomized Holotron (fp32, eval)
    folder = write_tiny_vl_checkpoint(tmp / "m")    # a complete checkpoint folder in the real format

The tiny RADIO has width 32, 2 blocks, patch 4 and 32-pixel tiles: a tile is an 8x8 patch grid, so
after the 2x2 pixel shuffle it becomes ``TOKENS_PER_TILE`` = 16 image tokens; images are cut into at
most ``MAX_NUM_TILES`` = 4 tiles (plus a thumbnail). The language model is ``tiny_lm``'s (layers
"M*-M": Mamba, attention, MLP, Mamba) with a vocabulary that covers the tiny tokenizer's 512 ids.

``write_tiny_vl_checkpoint`` writes what the published checkpoint holds, in its spelling:
config.json (``NemotronH_Nano_VL_V2``, ``llm_config``, ``img_context_token_id``, ``vit_hidden_size``,
...) and model.safetensors through ``holotron.save_pretrained``, preprocessor_config.json,
generation_config.json (eos ids: ``</s>`` and the chat end-of-turn ``<SPECIAL_12>``), tokenizer.json
and tokenizer_config.json (``tiny_tokenizer``: ``<image>`` = 18, ``<img>`` = 19, ``</img>`` = 20).
It is used by the model tests, the command-line tests and the tiny shipped model.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tiny_lm import randomize_, tiny_config
from tiny_tokenizer import SPECIAL_IDS, write_tiny_tokenizer
from tokenizers import Tokenizer
from torch import nn

import holotron
from holotron.model import Holotron, HolotronConfig
from holotron.vision.config import VisionConfig

TOKENIZER_VOCAB = 512                      # write_tiny_tokenizer's default vocab_size
IMAGE_TOKEN_ID = SPECIAL_IDS["<image>"]    # 18
END_OF_TURN_ID = SPECIAL_IDS["<SPECIAL_12>"]
TILE = 32                                  # tile side in pixels
TOKENS_PER_TILE = 16                       # (32 / patch 4 / shuffle 2)^2
MAX_NUM_TILES = 4

TINY_VISION = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=4, mlp_ratio=2.0,
    max_img_size=64,            # a 16x16 position grid, resized to each tile's 8x8 patch grid
    num_prefix_tokens=4,        # CLS + 3 registers (dropped after the ViT)
    image_size=TILE, max_num_tiles=MAX_NUM_TILES, use_thumbnail=True,
    projector_hidden_size=48,
)
TINY_TEXT = dict(vocab_size=TOKENIZER_VOCAB, hybrid_override_pattern="M*-M", eos_token_id=(2,), pad_token_id=0)
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, END_OF_TURN_ID], "pad_token_id": 0}


def tiny_vl_config(text: dict | None = None, vision: dict | None = None, **overrides) -> HolotronConfig:
    """A HolotronConfig of the tiny model; ``text`` / ``vision`` override TextConfig / VisionConfig
    fields, other keywords HolotronConfig's (e.g. ``image_token_id``)."""
    tcfg = tiny_config(**{**TINY_TEXT, **(text or {})})
    vcfg = VisionConfig(**{**TINY_VISION, "projector_output_size": tcfg.hidden_size, **(vision or {})})
    return HolotronConfig(text=tcfg, vision=vcfg, **{"image_token_id": IMAGE_TOKEN_ID, **overrides})


@torch.no_grad()
def randomize_vl_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every parameter of a VL model an O(1)-activation value: the language model through
    ``tiny_lm.randomize_``, the rest by name and shape. Works on holotron's ``Holotron`` and on
    transformers' ``NemotronH_Omni_Reasoning_V3`` alike (both call the LM ``language_model``)."""
    randomize_(model.language_model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if name.startswith("language_model."):
            continue
        leaf = name.rsplit(".", 1)[-1]
        rn = torch.randn(p.shape, generator=g)
        if leaf == "bias":
            v = 0.1 * rn
        elif p.dim() == 1:  # LayerNorm / RMSNorm weights, layer scales
            v = 1.0 + 0.2 * rn
        elif "pos_embed" in name or "cls_token" in name:
            v = 0.5 * rn
        else:  # Linear (out, in)
            v = rn / math.sqrt(p.shape[-1])
        p.copy_(v.to(p.dtype))
    return model


def tiny_vl(seed: int = 0, config: HolotronConfig | None = None, dtype: torch.dtype = torch.float32) -> Holotron:
    """A randomized tiny Holotron in eval mode."""
    model = Holotron(config or tiny_vl_config())
    randomize_vl_(model, seed)
    return model.to(dtype).eval()


def write_tiny_vl_checkpoint(folder, seed: int = 0, model: Holotron | None = None,
                             generation_config: dict | None = None, **tokenizer_kwargs) -> Path:
    """Write a complete tiny VL checkpoint into ``folder`` and return it as a Path.

    ``model``: the Holotron to save (default ``tiny_vl(seed)``); ``generation_config``: the
    generation_config.json content (default ``GENERATION_CONFIG``); other keywords go to
    ``write_tiny_tokenizer`` (e.g. ``chat_template=``). The model's vocabulary must cover the tokenizer's.
    """
    model = model if model is not None else tiny_vl(seed)
    model.generation_config = dict(GENERATION_CONFIG if generation_config is None else generation_config)
    # config.json, model.safetensors, generation_config.json, preprocessor_config.json
    holotron.save_pretrained(model, folder)
    folder = write_tiny_tokenizer(folder, **tokenizer_kwargs)
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    if model.config.text.vocab_size < vocab:
        raise ValueError(f"the model's vocab_size {model.config.text.vocab_size} does not cover "
                         f"the tokenizer's {vocab}")
    return folder
