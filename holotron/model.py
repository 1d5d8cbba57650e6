"""Holotron: the vision-language model (docs/architecture.md, section 1).

    vision_model (RADIO ViT) -> pixel shuffle -> mlp1 -> scattered into the <image> positions of
    language_model.backbone.embeddings(input_ids) -> the hybrid LM -> logits

    vision_model     RadioVisionModel      normalised tiles (T, 3, S, S) -> patch features (T, (S/P)^2, Dv)
    mlp1             Projector             pixel-shuffled features (T, (S/2P)^2, 4 Dv) -> (T, (S/2P)^2, D)
    language_model   HybridLM              Nemotron-H: embeddings, Mamba2 / attention / MLP blocks, lm_head

Module names are the checkpoint's (``vision_model.radio_model.*``, ``mlp1.*``, ``language_model.*``).
Image embeddings replace the ``<image>`` positions in order: batch row by row, then image, tile
(thumbnail last, as the preprocessing emits them), token row-major. The number of ``<image>``
positions must equal tiles x tokens per tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .config import ConfigError, TextConfig
from .lm import HybridLM
from .state import InferenceState
from .vision.config import VisionConfig
from .vision.projector import Projector, embed_tiles
from .vision.radio import RadioVisionModel

__all__ = ["HolotronConfig", "Holotron", "ImageTokenError"]


class ImageTokenError(ValueError):
    """The prompt's ``<image>`` positions do not match the images given."""


@dataclass
class HolotronConfig:
    text: TextConfig                        # llm_config / text_config
    vision: VisionConfig                    # vision_config + projector + preprocessing
    image_token_id: int = 18                # <image>: img_context_token_id / image_token_id
    image_token: str = "<image>"
    image_start_token: str = "<img>"
    image_end_token: str = "</img>"
    max_sequence_length: int | None = None
    extra: dict = field(default_factory=dict, repr=False, compare=False)  # other top-level fields, kept for to_hf

    @classmethod
    def from_hf(cls, d: dict, preprocessor: dict | None = None) -> "HolotronConfig":
        """From a VL ``config.json`` dict: the NemotronH_Nano_VL_V2 spelling (``llm_config``,
        ``img_context_token_id``, ``vit_hidden_size``) or the newer one (``text_config``,
        ``image_token_id``, ``vision_hidden_size``); ``preprocessor`` is preprocessor_config.json."""
        llm = d.get("llm_config") if d.get("llm_config") is not None else d.get("text_config")
        if not isinstance(llm, dict):
            raise ConfigError("llm_config / text_config: missing or not an object in a VL config.json")
        if d.get("audio_config") or d.get("sound_config"):
            raise ConfigError("audio_config: the audio branch is not implemented")
        text = TextConfig.from_hf(llm)
        vision = VisionConfig.from_hf(d, preprocessor)  # refuses ps_version "v1"; projector output = LM width
        tok = d.get("img_context_token_id", d.get("image_token_id"))
        if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < text.vocab_size:
            raise ConfigError(f"img_context_token_id / image_token_id: expected a token id below vocab_size "
                              f"{text.vocab_size}, got {tok!r}")
        known = {"llm_config", "text_config", "vision_config", "img_context_token_id", "image_token_id",
                 "img_context_token", "img_start_token", "img_end_token", "max_sequence_length",
                 "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "auto_map",
                 "force_image_size", "patch_size", "downsample_ratio", "ps_version", "use_thumbnail",
                 "vit_hidden_size", "vision_hidden_size", "projector_hidden_size", "norm_mean", "norm_std",
                 "max_num_tiles"}
        return cls(text=text, vision=vision, image_token_id=tok,
                   image_token=d.get("img_context_token", "<image>"),
                   image_start_token=d.get("img_start_token", "<img>"),
                   image_end_token=d.get("img_end_token", "</img>"),
                   max_sequence_length=d.get("max_sequence_length"),
                   extra={k: v for k, v in d.items() if k not in known})

    def to_hf(self) -> dict:
        """config.json in the NemotronH_Nano_VL_V2 spelling (what the real checkpoint and vLLM read)."""
        out = dict(self.extra)
        out.update(architectures=["NemotronH_Nano_VL_V2"], model_type="NemotronH_Nano_VL_V2")
        out.update(self.vision.to_hf())
        out.update(img_context_token_id=self.image_token_id, img_context_token=self.image_token,
                   img_start_token=self.image_start_token, img_end_token=self.image_end_token,
                   llm_config=self.text.to_hf())
        if self.max_sequence_length is not None:
            out["max_sequence_length"] = self.max_sequence_length
        return out

    @property
    def tokens_per_tile(self) -> int:
        return self.vision.tokens_per_tile

    # generate() reads eos / pad ids from the LM's config
    @property
    def eos_token_id(self) -> tuple[int, ...]:
        return self.text.eos_token_id

    @property
    def pad_token_id(self) -> int | None:
        return self.text.pad_token_id


