"""Processor: tokenizer files, chat templates in the sandbox, image placeholders, batching, decoding."""

import json

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from tiny_tokenizer import SPECIAL_IDS, write_tiny_tokenizer
from tokenizers import Tokenizer

from holotron.grounding import localization_messages, localization_prompt
from holotron.processor import (
    NEMOTRON_CHAT_TEMPLATE,
    BatchInputs,
    ChatTemplateError,
    GenerationConfig,
    ModelNotFoundError,
    Processor,
    ProcessorError,
    resolve_pretrained,
)

TOKENS_PER_TILE = 256  # what the stub preprocessing reports per tile (the real model's count)


class StubImage:
    """Stands in for a picture: the stub preprocessing gives it ``tiles`` tiles filled with ``value``."""

    def __init__(self, tiles: int, value: float = 0.0):
        self.tiles, self.value = tiles, value


def stub_preprocess(image: StubImage):
    return torch.full((image.tiles, 3, 8, 8), image.value), TOKENS_PER_TILE * image.tiles


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def proc(tok_dir):
    return Processor.from_pretrained(tok_dir, image_processor=stub_preprocess)


# ------------------------------------------------------------------------------------------------
# tokenizer files
# ------------------------------------------------------------------------------------------------

def test_special_token_ids_are_read_from_the_tokenizer(proc):
    assert proc.image_token_id == SPECIAL_IDS["<image>"] == 18
    assert (proc.image_start_token_id, proc.image_end_token_id) == (19, 20)
    for token, i in SPECIAL_IDS.items():
        assert proc.encode(token) == [i], token
    assert proc.encode("<SPECIAL_10>System\n")[0] == 10
    assert proc.decode([10, 11, 12]) == "<SPECIAL_10><SPECIAL_11><SPECIAL_12>"


def test_ids_follow_the_tokenizer_not_constants(tmp_path):
    # put <image>/<img>/</img> elsewhere: the processor must follow the files
    folder = write_tiny_tokenizer(tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    swap = {"<image>": "<SPECIAL_25>", "<SPECIAL_25>": "<image>"}
    data["model"]["vocab"] = {swap.get(k, k): v for k, v in vocab.items()}
    for a in data["added_tokens"]:
        a["content"] = swap.get(a["content"], a["content"])
    (folder / "tokenizer.json").write_text(json.dumps(data))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for entry in cfg["added_tokens_decoder"].values():
        entry["content"] = swap.get(entry["content"], entry["content"])
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    p = Processor.from_pretrained(folder, image_processor=stub_preprocess)
    assert p.image_token_id == 25
    out = p("a<image>b", images=[StubImage(1)])
    assert (out.input_ids == 25).sum() == TOKENS_PER_TILE and (out.input_ids == 18).sum() == 0


def test_tokenizer_config_tokens_are_merged(tmp_path):
    folder = write_tiny_tokenizer(tmp_path, omit_from_tokenizer_json=("<think>", "</think>"))
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert len(raw.encode("<think>", add_special_tokens=False).ids) > 1  # the file alone splits it
    p = Processor.from_pretrained(folder)
    assert p.encode("<think>\nok</think>")[0] == 21 and p.encode("</think>") == [22]
    assert p.decode(p.encode("a<think>b"), skip_special_tokens=True) == "ab"


def test_tokenizer_files_that_disagree(tmp_path):
    folder = write_tiny_tokenizer(tmp_path)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"]["25"] = dict(cfg["added_tokens_decoder"]["21"])  # <think> declared at 25 too
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ProcessorError, match=r"'<think>' is id 25 in tokenizer_config.json but 21 in tokenizer.json"):
        Processor.from_pretrained(folder)


