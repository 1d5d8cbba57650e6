"""Fuzzing what comes from outside: image bytes, checkpoint JSON (config.json, preprocessor_config.json,
generation_config.json, tokenizer_config.json) and chat templates. Every input either works or raises the
library's own error class (ImageError, ConfigError, ProcessorError / ChatTemplateError), never hangs and
never leaks an untyped exception. Each test runs a bounded number of examples in a few seconds."""

from __future__ import annotations

import copy
import io
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from tiny_tokenizer import write_tiny_tokenizer

from holotron import bundled
from holotron.chat_template import (
    NEMOTRON_CHAT_TEMPLATE,
    ChatTemplateError,
    TemplateLimits,
    compile_chat_template,
    render_chat_template,
)
from holotron.config import ConfigError, TextConfig
from holotron.generation_config import GenerationConfig
from holotron.processor import Processor, ProcessorError
from holotron.vision.config import VisionConfig
from holotron.vision.preprocess import ImageError, load_image, preprocess_image

# HOLOTRON_FUZZ=N multiplies the examples and draws fresh ones (a longer hunt than the fixed default run)
SCALE = int(os.environ.get("HOLOTRON_FUZZ", "0"))
FUZZ = settings(deadline=None, max_examples=60 * max(1, SCALE), derandomize=not SCALE,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------------------------------------- images

SMALL = VisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, patch_size=4, max_img_size=32,
                     image_size=16, max_num_tiles=4, projector_hidden_size=8, projector_output_size=8)
MAX_PIXELS = 1 << 20  # a mutated header may claim any size: keep what a test may decode small


def _png(mode: str, size=(13, 9)) -> bytes:
    im = Image.new(mode, size)
    for x in range(size[0]):
        im.putpixel((x, x % size[1]), 200 if mode in ("L", "P", "I;16", "I") else (200,) * len(mode))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


VALID = [_png("RGB"), _png("RGBA"), _png("L"), _png("P"), _png("I;16"), _png("LA")]


@st.composite
def mutated(draw, seeds=VALID):
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "insert", "chunk"]))
        pos = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[pos] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "chunk" and 16 <= pos < len(data):  # a size field of a PNG chunk or the header
            data[pos:pos + 4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "big")
    return bytes(data)


def _image_ok_or_image_error(data: bytes):
    try:
        im = load_image(data, max_pixels=MAX_PIXELS)
    except ImageError:
        return
    assert im.mode == "RGB" and min(im.size) >= 2
    try:
        pixel_values, n = preprocess_image(data, SMALL, max_pixels=MAX_PIXELS)
    except ImageError:
        return
    assert pixel_values.dim() == 4 and n == pixel_values.shape[0] * SMALL.tokens_per_tile


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_are_an_image_error(data):
    _image_ok_or_image_error(data)


@FUZZ
@given(mutated())
def test_mutated_pngs_load_or_are_an_image_error(data):
    _image_ok_or_image_error(data)


def test_the_valid_seeds_load():
    for data in VALID:
        assert load_image(data).size == (13, 9)


# ---------------------------------------------------------------------------------------------- configs

BUNDLED = Path(bundled.MODELS_DIR) / bundled.DEFAULT_MODEL
CONFIG = json.loads((BUNDLED / "config.json").read_text())
PREPROCESSOR = json.loads((BUNDLED / "preprocessor_config.json").read_text())
GENERATION = json.loads((BUNDLED / "generation_config.json").read_text())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_json(draw, base: dict):
    """``base`` with a few values replaced by other JSON values, or keys removed."""
    d = copy.deepcopy(base)
    paths = [p for p in _paths(d) if p]
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(paths))
        parent = d
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):  # an earlier mutation changed the shape under this path
            continue
    return d


def test_the_unmutated_configs_parse():
    VisionConfig.from_hf(CONFIG, PREPROCESSOR)
    TextConfig.from_hf(CONFIG["llm_config"])
    GenerationConfig.from_dict(GENERATION)


@FUZZ
@given(mutated_json(CONFIG), mutated_json(PREPROCESSOR))
def test_vision_config_parses_or_is_a_config_error(config, pre):
    try:
        VisionConfig.from_hf(config, pre)
    except ConfigError:
        pass


@FUZZ
@given(mutated_json(CONFIG["llm_config"]))
def test_text_config_parses_or_is_a_config_error(config):
    try:
        TextConfig.from_hf(config)
    except ConfigError:
        pass


@FUZZ
@given(mutated_json(GENERATION) | st.dictionaries(st.sampled_from(
    ["eos_token_id", "pad_token_id", "bos_token_id", "max_new_tokens", "do_sample", "temperature", "top_p", "top_k",
     "repetition_penalty"]), json_values, max_size=5))
def test_generation_config_parses_or_is_a_processor_error(data):
    try:
        cfg = GenerationConfig.from_dict(data)
    except ProcessorError:
        return
    cfg.generate_kwargs()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@settings(FUZZ, max_examples=30 * max(1, SCALE))
@given(data=st.data())
def test_processor_files_load_or_are_a_processor_error(tok_dir, data):
    """Mutated tokenizer_config.json / config.json / preprocessor_config.json in a checkpoint folder."""
    tok_config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    which = data.draw(st.sampled_from(["tokenizer_config.json", "config.json", "preprocessor_config.json"]))
    base = {"tokenizer_config.json": tok_config, "config.json": CONFIG, "preprocessor_config.json": PREPROCESSOR}
    files = {"tokenizer_config.json": tok_config, which: data.draw(mutated_json(base[which]))}
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
        for name, content in files.items():
            (folder / name).write_text(json.dumps(content))
        try:
            proc = Processor.from_pretrained(folder)
            proc([{"role": "user", "content": "hi"}])
        except (ProcessorError, ConfigError):
            pass


