"""The processor's error classes, and the one JSON reader every processor file goes through (so a broken
file is one ProcessorError line naming it)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ProcessorError", "ChatTemplateError", "ModelNotFoundError", "read_json"]


class ProcessorError(ValueError):
    """Bad input to the processor or a broken tokenizer / template file; the message is one line."""


class ChatTemplateError(ProcessorError):
    """A chat template that does not compile, fails to render, or is refused by the sandbox or its limits."""


class ModelNotFoundError(FileNotFoundError):
    """Neither a local folder nor a repo id available in the Hugging Face cache (or on the Hub)."""


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ProcessorError naming the file when it cannot be read or is not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ProcessorError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise ProcessorError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ProcessorError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise ProcessorError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