def test_no_bos_is_added(tmp_path):
    folder = write_tiny_tokenizer(tmp_path)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                              {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {
                              "<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode("hi").ids[0] == 1  # the file adds BOS
    p = Processor.from_pretrained(folder)
    assert p.encode("hi")[0] != 1
    assert p("hi").input_ids[0, 0] != 1


def test_text_only_tokenizer(tmp_path):
    # a text-only Nemotron-H tokenizer has <SPECIAL_18..20> where the VL one has the image tokens
    folder = write_tiny_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        text = (folder / name).read_text()
        for i, t in ((18, "<image>"), (19, "<img>"), (20, "</img>")):
            text = text.replace(f'"{t}"', f'"<SPECIAL_{i}>"')
        (folder / name).write_text(text)
    p = Processor.from_pretrained(folder)
    assert not p.supports_images and p.encode("<SPECIAL_19>") == [19]
    out = p([{"role": "user", "content": "what does <image> mean?"}])
    assert out.input_ids[0].tolist() == p.encode(out.texts[0]) and 18 not in out.input_ids[0].tolist()
    with pytest.raises(ProcessorError, match="text-only model's tokenizer cannot take images"):
        p("<image>", images=[StubImage(1)])


def test_config_image_token_id_must_match(tmp_path):
    folder = write_tiny_tokenizer(tmp_path)
    (folder / "config.json").write_text(json.dumps({"img_context_token_id": 5, "img_context_token": "<image>"}))
    with pytest.raises(ProcessorError, match=r"config.json says the image token is id 5 .* '<image>' at id 18"):
        Processor.from_pretrained(folder)


def test_special_tokens_must_be_single(tmp_path):
    folder = write_tiny_tokenizer(tmp_path)
    (folder / "config.json").write_text(json.dumps({"img_start_token": "<picture>"}))
    with pytest.raises(ProcessorError, match=r"must each encode to one id.*'<picture>'"):
        Processor.from_pretrained(folder)


# ------------------------------------------------------------------------------------------------
# the built-in Nemotron template
# ------------------------------------------------------------------------------------------------

def test_builtin_template_format(proc):
    assert proc.chat_template == NEMOTRON_CHAT_TEMPLATE and "built-in" in proc.chat_template_source
    r = proc.apply_chat_template
    assert r([{"role": "user", "content": "Hi"}]) == (
        "<SPECIAL_10>System\n\n<SPECIAL_11>User\nHi\n<SPECIAL_11>Assistant\n<think>\n")
    assert r([{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}]) == (
        "<SPECIAL_10>System\nBe brief.\n<SPECIAL_11>User\nHi\n<SPECIAL_11>Assistant\n<think>\n")
    assert r([{"role": "user", "content": "Hi"}], add_generation_prompt=False) == (
        "<SPECIAL_10>System\n\n<SPECIAL_11>User\nHi\n")
    history = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
               {"role": "user", "content": "and 3+3?"}]
    assert r(history) == ("<SPECIAL_10>System\n\n<SPECIAL_11>User\n2+2?\n<SPECIAL_11>Assistant\n4\n<SPECIAL_12>\n"
                          "<SPECIAL_11>User\nand 3+3?\n<SPECIAL_11>Assistant\n<think>\n")


def test_builtin_template_thinking_switches(proc):
    r = proc.apply_chat_template
    off = r([{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "Hi"}])
    assert off == "<SPECIAL_10>System\nBe brief.\n<SPECIAL_11>User\nHi\n<SPECIAL_11>Assistant\n<think></think>"
    # the last switch wins, and it is removed from the text
    on_again = r([{"role": "system", "content": "/no_think"}, {"role": "user", "content": "Hi /think"}])
    assert on_again.endswith("<SPECIAL_11>User\nHi\n<SPECIAL_11>Assistant\n<think>\n")
    assert r([{"role": "user", "content": "Hi"}], enable_thinking=False).endswith("Assistant\n<think></think>")
    # '</think>' in a text is not a '/think' switch
    kept = r([{"role": "system", "content": "/no_think"}, {"role": "user", "content": "say </think>"}])
    assert kept.endswith("User\nsay </think>\n<SPECIAL_11>Assistant\n<think></think>")


def test_builtin_template_images(proc):
    one = proc.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                                 {"type": "image"}]}])
    assert "<SPECIAL_11>User\n<image>\nWhat is this?\n" in one
    two = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                                 {"type": "text", "text": "Compare."}]}])
    assert "<SPECIAL_11>User\n<image 1><image> <image 2><image>\nCompare.\n" in two
    placed = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                                    {"type": "text", "text": "A <image> here"}]}])
    assert placed.count("<image>") == 1 and "User\nA <image> here\n" in placed


def test_builtin_template_refuses_unknown_roles(proc):
    with pytest.raises(ChatTemplateError,
                       match=r"built-in Nemotron template raised an error: role 'tool' is not supported"):
        proc.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ProcessorError, match="message 0 needs 'role' and 'content'"):
        proc.apply_chat_template([{"content": "x"}])


