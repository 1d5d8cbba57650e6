"""Chat templates: holotron's built-in Nemotron template, finding a checkpoint's own, compiling and
rendering it in the bounded sandbox of template_sandbox.py.

A checkpoint's chat template is code that comes with it: it is compiled in jinja2's immutable sandbox
(no attribute escapes, no includes, no mutation) and rendered within ``TemplateLimits`` (time, output size,
``range`` size). Every failure is a one-line ``ChatTemplateError`` naming where the template came from; a
refusal also names the limit hit and how to raise it for a trusted checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from .processor_errors import ChatTemplateError, ProcessorError, read_json
from .template_sandbox import LimitExceeded, TemplateLimits, TemplateRaised, make_environment, render_with_limits

__all__ = ["NEMOTRON_CHAT_TEMPLATE", "END_OF_TURN", "TemplateLimits", "ChatTemplateError", "compile_chat_template",
           "render_chat_template", "find_chat_template"]

# holotron's own rendering of the Nemotron-Nano VL chat format, used when a checkpoint has no template:
#   <SPECIAL_10>System\n{system}\n<SPECIAL_11>User\n{user}\n<SPECIAL_11>Assistant\n{answer}\n<SPECIAL_12>\n
#   ... <SPECIAL_11>Assistant\n<think>\n            (generation prompt, reasoning on: the default)
#   ... <SPECIAL_11>Assistant\n<think></think>      ("/no_think" in a system or user text, or enable_thinking=False)
# A message whose content is a list puts its images first: "<image>\n" for one, "<image 1><image> <image 2><image>\n"
# for several (unless its text already holds "<image>" placeholders).
NEMOTRON_CHAT_TEMPLATE = (Path(__file__).parent / "nemotron_chat_template.jinja").read_text(encoding="utf-8")

END_OF_TURN = "<SPECIAL_12>"  # the Nemotron chat format's end-of-answer token (its id is read from the tokenizer)


def compile_chat_template(source_text: str, source: str):
    """The template compiled in the bounded sandbox; ChatTemplateError naming ``source`` when it does not compile."""
    from jinja2 import TemplateSyntaxError

    if not isinstance(source_text, str):
        raise ChatTemplateError(f"chat template from {source} must be text, got {type(source_text).__name__}")
    try:
        return make_environment().from_string(source_text)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template from {source} does not compile: {e.message} "
                                f"(line {e.lineno})") from None
    except Exception as e:  # jinja can emit Python that does not compile ({% break %} outside a loop), or
        # fail in constant folding or on deep nesting
        raise ChatTemplateError(f"chat template from {source} does not compile: {type(e).__name__}: "
                                f"{_one_line(e)}") from None


def render_chat_template(template, context: dict, source: str, limits: TemplateLimits | None = None) -> str:
    """Render a compiled template within ``limits`` (default: ``template_sandbox.DEFAULT_LIMITS``); every
    failure is a ChatTemplateError naming ``source``."""
    from jinja2.sandbox import SecurityError

    try:
        return render_with_limits(template, context, limits)
    except LimitExceeded as e:
        raise ChatTemplateError(
            f"chat template from {source} was stopped: {e}; for a checkpoint you trust, pass a larger limit "
            f"(Processor.from_pretrained(..., template_limits=TemplateLimits(...)), None for none)") from None
    except SecurityError as e:
        raise ChatTemplateError(f"chat template from {source} was refused by the sandbox: {_one_line(e)}") from None
    except TemplateRaised as e:
        raise ChatTemplateError(f"chat template from {source} raised an error: {_one_line(e)}") from None
    except Exception as e:
        raise ChatTemplateError(f"chat template from {source} failed to render: {type(e).__name__}: "
                                f"{_one_line(e)}") from None


def _one_line(e: BaseException, width: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= width else text[:width] + " ..."


def find_chat_template(folder: Path, tok_config: dict) -> tuple[str | None, str | None]:
    """(template text, where it came from): chat_template.jinja, chat_template.json, tokenizer_config.json."""
    path = folder / "chat_template.jinja"
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    path = folder / "chat_template.json"
    if path.is_file():
        value = read_json(path).get("chat_template")
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
