"""What a checkpoint holds, read and checked before any tensor is: the safetensors index and headers, and
the strict comparison of their names, shapes and dtypes with the model (``holotron/weights.py`` loads).

Every failure is a ``CheckpointError`` (a ValueError) whose message names the file, and where it applies
the tensor and the shape. A header is read in full only after its size prefix is checked against the
file (and a 100 MiB cap); every entry is checked as the safetensors library will check it (known dtype,
non-negative integer shape, data offsets inside the file, contiguous, sized for the shape), so a damaged
file is named here, in one line, instead of failing later inside a reader.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import torch

__all__ = ["CheckpointError", "SINGLE", "INDEX", "MAX_HEADER_BYTES", "read_header", "weight_files", "check_tensors",
           "dtype_size"]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 2**20  # a header larger than this is taken as damage, not read

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
              "F8_E5M2": getattr(torch, "float8_e5m2", None), "U16": getattr(torch, "uint16", None),
              "U32": getattr(torch, "uint32", None), "U64": getattr(torch, "uint64", None)}
_KNOWN = {k: v for k, v in _ST_DTYPES.items() if v is not None}


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is; the message names file, tensor and shape."""


def dtype_size(st_dtype: str) -> int:
    """Bytes per element of a safetensors dtype name (1 for a name torch does not know)."""
    t = _KNOWN.get(st_dtype)
    return t.itemsize if t is not None else 1


def _short(obj, limit: int = 120) -> str:
    """repr(obj), one line, cut at ``limit`` characters (names and entries come from the file)."""
    r = repr(obj)
    return r if len(r) <= limit else r[:limit] + "..."


# ----------------------------------------------------------------------------- locating files


def weight_files(folder: Path) -> dict[str, Path] | Path:
    """Sharded: {tensor name: shard path} from the index (every shard checked to exist). Single: the file."""
    single, index = folder / SINGLE, folder / INDEX
    if single.is_file():
        return single
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
            if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
                raise TypeError("weight_map is not an object of tensor name -> file name")
        except (ValueError, KeyError, TypeError, IndexError, RecursionError, OSError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({type(e).__name__}: "
                                  f"{_short(str(e), 200)})") from None
        outside = [fn for fn in set(wm.values()) if Path(fn).is_absolute() or ".." in Path(fn).parts]
        if outside:
            raise CheckpointError(f"{index}: the index names files outside its folder, e.g. {_short(outside[0])}")
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


# ----------------------------------------------------------------------------- safetensors headers


def _uint(v) -> bool:
    return type(v) is int and v >= 0  # (not bool, which JSON true / false become)


def _numel(shape: list[int], cap: int) -> int:
    """The product of ``shape``, or cap + 1 as soon as it passes ``cap`` (no huge integers from absurd dims)."""
    if 0 in shape:
        return 0
    n = 1
    for s in shape:
        n *= s
        if n > cap:
            return cap + 1
    return n


def _read_raw(path: Path) -> tuple[bytes, int]:
    """The header bytes and the file size; the 8-byte size prefix checked before anything else is read."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file ({size} bytes, shorter than the 8-byte "
                                      "header size)")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors file (header claims {n} bytes, "
                                      f"file has {size})")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({_short(str(e), 200)})") from None
    if len(raw) != n:
        raise CheckpointError(f"{path}: truncated while reading (header claims {n} bytes, read {len(raw)})")
    return raw, size


def read_header(path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (safetensors dtype, shape)} from the file's header, checked entry by entry and against
    the file size as the safetensors reader will check it; ``CheckpointError`` naming the file otherwise."""
    path = Path(path)
    raw, size = _read_raw(path)
    try:
        hdr = json.loads(raw.decode("utf-8"))  # UTF-8 only, as safetensors reads it (json.loads(bytes) guesses)
    except (ValueError, RecursionError) as e:  # (UnicodeDecodeError is a ValueError)
        raise CheckpointError(f"{path}: corrupt safetensors file (header is not valid JSON: "
                              f"{_short(str(e), 200)})") from None
    if not isinstance(hdr, dict):
        raise CheckpointError(f"{path}: corrupt safetensors file (header is not a JSON object but "
                              f"{type(hdr).__name__})")
    meta = hdr.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{path}: corrupt safetensors header (__metadata__ must map strings to strings, got "
                              f"{_short(meta)})")
    data = size - 8 - len(raw)  # bytes after the header
    out, spans, end = {}, [], 0
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        entry = info if isinstance(info, dict) else {}
        dt, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(dt, str) and isinstance(shape, list) and all(_uint(s) for s in shape)
                and isinstance(offs, list) and len(offs) == 2 and all(_uint(o) for o in offs) and offs[0] <= offs[1]):
            raise CheckpointError(f"{path}: corrupt safetensors header entry for {_short(name)}: {_short(info)}")
        if dt not in _KNOWN:
            raise CheckpointError(f"{path}: tensor {_short(name)} has dtype {_short(dt)}, which holotron cannot read "
                                  f"(known: {', '.join(_KNOWN)})")
        out[name] = (dt, tuple(shape))
        spans.append((offs[0], offs[1], name))
        end = max(end, offs[1])
    needs = 8 + len(raw) + end
    if needs > size:
        raise CheckpointError(f"{path}: truncated safetensors file: its header needs "
                              f"{needs if needs < 2**64 else 'over 2**64'} bytes, the file has {size} "
                              "(re-download or re-save it)")
    for a, b, name in spans:  # every offset now lies inside the file
        dt, shape = out[name]
        numel = _numel(list(shape), data)
        if numel * _KNOWN[dt].itemsize != b - a:
            want = "more bytes than the file holds" if numel > data else f"{numel * _KNOWN[dt].itemsize} bytes"
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {_short(name)} {dt} "
                                  f"{_short(list(shape), 60)} needs {want}, its data_offsets span {b - a}")
    pos = 0
    for a, b, name in sorted(spans):
        if a != pos:
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {_short(name)}'s data starts at "
                                  f"byte {a}, expected {pos} (tensors overlap or leave a gap)")
        pos = b
    if pos != data:
        raise CheckpointError(f"{path}: corrupt safetensors file: {data - pos} bytes after the last tensor's data "
                              "that no header entry accounts for")
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


def check_tensors(model_tensors: dict[str, torch.Tensor], found: dict[str, tuple[Path, str, tuple]],
                  where: str) -> None:
    """Names, shapes and dtypes of the checkpoint (``found``: name -> (file, dtype, shape)) against the
    model's; one ``CheckpointError`` listing every difference, grouped by layer, otherwise nothing."""
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