def test_localization_messages_render(proc):
    msgs = localization_messages("the OK button", StubImage(2))
    text = proc.apply_chat_template(msgs)
    assert text == ("<SPECIAL_10>System\n\n<SPECIAL_11>User\n<image>\n" + localization_prompt("the OK button")
                    + "\n<SPECIAL_11>Assistant\n<think></think>")
    out = proc(msgs)
    assert (out.input_ids == 18).sum() == 2 * TOKENS_PER_TILE and out.num_tiles.tolist() == [2]


# ------------------------------------------------------------------------------------------------
# checkpoint templates and the sandbox
# ------------------------------------------------------------------------------------------------

CUSTOM = ("{% for m in messages %}[{{ m.role }}]{{ m.content | tojson }}{% endfor %}"
          "{% if add_generation_prompt %}[go]{{ eos_token }}{% endif %}")


def test_template_from_tokenizer_config(tmp_path):
    p = Processor.from_pretrained(write_tiny_tokenizer(tmp_path, chat_template=CUSTOM))
    assert p.chat_template_source.endswith("tokenizer_config.json")
    assert p.apply_chat_template([{"role": "user", "content": "é\""}]) == '[user]"é\\""[go]<SPECIAL_12>'


def test_chat_template_jinja_wins(tmp_path):
    folder = write_tiny_tokenizer(tmp_path, chat_template="{{ 'from config' }}")
    (folder / "chat_template.jinja").write_text(CUSTOM)
    p = Processor.from_pretrained(folder)
    assert p.chat_template_source.endswith("chat_template.jinja")
    assert p.apply_chat_template([{"role": "user", "content": "x"}]).startswith("[user]")


def test_named_templates(tmp_path):
    folder = write_tiny_tokenizer(tmp_path, config_extra={"chat_template": [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ messages|length }}"}]})
    assert Processor.from_pretrained(folder).apply_chat_template([{"role": "user", "content": "x"}]) == "D1"


def test_hf_style_template_features_work(proc):
    template = (
        "{%- set ns = namespace(n=0) -%}"
        "{%- for m in messages -%}{%- if loop.index > 2 -%}{%- break -%}{%- endif -%}"
        "{%- set ns.n = ns.n + 1 -%}{{ m.content | tojson(indent=None) }}{%- endfor -%}"
        "{%- if ns.n == 0 -%}{{ raise_exception('no messages') }}{%- endif -%}"
        "|{{ strftime_now('%Y') | length }}|{{ bos_token }}"
        "{% generation %}|{{ messages[-1].content }}{% endgeneration %}"
    )
    p = Processor(proc.tokenizer, chat_template=template, special_tokens={"bos_token": "<s>"})
    msgs = [{"role": "user", "content": c} for c in ("a", "b", "c")]
    assert p.apply_chat_template(msgs) == '"a""b"|4|<s>|c'


@pytest.mark.parametrize("attack", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ (messages|first).__class__ }}",
    "{{ messages[0]['__class__'] }}",
    "{% set x = messages.append(1) %}",
    "{{ lipsum.__globals__['os'] }}",
])
def test_sandbox_refuses_python_internals(tmp_path, attack):
    folder = write_tiny_tokenizer(tmp_path, chat_template=attack, chat_template_file=True)
    p = Processor.from_pretrained(folder)
    with pytest.raises(ChatTemplateError) as err:
        p.apply_chat_template([{"role": "user", "content": "hi"}])
    msg = str(err.value)
    assert "refused by the sandbox" in msg and str(folder / "chat_template.jinja") in msg
    assert "\n" not in msg


@pytest.mark.parametrize("attack", ["{% include '/etc/passwd' %}", "{% import '/etc/hostname' as h %}",
                                    "{% extends '/etc/passwd' %}"])
def test_templates_cannot_read_files(tmp_path, attack):
    folder = write_tiny_tokenizer(tmp_path, chat_template=attack)
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json failed to render") as err:
        Processor.from_pretrained(folder).apply_chat_template([{"role": "user", "content": "hi"}])
    assert "root:" not in str(err.value)


def test_template_errors_name_the_file(tmp_path):
    folder = write_tiny_tokenizer(tmp_path, chat_template="{{ messages[5].content.strip() }}")
    p = Processor.from_pretrained(folder)
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config.json failed to render: UndefinedError"):
        p.apply_chat_template([{"role": "user", "content": "hi"}])
    bad = write_tiny_tokenizer(tmp_path / "b", chat_template="{% for m in messages %}{{ m }}", chat_template_file=True)
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja does not compile: .*\(line 1\)"):
        Processor.from_pretrained(bad)
    raiser = write_tiny_tokenizer(tmp_path / "c", chat_template="{{ raise_exception('only user turns') }}")
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config.json raised an error: only user turns"):
        Processor.from_pretrained(raiser).apply_chat_template([{"role": "user", "content": "hi"}])


