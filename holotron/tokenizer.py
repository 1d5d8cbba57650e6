"""Byte-level BPE tokenizers that carry the real model's special tokens at its low ids.

    tok = train_tokenizer(texts, vocab_size=2048)                  # a tokenizers.Tokenizer
    write_tokenizer(tok, folder, chat_template=NEMOTRON_CHAT_TEMPLATE)
    # -> folder/tokenizer.json + folder/tokenizer_config.json, read by holotron.Processor

    python -m holotron.tokenizer --out DIR [--vocab-size 2048] [--n 4000]   # trained on holotron.data.corpus

The real checkpoint's tokenizer cannot be downloaded here, so small models (the tests' and the shipped
tiny one) train their own with the ``tokenizers`` library and write it in the Hugging Face layout. Low
ids mirror the real vocabulary: ``<unk>``, ``<s>``, ``</s>`` at 0, 1, 2, then ``<SPECIAL_k>`` at id k,
except that ``<image>``, ``<img>`` and ``</img>`` take ids 18, 19 and 20 as in the real checkpoint, and
``<think>`` / ``</think>`` follow (21, 22: a choice of this builder, not a fact about the real
tokenizer). The chat format's turn tokens are ``<SPECIAL_10>`` (system), ``<SPECIAL_11>`` (turn start)
and ``<SPECIAL_12>`` (end of turn, the eos token here), so a prompt rendered by the Nemotron chat
template tokenizes exactly as it does for the 12B model, special token for special token.

``split_digits`` puts each digit in a token of its own (as the Mistral / Nemotron tokenizers do), so a
click answer ``{"x": 381, "y": 682}`` is read and written digit by digit, coarse to fine, with one
token per digit whatever the number.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["N_RESERVED", "RESERVED_TOKENS", "SPECIAL_IDS", "EOS_TOKEN", "train_tokenizer", "tokenizer_config",
           "write_tokenizer", "task_texts"]

N_RESERVED = 32
_NAMED = {0: "<unk>", 1: "<s>", 2: "</s>", 18: "<image>", 19: "<img>", 20: "</img>", 21: "<think>", 22: "</think>"}
RESERVED_TOKENS = [_NAMED.get(i, f"<SPECIAL_{i}>") for i in range(N_RESERVED)]  # id -> token
SPECIAL_IDS = {tok: i for i, tok in enumerate(RESERVED_TOKENS)}                    # token -> id
EOS_TOKEN = "<SPECIAL_12>"  # the chat format's end of turn: what ends an answer


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, split_digits: bool = False,
                    min_frequency: int = 0) -> Tokenizer:
    """Train a byte-level BPE (no normaliser, GPT-2 pre-tokenisation regex, no BOS) on ``texts``.

    The ``N_RESERVED`` special tokens take ids 0 .. 31 (``SPECIAL_IDS``); the 256 byte symbols follow,
    then the merges, up to ``vocab_size`` ids in all. ``split_digits``: every digit is a pre-token of
    its own, so numbers are never merged."""
    if vocab_size < N_RESERVED + 256:
        raise ValueError(f"vocab_size must be at least {N_RESERVED + 256} (special tokens + 256 bytes), "
                         f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=RESERVED_TOKENS, show_progress=False, min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    for token, i in SPECIAL_IDS.items():  # the trainer puts special tokens first, in order
        if tok.token_to_id(token) != i:
            raise RuntimeError(f"{token} got id {tok.token_to_id(token)}, expected {i}")
    return tok


def tokenizer_config(*, pad_token: str | None = None, chat_template: str | None = None,
                     extra: dict | None = None) -> dict:
    """tokenizer_config.json: bos / eos / unk (and optionally pad) names, no BOS or EOS added,
    ``added_tokens_decoder`` for the reserved ids, and optionally the chat template."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": EOS_TOKEN,
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
    if chat_template is not None:
        config["chat_template"] = chat_template
    if extra:
        config.update(extra)
    return config


def write_tokenizer(tok: Tokenizer, folder, *, chat_template: str | None = None, chat_template_file: bool = False,
                    pad_token: str | None = None, omit_from_tokenizer_json: tuple[str, ...] = (),
                    config_extra: dict | None = None) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ chat_template.jinja) into ``folder``; returns it.

    chat_template: stored in tokenizer_config.json, or in ``chat_template.jinja`` when
        ``chat_template_file`` is true; None writes no template (the Processor's built-in is used).
    omit_from_tokenizer_json: special tokens left out of tokenizer.json's ``added_tokens`` (they stay
        in the BPE vocab and in tokenizer_config.json's ``added_tokens_decoder``), as some published
        checkpoints do.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(tok.to_str())
    data["added_tokens"] = [a for a in data["added_tokens"] if a["content"] not in omit_from_tokenizer_json]
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config = tokenizer_config(pad_token=pad_token, chat_template=None if chat_template_file else chat_template,
                              extra=config_extra)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    if chat_template is not None and chat_template_file:
        (folder / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return folder


# the chat template's plain words around a turn (its special tokens are whole tokens already)
CHAT_WORDS = "System\n/no_think\nUser\nAssistant\n"


def task_texts(n: int = 4000, seed0: int = 0) -> list[str]:
    """The grounding task's text: ``holotron.data.corpus(n)`` (localisation prompts and answers of n
    training screens), the chat template's words once per screen, and every label of the vocabulary
    once, so no label is left to chance."""
    from .data import all_labels, corpus

    return corpus(n, seed0=seed0) + [CHAT_WORDS] * n + all_labels()


def build_task_tokenizer(folder, vocab_size: int = 2048, n: int = 4000) -> Path:
    """Train the grounding tokenizer (digits split) on ``task_texts(n)`` and write it with the built-in
    Nemotron chat template into ``folder``."""
    from .chat_template import NEMOTRON_CHAT_TEMPLATE

    tok = train_tokenizer(task_texts(n), vocab_size, split_digits=True)
    return write_tokenizer(tok, folder, chat_template=NEMOTRON_CHAT_TEMPLATE, pad_token="<unk>")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m holotron.tokenizer",
                                description="Train the grounding tokenizer on synthetic-screen text and write it.")
    p.add_argument("--out", required=True, help="folder for tokenizer.json and tokenizer_config.json")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--n", type=int, default=4000, help="screens whose prompt and answer go into the corpus")
    args = p.parse_args(argv)
    folder = build_task_tokenizer(args.out, args.vocab_size, args.n)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    print(f"wrote {folder} ({tok.get_vocab_size()} tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
