"""Text side of the model: tokenizer.json, the chat template, image placeholders, decoding.

    Processor.from_pretrained(path_or_repo_id)       reads a checkpoint folder (or the Hugging Face cache)
    processor(messages_or_text, images=None)         -> input_ids, attention_mask (+ pixel_values, num_tiles)
    processor.decode(ids) / processor.stream_decoder()

The prompt format: the chat template renders one ``<image>`` placeholder per image; each becomes
``<img>`` + ``<image>`` x (tokens for that image) + ``</img>``, where the count comes from the image
preprocessing (256 per 512-pixel tile, thumbnail included). The tokenizer is the checkpoint's byte-level
BPE loaded with ``tokenizers``; special tokens declared in ``tokenizer_config.json`` are merged in so each
encodes to one id, and no BOS is added. Chat templates shipped with a checkpoint are rendered in a bounded
sandbox (chat_template.py, template_sandbox.py); when a checkpoint has none, holotron's built-in Nemotron
template is used. No code shipped with a checkpoint is ever run as Python.

The pieces live beside this file: processor_errors.py (the error classes), generation_config.py,
stream_decoder.py, batch_inputs.py, chat_messages.py, chat_template.py; their public names are
re-exported here.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from tokenizers import Tokenizer

from .batch_inputs import BatchInputs
from .chat_messages import embedded_images, is_messages, template_messages
from .chat_template import (
    END_OF_TURN,
    NEMOTRON_CHAT_TEMPLATE,
    TemplateLimits,
    compile_chat_template,
    find_chat_template,
    render_chat_template,
)
from .generation_config import GenerationConfig
from .hub import resolve as hub_resolve
from .processor_errors import ChatTemplateError, ModelNotFoundError, ProcessorError, read_json
from .stream_decoder import StreamDecoder
from .tokenizer_files import merge_added_tokens, read_tokenizer, special_tokens

__all__ = [
    "Processor", "StreamDecoder", "GenerationConfig", "BatchInputs", "NEMOTRON_CHAT_TEMPLATE", "END_OF_TURN",
    "ProcessorError", "ChatTemplateError", "ModelNotFoundError", "TemplateLimits", "resolve_pretrained",
    "render_chat_template",
]

# files the processor reads; hub downloads are limited to these (never *.py or weights)
PROCESSOR_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "generation_config.json", "config.json", "preprocessor_config.json",
    "processor_config.json",
)


# ----------------------------------------------------------------------------------------------
# locating a checkpoint: local folder, or a repo id in the Hugging Face cache / on the Hub
# ----------------------------------------------------------------------------------------------

def resolve_pretrained(path_or_repo_id: str | os.PathLike, allow_patterns: Sequence[str] = PROCESSOR_FILES,
                       revision: str | None = None) -> Path:
    """A local folder for ``path_or_repo_id`` (a folder, a bundled model, or a Hub snapshot of
    ``allow_patterns``; see ``holotron.hub.resolve``); ModelNotFoundError with one line otherwise."""
    return hub_resolve(path_or_repo_id, allow_patterns=allow_patterns, revision=revision, error=ModelNotFoundError)


def _text(config: dict, key: str, default: str) -> str:
    value = config.get(key, default)
    if not isinstance(value, str) or not value:
        raise ProcessorError(f"config.json: {key} must be a token text, got {value!r:.80}")
    return value


# an image preprocessing callable: image (PIL image or path) -> (tiles (n, 3, S, S), number of image tokens)
ImagePreprocessor = Callable[[Any], "tuple[torch.Tensor, int]"]


class Processor:
    """Tokenizer + chat template + image placeholder expansion for Holotron / Nemotron-Nano VL.

    Build it with ``Processor.from_pretrained(path_or_repo_id)`` or directly from a
    ``tokenizers.Tokenizer``. ``image_processor`` is a callable image -> (tiles (n, 3, S, S), number
    of image tokens). ``from_pretrained`` defaults it to holotron's vision preprocessing
    (``holotron.vision.preprocess.preprocess_image``) configured from the checkpoint's config.json and
    preprocessor_config.json, built the first time an image is processed.

    Padding (for batches) is on the left with ``pad_token_id``: the tokenizer's pad token, else
    generation_config's pad_token_id, else the eos token, else 0. Padded positions have
    attention_mask 0, so the value itself never reaches the model's output.

    The chat template is rendered within ``template_limits`` (a ``TemplateLimits``: ``seconds`` per render,
    ``max_output_chars``, ``max_range``; None fields turn a bound off). The default is
    ``holotron.template_sandbox.DEFAULT_LIMITS`` (2 s, 2,000,000 characters, ranges of 10,000); raise
    it for a checkpoint you trust whose template needs more, e.g.
    ``Processor.from_pretrained(path, template_limits=TemplateLimits(seconds=30, max_output_chars=None))``.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        chat_template: str | None = None,
        chat_template_source: str | None = None,
        special_tokens: dict[str, str | None] | None = None,   # bos_token / eos_token / pad_token / unk_token
        added_tokens: dict[str, dict] | None = None,           # tokenizer_config.json's added_tokens_decoder
        image_processor: ImagePreprocessor | None = None,
        generation_config: GenerationConfig | None = None,
        max_length: int | None = None,
        image_token: str = "<image>",
        image_start_token: str = "<img>",
        image_end_token: str = "</img>",
        image_token_id: int | None = None,                     # config.json's id for image_token, checked
        tokenizer_source: str = "tokenizer",
        template_limits: TemplateLimits | None = None,
    ):
        self.tokenizer = tokenizer
        self.tokenizer_source = tokenizer_source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.image_processor = image_processor
        self._vision_configs: tuple[dict, dict] | None = None  # (config.json, preprocessor_config.json)
        self.generation_config = generation_config or GenerationConfig()
        self.max_length = max_length
        self.image_token, self.image_start_token, self.image_end_token = image_token, image_start_token, image_end_token

        merge_added_tokens(tokenizer, added_tokens or {}, tokenizer_source)
        image_tokens = [image_token, image_start_token, image_end_token]
        # a text-only tokenizer (Nemotron-H) has none of the three: prompts are then plain text
        self.supports_images = (image_token_id is not None
                                or any(tokenizer.token_to_id(t) is not None for t in image_tokens))
        self._check_single_tokens((image_tokens if self.supports_images else []) + list(self.special_tokens.values()))
        self.image_token_id = tokenizer.token_to_id(image_token)
        self.image_start_token_id = tokenizer.token_to_id(image_start_token)
        self.image_end_token_id = tokenizer.token_to_id(image_end_token)
        if image_token_id is not None and image_token_id != self.image_token_id:
            raise ProcessorError(
                f"config.json says the image token is id {image_token_id} but {tokenizer_source} has {image_token!r} "
                f"at id {self.image_token_id}: the tokenizer does not belong to this model")

        if chat_template is None:
            chat_template, chat_template_source = NEMOTRON_CHAT_TEMPLATE, "holotron's built-in Nemotron template"
        self.chat_template = chat_template
        self.chat_template_source = chat_template_source or "the given chat template"
        self.template_limits = template_limits
        self._template = compile_chat_template(chat_template, self.chat_template_source)

        self.pad_token_id = self._pick_pad_id()

    # ---- construction from a checkpoint folder ---------------------------------------------------

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | os.PathLike, *, image_processor: ImagePreprocessor | None = None,
                        chat_template: str | None = None, max_length: int | None = None,
                        revision: str | None = None, template_limits: TemplateLimits | None = None) -> "Processor":
        """Read tokenizer.json, tokenizer_config.json, the chat template, generation_config.json and
        config.json (image tokens; with preprocessor_config.json, the image preprocessing) from a folder
        or a hub repo id. ``template_limits``: see the class docstring."""
        folder = resolve_pretrained(path_or_repo_id, revision=revision)
        tokenizer, tok_path = read_tokenizer(folder)
        tok_config, special_map, config, pre = (
            read_json(folder / name) if (folder / name).is_file() else {}
            for name in ("tokenizer_config.json", "special_tokens_map.json", "config.json", "preprocessor_config.json"))

        source = None
        if chat_template is None:
            chat_template, source = find_chat_template(folder, tok_config)

        if max_length is None:
            limit = tok_config.get("model_max_length")
            if isinstance(limit, int) and 0 < limit < 10**9:
                max_length = limit
            elif isinstance(config.get("max_sequence_length"), int):
                max_length = config["max_sequence_length"]

        image_token_id = config.get("img_context_token_id", config.get("image_token_id"))
        processor = cls(
            tokenizer,
            chat_template=chat_template, chat_template_source=source,
            special_tokens=special_tokens(tok_config, special_map),
            added_tokens=tok_config.get("added_tokens_decoder") or {},
            image_processor=image_processor,
            generation_config=GenerationConfig.from_file(folder / "generation_config.json"),
            max_length=max_length,
            image_token=_text(config, "img_context_token", "<image>"),
            image_start_token=_text(config, "img_start_token", "<img>"),
            image_end_token=_text(config, "img_end_token", "</img>"),
            image_token_id=image_token_id if isinstance(image_token_id, int) else None,
            tokenizer_source=str(tok_path),
            template_limits=template_limits,
        )
        if image_processor is None and isinstance(config.get("vision_config"), dict):
            processor._vision_configs = (config, pre)
        return processor

    # ---- token ids ----------------------------------------------------------------------------

    def _check_single_tokens(self, tokens: Iterable[str]) -> None:
        bad = []
        for t in dict.fromkeys(tokens):
            ids = self.tokenizer.encode(t, add_special_tokens=False).ids
            if len(ids) != 1 or self.tokenizer.token_to_id(t) is None:
                bad.append(f"{t!r} -> {ids}")
        if bad:
            raise ProcessorError(f"{self.tokenizer_source}: these tokens must each encode to one id but do not: "
                                 f"{'; '.join(bad)}")

    def _pick_pad_id(self) -> int:
        if "pad_token" in self.special_tokens:
            return self.tokenizer.token_to_id(self.special_tokens["pad_token"])
        if self.generation_config.pad_token_id is not None:
            return self.generation_config.pad_token_id
        if "eos_token" in self.special_tokens:
            return self.tokenizer.token_to_id(self.special_tokens["eos_token"])
        return 0

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        t = self.special_tokens.get("eos_token")
        return None if t is None else self.tokenizer.token_to_id(t)

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end an answer: generation_config's eos ids, the tokenizer's eos token and, when the
        chat template uses it, the Nemotron end-of-turn token."""
        ids = list(self.generation_config.eos_token_ids)
        if self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        eot = self.tokenizer.token_to_id(END_OF_TURN)
        if eot is not None and END_OF_TURN in self.chat_template:
            ids.append(eot)
        return tuple(dict.fromkeys(ids))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text become their ids; no BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def batch_decode(self, rows, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(r, skip_special_tokens) for r in rows]

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self.tokenizer, skip_special_tokens=skip_special_tokens)

    # ---- prompts ------------------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """Render ``messages`` (dicts with role and content: a string, or a list of {"type": "text", "text": ..}
        / {"type": "image", ...} parts) to the prompt text, with one ``<image>`` per image."""
        msgs = template_messages(messages)
        context = dict(self.special_tokens)
        context.update(messages=msgs, add_generation_prompt=add_generation_prompt, tools=None, documents=None)
        context.update(kwargs)
        return render_chat_template(self._template, context, self.chat_template_source, self.template_limits)

    def __call__(self, prompts, images=None, *, add_generation_prompt: bool = True, max_length: int | None = None,
                 **template_kwargs) -> BatchInputs:
        """Tokenise one prompt or a batch.

        prompts: a text (already in the chat format, with ``<image>`` placeholders), a list of messages,
            or a list of either (a batch).
        images: for one prompt, an image or a list of images; for a batch, a list with one entry (None,
            an image or a list) per prompt. Images may instead sit in the messages as
            {"type": "image", "image": img} parts. Their count must match the ``<image>`` placeholders.
        Returns BatchInputs: input_ids and attention_mask (batch, seqlen) left-padded; with images
        also pixel_values (all tiles, prompt by prompt) and num_tiles (one count per image).
        """
        batched = isinstance(prompts, (list, tuple)) and not is_messages(prompts)
        items = list(prompts) if batched else [prompts]
        if not items:
            raise ProcessorError("no prompts given")
        if images is None:
            per_prompt = [None] * len(items)
        elif batched:
            if not isinstance(images, (list, tuple)) or len(images) != len(items):
                n = len(images) if isinstance(images, (list, tuple)) else 1
                raise ProcessorError(f"{len(items)} prompts but images has {n} entries: give one entry "
                                     f"(None, an image or a list of images) per prompt")
            per_prompt = list(images)
        else:
            per_prompt = [images]
        limit = self.max_length if max_length is None else max_length

        rows, texts, all_tiles, num_tiles, counts = [], [], [], [], []
        for i, (item, imgs) in enumerate(zip(items, per_prompt)):
            imgs = [] if imgs is None else list(imgs) if isinstance(imgs, (list, tuple)) else [imgs]
            if isinstance(item, str):
                text = item
            elif is_messages(item):
                embedded = embedded_images(item)
                if embedded and imgs:
                    raise ProcessorError(f"prompt {i}: images given both inside the messages and through images=; "
                                         f"use one or the other")
                imgs = imgs or embedded
                text = self.apply_chat_template(item, add_generation_prompt=add_generation_prompt, **template_kwargs)
            else:
                raise ProcessorError(f"prompt {i}: expected a text or a list of message dicts, "
                                     f"got {type(item).__name__}")
            ids, tiles, n_tiles, n_image_tokens = self._tokenize(text, imgs, i)
            if limit is not None and len(ids) > limit:
                raise ProcessorError(
                    f"prompt {i} is {len(ids)} tokens ({len(ids) - n_image_tokens} text + {n_image_tokens} image), "
                    f"more than max_length={limit}: shorten the text, send fewer or smaller images (fewer tiles), "
                    f"or pass a larger max_length")
            rows.append(ids)
            texts.append(text)
            all_tiles += tiles
            num_tiles += n_tiles
            counts.append(len(imgs))

        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):  # left padding: the last prompt token sits at the last position
            if r:
                input_ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
                attention_mask[b, width - len(r):] = 1
        out = BatchInputs(input_ids=input_ids, attention_mask=attention_mask)
        if all_tiles:
            out["pixel_values"] = all_tiles[0] if len(all_tiles) == 1 else torch.cat(all_tiles, dim=0)
            out["num_tiles"] = torch.tensor(num_tiles, dtype=torch.long)
        out.texts, out.images_per_prompt = texts, counts
        return out

    def _image_preprocessing(self) -> ImagePreprocessor | None:
        if self.image_processor is None and self._vision_configs is not None:
            from .vision.config import VisionConfig
            from .vision.preprocess import preprocess_image

            cfg = VisionConfig.from_hf(*self._vision_configs)
            self.image_processor = functools.partial(preprocess_image, cfg=cfg)
        return self.image_processor

    def _tokenize(self, text: str, images: list, index: int):
        """Token ids of one prompt with its ``<image>`` placeholders expanded; also the tiles."""
        if not self.supports_images:
            if images:
                raise ProcessorError(f"{self.tokenizer_source} has no {self.image_token!r} / "
                                     f"{self.image_start_token!r} / {self.image_end_token!r} tokens: "
                                     "a text-only model's tokenizer cannot take images")
            return self.encode(text), [], [], 0
        pieces = text.split(self.image_token)
        n_placeholders = len(pieces) - 1
        if n_placeholders != len(images):
            raise ProcessorError(
                f"prompt {index} has {n_placeholders} {self.image_token!r} placeholder(s) but {len(images)} image(s) "
                f"were given: use exactly one placeholder (or one {{'type': 'image'}} content part) per image")
        preprocess = self._image_preprocessing() if images else None
        if images and preprocess is None:
            raise ProcessorError("images were given but this Processor has no image_processor: load a VL checkpoint "
                                 "(config.json with vision_config) or pass image_processor= (image -> (tiles, tokens))")
        ids: list[int] = self.encode(pieces[0])
        tiles, n_tiles, n_image_tokens = [], [], 0
        for k, (image, piece) in enumerate(zip(images, pieces[1:])):
            pixel_values, n_tokens = preprocess(image)
            if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
                raise ProcessorError(f"image_processor must return a (tiles, 3, S, S) tensor, got "
                                     f"{getattr(pixel_values, 'shape', type(pixel_values).__name__)}")
            n_tokens = int(n_tokens)
            if n_tokens <= 0 or n_tokens % pixel_values.shape[0]:
                raise ProcessorError(
                    f"prompt {index}, image {k}: the image preprocessing reports {n_tokens} tokens for "
                    f"{pixel_values.shape[0]} tiles; every tile must give the same positive number")
            ids += [self.image_start_token_id] + [self.image_token_id] * n_tokens + [self.image_end_token_id]
            ids += self.encode(piece)
            tiles.append(pixel_values)
            n_tiles.append(pixel_values.shape[0])
            n_image_tokens += n_tokens + 2
        return ids, tiles, n_tiles, n_image_tokens

