"""What the command line points the run at, checked before any work starts: the output folder (``check_out``),
the tokenizer and the ``--init-from`` checkpoint (``check_inputs``), the device (``pick_device``); and the
tokenizer folder the run uses (``prepare_tokenizer``: the one given, a checkpoint's own, else one trained
into OUT/tokenizer)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..bundled import bundled_path
from ..cli_common import CLIError, check_out_dir
from ..devices import DeviceError, resolve_device
from ..processor import Processor, ProcessorError
from ..weights import CheckpointError, load

__all__ = ["check_out", "pick_device", "given_tokenizer", "check_inputs", "prepare_tokenizer"]


def check_out(out) -> Path:
    """``--out``: a folder this run can write into, or one it can create (``check_out_dir``, shared with the
    other command lines: a probe file written and removed, nothing left behind). Exits with one line naming
    ``out`` otherwise."""
    try:
        return check_out_dir(out)
    except CLIError as e:
        raise SystemExit(f"holotron.train: error: {e}") from None


def pick_device(name: str) -> torch.device:
    """``--device``: auto (cuda if available, else cpu) or a torch device name; a CUDA device must exist."""
    try:
        return resolve_device(name, label=f"--device {name}", use_cpu="--device cpu")
    except DeviceError as e:
        raise SystemExit(f"holotron.train: error: {e}") from None


def given_tokenizer(args) -> Path | None:
    """The tokenizer folder the command line names: --tokenizer, else the --resume or --init-from checkpoint's
    own (every checkpoint holds its tokenizer files), else None (train one into OUT/tokenizer)."""
    if args.tokenizer:
        return Path(args.tokenizer)
    # --init-parts vision takes the vision side alone: the run trains its own tokenizer
    init = args.init_from if getattr(args, "init_parts", "all") == "all" else None
    for folder in (args.resume, init):
        path = folder and (Path(folder) if Path(folder).is_dir() else bundled_path(str(folder)))
        if path and (path / "tokenizer.json").is_file():
            return path
    return None


def check_inputs(args):
    """Fail on a bad tokenizer or --init-from checkpoint before anything is written (OUT, a tokenizer).
    Returns the --init-from model, loaded on the CPU in float32, or None."""
    tok = given_tokenizer(args)
    if tok is not None:
        try:
            Processor.from_pretrained(tok)
        except (ProcessorError, OSError) as e:
            what = "--tokenizer" if args.tokenizer else "the tokenizer of --resume / --init-from"
            raise SystemExit(f"holotron.train: error: {what} {tok}: {e}") from None
    if not args.init_from:
        return None
    try:
        return load(args.init_from, dtype=torch.float32, device="cpu")
    except (CheckpointError, OSError) as e:
        raise SystemExit(f"holotron.train: error: --init-from {args.init_from}: {e}") from None


def prepare_tokenizer(args, out: Path, log) -> Path:
    """The tokenizer folder of the run: ``given_tokenizer``'s, else one trained into OUT/tokenizer (once:
    a later run into the same OUT reuses it, and must ask for the same kind).

    The kind is ``args.tokenizer_kind`` ("bpe" when absent; holotron/tokenizer.py's ``KINDS``): "bpe" has
    ``args.vocab_size`` ids; "word" is sized by its corpus (every word one token, plus the 1,001 number
    tokens), so ``args.vocab_size`` does not apply to it."""
    if (given := given_tokenizer(args)) is not None:
        return given
    from tokenizers import Tokenizer

    from ..tokenizer import build_task_tokenizer, coordinate_token_ids

    kind = getattr(args, "tokenizer_kind", None) or "bpe"
    folder = out / "tokenizer"
    if not (folder / "tokenizer.json").is_file():
        t = time.perf_counter()
        try:
            build_task_tokenizer(folder, args.vocab_size if kind == "bpe" else None, args.tokenizer_corpus, kind=kind)
        except ValueError as e:
            raise SystemExit(f"holotron.train: error: --tokenizer-kind {kind}: {e}") from None
        size = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
        log(f"trained the {kind} tokenizer ({size} tokens) on {args.tokenizer_corpus} screens in "
            f"{time.perf_counter() - t:.1f} s -> {folder}")
    else:
        have = "bpe" if coordinate_token_ids(Tokenizer.from_file(str(folder / "tokenizer.json"))) is None else "word"
        if have != kind:
            raise SystemExit(f"holotron.train: error: {folder} holds a {have} tokenizer but the run asks for "
                             f"--tokenizer-kind {kind}: use another --out, or the same kind")
    return folder