# ------------------------------------------------------------------------------------------------
# bounds on rendering (the template is code from the checkpoint)
# ------------------------------------------------------------------------------------------------

RUNAWAY = {
    "two ranges of 100,000": ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                              "TemplateLimits.max_range"),
    "a hundred million characters": ("{% for i in range(10000) %}{% for j in range(10000) %}xxxx{% endfor %}"
                                     "{% endfor %}", "TemplateLimits.max_output_chars"),
    "a billion silent steps": ("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                               "{% endfor %}{% endfor %}{% endfor %}", "TemplateLimits.seconds"),
    "loops over a built list": ("{% set xs = range(1000)|list %}{% for a in xs %}{% for b in xs %}{% for c in xs %}"
                                "{% endfor %}{% endfor %}{% endfor %}", "TemplateLimits.seconds"),
    "one huge string": ("{{ 'x' * 1000000000 }}", "TemplateLimits.max_output_chars"),
    "doubling with ~": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s }}", "TemplateLimits.max_output_chars"),
    "a padded width": ("{{ 'x'|center(1000000000) }}", "TemplateLimits.max_output_chars"),
    "a format width": ("{{ '%0999999999d' % 1 }}", "TemplateLimits.max_output_chars"),
    "replace everywhere": ("{{ ('ab' * 100000)|replace('', 'xxxxxxxxxx') }}", "TemplateLimits.max_output_chars"),
}


@pytest.mark.parametrize("case", list(RUNAWAY))
def test_runaway_templates_are_stopped(tmp_path, case):
    """Each is refused in one line naming the template's file and the limit, in well under 5 s and without
    the memory a finished render would take (the nested ranges alone grew ~80 MB/s before)."""
    import time
    import tracemalloc

    source, limit = RUNAWAY[case]
    folder = write_tiny_tokenizer(tmp_path, chat_template=source, chat_template_file=True)
    p = Processor.from_pretrained(folder)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ChatTemplateError) as err:
            p.apply_chat_template([{"role": "user", "content": "hi"}])
        seconds = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert str(folder / "chat_template.jinja") in msg and limit in msg and "\n" not in msg, msg
    assert seconds < 4.5, seconds
    assert peak < 150e6, peak


def test_long_user_text_is_bounded_too(proc):
    with pytest.raises(ChatTemplateError, match=r"over 2,000,000 characters.*max_output_chars"):
        proc.apply_chat_template([{"role": "user", "content": "word " * 500_000}])


def test_limits_are_configurable_for_trusted_checkpoints(tmp_path):
    from holotron.processor import TemplateLimits

    source = "{% for i in range(20000) %}{% if loop.last %}{{ i }}{% endif %}{% endfor %}"
    folder = write_tiny_tokenizer(tmp_path, chat_template=source, chat_template_file=True)
    with pytest.raises(ChatTemplateError, match=r"range\(20000\) gives 20,000 items, over 10,000"):
        Processor.from_pretrained(folder).apply_chat_template([{"role": "user", "content": "hi"}])
    trusted = Processor.from_pretrained(folder, template_limits=TemplateLimits(max_range=None))
    assert trusted.apply_chat_template([{"role": "user", "content": "hi"}]) == "19999"
    assert TemplateLimits(seconds=None, max_output_chars=None, max_range=None).seconds is None
    with pytest.raises(ValueError, match="TemplateLimits.seconds"):
        TemplateLimits(seconds=0)


def test_the_real_templates_render_within_the_default_limits(proc):
    """The built-in Nemotron template over a long conversation with images, well inside every bound."""
    turns = [{"role": "system", "content": "/no_think"}]
    for k in range(200):
        turns += [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"question {k}"}]},
                  {"role": "assistant", "content": f"answer {k}"}]
    text = proc.apply_chat_template(turns)
    assert text.count("<image>") == 200 and text.endswith("<SPECIAL_11>Assistant\n<think></think>")


# ------------------------------------------------------------------------------------------------
# image placeholders
# ------------------------------------------------------------------------------------------------

