"""A checkpoint's tokenizer files read into a ``tokenizers.Tokenizer``: tokenizer.json, and the special and
added tokens that tokenizer_config.json / special_tokens_map.json declare (each merged so it encodes to
its declared id). Every problem is a one-line ProcessorError naming the file."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from .processor_errors import ProcessorError

__all__ = ["read_tokenizer", "special_tokens", "merge_added_tokens"]

SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


def read_tokenizer(folder: Path) -> tuple[Tokenizer, Path]:
    """The fast tokenizer in ``folder`` and its path."""
    tok_path = folder / "tokenizer.json"
    if not tok_path.is_file():
        present = sorted(p.name for p in folder.iterdir())[:8]
        raise ProcessorError(
            f"no tokenizer.json in {folder} (found: {', '.join(present) or 'nothing'}): holotron needs the fast "
            f"tokenizer file; convert a slow tokenizer once with transformers and save it with save_pretrained")
    try:
        return Tokenizer.from_file(str(tok_path)), tok_path
    except Exception as e:
        raise ProcessorError(f"{tok_path}: not a tokenizers file ({str(e).splitlines()[0][:200]})") from None


def special_tokens(tok_config: dict, special_map: dict) -> dict[str, str | None]:
    """bos / eos / pad / unk token texts: tokenizer_config.json's, else special_tokens_map.json's."""
    specials = {}
    for name in SPECIAL_NAMES:
        value = tok_config.get(name, special_map.get(name))
        if isinstance(value, dict):  # {"content": "<s>", ...}
            value = value.get("content")
        specials[name] = value if isinstance(value, str) else None
    return specials


def merge_added_tokens(tokenizer: Tokenizer, added, source: str) -> None:
    """Register tokenizer_config.json's added_tokens_decoder so each token encodes to its declared id."""
    if not isinstance(added, dict):
        raise ProcessorError(f"{source}: added_tokens_decoder must be an object of id -> token, "
                             f"got {type(added).__name__}")
    entries = []
    for key, entry in added.items():
        id_like = isinstance(key, str) and key.isdigit() or isinstance(key, int) and key >= 0
        if not id_like or not isinstance(entry, dict):
            raise ProcessorError(f"{source}: added_tokens_decoder entry {key!r}: expected a token id -> "
                                 f"{{'content': ...}}, got {type(entry).__name__}")
        entries.append((int(key), entry))
    problems = []
    for want, entry in sorted(entries, key=lambda kv: kv[0]):
        content = entry.get("content")
        if not isinstance(content, str) or not content:
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
            problems.append(f"{content!r} is id {want} in tokenizer_config.json but is not in tokenizer.json's "
                            "vocabulary")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ProcessorError(f"{source}: tokenizer files disagree: {shown}")
