"""Chat messages as the processor takes them: a list of {"role", "content"} dicts whose content is a text or
a list of parts ({"type": "text", "text": ..} / {"type": "image", "image": ..})."""

from __future__ import annotations

from typing import Sequence

from .processor_errors import ProcessorError

__all__ = ["is_messages", "template_messages", "embedded_images"]


def is_messages(x) -> bool:
    """True for a non-empty list (or tuple) of dicts: one conversation rather than a batch of prompts."""
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(m, dict) for m in x)


def template_messages(messages: Sequence[dict]) -> list[dict]:
    """Plain copies for the template: image parts become {"type": "image"} (the pixels stay here)."""
    if not is_messages(messages):
        raise ProcessorError("messages must be a non-empty list of dicts with 'role' and 'content'")
    out = []
    for i, m in enumerate(messages):
        if "role" not in m or "content" not in m:
            raise ProcessorError(f"message {i} needs 'role' and 'content', has {sorted(map(str, m))}")
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


def embedded_images(messages: Sequence[dict]) -> list:
    """Images carried inside the messages: {"type": "image", "image": ...} parts, in order."""
    found = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, (list, tuple)):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image" and part.get("image") is not None:
                    found.append(part["image"])
    return found
