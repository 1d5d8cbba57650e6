"""generation_config.json: the decoding defaults a checkpoint ships, read with their Hugging Face meaning."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processor_errors import ProcessorError, read_json

__all__ = ["GenerationConfig"]


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
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int))
                    or v < 0):
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
        return cls.from_dict(read_json(path), source=str(path))