def test_image_expansion_matches_expanded_text(proc):
    text = "look <image> and then <image>: which?"
    images = [StubImage(1, 1.0), StubImage(3, 2.0)]
    out = proc(text, images=images)
    expanded = text.replace("<image>", "\0", 2)
    for n in (1, 3):
        expanded = expanded.replace("\0", "<img>" + "<image>" * (TOKENS_PER_TILE * n) + "</img>", 1)
    assert out.input_ids[0].tolist() == proc.encode(expanded)
    ids = out.input_ids[0].tolist()
    start = ids.index(19)
    assert (ids[start + 1:start + 1 + TOKENS_PER_TILE] == [18] * TOKENS_PER_TILE
            and ids[start + 1 + TOKENS_PER_TILE] == 20)
    assert out.num_tiles.tolist() == [1, 3] and out.pixel_values.shape == (4, 3, 8, 8)
    assert out.pixel_values[:, 0, 0, 0].tolist() == [1.0, 2.0, 2.0, 2.0]  # tiles in image order
    assert out.texts == [text] and out.images_per_prompt == [2]


def test_images_inside_messages(proc):
    msgs = [{"role": "user",
             "content": [{"type": "image", "image": StubImage(2, 5.0)}, {"type": "text", "text": "Hi"}]}]
    out = proc(msgs)
    assert (out.input_ids == 18).sum() == 2 * TOKENS_PER_TILE and out.pixel_values[0, 0, 0, 0] == 5.0
    placeholder = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    assert torch.equal(proc(placeholder, images=StubImage(2, 5.0)).input_ids, out.input_ids)
    with pytest.raises(ProcessorError, match="both inside the messages and through images="):
        proc(msgs, images=[StubImage(1)])


