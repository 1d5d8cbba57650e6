"""Checkpoints in the Hugging Face layout: load (strict, streamed shard by shard) and save.

    model = load("path/or/org/repo", dtype=torch.bfloat16, device="cuda")
    save_pretrained(model, "out/")        # config.json + model.safetensors (or shards + index)

Loading: resolve the folder (local, or the Hub through huggingface_hub: honours HF_HUB_OFFLINE and
the local cache, fetches only json / safetensors / tokenizer / jinja files, never code); read
config.json and pick a builder from the registry (``architectures`` / ``model_type`` -> builder);
read every safetensors header and check names and shapes against the model built on the meta device
(missing shards and mismatches are reported, grouped on one screen, before any tensor is read);
then stream the tensors shard by shard into the model (``load_into``). Every failure is a
``CheckpointError`` (a ValueError) whose message names the file, the tensor and the shape; a device or
dtype that cannot be used here is a ``DeviceError`` (a ValueError), raised before any file is read.
Reading and checking the index and headers is ``holotron/weights_check.py``'s; writing the folder all at
once is ``holotron/atomic_folder.py``'s; devices and dtypes are ``holotron/devices.py``'s.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from .atomic_folder import atomic_folder
from .config import ConfigError
from .devices import DTYPE_NAMES, DeviceError, resolve_device, resolve_dtype
from .weights_check import INDEX, SINGLE, CheckpointError, check_tensors, dtype_size, read_header, weight_files

__all__ = ["CheckpointError", "DeviceError", "load", "load_into", "save_pretrained", "register_model", "resolve",
           "weight_files", "read_header"]

CONFIG = "config.json"
HUB_ALLOW = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]
HUB_IGNORE = ["*.py", "*.pyc", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf"]


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


# ----------------------------------------------------------------------------- loading


def _bar(label: str, nbytes: int, progress: bool | None):
    """A progress bar of one shard's ``nbytes`` on stderr: always with ``progress=True``, never with False;
    with None only on a terminal, and only once the shard has taken half a second (small models load
    without one). One line per shard, kept when it ends."""
    from tqdm import tqdm

    on = sys.stderr.isatty() if progress is None else bool(progress)
    return tqdm(total=max(nbytes, 1), desc=f"  {label}", unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=not on, delay=0.5 if progress is None else 0.0, leave=True)


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
              device=None, progress: bool | None = None, where: str | None = None, after=None) -> nn.Module:
    """Strictly fill ``model`` (typically built on the meta device) from safetensors ``files``.

    ``files``: one file, or {tensor name: file} as in an index. Every header is read and every name and
    shape checked before any tensor is loaded; then each file is read once, its tensors cast to
    ``dtype`` (floating ones; names in a module's ``keep_fp32`` stay fp32 under a 16-bit dtype) and
    moved to ``device``, and assigned in place of the model's tensors. ``progress``: see ``_bar``.
    ``after(name)``, when given, is called once each tensor is assigned (``holotron.quant.quantizer``).
    """
    device = resolve_device(device)  # (device and dtype before any file is opened)
    dtype = resolve_dtype(dtype, device)
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
    check_tensors(model.state_dict(keep_vars=True), found, where)

    keep = _fp32_names(model)
    from safetensors import safe_open

    for p, names in sorted(by_file.items()):
        nbytes = sum(math.prod(headers[p][n][1]) * dtype_size(headers[p][n][0]) for n in names)
        try:
            with _bar(p.name, nbytes, progress) as bar, safe_open(str(p), framework="pt", device=str(device)) as f:
                for n in names:
                    t = f.get_tensor(n)
                    if t.is_floating_point():
                        want = dtype or t.dtype
                        if n.endswith(keep) and want in (torch.float16, torch.bfloat16):
                            want = torch.float32
                        t = t.to(want)
                    _assign(model, n, t)
                    del t
                    if after is not None:
                        after(n)
                    bar.update(math.prod(headers[p][n][1]) * dtype_size(headers[p][n][0]))
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors/IO failures become one line naming the file
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise CheckpointError(f"{p}: cannot read tensors ({type(e).__name__}: {first})") from None
    left = [n for n, t in model.state_dict(keep_vars=True).items() if t.is_meta]
    if left:
        raise CheckpointError(f"{where}: {len(left)} tensors were not loaded, e.g. {', '.join(left[:3])}")
    return model


def _checkpoint_dtype(cfg: dict) -> torch.dtype | None:
    """The dtype the checkpoint declares (config ``torch_dtype`` / ``dtype``), else None (keep stored dtypes)."""
    name = cfg.get("torch_dtype") or cfg.get("dtype")
    return DTYPE_NAMES.get(name.strip().lower().removeprefix("torch.")) if isinstance(name, str) else None


def load(path_or_repo_id, dtype: torch.dtype | str | None = None, device=None, *, revision: str | None = None,
         cache_dir=None, progress: bool | None = None, quantize: str | None = None) -> nn.Module:
    """Build the model that ``config.json`` describes and load its weights strictly.

    ``path_or_repo_id``: a local folder (or a file in it) or a Hugging Face repo id. ``dtype``: the
    floating dtype of the model, a torch dtype or a name ("bfloat16", "bf16", "float32", ...; "auto":
    bfloat16 on CUDA, float32 elsewhere); default the checkpoint's ``torch_dtype``, else as stored.
    ``device``: where tensors are loaded (default CPU; "cpu", "cuda", "cuda:N", "auto"). Both are checked
    before any file is read (``DeviceError``, e.g. CUDA asked for where torch sees no GPU).
    ``revision`` / ``cache_dir``: for a Hub id. A progress bar per shard is shown on a terminal when
    loading is slow (``progress`` forces it on or off). ``quantize``: None, or "fp8" for float8_e4m3fn
    weights with per-output-channel scales in the language model's linear layers (lm_head excepted;
    ``holotron/quant.py``), each layer quantised as soon as its tensors are read, so the full-precision
    weights are never all held at once. Returns the model in eval mode.
    """
    if quantize is not None and quantize != "fp8":
        raise CheckpointError(f"load: quantize must be None or 'fp8', got {quantize!r}")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    folder = resolve(path_or_repo_id, revision, cache_dir)
    cfg_path = folder / CONFIG
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object")
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
    after = None
    if quantize is not None:
        from .quant import quantizer
        try:
            after = quantizer(model, quantize)
        except ValueError as e:
            raise CheckpointError(f"{cfg_path}: {e}") from None
    load_into(model, files, dtype=dtype, device=device, progress=progress, where=str(folder), after=after)
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
    ``model.safetensors.index.json``. Through ``atomic_folder``: ``folder`` (or the parents it needs) is
    checked before anything is written (an OSError of one line naming it otherwise), everything is written
    to a temporary folder and moved into place at the end, so a failure never leaves a half-written
    checkpoint; weights an earlier save left there are removed; modes follow the process umask. A model
    with float8 weights (``load(..., quantize="fp8")``) is refused with a CheckpointError: there is no
    float8 checkpoint layout; save the unquantised model.
    """
    from safetensors.torch import save_file

    limit = _parse_size(max_shard_size)
    folder = Path(folder)
    sd = {n: t.detach() for n, t in model.state_dict().items()}
    fp8 = [n for n, t in sd.items() if t.dtype == torch.float8_e4m3fn]
    if fp8:
        raise CheckpointError(f"save_pretrained: the model holds float8 weights ({fp8[0]}, ...; loaded with "
                              "quantize='fp8'); save the unquantised model and quantise when loading")
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

    stale = lambda name: name.endswith(".safetensors") or name == INDEX  # noqa: E731 - an earlier save's weights
    with atomic_folder(folder, who="save_pretrained", stale=stale) as tmp:
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
