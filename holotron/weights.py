"""Checkpoints in the Hugging Face layout: load (strict, streamed shard by shard) and save.

    model = load("path/or/org/repo", dtype=torch.bfloat16, device="cuda")
    save_pretrained(model, "out/")        # config.json + model.safetensors (or shards + index)

Loading: resolve the folder (local, or the Hub through huggingface_hub: honours HF_HUB_OFFLINE and
the local cache, fetches only json / safetensors / tokenizer / jinja files, never code); read
config.json and pick a builder from the registry (``architectures`` / ``model_type`` -> builder);
read every safetensors header and check names and shapes against the model built on the meta device
(missing shards and mismatches are reported, grouped on one screen, before any tensor is read);
then stream the tensors shard by shard into the model (``load_into``). Every failure is a
``CheckpointError`` (a ValueError) whose message names the file, the tensor and the shape.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from .config import ConfigError

__all__ = ["CheckpointError", "load", "load_into", "save_pretrained", "register_model", "resolve",
           "weight_files", "read_header"]

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
HUB_ALLOW = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]
HUB_IGNORE = ["*.py", "*.pyc", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is; the message names file, tensor and shape."""


# ----------------------------------------------------------------------------- registry

# config.json "architectures" entry or "model_type" -> "module:callable";
# callable(config_dict, preprocessor_dict_or_None) -> nn.Module
_REGISTRY: dict[str, str] = {
    "NemotronHForCausalLM": "holotron.weights:build_text_model",
    "nemotron_h": "holotron.weights:build_text_model",
    # the VL model (holotron.model.Holotron): the real checkpoint's spelling and transformers' newer one
    "NemotronH_Nano_VL_V2": "holotron.model:build_vl_model",
    "NemotronH_Omni_Reasoning_V3": "holotron.model:build_vl_model",
    "nemotron_h_omni": "holotron.model:build_vl_model",
}


def register_model(key: str, builder: str) -> None:
    """Map a config.json ``architectures`` entry or ``model_type`` to ``"module:callable"``.

    ``load`` calls it under the meta device with the config.json dict and the preprocessor_config.json
    dict (None when absent). The model it returns may define ``adapt_to_checkpoint({name: shape})``
    (called before the strict check, to shape checkpoint-dependent tensors) and ``extra_files()``
    ({file name: dict} that ``save_pretrained`` writes as JSON beside config.json)."""
    _REGISTRY[key] = builder


def build_text_model(cfg: dict, preprocessor: dict | None = None) -> nn.Module:
    from .config import TextConfig
    from .lm import HybridLM
    return HybridLM(TextConfig.from_hf(cfg))


def _builder_for(cfg: dict, where: str):
    keys = [a for a in (cfg.get("architectures") or []) if isinstance(a, str)] + [cfg.get("model_type")]
    for k in keys:
        if k in _REGISTRY:
            mod, _, fn = _REGISTRY[k].partition(":")
            obj = importlib.import_module(mod)
            for part in fn.split("."):
                obj = getattr(obj, part)
            return obj
    known = sorted(_REGISTRY)
    raise CheckpointError(f"{where}: architectures {cfg.get('architectures')!r} / model_type {cfg.get('model_type')!r} "
                          f"is not a model holotron knows (known: {', '.join(known)})")


# ----------------------------------------------------------------------------- locating files


def resolve(path_or_repo_id, revision: str | None = None, cache_dir=None) -> Path:
    """A local folder holding the checkpoint: the path itself (or the folder of its config.json /
    safetensors file), a bundled model, or a Hub snapshot of its json / safetensors / tokenizer / jinja
    files (``holotron.hub.resolve``); CheckpointError otherwise."""
    from .hub import resolve as hub_resolve

    return hub_resolve(path_or_repo_id, allow_patterns=HUB_ALLOW, ignore_patterns=HUB_IGNORE, revision=revision,
                       cache_dir=cache_dir, file_ok=lambda p: p.name == CONFIG or p.suffix == ".safetensors",
                       error=CheckpointError)


