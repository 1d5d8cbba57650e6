"""Text side of the model: tokenizer.json, the chat template, image placeholders, decoding.

    Processor.from_pretrained(path_or_repo_id)       reads a checkpoint folder (or the Hugging Face cache)
    processor(messages_or_text, images=None)         -> input_ids, attention_mask (+ pixel_values, num_tiles)
    processor.decode(ids) / processor.stream_decoder()

The prompt format (ARCHITECTURE.md section 5): the chat template renders one ``<image>`` placeholder
per image; each becomes ``<img>`` + ``<image>`` x (tokens for that image) + ``</img>``, where the count
comes from the image preprocessing (256 per 512-pixel tile, thumbnail included). The tokenizer is the
checkpoint's byte-level BPE loaded with ``tokenizers``; special tokens declared in
``tokenizer_config.json`` are merged in so each encodes to one id, and no BOS is added. Chat templates
shipped with a checkpoint are rendered in a sandboxed jinja2 environment; when a checkpoint has none,
holotron's built-in Nemotron template is used. No code shipped with a checkpoint is ever run.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from tokenizers import AddedToken, Tokenizer

from .hub import resolve as hub_resolve

__all__ = [
    "Processor", "StreamDecoder", "GenerationConfig", "BatchInputs", "NEMOTRON_CHAT_TEMPLATE",
    "ProcessorError", "ChatTemplateError", "ModelNotFoundError", "resolve_pretrained", "render_chat_template",
]


class ProcessorError(ValueError):
    """Bad input to the processor or a broken tokenizer / template file; the message is one line."""


class ChatTemplateError(ProcessorError):
    """A chat template that does not compile, fails to render, or is refused by the sandbox."""


class ModelNotFoundError(FileNotFoundError):
    """Neither a local folder nor a repo id available in the Hugging Face cache (or on the Hub)."""


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


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ProcessorError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except OSError as e:
        raise ProcessorError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise ProcessorError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


# ----------------------------------------------------------------------------------------------
# generation_config.json
# ----------------------------------------------------------------------------------------------

def _id_list(value: Any, what: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ProcessorError(f"{what} must be a token id or a list of ids, got {value!r}")
    return tuple(values)


@dataclass
class GenerationConfig:
    """The defaults a checkpoint ships in generation_config.json (None = not set by the checkpoint)."""

    eos_token_ids: tuple[int, ...] = ()    # eos_token_id in the file: an int, a list, or null
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    max_new_tokens: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    extra: dict = field(default_factory=dict)  # every other field, untouched

    _NUMBERS = {"max_new_tokens": int, "top_k": int, "temperature": float, "top_p": float, "repetition_penalty": float}

    @classmethod
    def from_dict(cls, data: dict, source: str = "generation_config") -> "GenerationConfig":
        data = dict(data)
        out = cls(eos_token_ids=_id_list(data.pop("eos_token_id", None), f"{source}: eos_token_id"))
        for name in ("bos_token_id", "pad_token_id"):
            ids = _id_list(data.pop(name, None), f"{source}: {name}")
            if len(ids) > 1:
                raise ProcessorError(f"{source}: {name} must be one id, got {list(ids)}")
            setattr(out, name, ids[0] if ids else None)
        if (v := data.pop("do_sample", None)) is not None:
            if not isinstance(v, bool):
                raise ProcessorError(f"{source}: do_sample must be true or false, got {v!r}")
            out.do_sample = v
        for name, kind in cls._NUMBERS.items():
            v = data.pop(name, None)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)) or v < 0:
                raise ProcessorError(f"{source}: {name} must be a non-negative {kind.__name__}, got {v!r}")
            setattr(out, name, kind(v))
        if out.top_p is not None and out.top_p > 1:
            raise ProcessorError(f"{source}: top_p must be in [0, 1], got {out.top_p}")
        out.extra = data
        return out

    def generate_kwargs(self) -> dict:
        """Keyword arguments for ``holotron.generate`` with the Hugging Face meaning of the file: without
        ``do_sample: true`` decoding is greedy (temperature 0) whatever temperature / top_p say; top_k 0
        means no top-k. Only what the file sets is returned (eos ids as a list)."""
        kw: dict[str, Any] = {}
        if self.max_new_tokens is not None:
            kw["max_new_tokens"] = self.max_new_tokens
        if self.do_sample:
            kw["temperature"] = 1.0 if self.temperature is None else self.temperature
            if self.top_p is not None and self.top_p < 1:
                kw["top_p"] = self.top_p
            if self.top_k:
                kw["top_k"] = self.top_k
        else:
            kw["temperature"] = 0.0
        if self.eos_token_ids:
            kw["eos_token_id"] = list(self.eos_token_ids)
        if self.pad_token_id is not None:
            kw["pad_token_id"] = self.pad_token_id
        return kw

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "GenerationConfig":
        """Read generation_config.json; a missing file gives the empty defaults."""
        path = Path(path)
        if not path.is_file():
            return cls()
        return cls.from_dict(_read_json(path), source=str(path))


# an image preprocessing callable: image (PIL image or path) -> (tiles (n, 3, S, S), number of image tokens)
ImagePreprocessor = Callable[[Any], "tuple[torch.Tensor, int]"]


# ----------------------------------------------------------------------------------------------
# chat templates in a sandbox
# ----------------------------------------------------------------------------------------------

# holotron's own rendering of the Nemotron-Nano VL chat format, used when a checkpoint has no template:
#   <SPECIAL_10>System\n{system}\n<SPECIAL_11>User\n{user}\n<SPECIAL_11>Assistant\n{answer}\n<SPECIAL_12>\n
#   ... <SPECIAL_11>Assistant\n<think>\n            (generation prompt, reasoning on: the default)
#   ... <SPECIAL_11>Assistant\n<think></think>      ("/no_think" in a system or user text, or enable_thinking=False)
# A message whose content is a list puts its images first: "<image>\n" for one, "<image 1><image> <image 2><image>\n"
# for several (unless its text already holds "<image>" placeholders).
NEMOTRON_CHAT_TEMPLATE = r"""
{%- macro text_of(content) -%}
  {%- if content is string -%}{{ content }}
  {%- elif content is iterable -%}
    {%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- macro without_flags(text) -%}
  {{- text.replace('</think>', '\x00').replace('/no_think', '').replace('/think', '').replace('\x00', '</think>') -}}
{%- endmacro -%}
{%- set ns = namespace(think=true, system='') -%}
{%- for message in messages -%}
  {%- if message.role == 'system' or message.role == 'user' -%}
    {%- set text = text_of(message.content) -%}
    {%- if '/think' in text.replace('</think>', '') -%}{%- set ns.think = true -%}
    {%- elif '/no_think' in text -%}{%- set ns.think = false -%}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if enable_thinking is defined and enable_thinking is not none -%}{%- set ns.think = enable_thinking -%}{%- endif -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = without_flags(text_of(messages[0].content)).strip() -%}
  {%- set messages = messages[1:] -%}
{%- endif -%}
{{- '<SPECIAL_10>System\n' + ns.system + '\n' -}}
{%- for message in messages -%}
  {%- set text = text_of(message.content) -%}
  {%- if message.content is not string and message.content is iterable -%}
    {%- set n = namespace(images=0) -%}
    {%- for part in message.content -%}{%- if part.type == 'image' -%}{%- set n.images = n.images + 1 -%}{%- endif -%}{%- endfor -%}
    {%- if '<image>' not in text -%}
      {%- if n.images == 1 -%}{%- set text = '<image>\n' + text.lstrip('\n') -%}
      {%- elif n.images > 1 -%}
        {%- set tags = namespace(s='') -%}
        {%- for i in range(n.images) -%}{%- set tags.s = tags.s + ('' if loop.first else ' ') + '<image ' + (i + 1)|string + '><image>' -%}{%- endfor -%}
        {%- set text = tags.s + '\n' + text.lstrip('\n') -%}
      {%- endif -%}
    {%- endif -%}
  {%- endif -%}
  {%- if message.role == 'user' -%}
    {{- '<SPECIAL_11>User\n' + without_flags(text).strip() + '\n' -}}
  {%- elif message.role == 'assistant' -%}
    {{- '<SPECIAL_11>Assistant\n' + text.strip() + '\n<SPECIAL_12>\n' -}}
  {%- elif message.role == 'system' -%}
    {{- raise_exception('a system message is only allowed first') -}}
  {%- else -%}
    {{- raise_exception("role '" + message.role|string + "' is not supported by the built-in template (system, user, assistant)") -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<SPECIAL_11>Assistant\n' + ('<think>\n' if ns.think else '<think></think>') -}}
{%- endif -%}
"""

END_OF_TURN = "<SPECIAL_12>"  # the Nemotron chat format's end-of-answer token (its id is read from the tokenizer)


class _TemplateRaised(Exception):
    """raise_exception() called by a template."""


def _template_env():
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class _Generation(Extension):
        # {% generation %}...{% endgeneration %} marks assistant text for training masks in some templates;
        # here it renders its body unchanged
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class _Env(ImmutableSandboxedEnvironment):
        # the stock sandbox returns an Undefined that only fails when used; refuse at the first touch
        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is not allowed")

    def raise_exception(message):
        raise _TemplateRaised(str(message))

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = _Env(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation], autoescape=False,
               keep_trailing_newline=False)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _compile_template(source_text: str, source: str):
    from jinja2 import TemplateSyntaxError

    try:
        return _template_env().from_string(source_text)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template from {source} does not compile: {e.message} (line {e.lineno})") from None


def render_chat_template(template, context: dict, source: str) -> str:
    """Render a compiled template; every failure is a ChatTemplateError naming ``source``."""
    from jinja2.sandbox import SecurityError

    try:
        return template.render(**context)
    except SecurityError as e:
        raise ChatTemplateError(f"chat template from {source} was refused by the sandbox: {e}") from None
    except _TemplateRaised as e:
        raise ChatTemplateError(f"chat template from {source} raised an error: {e}") from None
    except Exception as e:
        raise ChatTemplateError(f"chat template from {source} failed to render: {type(e).__name__}: {e}") from None


def _find_chat_template(folder: Path, tok_config: dict) -> tuple[str | None, str | None]:
    """(template text, where it came from): chat_template.jinja, chat_template.json, tokenizer_config.json."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8"), str(path)
    path = folder / "chat_template.json"
    if path.is_file():
        value = _read_json(path).get("chat_template")
        if isinstance(value, str):
            return value, str(path)
    value = tok_config.get("chat_template")
    source = str(folder / "tokenizer_config.json")
    if isinstance(value, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
        if value is None:
            raise ProcessorError(f"{source}: chat_template lists {sorted(map(str, named))} but no 'default'")
    if isinstance(value, str):
        return value, source
    return None, None


# ----------------------------------------------------------------------------------------------
# streaming detokenisation
# ----------------------------------------------------------------------------------------------

class StreamDecoder:
    """Turns token ids into text as they arrive, never splitting a multi-byte character.

    ``put(ids)`` returns the text that became complete (possibly ""), ``flush()`` whatever is left
    (a trailing incomplete byte sequence shows as U+FFFD). The concatenation of everything returned
    equals ``tokenizer.decode(all_ids)``. Byte-level BPE tokens can hold part of a UTF-8 character,
    so text is only emitted once decoding no longer ends in the replacement character; decoding works
    on a window that starts at the last emitted boundary, so each step costs O(window).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # window start: a character boundary
        self._read = 0    # ids[:_read] have been emitted
        self.text = ""    # all text emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def put(self, token_ids: int | Iterable[int]) -> str:
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.reshape(-1).tolist()
        self.ids.extend([int(token_ids)] if isinstance(token_ids, int) else [int(t) for t in token_ids])
        done = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        if len(now) <= len(done) or now.endswith("\ufffd"):
            return ""  # nothing new, or a character still incomplete: wait for more tokens
        delta = now[len(done):]
        self._prefix, self._read = self._read, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        done = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        delta = now[len(done):]
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta


# ----------------------------------------------------------------------------------------------
# the processor
# ----------------------------------------------------------------------------------------------

class BatchInputs(dict):
    """Model inputs (input_ids, attention_mask and, with images, pixel_values and num_tiles).

    Keys are also attributes. ``texts`` holds the rendered prompts and ``images_per_prompt`` how
    many images each prompt took (pixel_values and num_tiles list them prompt by prompt).
    """

    texts: list[str]
    images_per_prompt: list[int]

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device=None, dtype=None) -> "BatchInputs":
        """Move tensors to ``device``; ``dtype`` applies to pixel_values only."""
        out = BatchInputs({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()})
        if dtype is not None and "pixel_values" in out:
            out["pixel_values"] = out["pixel_values"].to(dtype)
        out.texts, out.images_per_prompt = self.texts, self.images_per_prompt
        return out


def _is_messages(x) -> bool:
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(m, dict) for m in x)


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
    ):
        self.tokenizer = tokenizer
        self.tokenizer_source = tokenizer_source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.image_processor = image_processor
        self._vision_configs: tuple[dict, dict] | None = None  # (config.json, preprocessor_config.json)
        self.generation_config = generation_config or GenerationConfig()
        self.max_length = max_length
        self.image_token, self.image_start_token, self.image_end_token = image_token, image_start_token, image_end_token

        _merge_added_tokens(tokenizer, added_tokens or {}, tokenizer_source)
        image_tokens = [image_token, image_start_token, image_end_token]
        # a text-only tokenizer (Nemotron-H) has none of the three: prompts are then plain text
        self.supports_images = image_token_id is not None or any(tokenizer.token_to_id(t) is not None for t in image_tokens)
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
        self._template = _compile_template(chat_template, self.chat_template_source)

        self.pad_token_id = self._pick_pad_id()

    # ---- construction from a checkpoint folder ---------------------------------------------------

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | os.PathLike, *, image_processor: ImagePreprocessor | None = None,
                        chat_template: str | None = None, max_length: int | None = None,
                        revision: str | None = None) -> "Processor":
        """Read tokenizer.json, tokenizer_config.json, the chat template, generation_config.json and
        config.json (image tokens; with preprocessor_config.json, the image preprocessing) from a folder
        or a hub repo id."""
        folder = resolve_pretrained(path_or_repo_id, revision=revision)
        tok_path = folder / "tokenizer.json"
        if not tok_path.is_file():
            present = sorted(p.name for p in folder.iterdir())[:8]
            raise ProcessorError(
                f"no tokenizer.json in {folder} (found: {', '.join(present) or 'nothing'}): holotron needs the fast "
                f"tokenizer file; convert a slow tokenizer once with transformers and save it with save_pretrained")
        try:
            tokenizer = Tokenizer.from_file(str(tok_path))
        except Exception as e:
            raise ProcessorError(f"{tok_path}: not a tokenizers file ({str(e).splitlines()[0][:200]})") from None

        tok_config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        special_map = _read_json(folder / "special_tokens_map.json") if (folder / "special_tokens_map.json").is_file() else {}
        config = _read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
        pre = _read_json(folder / "preprocessor_config.json") if (folder / "preprocessor_config.json").is_file() else {}

        specials = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = tok_config.get(name, special_map.get(name))
            if isinstance(value, dict):  # {"content": "<s>", ...}
                value = value.get("content")
            specials[name] = value if isinstance(value, str) else None

        source = None
        if chat_template is None:
            chat_template, source = _find_chat_template(folder, tok_config)

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
            special_tokens=specials,
            added_tokens=tok_config.get("added_tokens_decoder") or {},
            image_processor=image_processor,
            generation_config=GenerationConfig.from_file(folder / "generation_config.json"),
            max_length=max_length,
            image_token=config.get("img_context_token", "<image>"),
            image_start_token=config.get("img_start_token", "<img>"),
            image_end_token=config.get("img_end_token", "</img>"),
            image_token_id=image_token_id if isinstance(image_token_id, int) else None,
            tokenizer_source=str(tok_path),
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
        msgs = _template_messages(messages)
        context = dict(self.special_tokens)
        context.update(messages=msgs, add_generation_prompt=add_generation_prompt, tools=None, documents=None)
        context.update(kwargs)
        return render_chat_template(self._template, context, self.chat_template_source)

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
        batched = isinstance(prompts, (list, tuple)) and not _is_messages(prompts)
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
            elif _is_messages(item):
                embedded = _embedded_images(item)
                if embedded and imgs:
                    raise ProcessorError(f"prompt {i}: images given both inside the messages and through images=; "
                                         f"use one or the other")
                imgs = imgs or embedded
                text = self.apply_chat_template(item, add_generation_prompt=add_generation_prompt, **template_kwargs)
            else:
                raise ProcessorError(f"prompt {i}: expected a text or a list of message dicts, got {type(item).__name__}")
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
            out["pixel_values"] = torch.cat(all_tiles, dim=0)
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
                raise ProcessorError(f"{self.tokenizer_source} has no {self.image_token!r} / {self.image_start_token!r} / "
                                     f"{self.image_end_token!r} tokens: a text-only model's tokenizer cannot take images")
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


def _merge_added_tokens(tokenizer: Tokenizer, added: dict[str, dict], source: str) -> None:
    """Register tokenizer_config.json's added_tokens_decoder so each token encodes to its declared id."""
    problems = []
    for key, entry in sorted(added.items(), key=lambda kv: int(kv[0])):
        content, want = entry.get("content"), int(key)
        if not isinstance(content, str):
            continue
        have = tokenizer.token_to_id(content)
        if have is not None and have != want:
            problems.append(f"{content!r} is id {want} in tokenizer_config.json but {have} in tokenizer.json")
            continue
        token = AddedToken(content, single_word=bool(entry.get("single_word", False)),
                           lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
                           normalized=bool(entry.get("normalized", False)), special=bool(entry.get("special", True)))
        if token.special:
            tokenizer.add_special_tokens([token])
        else:
            tokenizer.add_tokens([token])
        if tokenizer.token_to_id(content) != want:
            problems.append(f"{content!r} is id {want} in tokenizer_config.json but is not in tokenizer.json's vocabulary")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ProcessorError(f"{source}: tokenizer files disagree: {shown}")


def _template_messages(messages: Sequence[dict]) -> list[dict]:
    """Plain copies for the template: image parts become {"type": "image"} (the pixels stay here)."""
    if not _is_messages(messages):
        raise ProcessorError("messages must be a non-empty list of dicts with 'role' and 'content'")
    out = []
    for i, m in enumerate(messages):
        if "role" not in m or "content" not in m:
            raise ProcessorError(f"message {i} needs 'role' and 'content', has {sorted(m)}")
        m = dict(m)
        if isinstance(m["content"], (list, tuple)):
            parts = []
            for part in m["content"]:
                if not isinstance(part, dict) or "type" not in part:
                    raise ProcessorError(f"message {i}: content parts must be dicts with a 'type', got {part!r:.80}")
                if part["type"] in ("image", "image_url"):
                    parts.append({"type": "image"})
                else:
                    parts.append(dict(part))
            m["content"] = parts
        out.append(m)
    return out


def _embedded_images(messages: Sequence[dict]) -> list:
    """Images carried inside the messages: {"type": "image", "image": ...} parts, in order."""
    found = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None:
                    found.append(part["image"])
    return found
