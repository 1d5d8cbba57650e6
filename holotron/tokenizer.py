"""Tokenizers that carry the real model's special tokens at their low ids, in two kinds.

    tok = train_tokenizer(texts, vocab_size=2048)                  # "bpe": byte-level BPE (a tokenizers.Tokenizer)
    tok = train_word_tokenizer(texts)                              # "word": whole words, one token per number 0..1000
    write_tokenizer(tok, folder, chat_template=NEMOTRON_CHAT_TEMPLATE)
    # -> folder/tokenizer.json + folder/tokenizer_config.json, read by holotron.Processor
    ids = coordinate_token_ids(processor)                          # id of "k" for k = 0 .. 1000, or None

    python -m holotron.tokenizer --out DIR [--kind bpe|word] [--vocab-size N] [--n 4000]   # on holotron.data.corpus

The real checkpoint's tokenizer cannot be downloaded here, so small models (the tests' and the shipped
tiny one) train their own with the ``tokenizers`` library and write it in the Hugging Face layout. Low
ids mirror the real vocabulary: ``<unk>``, ``<s>``, ``</s>`` at 0, 1, 2, then ``<SPECIAL_k>`` at id k,
except that ``<image>``, ``<img>`` and ``</img>`` take ids 18, 19 and 20 as in the real checkpoint, and
``<think>`` / ``</think>`` follow (21, 22: a choice of this builder, not a fact about the real
tokenizer). The chat format's turn tokens are ``<SPECIAL_10>`` (system), ``<SPECIAL_11>`` (turn start)
and ``<SPECIAL_12>`` (end of turn, the eos token here), so a prompt rendered by the Nemotron chat
template tokenizes exactly as it does for the 12B model, special token for special token. Both kinds
share them.

"bpe" (``train_tokenizer``, the default): the GPT-2 pre-tokenisation regex, so a word takes a leading
space into its token (" Save" and "Save" are different tokens); ``split_digits`` puts each digit in a
token of its own (as the Mistral / Nemotron tokenizers do), so a click answer ``{"x": 381, "y": 682}``
is read and written digit by digit, coarse to fine, six digit tokens per answer.

"word" (``train_word_tokenizer``): a run of letters is always a pre-token of its own and the rest
(spaces, quotes, punctuation; a newline stands alone) is never joined to it, so a word has ONE token
whatever precedes it (start of text, a space, a quote); the BPE merges run until every word of the
corpus is one token (``vocab_size`` None: no cap). ``task_texts(n, label_repeats=20)`` puts every label
of ``holotron.data.all_labels()`` in the corpus in each context, so every label word is one token
(``split_label_words`` lists those that are not). The numbers "0" .. "1000" are then added as
non-special tokens (``add_coordinate_tokens``), so each coordinate of an answer is one token and the
answer ``{"x": 624, "y": 646}`` is 9 tokens: ``{"`` ``x`` ``": `` ``624`` ``, "`` ``y`` ``": `` ``646``
``}`` (the same 9 after ``<think></think>`` and before the template's newline). Being non-special, the
numbers survive ``decode(..., skip_special_tokens=True)``. Digits are split one by one while training,
so no merge is spent on numbers: any digit run is written with the added number tokens, longest first
("2024" -> "202" "4").
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["N_RESERVED", "RESERVED_TOKENS", "SPECIAL_IDS", "EOS_TOKEN", "KINDS", "COORDINATE_MAX", "train_tokenizer",
           "train_word_tokenizer", "add_coordinate_tokens", "coordinate_token_ids", "tokenizer_config",
           "write_tokenizer", "task_texts", "label_words", "split_label_words", "build_task_tokenizer"]

N_RESERVED = 32
_NAMED = {0: "<unk>", 1: "<s>", 2: "</s>", 18: "<image>", 19: "<img>", 20: "</img>", 21: "<think>", 22: "</think>"}
RESERVED_TOKENS = [_NAMED.get(i, f"<SPECIAL_{i}>") for i in range(N_RESERVED)]  # id -> token
SPECIAL_IDS = {tok: i for i, tok in enumerate(RESERVED_TOKENS)}                    # token -> id
EOS_TOKEN = "<SPECIAL_12>"  # the chat format's end of turn: what ends an answer
KINDS = ("bpe", "word")     # build_task_tokenizer's kinds (the module docstring says how they differ)
COORDINATE_MAX = 1000       # a click coordinate is an integer 0 .. COORDINATE_MAX (holotron/grounding.py)


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
    tok.train_from_iterator(texts, _trainer(vocab_size, min_frequency))
    _check_reserved(tok)
    return tok


def _trainer(vocab_size: int, min_frequency: int) -> trainers.BpeTrainer:
    """The BPE trainer both kinds use: the reserved tokens first (ids 0 .. 31), then the 256 byte symbols."""
    return trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=RESERVED_TOKENS, show_progress=False, min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )


def _check_reserved(tok: Tokenizer) -> None:
    for token, i in SPECIAL_IDS.items():  # the trainer puts special tokens first, in order
        if tok.token_to_id(token) != i:
            raise RuntimeError(f"{token} got id {tok.token_to_id(token)}, expected {i}")


def train_word_tokenizer(texts: Iterable[str], vocab_size: int | None = None, *, coordinates: bool = True,
                         min_frequency: int = 0) -> Tokenizer:
    """Train the "word" kind on ``texts``: byte-level BPE whose merges never cross a word's edge.

    Pre-tokenisation: each digit alone, each run of letters (``\\p{L}+``) alone, each newline alone, the
    rest (spaces, quotes, punctuation, in runs such as ``": ``) byte-level without the GPT-2 regex, so no
    leading space or quote is ever part of a word's token. ``vocab_size`` caps the trained vocabulary
    (reserved tokens, bytes and merges); None leaves it uncapped: the merges go on until every pre-token
    of ``texts`` is one token.
    ``coordinates``: then add "0" .. "1000" (``add_coordinate_tokens``) after the trained ids."""
    if vocab_size is not None and vocab_size < N_RESERVED + 256:
        raise ValueError(f"vocab_size must be at least {N_RESERVED + 256} (special tokens + 256 bytes) or None, "
                         f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        # one digit a pre-token while training: no merge is spent on numbers, which the added number tokens
        # write (they are matched before pre-tokenisation, longest first)
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="isolated"),
        # a newline alone too: the chat template puts one after an answer, which must keep its last token "}"
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    if vocab_size is None:  # each merge joins two symbols of a distinct pre-token: their count bounds the merges
        texts = list(texts)
        pieces = {piece for text in texts for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)}
        vocab_size = N_RESERVED + 256 + sum(len(piece) - 1 for piece in pieces)
    tok.train_from_iterator(texts, _trainer(vocab_size, min_frequency))
    _check_reserved(tok)
    if coordinates:
        add_coordinate_tokens(tok)
    return tok


def add_coordinate_tokens(tok: Tokenizer) -> list[int]:
    """Add the strings "0" .. "1000" as non-special, unnormalised tokens, so each encodes to one id and
    ``decode(..., skip_special_tokens=True)`` keeps them; returns their ids (index k: the id of "k").
    A number already in the vocabulary (the digits "0" .. "9" are byte symbols) keeps its id; the others
    take new ids after the vocabulary, in order."""
    tok.add_tokens([AddedToken(str(k), normalized=False, special=False, single_word=False, lstrip=False,
                               rstrip=False) for k in range(COORDINATE_MAX + 1)])
    ids = coordinate_token_ids(tok)
    if ids is None:
        raise RuntimeError("the number tokens 0 .. 1000 were added but do not each encode to one id")
    return ids


def coordinate_token_ids(tokenizer) -> list[int] | None:
    """The id of "k" for k = 0 .. 1000 (a list of 1,001 distinct ids), or None when the tokenizer does not
    write each of these numbers as one token of its own (the "bpe" kind, which splits digits).

    ``tokenizer``: a ``tokenizers.Tokenizer`` or a ``holotron.Processor`` (its ``.tokenizer`` is read)."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"expected a tokenizers.Tokenizer or a holotron.Processor, got {type(tokenizer).__name__}")
    ids = []
    for k in range(COORDINATE_MAX + 1):
        i = tok.token_to_id(str(k))
        if i is None or tok.encode(str(k), add_special_tokens=False).ids != [i]:
            return None
        ids.append(i)
    return ids if len(set(ids)) == len(ids) else None


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


def _label_contexts(label: str) -> tuple[str, ...]:
    """A label as the instructions write it (holotron/data/instructions.py): bare at the start, after a
    space, and quoted with ' or "."""
    return label, f" {label}", f"'{label}'", f'"{label}"'


def task_texts(n: int = 4000, seed0: int = 0, label_repeats: int = 1) -> list[str]:
    """The grounding task's text: ``holotron.data.corpus(n)`` (localisation prompts and answers of n
    training screens), the chat template's words once per screen, and every label of the vocabulary
    ``label_repeats`` times (once: the label alone; more: cycling through the label alone, after a space
    and in ' and " quotes), so no label is left to chance."""
    from .data import all_labels, corpus

    labels = [_label_contexts(label)[r % 4] for label in all_labels() for r in range(label_repeats)]
    return corpus(n, seed0=seed0) + [CHAT_WORDS] * n + labels


def label_words() -> list[str]:
    """The distinct words (runs of letters) of ``holotron.data.all_labels()``, sorted."""
    from .data import all_labels

    return sorted({w for label in all_labels() for w in re.findall(r"[^\W\d_]+", label)})


def split_label_words(tokenizer) -> list[str]:
    """The words of the label vocabulary that do not come out as one token of their own in every context
    the instructions write a label in (``_label_contexts``); [] when all do. ``tokenizer``: a
    ``tokenizers.Tokenizer`` or a ``holotron.Processor``."""
    from .data import all_labels

    tok = getattr(tokenizer, "tokenizer", tokenizer)
    split: set[str] = set()
    for label in all_labels():
        for text in _label_contexts(label):
            spans = set(tok.encode(text, add_special_tokens=False).offsets)
            split.update(m.group() for m in re.finditer(r"[^\W\d_]+", text) if m.span() not in spans)
    return sorted(split)


def build_task_tokenizer(folder, vocab_size: int | None = None, n: int = 4000, kind: str = "bpe") -> Path:
    """Train the grounding tokenizer of ``kind`` on the task's text and write it with the built-in Nemotron
    chat template into ``folder``.

    "bpe": ``train_tokenizer`` (digits split) on ``task_texts(n)``, ``vocab_size`` ids (None: 2048).
    "word": ``train_word_tokenizer`` on ``task_texts(n, label_repeats=20)``, ``vocab_size`` capping the
    trained part (None: no cap, every word of the corpus a token), then the 1,001 number tokens; a cap
    that leaves a label word in pieces is refused (ValueError)."""
    from .chat_template import NEMOTRON_CHAT_TEMPLATE

    if kind == "bpe":
        tok = train_tokenizer(task_texts(n), 2048 if vocab_size is None else vocab_size, split_digits=True)
    elif kind == "word":
        tok = train_word_tokenizer(task_texts(n, label_repeats=20), vocab_size)
        split = split_label_words(tok)
        if split:
            raise ValueError(f"vocab_size {vocab_size} leaves {len(split)} of {len(label_words())} label words in "
                             f"pieces (e.g. {', '.join(split[:5])}): raise it, or leave it out (None: no cap)")
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}: use one of {', '.join(KINDS)}")
    return write_tokenizer(tok, folder, chat_template=NEMOTRON_CHAT_TEMPLATE, pad_token="<unk>")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m holotron.tokenizer",
                                description="Train the grounding tokenizer on synthetic-screen text and write it.")
    p.add_argument("--out", required=True, help="folder for tokenizer.json and tokenizer_config.json")
    p.add_argument("--kind", choices=KINDS, default="bpe",
                   help="bpe: byte-level BPE, digits split (the default); word: one token per word and per number "
                        "0..1000")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="bpe: ids in all (default 2048); word: cap on the trained part (default: none, every word "
                        "of the corpus a token; the 1,001 numbers come on top)")
    p.add_argument("--n", type=int, default=4000, help="screens whose prompt and answer go into the corpus")
    args = p.parse_args(argv)
    try:
        folder = build_task_tokenizer(args.out, args.vocab_size, args.n, kind=args.kind)
    except ValueError as e:
        p.error(str(e))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    words = label_words()
    single = len(words) - len(split_label_words(tok))
    answer = len(tok.encode('{"x": 624, "y": 646}', add_special_tokens=False).ids)
    print(f"wrote {folder} ({tok.get_vocab_size()} tokens; {single} of {len(words)} label words one token; "
          f"a click answer {answer} tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