class Holotron(nn.Module):
    def __init__(self, config: HolotronConfig):
        super().__init__()
        self.config = config
        self.vision_model = RadioVisionModel(config.vision)
        self.mlp1 = Projector.from_config(config.vision)
        self.language_model = HybridLM(config.text)
        self.generation_config: dict = {}

    # ------------------------------------------------------------------ initialisation
    def init_weights(self, seed: int = 0) -> "Holotron":
        """A from-scratch initialisation of every part (``RadioVisionModel.init_weights``,
        ``Projector.init_weights``, ``HybridLM.init_weights``) from one generator seeded with ``seed``,
        the parts in their registration order (that of ``named_parameters``), so a seed always gives the
        same weights. The LM's conv1d keeps torch's default: seed the global RNG before building the model
        for those. Returns the model."""
        generator = torch.Generator().manual_seed(seed)
        self.vision_model.init_weights(generator)
        self.mlp1.init_weights(generator)
        self.language_model.init_weights(generator)
        return self

    # ------------------------------------------------------------------ images
    def embed_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Normalised tiles (tiles, 3, S, S) -> language-model embeddings (tiles, tokens_per_tile, hidden)."""
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4 or pixel_values.shape[1] != 3:
            raise ValueError(
                f"pixel_values: expected (tiles, 3, S, S), got "
                f"{tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values)}")
        P = self.config.vision.patch_size * round(1 / self.config.vision.downsample_ratio)
        if pixel_values.shape[-1] % P or pixel_values.shape[-2] % P:
            raise ValueError(f"pixel_values: tile sides must be multiples of {P} (patch x pixel-shuffle), "
                             f"got {tuple(pixel_values.shape[-2:])}")
        return embed_tiles(self.vision_model, self.mlp1, pixel_values)

    def embed_inputs(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                     image_embeds: torch.Tensor | None = None,
                     num_tiles: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """Token embeddings (B, T, D) with the ``<image>`` positions replaced by image embeddings.

        ``image_embeds`` (tiles, tokens, D) or (n, D) may be given instead of ``pixel_values`` (e.g. to
        embed a screenshot once and reuse it). ``num_tiles`` (one count per image, as the Processor
        returns it) makes the check per image: the k-th run of ``<image>`` positions (row-major) must
        take exactly the k-th image's tiles, so an image cannot spill into another's placeholders."""
        emb = self.language_model.backbone.embeddings
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected (batch, seqlen), got {tuple(input_ids.shape)}")
        x = emb(input_ids)
        is_img = input_ids == self.config.image_token_id
        n_pos = int(is_img.sum())
        if pixel_values is None and image_embeds is None:
            if n_pos and input_ids.shape[1] > 1:
                raise ImageTokenError(f"input_ids hold {n_pos} <image> positions (id {self.config.image_token_id}) "
                                      "but no pixel_values were given: pass the images the prompt was built for")
            return x
        if pixel_values is not None and image_embeds is not None:
            raise ValueError("pass pixel_values or image_embeds, not both")
        if image_embeds is None:
            image_embeds = self.embed_images(pixel_values)
        feats = image_embeds.reshape(-1, image_embeds.shape[-1])
        if feats.shape[-1] != x.shape[-1]:
            raise ValueError(f"image_embeds width {feats.shape[-1]} != language model width {x.shape[-1]}")
        if num_tiles is not None:
            per_tile = image_embeds.shape[1] if image_embeds.dim() == 3 else self.config.tokens_per_tile
            _check_images(is_img, torch.as_tensor(num_tiles).reshape(-1).tolist(), feats.shape[0], per_tile)
        if n_pos != feats.shape[0]:
            tiles = feats.shape[0] / self.config.tokens_per_tile
            raise ImageTokenError(
                f"input_ids hold {n_pos} <image> positions but the images give {feats.shape[0]} embeddings "
                f"({tiles:g} tiles x {self.config.tokens_per_tile} tokens): build the prompt with "
                "holotron.Processor from the same images (one <img><image>*N</img> per image)")
        x = x.clone()
        x[is_img] = feats.to(x.dtype)  # boolean indexing is row-major: row, then position
        return x

    # ------------------------------------------------------------------ forward
    def new_state(self, batch_size: int, capacity: int = 0, ssm_dtype: torch.dtype = torch.float32,
                  kv_dtype: torch.dtype | None = None) -> InferenceState:
        return self.language_model.new_state(batch_size, capacity, ssm_dtype, kv_dtype)

    def forward(self, input_ids: torch.Tensor | None = None, pixel_values: torch.Tensor | None = None, *,
                image_embeds: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                state: InferenceState | None = None, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int | None = None, num_tiles: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) fp32. ``pixel_values`` (tiles, 3, S, S) fill the prompt's ``<image>`` positions;
        ``num_tiles`` (tiles per image, optional) checks them image by image. ``model(**processor(...))``
        works: the Processor's output holds exactly these keys."""
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids (or inputs_embeds)")
            inputs_embeds = self.embed_inputs(input_ids, pixel_values, image_embeds, num_tiles)
        elif pixel_values is not None or image_embeds is not None or num_tiles is not None:
            raise ValueError("inputs_embeds already hold the image embeddings: do not pass pixel_values, image_embeds "
                             "or num_tiles too")
        return self.language_model(inputs_embeds=inputs_embeds, state=state, attention_mask=attention_mask,
                                   logits_to_keep=logits_to_keep)

    # ------------------------------------------------------------------ misc
    @property
    def dtype(self) -> torch.dtype:
        return self.language_model.dtype

    @property
    def device(self) -> torch.device:
        return self.language_model.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def adapt_to_checkpoint(self, shapes) -> list[str]:
        """Shape the checkpoint-dependent vision tensors (CLS/register count, optional RADIO tensors)
        after a checkpoint's {name: shape}; called by the loader before its strict check."""
        return self.vision_model.adapt_to_checkpoint(shapes, prefix="vision_model.")

    def extra_files(self) -> dict[str, dict]:
        """JSON files written beside config.json by ``save_pretrained``."""
        return {"preprocessor_config.json": self.config.vision.to_preprocessor_config()}


