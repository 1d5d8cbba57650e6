"""Build a tiny byte-level BPE tokenizer that carries the real Nemotron special tokens.

Tests cannot download the real tokenizer, so they train a small one with the `tokenizers` library
(through ``holotron.tokenizer``, which the shipped tiny model's tokenizer also comes from) on a
fixed toy corpus, and write it in the Hugging Face layout:

    tokenizer.json          the fast tokenizer (byte-level BPE, no normaliser, no BOS added)
    tokenizer_config.json   bos/eos/unk (and optionally pad) names, added_tokens_decoder, and
                            optionally a chat_template

Low ids mirror the real vocabulary: ``<unk>``, ``<s>``, ``</s>`` at 0, 1, 2, then ``<SPECIAL_k>`` at
id k, except that ``<image>``, ``<img>`` and ``</img>`` take ids 18, 19 and 20 as in the real
checkpoint, and ``<think>`` / ``</think>`` follow (21, 22: a choice of this builder, not a fact about
the real tokenizer). Code under test must read every id from the tokenizer; tests may compare with
``SPECIAL_IDS`` to check that it did.
"""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer

from holotron.tokenizer import N_RESERVED, RESERVED_TOKENS, SPECIAL_IDS, train_tokenizer, write_tokenizer

__all__ = ["N_RESERVED", "RESERVED_TOKENS", "SPECIAL_IDS", "build_tokenizer", "write_tiny_tokenizer"]

_WORDS = (
    "click the button on the screen open close save cancel submit search settings menu file edit view "
    "help window tab link icon field text box checkbox dialog toolbar sidebar login sign in out user "
    "password email name next previous back home profile upload download share delete add new create "
    "select option item list page scroll up down left right top bottom corner center red blue green "
    "Localize an element on the GUI image according to the provided target and output a click "
    "position. You must output a valid JSON following the format: Your target is: System User "
    "Assistant coordinate integer between width height image think answer the model says hello world"
).split()
_EXTRA = [
    "café", "naïve", "résumé", "über", "Ελληνικά", "русский", "日本語", "中文", "한국어", "😀", "👍", "✓",
    '{"x": 512, "y": 384}', "click(120, 640)", "(10, 20)", "[300, 400]", "x=1, y=2", "```json", "```",
]


def _corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.5:
            words.insert(rng.randrange(len(words) + 1), rng.choice(_EXTRA))
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 1000)))
        lines.append(" ".join(words))
    return lines


def build_tokenizer(vocab_size: int = 512, seed: int = 0) -> Tokenizer:
    """Train the tiny byte-level BPE in memory (a few milliseconds)."""
    return train_tokenizer(_corpus(seed=seed), vocab_size)


def write_tiny_tokenizer(
    folder, *, vocab_size: int = 512, chat_template: str | None = None, chat_template_file: bool = False,
    pad_token: str | None = None, omit_from_tokenizer_json: tuple[str, ...] = (), config_extra: dict | None = None,
    seed: int = 0,
) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ chat_template.jinja) into ``folder``; the keywords
    are ``holotron.tokenizer.write_tokenizer``'s. Returns the folder as a Path."""
    return write_tokenizer(build_tokenizer(vocab_size, seed=seed), folder, chat_template=chat_template,
                           chat_template_file=chat_template_file, pad_token=pad_token,
                           omit_from_tokenizer_json=omit_from_tokenizer_json, config_extra=config_extra)


if __name__ == "__main__":  # pragma: no cover - handy for looking at the output
    import sys
    import tempfile

    out = write_tiny_tokenizer(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    print(out)
