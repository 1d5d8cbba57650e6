"""Streaming detokenisation: token ids in, text out as soon as it is complete."""

from __future__ import annotations

from typing import Iterable

import torch
from tokenizers import Tokenizer

__all__ = ["StreamDecoder"]


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