def test_image_count_must_match(proc):
    with pytest.raises(ProcessorError, match=r"prompt 0 has 2 '<image>' placeholder\(s\) but 1 image\(s\)"):
        proc("a <image> b <image>", images=[StubImage(1)])
    with pytest.raises(ProcessorError, match=r"has 0 '<image>' placeholder\(s\) but 1 image\(s\)"):
        proc("no placeholder", images=StubImage(1))
    with pytest.raises(ProcessorError, match=r"has 1 '<image>' placeholder\(s\) but 0 image\(s\)"):
        proc([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
    with pytest.raises(ProcessorError, match=r"prompt 1 has 1 '<image>' placeholder\(s\) but 2 image\(s\)"):
        proc(["<image>", "<image>"], images=[StubImage(1), [StubImage(1), StubImage(1)]])


def test_image_preprocessing_is_required_and_checked(proc):
    bare = Processor(proc.tokenizer)
    with pytest.raises(ProcessorError, match="no image_processor"):
        bare("<image>", images=[StubImage(1)])
    wrong = Processor(proc.tokenizer, image_processor=lambda im: (torch.zeros(2, 3, 8, 8), 301))
    with pytest.raises(ProcessorError, match="reports 301 tokens for 2 tiles; every tile must give the same"):
        wrong("<image>", images=[StubImage(2)])
    flat = Processor(proc.tokenizer, image_processor=lambda im: (torch.zeros(3, 8, 8), 256))
    with pytest.raises(ProcessorError, match=r"must return a \(tiles, 3, S, S\) tensor"):
        flat("<image>", images=[StubImage(1)])


# ------------------------------------------------------------------------------------------------
# batching, padding and length
# ------------------------------------------------------------------------------------------------

def test_batch_left_padding(proc):
    prompts = [[{"role": "user", "content": "short"}],
               [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a much longer question"}]}]]
    out = proc(prompts, images=[None, [StubImage(2, 7.0)]])
    singles = [proc(prompts[0]).input_ids[0], proc(prompts[1], images=[StubImage(2, 7.0)]).input_ids[0]]
    width = max(len(s) for s in singles)
    assert out.input_ids.shape == out.attention_mask.shape == (2, width)
    for b, s in enumerate(singles):
        pad = width - len(s)
        assert out.input_ids[b, pad:].tolist() == s.tolist()
        assert out.attention_mask[b].tolist() == [0] * pad + [1] * len(s)
        assert (out.input_ids[b, :pad] == proc.pad_token_id).all()
    assert width - len(singles[0]) > 0
    assert out.images_per_prompt == [0, 1] and out.num_tiles.tolist() == [2] and out.pixel_values.shape[0] == 2
    assert set(out.keys()) == {"input_ids", "attention_mask", "pixel_values", "num_tiles"}
    moved = out.to("cpu", dtype=torch.float16)
    assert isinstance(moved, BatchInputs) and moved.pixel_values.dtype == torch.float16 and moved.texts == out.texts
    assert "pixel_values" not in proc(["a", "bb"])


def test_batch_images_stay_in_prompt_order(proc):
    out = proc(["<image>x", "y<image>z<image>"], images=[StubImage(1, 1.0), [StubImage(2, 2.0), StubImage(1, 3.0)]])
    assert out.num_tiles.tolist() == [1, 2, 1] and out.images_per_prompt == [1, 2]
    assert out.pixel_values[:, 0, 0, 0].tolist() == [1.0, 2.0, 2.0, 3.0]
    with pytest.raises(ProcessorError, match="2 prompts but images has 1 entries"):
        proc(["<image>", "b"], images=[StubImage(1)])


def test_batch_to_checks_device_and_dtype_up_front(proc):
    batch = proc("look <image>", images=[StubImage(1)])
    moved = batch.to("cpu", torch.bfloat16)
    assert moved.pixel_values.dtype == torch.bfloat16 and moved.input_ids.dtype == torch.long
    with pytest.raises(ProcessorError, match="unknown device 'tpu'"):
        batch.to("tpu")
    with pytest.raises(ProcessorError, match="floating torch dtype"):
        batch.to("cpu", torch.int64)
    if not torch.cuda.is_available():
        with pytest.raises(ProcessorError, match=r"CUDA was asked for but torch sees no GPU \(torch .*\)") as err:
            batch.to("cuda")
        if torch.version.cuda is None:
            assert f"(torch {torch.__version__}, CPU build)" in str(err.value)


def test_pad_id_choice(tmp_path, proc):
    assert proc.pad_token_id == 12  # no pad token, no generation_config: the eos token <SPECIAL_12>
    p = Processor.from_pretrained(write_tiny_tokenizer(tmp_path / "a", pad_token="<SPECIAL_30>"))
    assert p.pad_token_id == 30
    folder = write_tiny_tokenizer(tmp_path / "b")
    (folder / "generation_config.json").write_text(json.dumps({"pad_token_id": 0}))
    assert Processor.from_pretrained(folder).pad_token_id == 0
    assert Processor(proc.tokenizer).pad_token_id == 0  # nothing declared at all


def test_max_length(proc, tmp_path):
    text = "<image>" + " word" * 40
    n = len(proc(text, images=[StubImage(1)]).input_ids[0])
    assert proc(text, images=[StubImage(1)], max_length=n).input_ids.shape[1] == n
    with pytest.raises(ProcessorError) as err:
        proc(text, images=[StubImage(1)], max_length=n - 1)
    msg = str(err.value)
    assert f"prompt 0 is {n} tokens ({n - 258} text + 258 image), more than max_length={n - 1}" in msg
    assert "fewer or smaller images" in msg and "larger max_length" in msg
    folder = write_tiny_tokenizer(tmp_path, config_extra={"model_max_length": 5})
    with pytest.raises(ProcessorError, match="more than max_length=5"):
        Processor.from_pretrained(folder)("a rather long prompt with many words")


# ------------------------------------------------------------------------------------------------
# decoding and streaming
# ------------------------------------------------------------------------------------------------

def test_decode_skip_special(proc):
    ids = proc.encode("<SPECIAL_11>Assistant\n<think></think>café 😀<SPECIAL_12>")
    assert proc.decode(ids) == "<SPECIAL_11>Assistant\n<think></think>café 😀<SPECIAL_12>"
    assert proc.decode(ids, skip_special_tokens=True) == "Assistant\ncafé 😀"
    assert proc.decode(torch.tensor([ids])) == proc.decode(ids)
    assert proc.batch_decode([ids, ids[:2]], skip_special_tokens=True)[1] == "Assistant"


def test_multibyte_characters_really_split(proc):
    # the tiny vocabulary splits these characters over several tokens: the streaming tests mean something
    for ch in ("😀", "🦜", "鸚", "é"):
        pieces = [proc.decode([i]) for i in proc.encode(ch)]
        assert len(pieces) > 1 and "\ufffd" in "".join(pieces), ch


def _feed(decoder, ids):
    chunks = [decoder.put(i) for i in ids]
    return chunks + [decoder.flush()]


_texts = st.lists(st.sampled_from(list("ab ,.\n") + ["é", "ü", "ñ", "日", "本", "語", "鸚", "😀", "🦜", "👍🏽", "∑"]),
                  max_size=30).map("".join)


@given(text=_texts)
@example(text="🦜 日本語 café")
@example(text="😀😀")
def test_stream_decoder_matches_decode(proc, text):
    ids = proc.encode(text)
    d = proc.stream_decoder()
    chunks = _feed(d, ids)
    assert "".join(chunks) == text == d.text == proc.decode(ids)
    assert all("\ufffd" not in c for c in chunks)


def test_stream_decoder_waits_for_whole_characters(proc):
    ids = proc.encode("a🦜")
    d = proc.stream_decoder()
    assert d.put(ids[0]) == "a"
    emitted = [d.put(i) for i in ids[1:]]
    assert emitted[:-1] == [""] * (len(emitted) - 1) and emitted[-1] == "🦜"
    cut = proc.stream_decoder()
    assert cut.put(proc.encode("🦜")[0]) == ""
    assert cut.flush() == "\ufffd"  # an unfinished character shows as the replacement mark at the end


def test_stream_decoder_special_tokens(proc):
    ids = proc.encode("<think></think>ok<SPECIAL_12>")
    assert "".join(_feed(proc.stream_decoder(), ids)) == "ok"
    assert "".join(_feed(proc.stream_decoder(skip_special_tokens=False), ids)) == "<think></think>ok<SPECIAL_12>"
    batch = proc.stream_decoder()
    assert batch.put(torch.tensor(ids)) == "ok"


# ------------------------------------------------------------------------------------------------
# generation_config.json
# ------------------------------------------------------------------------------------------------

def test_generation_config(tmp_path):
    path = tmp_path / "generation_config.json"
    path.write_text(json.dumps({"eos_token_id": [2, 12], "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 128,
                                "do_sample": True, "bos_token_id": 1, "transformers_version": "5.0"}))
    g = GenerationConfig.from_file(path)
    assert g.eos_token_ids == (2, 12) and g.temperature == 0.6 and g.top_p == 0.95 and g.max_new_tokens == 128
    assert (g.do_sample is True and g.bos_token_id == 1 and g.top_k is None
            and g.extra == {"transformers_version": "5.0"})
    assert g.generate_kwargs() == {"max_new_tokens": 128, "temperature": 0.6, "top_p": 0.95, "eos_token_id": [2, 12]}
    greedy = GenerationConfig.from_dict({"temperature": 0.6, "top_p": 0.95, "top_k": 0})  # no do_sample: greedy
    assert greedy.generate_kwargs() == {"temperature": 0.0}
    assert GenerationConfig.from_dict({"do_sample": True, "top_k": 0}).generate_kwargs() == {"temperature": 1.0}
    assert GenerationConfig.from_dict({"eos_token_id": 7}).eos_token_ids == (7,)
    assert GenerationConfig.from_dict({"eos_token_id": None}).eos_token_ids == ()
    assert GenerationConfig.from_file(tmp_path / "missing.json") == GenerationConfig()
    path.write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(ProcessorError, match=r"generation_config.json: temperature must be a non-negative float"):
        GenerationConfig.from_file(path)
    path.write_text("{not json")
    with pytest.raises(ProcessorError, match=r"generation_config.json: not valid JSON"):
        GenerationConfig.from_file(path)
    with pytest.raises(ProcessorError, match="eos_token_id must be a token id"):
        GenerationConfig.from_dict({"eos_token_id": ["</s>"]})


def test_stop_token_ids(tmp_path):
    folder = write_tiny_tokenizer(tmp_path, config_extra={"eos_token": "</s>"})
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    p = Processor.from_pretrained(folder)
    assert p.stop_token_ids == (2, 5, 12)  # generation_config, tokenizer eos (2 again), end of turn
    other = write_tiny_tokenizer(tmp_path / "o", chat_template="{{ messages[0].content }}",
                                 config_extra={"eos_token": "</s>"})
    assert Processor.from_pretrained(other).stop_token_ids == (2,)  # a template without <SPECIAL_12>


def test_vl_checkpoint_uses_the_vision_preprocessing(tmp_path):
    from PIL import Image

    folder = write_tiny_tokenizer(tmp_path)
    (folder / "config.json").write_text(json.dumps({
        "img_context_token_id": 18, "force_image_size": 64, "downsample_ratio": 0.5, "use_thumbnail": True,
        "vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 16}}))
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_size": 64, "max_num_tiles": 4}))
    p = Processor.from_pretrained(folder)
    out = p([{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (256, 64), "white")},
                                          {"type": "text", "text": "Where?"}]}])
    tiles = out.pixel_values.shape[0]
    assert out.pixel_values.shape[1:] == (3, 64, 64) and tiles == 5  # a 4 x 1 grid for 4:1, then the thumbnail
    assert out.num_tiles.tolist() == [5]
    assert (out.input_ids == 18).sum() == tiles * 4  # (64 / 16 / 2)^2 tokens per tile
    assert Processor.from_pretrained(write_tiny_tokenizer(tmp_path / "text")).image_processor is None


# ------------------------------------------------------------------------------------------------
# finding checkpoints
# ------------------------------------------------------------------------------------------------

def test_missing_model_and_files(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r".*nope: no such folder \(and not a Hugging Face repo id\)"):
        Processor.from_pretrained(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ProcessorError, match=r"no tokenizer.json in .* \(found: config.json\)"):
        Processor.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{\"version\": \"1.0\"}")
    with pytest.raises(ProcessorError, match=r"tokenizer.json: not a tokenizers file"):
        Processor.from_pretrained(tmp_path)
    good = write_tiny_tokenizer(tmp_path / "g")
    (good / "tokenizer_config.json").write_text("{\"eos_token\": ")
    with pytest.raises(ProcessorError, match=r"tokenizer_config.json: not valid JSON"):
        Processor.from_pretrained(good)


def _hub_cache(home, repo_id):
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    write_tiny_tokenizer(repo / "snapshots" / sha)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    return repo / "snapshots" / sha


def test_hub_cache_offline(tmp_path, monkeypatch):
    snapshot = _hub_cache(tmp_path, "acme/tiny-vl")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_pretrained("acme/tiny-vl") == snapshot
    assert Processor.from_pretrained("acme/tiny-vl").encode("<image>") == [18]
    with pytest.raises(ModelNotFoundError) as err:
        Processor.from_pretrained("acme/missing")
    msg = str(err.value)
    assert msg.startswith("acme/missing: not a local folder, and HF_HUB_OFFLINE is set "
                          "and it is not in the local cache")
    assert "hf download acme/missing" in msg
    assert str(tmp_path / "hub") in msg and "\n" not in msg


def test_hub_download_never_fetches_code(tmp_path, monkeypatch):
    import fnmatch

    import huggingface_hub

    calls = {}

    def fake_snapshot_download(repo_id, **kwargs):
        calls.update(kwargs, repo_id=repo_id)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert resolve_pretrained("acme/remote") == tmp_path
    assert calls["repo_id"] == "acme/remote" and calls["local_files_only"] is False
    allowed = calls["allow_patterns"]
    assert "tokenizer.json" in allowed and "chat_template.jinja" in allowed
    for name in ("modeling_nemotron.py", "processing.py", "model-00001-of-00005.safetensors"):
        assert not any(fnmatch.fnmatch(name, pat) for pat in allowed), name
    assert "*.py" in calls["ignore_patterns"]


# ------------------------------------------------------------------------------------------------
# oracle: transformers reads the same files the same way (optional dependency)
# ------------------------------------------------------------------------------------------------

# block tags without '-': the result depends on trim_blocks / lstrip_blocks, which must match transformers'
WHITESPACE_TEMPLATE = """{% for m in messages %}
    {% if m.role == 'user' %}
<u>{{ m.content }}</u>
    {% else %}
<a>{{ m.content }}</a>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}<go>{% endif %}"""


@pytest.mark.parametrize("template", [NEMOTRON_CHAT_TEMPLATE, WHITESPACE_TEMPLATE])
def test_same_prompt_and_ids_as_transformers(tmp_path, template):
    transformers = pytest.importorskip("transformers")
    folder = write_tiny_tokenizer(tmp_path, chat_template=template, omit_from_tokenizer_json=("<think>", "</think>"))
    ours = Processor.from_pretrained(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    conversations = [
        [{"role": "system", "content": "Be brief. /no_think"},
         {"role": "user", "content": "Où est le bouton « OK » ? 😀"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>4"},
         {"role": "user", "content": "and 3+3? /think"}],
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click Save"}]}],
    ]
    for msgs in conversations:
        if template is WHITESPACE_TEMPLATE and not isinstance(msgs[-1]["content"], str):
            continue
        text = ours.apply_chat_template(msgs)
        assert text == theirs.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"]