# ---------------------------------------------------------------------------------------------- chat templates

FAST = TemplateLimits(seconds=0.5, max_output_chars=100_000, max_range=1_000)
MESSAGES = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "the OK button"}]},
            {"role": "assistant", "content": '{"x": 1, "y": 2}'}]
PRISTINE = copy.deepcopy(MESSAGES)

names = st.sampled_from(["messages", "m", "m.role", "m.content", "messages[0]", "messages[-1].content", "x", "ns.v",
                         "loop.index", "add_generation_prompt", "none", "1", "'s'", "[1, 2]", "{'a': 1}"])
numbers = st.sampled_from(["0", "1", "3", "10", "1000", "100000", "10 ** 9", "-1"])
expressions = st.recursive(
    names | numbers,
    lambda e: st.one_of(
        st.tuples(e, st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "~", "==", "and", "or", "in"]), e).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(e, st.sampled_from(["length", "string", "upper", "list", "join", "tojson", "first", "last",
                                      "center(1000000)", "replace('', 'xx')", "indent(100)", "trim", "reverse",
                                      "unique", "sort", "format(1)", "int", "abs", "batch(3)", "slice(9999)"])).map(
            lambda t: f"({t[0]}|{t[1]})"),
        st.tuples(st.sampled_from(["range", "raise_exception", "namespace", "dict", "lipsum", "undefined_fn"]),
                  e).map(lambda t: f"{t[0]}({t[1]})"),
        e.map(lambda x: f"{x}.strip()"), e.map(lambda x: f"{x}[0]"), e.map(lambda x: f"{x}.__class__"),
    ),
    max_leaves=5)


def _block(inner):
    return st.one_of(
        expressions.map(lambda x: "{{ " + x + " }}"),
        st.tuples(expressions, inner).map(lambda t: "{% for m in " + t[0] + " %}" + t[1] + "{% endfor %}"),
        st.tuples(expressions, inner, inner).map(lambda t: "{% if " + t[0] + " %}" + t[1] + "{% else %}" + t[2]
                                                 + "{% endif %}"),
        expressions.map(lambda x: "{% set x = " + x + " %}"),
        expressions.map(lambda x: "{% set ns = namespace(v=" + x + ") %}"),
        inner.map(lambda b: "{% macro f(a) %}" + b + "{{ f(a) }}{% endmacro %}{{ f(1) }}"),
        st.sampled_from(["{% break %}", "{% continue %}", "{% endfor %}", "{% if %}", "{{", "}}", "{# c #}",
                         "{% generation %}a{% endgeneration %}", "text ", "\n", "{% include 'x' %}",
                         "{% raw %}{{{% endraw %}", "{% filter upper %}x{% endfilter %}"]),
    )


templates = st.recursive(st.just(""), lambda inner: st.lists(_block(inner), min_size=1, max_size=4).map("".join),
                         max_leaves=8)


@settings(FUZZ, max_examples=150 * max(1, SCALE))
@given(templates)
def test_chat_templates_render_or_are_a_chat_template_error(source):
    t0 = time.monotonic()
    try:
        template = compile_chat_template(source, "fuzz.jinja")
        out = render_chat_template(template, {"messages": MESSAGES, "add_generation_prompt": True}, "fuzz.jinja",
                                   FAST)
        assert isinstance(out, str) and len(out) <= FAST.max_output_chars
    except ChatTemplateError as e:
        assert "fuzz.jinja" in str(e) and "\n" not in str(e)
    assert time.monotonic() - t0 < 3 * FAST.seconds + 2
    assert MESSAGES == PRISTINE, "the template changed its input"


def test_a_filter_cannot_change_the_callers_messages():
    """Found by the fuzzing above: jinja's indent does ``s += "\\n"``, which on a list appends in place."""
    messages = copy.deepcopy(MESSAGES)
    out = render_chat_template(compile_chat_template("{{ messages|indent(2) }}", "fuzz.jinja"),
                               {"messages": messages}, "fuzz.jinja")
    assert messages == PRISTINE and out.startswith("[{'role': 'system'")


def test_the_grammar_reaches_the_limits():
    """The grammar above can build the runaway templates the limits are for; each is refused by name."""
    for source, limit in [("{% for m in range(100000) %}{% endfor %}", "max_range"),
                          ("{{ ('x' * 1000) * 1000 }}", "max_output_chars"),
                          ("{% for m in range(1000) %}{% for n in range(1000) %}{% for k in range(1000) %}"
                           "{% endfor %}{% endfor %}{% endfor %}", "seconds")]:
        with pytest.raises(ChatTemplateError, match=f"TemplateLimits.{limit}"):
            render_chat_template(compile_chat_template(source, "fuzz.jinja"), {}, "fuzz.jinja", FAST)
    out = render_chat_template(compile_chat_template(NEMOTRON_CHAT_TEMPLATE, "builtin"),
                               {"messages": MESSAGES, "add_generation_prompt": True}, "builtin", FAST)
    assert out.endswith("<SPECIAL_11>Assistant\n<think>\n")
