"""Damaged checkpoints meet one error: random bytes, mutated safetensors headers (wrong size prefix, JSON
of the wrong shape, unknown dtypes, offsets out of range or overlapping, absurd shapes) and mutated
indexes give ``CheckpointError`` naming the file, in one line, and nothing else; a header the reader
accepts is one the safetensors library then reads in full."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from holotron.weights import CheckpointError, read_header, weight_files

FUZZ = settings(max_examples=200, deadline=None)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I8", "U8", "BOOL", "U16", "F8_E4M3", "C64", "F4", "f32", "", "X"]
FIELDS = ("dtype", "shape", "data_offsets")


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> tuple[dict, bytes]:
    """A small real safetensors file, as (header dict, the data after the header)."""
    path = tmp_path_factory.mktemp("valid") / "model.safetensors"
    tensors = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16),
               "c": torch.zeros(0, 5), "d": torch.tensor([1, 2], dtype=torch.int64)}
    save_file(tensors, str(path), metadata={"format": "pt"})
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _assert_only_checkpoint_error(path: Path) -> None:
    """read_header either raises CheckpointError (one line, naming the file) or accepts a header that
    safetensors then reads, every tensor of it."""
    try:
        hdr = read_header(path)
    except CheckpointError as e:
        msg = str(e)
        assert str(path) in msg and "\n" not in msg and len(msg) < 1000, msg
        return
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == set(hdr)
        for name, (_, shape) in hdr.items():
            assert tuple(f.get_tensor(name).shape) == shape


def _write(path: Path, body: bytes, prefix: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(body) if prefix is None else prefix) + body)
    return path


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(scratch, blob):
    path = scratch / "random.safetensors"
    path.write_bytes(blob)
    _assert_only_checkpoint_error(path)


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 2**64 - 1) | st.none())
def test_random_header_bytes_behind_a_size_prefix(scratch, body, prefix):
    _assert_only_checkpoint_error(_write(scratch / "prefixed.safetensors", body, prefix))


@FUZZ
@given(JSON, st.binary(max_size=64))
def test_json_of_any_shape(scratch, header, data):
    _assert_only_checkpoint_error(_write(scratch / "json.safetensors", json.dumps(header).encode() + data,
                                         len(json.dumps(header).encode())))


@st.composite
def _mutation(draw, hdr: dict):
    """One change to a valid header: a field set to another JSON value, a plausible-but-wrong dtype, shape or
    offsets, an entry dropped, added or replaced, or the metadata damaged."""
    names = sorted(k for k in hdr if k != "__metadata__")
    kind = draw(st.sampled_from(["value", "dtype", "shape", "offsets", "drop_field", "drop", "add", "entry",
                                 "meta"]))
    name = draw(st.sampled_from(names)) if names else None
    entry = hdr.get(name) if isinstance(hdr.get(name), dict) else None
    if kind == "meta" or name is None:
        hdr["__metadata__"] = draw(JSON)
    elif kind == "value" and entry is not None:
        entry[draw(st.sampled_from(FIELDS))] = draw(JSON)
    elif kind == "dtype" and entry is not None:
        entry["dtype"] = draw(st.sampled_from(DTYPES))
    elif kind == "shape" and entry is not None:
        entry["shape"] = draw(st.lists(st.integers(-2, 2**66) | st.integers(0, 8), max_size=5))
    elif kind == "offsets" and entry is not None:
        entry["data_offsets"] = draw(st.lists(st.integers(-4, 80) | st.integers(0, 2**70), min_size=0, max_size=3))
    elif kind == "drop_field" and entry is not None:
        entry.pop(draw(st.sampled_from(FIELDS)), None)
    elif kind == "drop":
        hdr.pop(name)
    elif kind == "add":
        hdr[draw(st.text(max_size=4))] = {"dtype": draw(st.sampled_from(DTYPES)),
                                          "shape": draw(st.lists(st.integers(0, 6), max_size=3)),
                                          "data_offsets": draw(st.lists(st.integers(0, 80), min_size=2, max_size=2))}
    else:
        hdr[name] = draw(JSON)
    return hdr


@FUZZ
@given(st.data())
def test_mutated_valid_headers(scratch, valid, data):
    hdr, payload = copy.deepcopy(valid[0]), valid[1]
    for _ in range(data.draw(st.integers(1, 3))):
        hdr = data.draw(_mutation(hdr))
    body = json.dumps(hdr).encode() + b" " * data.draw(st.integers(0, 7))
    prefix = data.draw(st.sampled_from([None, None, None, 0, len(body) - 1, len(body) + 1, 2**63]))
    tail = data.draw(st.sampled_from(["same", "cut", "extend"]))
    if tail == "cut":
        payload = payload[:data.draw(st.integers(0, max(0, len(payload) - 1)))]
    elif tail == "extend":
        payload = payload + data.draw(st.binary(min_size=1, max_size=16))
    _assert_only_checkpoint_error(_write(scratch / "mutated.safetensors", body + payload, prefix))


@FUZZ
@given(st.data())
def test_flipped_header_bytes(scratch, valid, data):
    hdr, payload = valid
    body = bytearray(json.dumps(hdr).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    _assert_only_checkpoint_error(_write(scratch / "flipped.safetensors", bytes(body) + payload))


@FUZZ
@given(JSON | st.fixed_dictionaries({"weight_map": JSON}) | st.binary(max_size=64))
def test_mutated_index(scratch, index):
    folder = scratch / "indexed"
    folder.mkdir(exist_ok=True)
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"")
    path = folder / "model.safetensors.index.json"
    path.write_bytes(index if isinstance(index, bytes) else json.dumps(index).encode())
    try:
        files = weight_files(folder)
    except CheckpointError as e:
        assert str(folder) in str(e), str(e)
        return
    assert isinstance(files, dict) and all(isinstance(p, Path) for p in files.values())
    assert all(folder in p.parents for p in files.values())
