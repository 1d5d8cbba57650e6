"""Build a tiny byte-level BPE tokenizer that carries the real Nemotron special tokens.

Tests (and the tiny shipped model) cannot download the real tokenizer, so they train a small one
with the `tokenizers` library and write it in the Hugging Face layout:

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

import json
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# token -> id in the tiny tokenizer (the reserved low ids)
N_RESERVED = 32
_NAMED = {0: "<unk>", 1: "<s>", 2: "</s>", 18: "<image>", 19: "<img>", 20: "</img>", 21: "<think>", 22: "</think>"}
RESERVED_TOKENS = [_NAMED.get(i, f"<SPECIAL_{i}>") for i in range(N_RESERVED)]
SPECIAL_IDS = {tok: i for i, tok in enumerate(RESERVED_TOKENS)}

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
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=RESERVED_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed=seed), trainer)
    for token, i in SPECIAL_IDS.items():  # the trainer puts special tokens first, in order
        assert tok.token_to_id(token) == i, (token, tok.token_to_id(token), i)
    return tok


def write_tiny_tokenizer(
    folder, *, vocab_size: int = 512, chat_template: str | None = None, chat_template_file: bool = False,
    pad_token: str | None = None, omit_from_tokenizer_json: tuple[str, ...] = (), config_extra: dict | None = None,
    seed: int = 0,
) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ chat_template.jinja) into ``folder``.

    chat_template: stored in tokenizer_config.json, or in ``chat_template.jinja`` when
        ``chat_template_file`` is true; None writes no template (the Processor's built-in is used).
    omit_from_tokenizer_json: special tokens left out of tokenizer.json's ``added_tokens`` (they stay
        in the BPE vocab and in tokenizer_config.json's ``added_tokens_decoder``), as some published
        checkpoints do: a reader that ignores tokenizer_config.json then splits them into pieces.
    Returns the folder as a Path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size, seed=seed)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [a for a in data["added_tokens"] if a["content"] not in omit_from_tokenizer_json]
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "<SPECIAL_12>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for t, i in SPECIAL_IDS.items()
        },
    }
    if pad_token is not None:
        config["pad_token"] = pad_token
    if chat_template is not None and not chat_template_file:
        config["chat_template"] = chat_template
    if config_extra:
        config.update(config_extra)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    if chat_template is not None and chat_template_file:
        (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return folder


if __name__ == "__main__":  # pragma: no cover - handy for looking at the output
    import sys
    import tempfile

    out = write_tiny_tokenizer(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    print(out)
