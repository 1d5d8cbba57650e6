"""What a run writes and reads back: the checkpoint (``save_checkpoint``: the HF layout ``holotron.load`` reads,
the tokenizer files, ``trainer_state.json`` and the loss log, the training-only heads beside it, and with
``--save-optimizer`` ``training_state.pt``), a fresh start from a checkpoint's weights (``init_from``,
``--init-from``) and the state a ``--resume`` continues from (``load_training_state``)."""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from ..model import Holotron
from ..weights import save_pretrained

__all__ = ["GENERATION_CONFIG", "TOKENIZER_FILES", "AUX_FILE", "save_checkpoint", "trainer_state", "write_log_csv",
           "init_from", "load_training_state"]

GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": [2, 12], "pad_token_id": 0, "max_new_tokens": 48}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
AUX_FILE = "aux_heads.pt"  # the training-only heads (holotron/train/heads.py), beside the model
TRAINING_STATE = "training_state.pt"


def _cpu_tensors(module: nn.Module) -> dict:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def save_checkpoint(model: Holotron, folder, tokenizer_dir, *, dtype: torch.dtype = torch.float32,
                    max_shard_size="5GB", state: dict | None = None, optimizer=None,
                    aux: nn.Module | None = None, click_pointer: dict | None = None) -> Path:
    """Write a checkpoint that ``holotron.load`` and ``Processor.from_pretrained`` read: the model in
    ``dtype`` (the SSM constants stay fp32), generation_config.json, the tokenizer files and
    ``trainer_state.json``; with ``optimizer``, ``training_state.pt`` (fp32 weights + AdamW state) too:
    tensors, numbers and plain containers only, so it loads with ``torch.load(..., weights_only=True)``.
    ``click_pointer`` ({"layer", "heads"[, "first"]}): the attention pointer the run trained, written into
    generation_config.json for decoding (holotron/click_pointer.py)."""
    folder = Path(folder)
    cpu = copy.deepcopy(model).to("cpu").to(dtype)
    cpu.generation_config = dict(GENERATION_CONFIG, **({"click_pointer": dict(click_pointer)} if click_pointer else {}))
    save_pretrained(cpu, folder, max_shard_size=max_shard_size)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file() and src.resolve() != (folder / name).resolve():
            shutil.copyfile(src, folder / name)
    if state is not None:
        (folder / "trainer_state.json").write_text(json.dumps(state, indent=1) + "\n")
    if aux is not None:  # training-only heads, beside the model (holotron.load never reads them)
        torch.save(_cpu_tensors(aux), folder / AUX_FILE)
    if optimizer is not None:
        tmp = folder / (TRAINING_STATE + ".tmp")
        extra = {} if aux is None else {"aux": _cpu_tensors(aux)}
        torch.save({"model": _cpu_tensors(model), "optimizer": optimizer.state_dict(),
                    "step": (state or {}).get("step", 0), **extra}, tmp)
        os.replace(tmp, folder / TRAINING_STATE)
    return folder


def trainer_state(args, step, history, evals, n_params, seconds, status) -> dict:
    """``trainer_state.json``: where the run stands (step, status, seconds), its arguments, evals and loss log."""
    return {"step": step, "status": status, "train_seconds": round(seconds, 2), "parameters": n_params,
            "args": {k: v for k, v in vars(args).items()}, "evals": evals, "log": history}


def write_log_csv(path: Path, history: list[dict]) -> None:
    """The loss log as a CSV table (``train_log.csv``), one column per key any row has."""
    if not history:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in history for k in row)))
        w.writeheader()
        w.writerows(history)


def init_from(model: Holotron, aux, src, folder, log, parts: str = "all") -> None:
    """Start from ``src``, the model loaded from checkpoint ``folder`` (a fresh optimizer and schedule, unlike
    --resume); the auxiliary heads too when the folder holds them (aux_heads.pt, written by every run that
    trains them). ``parts="vision"``: the vision tower and the projector alone (the language model, its
    tokenizer and the heads start fresh), e.g. a new tokenizer over a trained vision side."""
    if parts == "vision":
        mine = model.state_dict()
        theirs = {k: v for k, v in src.state_dict().items() if k.startswith(("vision_model.", "mlp1."))}
        bad = [k for k, v in theirs.items() if k not in mine or tuple(mine[k].shape) != tuple(v.shape)]
        if bad or not theirs:
            raise SystemExit(f"holotron.train: error: --init-from {folder} --init-parts vision: its vision tower "
                             f"does not fit this --config ({bad[0] if bad else 'no vision weights'})")
        model.load_state_dict(theirs, strict=False)
        log(f"initialised the vision tower and projector from {folder}")
        return
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if not isinstance(src, Holotron) or {k: tuple(v.shape) for k, v in src.state_dict().items()} != shapes:
        raise SystemExit(f"holotron.train: error: --init-from {folder}: not a checkpoint of this --config "
                         "(same preset and --set overrides and tokenizer needed)")
    model.load_state_dict(src.state_dict())
    heads = Path(folder) / AUX_FILE
    if aux is not None and heads.is_file():
        saved = torch.load(heads, map_location="cpu", weights_only=True)
        missing, unexpected = aux.load_state_dict(saved, strict=False)
        fresh_ok = ("char_in.", "ptr_q.", "ptr_k.", "centre_mid.", "match.")
        if unexpected or any(not k.startswith(fresh_ok) for k in missing):
            raise SystemExit(f"holotron.train: error: --init-from {folder}: {AUX_FILE} does not fit these heads "
                             f"(missing {missing}, unexpected {unexpected})")
        fresh = sorted({k.split(".")[0] for k in missing})
        log(f"initialised from {folder} (model and auxiliary heads{'; fresh ' + ', '.join(fresh) if fresh else ''})")
    else:
        log(f"initialised from {folder}")


def load_training_state(folder, stage: str, model: Holotron, aux, optimizer) -> tuple[int, list, list, float, float]:
    """Load a ``--save-optimizer`` checkpoint's weights, heads and optimizer state into ``model``, ``aux`` and
    ``optimizer`` for ``--resume``. Returns (step, loss log, evals, seconds trained so far, the schedule's
    minutes done before the run began: its ``--schedule-done``). The run must be resumed as it was started: the
    same ``stage``, the auxiliary heads or not."""
    ts_file, st_file = Path(folder) / TRAINING_STATE, Path(folder) / "trainer_state.json"
    if not (ts_file.is_file() and st_file.is_file()):
        raise SystemExit(f"holotron.train: error: --resume {folder}: no training_state.pt / trainer_state.json "
                         "there (a checkpoint written with --save-optimizer is needed)")
    prev = json.loads(st_file.read_text())
    prev_stage = prev.get("args", {}).get("stage", "ground")
    if prev_stage != stage:
        raise SystemExit(f"holotron.train: error: --resume {folder}: that run was --stage {prev_stage}; "
                         f"resume it with the same stage, or start a new run from it with --init-from")
    ts = torch.load(ts_file, map_location="cpu", weights_only=True)
    if (aux is None) != ("aux" not in ts):
        raise SystemExit(f"holotron.train: error: --resume {folder}: that run was trained "
                         f"{'with' if 'aux' in ts else 'without'} --aux-weight; resume it the same way")
    model.load_state_dict(ts["model"])
    if aux is not None:
        aux.load_state_dict(ts["aux"])
    optimizer.load_state_dict(ts["optimizer"])
    done = prev.get("args", {}).get("schedule_done") or 0.0
    return ts["step"], prev.get("log", []), prev.get("evals", []), prev.get("train_seconds", 0.0), done