def weight_files(folder: Path) -> dict[str, Path] | Path:
    """Sharded: {tensor name: shard path} from the index (every shard checked to exist). Single: the file."""
    single, index = folder / SINGLE, folder / INDEX
    if single.is_file():
        return single
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
            if not isinstance(wm, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__}: {e})") from None
        by_file = defaultdict(list)
        for name, fn in wm.items():
            by_file[fn].append(name)
        missing = [fn for fn in sorted(by_file) if not (folder / fn).is_file()]
        if missing:
            lines = [f"  {fn}  ({len(by_file[fn])} tensors, e.g. {by_file[fn][0]})" for fn in missing[:10]]
            more = [f"  ... and {len(missing) - 10} more"] if len(missing) > 10 else []
            raise CheckpointError("\n".join([f"{folder}: {len(missing)} of {len(by_file)} shards listed in {INDEX} "
                                             "are missing (nothing was loaded):", *lines, *more]))
        return {name: folder / fn for name, fn in wm.items()}
    others = sorted(x.name for x in folder.glob("*.safetensors"))
    hint = f" (found {', '.join(others[:5])}: expected {SINGLE} or {INDEX})" if others else ""
    raise CheckpointError(f"{folder}: no {SINGLE} and no {INDEX}{hint}")


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
              "F8_E5M2": getattr(torch, "float8_e5m2", None)}


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (safetensors dtype, shape)} from the file's header, checking it against the file size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file ({size} bytes, shorter than the 8-byte header size)")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > 100 * 2**20:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors file (header claims {n} bytes, "
                                      f"file has {size})")
            raw = f.read(n)
        hdr = json.loads(raw)
        if not isinstance(hdr, dict):
            raise ValueError("header is not a JSON object")
    except CheckpointError:
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors file (header is not valid JSON: {e})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e})") from None
    out, end = {}, 0
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (a, b) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt safetensors header entry for {name}: {info!r}") from None
        out[name] = (dt, shape)
        end = max(end, int(b))
    if 8 + n + end > size:
        raise CheckpointError(f"{path}: truncated safetensors file: its header needs {8 + n + end} bytes, "
                              f"the file has {size} (re-download or re-save it)")
    return out


# ----------------------------------------------------------------------------- strict checks


def _shape(s) -> str:
    return "[" + ", ".join(str(int(x)) for x in s) + "]"