def _check_images(is_img: torch.Tensor, num_tiles: list[int], n_feats: int, per_tile: int) -> None:
    """Each image's tiles fill exactly one run of <image> positions, in order (row-major)."""
    n_tiles = n_feats // per_tile
    if sum(num_tiles) != n_tiles or n_feats % per_tile:
        raise ImageTokenError(f"num_tiles says {sum(num_tiles)} tiles but pixel_values hold {n_feats / per_tile:g} "
                              f"({n_feats} embeddings, {per_tile} per tile)")
    edges = torch.nn.functional.pad(is_img.to(torch.int8), (1, 1)).diff(dim=1)  # +1 at a run's start, -1 after its end
    starts, ends = (edges == 1).nonzero(), (edges == -1).nonzero()             # (runs, 2) row-major
    lengths = (ends[:, 1] - starts[:, 1]).tolist()
    if len(lengths) != len(num_tiles):
        raise ImageTokenError(f"{len(num_tiles)} images in num_tiles but {len(lengths)} runs of <image> positions in "
                              "input_ids: each image needs one <img><image>*N</img> block (build the prompt with "
                              "holotron.Processor)")
    for k, (row, n, tiles) in enumerate(zip(starts[:, 0].tolist(), lengths, num_tiles)):
        if n != tiles * per_tile:
            raise ImageTokenError(f"image {k} (row {row}) has {n} <image> positions but its {tiles} tiles give "
                                  f"{tiles * per_tile} embeddings ({per_tile} per tile): the prompt was built for "
                                  "other images, or num_tiles / pixel_values are not in the prompt's order")


def build_vl_model(cfg: dict, preprocessor: dict | None = None) -> Holotron:
    return Holotron(HolotronConfig.from_hf(cfg, preprocessor))