def _ranges(idx: list[str]) -> str:
    """["0", "1", "2", "5"] -> "{0-2,5}"; one index stays bare."""
    nums = sorted({int(i) for i in idx})
    if len(nums) == 1:
        return str(nums[0])
    runs, start = [], nums[0]
    for a, b in zip(nums, nums[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if a == start else f"{start},{a}" if a == start + 1 else f"{start}-{a}")
            start = b
    return "{" + ",".join(runs) + "}"


def _group(items: list[tuple[str, str]], limit: int = 8) -> list[str]:
    """[(name, detail)] -> lines with layer indices folded: ``layers.{0,3,5}.mixer.D [8]  (file)``."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, detail in items:
        m = re.search(r"\.layers\.(\d+)\.", name)
        key = (re.sub(r"\.layers\.\d+\.", ".layers.{i}.", name, count=1) if m else name, detail)
        groups[key].append(m.group(1) if m else "")
    lines = []
    for (pat, detail), idx in groups.items():
        shown = pat.replace("{i}", _ranges(idx)) if idx[0] else pat
        lines.append(f"    {shown}  {detail}".rstrip())
    if len(lines) > limit:
        lines = lines[:limit] + [f"    ... and {len(lines) - limit} more"]
    return lines


def _check(model_tensors: dict[str, torch.Tensor], found: dict[str, tuple[Path, str, tuple]], where: str) -> None:
    expected = {n: t.shape for n, t in model_tensors.items()}
    missing = [(n, _shape(s)) for n, s in expected.items() if n not in found]
    unexpected = [(n, f"{_shape(sh)}  ({p.name})") for n, (p, _, sh) in found.items() if n not in expected]
    wrong = [(n, f"checkpoint {_shape(sh)} in {p.name}, model expects {_shape(expected[n])}")
             for n, (p, _, sh) in found.items() if n in expected and tuple(sh) != tuple(expected[n])]
    floats = {"F64", "F32", "F16", "BF16"}
    wrong_dtype = [(n, f"{dt} in {p.name}, model expects a floating tensor") for n, (p, dt, _) in found.items()
                   if n in model_tensors and model_tensors[n].is_floating_point() and dt not in floats]
    if not (missing or unexpected or wrong or wrong_dtype):
        return
    lines = [f"{where}: the checkpoint does not match the model built from config.json (nothing was loaded)"]
    if wrong:
        lines += [f"  wrong shape ({len(wrong)}):", *_group(wrong)]
        lines.append("    (config.json contradicts these tensors' shapes, or the weights belong to another model)")
    if wrong_dtype:
        lines += [f"  wrong dtype ({len(wrong_dtype)}):", *_group(wrong_dtype)]
    if missing:
        lines += [f"  missing from the checkpoint ({len(missing)}):", *_group(missing)]
    if unexpected:
        lines += [f"  unexpected, not in the model ({len(unexpected)}):", *_group(unexpected)]
    raise CheckpointError("\n".join(lines))


# ----------------------------------------------------------------------------- loading


class _Progress:
    """A one-line progress bar per shard on a terminal; silent otherwise."""

    def __init__(self, label: str, total: int, on: bool):
        self.label, self.total, self.on, self.done = label, max(total, 1), on, 0

    def update(self, n: int) -> None:
        if not self.on:
            return
        self.done += n
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        sys.stderr.write(f"\r  {self.label} [{bar}] {self.done / 2**30:.2f}/{self.total / 2**30:.2f} GiB")
        if self.done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _fp32_names(model: nn.Module) -> tuple[str, ...]:
    suffixes = set()
    for mod in model.modules():
        suffixes.update(getattr(type(mod), "keep_fp32", ()))
    return tuple(suffixes)


def _assign(model: nn.Module, name: str, t: torch.Tensor) -> None:
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    old = getattr(mod, leaf)
    if isinstance(old, nn.Parameter):
        setattr(mod, leaf, nn.Parameter(t, requires_grad=old.requires_grad))
    else:
        mod._buffers[leaf] = t


@contextlib.contextmanager
def _no_init():
    """Module initialisers as no-ops, for a model built on the meta device whose weights are read next:
    on meta tensors they compute nothing, but ``nn.init.normal_`` goes through ``torch._refs``, whose first
    call imports ``torch._dynamo`` (about 2 s of a CPU's start-up)."""
    from torch.nn import init

    names = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
             "xavier_normal_", "zeros_", "ones_", "constant_")
    saved = {n: getattr(init, n) for n in names if hasattr(init, n)}
    try:
        for n in saved:
            setattr(init, n, lambda tensor, *a, **k: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def load_into(model: nn.Module, files: dict[str, Path] | Path, *, dtype: torch.dtype | None = None,
              device=None, progress: bool | None = None, where: str | None = None) -> nn.Module:
    """Strictly fill ``model`` (typically built on the meta device) from safetensors ``files``.

    ``files``: one file, or {tensor name: file} as in an index. Every header is read and every name and
    shape checked before any tensor is loaded; then each file is read once, its tensors cast to
    ``dtype`` (floating ones; names in a module's ``keep_fp32`` stay fp32 under a 16-bit dtype) and
    moved to ``device``, and assigned in place of the model's tensors.
    """
    if isinstance(files, (str, Path)):
        path = Path(files)
        hdr = read_header(path)
        by_file = {path: list(hdr)}
        headers = {path: hdr}
    else:
        by_file = defaultdict(list)
        for name, p in files.items():
            by_file[Path(p)].append(name)
        headers = {p: read_header(p) for p in by_file}
        for p, names in by_file.items():
            absent = [n for n in names if n not in headers[p]]
            if absent:
                raise CheckpointError(f"{p}: the index lists {len(absent)} tensors this file does not hold, "
                                      f"e.g. {', '.join(absent[:3])}")
    where = where or str(next(iter(by_file)).parent)
    found = {n: (p, *headers[p][n]) for p, names in by_file.items() for n in names}
    if callable(getattr(model, "adapt_to_checkpoint", None)):
        model.adapt_to_checkpoint({n: shape for n, (_, _, shape) in found.items()})
    _check(model.state_dict(keep_vars=True), found, where)

    device = torch.device(device) if device is not None else torch.device("cpu")
    keep = _fp32_names(model)
    if progress is None:
        progress = sys.stderr.isatty()
    from safetensors import safe_open

    for p, names in sorted(by_file.items()):
        nbytes = sum(math.prod(headers[p][n][1]) * _dtype_size(headers[p][n][0]) for n in names)
        bar = _Progress(p.name, nbytes, progress)
        try:
            with safe_open(str(p), framework="pt", device=str(device)) as f:
                for n in names:
                    t = f.get_tensor(n)
                    if t.is_floating_point():
                        want = dtype or t.dtype
                        if n.endswith(keep) and want in (torch.float16, torch.bfloat16):
                            want = torch.float32
                        t = t.to(want)
                    _assign(model, n, t)
                    bar.update(t.numel() * _dtype_size(headers[p][n][0]))
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors/IO failures become one line naming the file
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CheckpointError(f"{p}: cannot read tensors ({type(e).__name__}: {first})") from None
    left = [n for n, t in model.state_dict(keep_vars=True).items() if t.is_meta]
    if left:
        raise CheckpointError(f"{where}: {len(left)} tensors were not loaded, e.g. {', '.join(left[:3])}")
    return model


def _dtype_size(st_dtype: str) -> int:
    t = _ST_DTYPES.get(st_dtype)
    return t.itemsize if t is not None else 1


def _checkpoint_dtype(cfg: dict) -> torch.dtype | None:
    """The dtype the checkpoint declares (config ``torch_dtype`` / ``dtype``), else None (keep stored dtypes)."""
    name = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(name, str):
        t = getattr(torch, name.replace("torch.", ""), None)
        if isinstance(t, torch.dtype) and t.is_floating_point:
            return t
    return None


def load(path_or_repo_id, dtype: torch.dtype | str | None = None, device=None, *, revision: str | None = None,
         cache_dir=None, progress: bool | None = None) -> nn.Module:
    """Build the model that ``config.json`` describes and load its weights strictly.

    ``path_or_repo_id``: a local folder (or a file in it) or a Hugging Face repo id. ``dtype``: the
    floating dtype of the model (default: the checkpoint's ``torch_dtype``, else as stored).
    ``device``: where tensors are loaded (default CPU). ``revision`` / ``cache_dir``: for a Hub id.
    A progress bar per shard is shown on a terminal (``progress`` forces it on or off).
    Returns the model in eval mode.
    """
    folder = resolve(path_or_repo_id, revision, cache_dir)
    cfg_path = folder / CONFIG
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object")
    if isinstance(dtype, str):
        t = getattr(torch, dtype, None)
        if not isinstance(t, torch.dtype):
            raise ValueError(f"dtype: unknown torch dtype {dtype!r}")
        dtype = t
    builder = _builder_for(cfg, str(cfg_path))
    files = weight_files(folder)  # a missing shard is named here, before anything is built or read
    preprocessor = None
    if (folder / "preprocessor_config.json").is_file():
        try:
            preprocessor = json.loads((folder / "preprocessor_config.json").read_text())
        except ValueError as e:
            raise CheckpointError(f"{folder / 'preprocessor_config.json'}: not valid JSON ({e})") from None
    try:
        with torch.device("meta"), _no_init():
            model = builder(cfg, preprocessor)
    except ConfigError as e:
        raise ConfigError(f"{cfg_path}: {e}") from None
    dtype = dtype or _checkpoint_dtype(cfg)
    load_into(model, files, dtype=dtype, device=device, progress=progress, where=str(folder))
    gen = folder / "generation_config.json"
    if gen.is_file() and hasattr(model, "generation_config"):
        try:
            model.generation_config = json.loads(gen.read_text())
        except ValueError as e:
            raise CheckpointError(f"{gen}: not valid JSON ({e})") from None
    return model.eval()


# ----------------------------------------------------------------------------- saving


def _parse_size(s) -> int:
    if isinstance(s, int):
        return s
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?i?B)\s*", str(s), re.I)
    if not m:
        raise ValueError(f"max_shard_size: expected bytes or a size like '5GB', got {s!r}")
    unit = m.group(2).upper()
    base = 1024 if "I" in unit else 1000
    return int(float(m.group(1)) * base ** "BKMGT".index(unit[0]))


def save_pretrained(model: nn.Module, folder, max_shard_size: int | str = "5GB") -> None:
    """Write ``config.json`` (+ ``generation_config.json``) and the weights in the Hugging Face layout.

    One ``model.safetensors`` up to ``max_shard_size``, else ``model-0000i-of-0000n.safetensors`` and
    ``model.safetensors.index.json``. Everything is written to a temporary folder next to ``folder``
    and moved into place at the end, so a failure never leaves a half-written checkpoint.
    """
    from safetensors.torch import save_file

    limit = _parse_size(max_shard_size)
    folder = Path(folder)
    sd = {n: t.detach() for n, t in model.state_dict().items()}
    if any(t.is_meta for t in sd.values()):
        raise ValueError("save_pretrained: the model still has tensors on the meta device (load weights first)")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for n, t in sd.items():
        if shards[-1] and size + t.nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][n] = t
        size += t.nbytes
    cfg = model.config.to_hf()
    cfg["torch_dtype"] = str(getattr(model, "dtype", next(iter(sd.values())).dtype)).replace("torch.", "")

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        (tmp / CONFIG).write_text(json.dumps(cfg, indent=2) + "\n")
        if getattr(model, "generation_config", None):
            (tmp / "generation_config.json").write_text(json.dumps(model.generation_config, indent=2) + "\n")
        extra = model.extra_files() if callable(getattr(model, "extra_files", None)) else {}
        for fn, content in extra.items():
            (tmp / fn).write_text(json.dumps(content, indent=2) + "\n")
        names = [SINGLE] if len(shards) == 1 else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                                                     for i in range(len(shards))]
        seen: set[int] = set()
        for fn, shard in zip(names, shards):
            out = {}
            for n, t in shard.items():
                t = t.to("cpu").contiguous()
                if t.data_ptr() in seen:  # shared storage would make safetensors refuse the file
                    t = t.clone()
                seen.add(t.data_ptr())
                out[n] = t
            save_file(out, str(tmp / fn), metadata={"format": "pt"})
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(t.nbytes for t in sd.values())},
                     "weight_map": {n: fn for fn, shard in zip(names, shards) for n in shard}}
            (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        if not folder.exists():
            os.replace(tmp, folder)
            return
        if not folder.is_dir():
            raise ValueError(f"save_pretrained: {folder} exists and is not a folder")
        written = {p.name for p in tmp.iterdir()}
        for p in tmp.iterdir():
            os.replace(p, folder / p.name)
        for old in folder.iterdir():  # weights of an earlier save that this one did not overwrite
            if old.name not in written and (old.name.endswith(".safetensors") or old.name == INDEX):
                old.unlink()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
