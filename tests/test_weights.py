"""Loading and saving checkpoints: round trips, sharding, dtypes, the Hub path, and every bad input's message."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm, write_checkpoint  # noqa: F401 (autouse fixture)

import holotron
from holotron import weights
from holotron.config import ConfigError
from holotron.lm import HybridLM
from holotron.weights import CheckpointError


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M-"), seed=21)


@pytest.fixture()
def ckpt(model, tmp_path):
    return write_checkpoint(model, tmp_path / "ckpt")


@pytest.fixture()
def sharded(model, tmp_path):
    return write_checkpoint(model, tmp_path / "sharded", max_shard_size=20_000)


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


# ----------------------------------------------------------------------------- round trips


def test_single_file_round_trip(model, ckpt):
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]
    back = holotron.load(ckpt)
    assert isinstance(back, HybridLM) and not back.training
    _same(model, back)
    assert back.config == model.config
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        assert torch.equal(back(ids), model(ids))


def test_sharded_round_trip(model, sharded):
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) > 2 and all(re.fullmatch(r"model-\d{5}-of-\d{5}\.safetensors", s) for s in shards)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in model.state_dict().values())
    _same(model, holotron.load(sharded))


def test_save_over_an_earlier_checkpoint_removes_stale_shards(model, sharded):
    weights.save_pretrained(model, sharded)  # now one file
    assert sorted(p.name for p in sharded.iterdir()) == ["config.json", "model.safetensors"]
    _same(model, holotron.load(sharded))


def test_failed_save_leaves_nothing_half_written(model, tmp_path, monkeypatch):
    import safetensors.torch as st

    calls = []

    def broken(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return save_file(tensors, path, metadata=metadata)  # the real writer, imported before the patch

    monkeypatch.setattr(st, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        weights.save_pretrained(model, tmp_path / "out", max_shard_size=20_000)
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary one


def test_dtype_on_load_keeps_ssm_constants_fp32(model, ckpt):
    low = holotron.load(ckpt, dtype=torch.bfloat16)
    for n, p in low.named_parameters():
        want = torch.float32 if n.endswith(("A_log", "mixer.D", "dt_bias")) else torch.bfloat16
        assert p.dtype == want, n
    assert holotron.load(ckpt, dtype="float16").lm_head.weight.dtype == torch.float16


def test_default_dtype_is_the_checkpoints(model, tmp_path):
    folder = write_checkpoint(tiny_lm(model.config, seed=1, dtype=torch.bfloat16), tmp_path / "bf16")
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    m = holotron.load(folder)
    assert m.dtype == torch.bfloat16 and m.backbone.layers[0].mixer.A_log.dtype == torch.float32


def test_generation_config_eos_is_kept(model, tmp_path):
    folder = write_checkpoint(tiny_lm(model.config, seed=1), tmp_path / "g",
                              generation_config={"eos_token_id": [2, 12]})
    m = holotron.load(folder)
    assert m.generation_config["eos_token_id"] == [2, 12]


def test_progress_bar_per_shard_only_when_asked_or_on_a_terminal(sharded, capsys):
    holotron.load(sharded)  # stderr is not a terminal under pytest
    assert capsys.readouterr().err == ""
    holotron.load(sharded, progress=True)
    err = capsys.readouterr().err
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert all(s in err for s in shards) and err.count("\n") == len(shards)


# ----------------------------------------------------------------------------- the Hub path


def _fake_hub_cache(src, cache, repo="org/tiny"):
    snap = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for p in src.iterdir():
        (snap / p.name).write_bytes(p.read_bytes())
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("a" * 40)


def test_hub_id_from_the_local_cache_offline(model, ckpt, tmp_path, monkeypatch):
    _fake_hub_cache(ckpt, tmp_path / "cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _same(model, holotron.load("org/tiny", cache_dir=tmp_path / "cache"))
    with pytest.raises(CheckpointError, match=r"org/absent: not a local folder, and HF_HUB_OFFLINE is set"):
        holotron.load("org/absent", cache_dir=tmp_path / "cache")


def test_hub_download_asks_only_for_data_files(monkeypatch, ckpt):
    seen = {}

    def fake(repo_id, **kw):
        seen.update(kw, repo_id=repo_id)
        return str(ckpt)

    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    holotron.load("org/tiny", revision="v1")
    assert seen["repo_id"] == "org/tiny" and seen["revision"] == "v1" and seen["local_files_only"] is False
    import fnmatch
    allowed = lambda f: any(fnmatch.fnmatch(f, p) for p in seen["allow_patterns"]) and \
        not any(fnmatch.fnmatch(f, p) for p in seen["ignore_patterns"])  # noqa: E731
    for f in ["config.json", "model-00001-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "preprocessor_config.json"]:
        assert allowed(f), f
    for f in ["modeling_nemotron_h.py", "tokenizer_helper.py", "pytorch_model.bin", "__init__.py"]:
        assert not allowed(f), f


def test_not_a_folder_nor_a_repo_id(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder"):
        holotron.load(tmp_path / "nope" / "deeper")
    with pytest.raises(CheckpointError, match="no such folder"):
        holotron.load("./relative/absent")


# ----------------------------------------------------------------------------- bad inputs


def test_missing_shard_is_named_before_loading(sharded, monkeypatch):
    victim = sorted(sharded.glob("model-*.safetensors"))[1]
    victim.unlink()
    opened = []
    monkeypatch.setattr(weights, "read_header", lambda p: opened.append(p))
    with pytest.raises(CheckpointError) as e:
        holotron.load(sharded)
    msg = str(e.value)
    assert victim.name in msg and "missing (nothing was loaded)" in msg and "tensors, e.g. backbone." in msg
    assert opened == []


@pytest.mark.parametrize("damage, expect", [
    (lambda b: b[:len(b) // 2], "truncated safetensors file: its header needs"),
    (lambda b: b[:5], "not a safetensors file"),
    (lambda b: b"\xff" * 8 + b[8:], "corrupt or truncated safetensors file (header claims"),
    (lambda b: b[:8] + b"{ not json" + b[18:], "corrupt safetensors file (header is not valid JSON"),
    (lambda b: b"", "not a safetensors file (0 bytes"),
])
def test_corrupt_or_truncated_file_is_named(ckpt, damage, expect):
    f = ckpt / "model.safetensors"
    f.write_bytes(damage(f.read_bytes()))
    with pytest.raises(CheckpointError) as e:
        holotron.load(ckpt)
    assert str(f) in str(e.value) and expect in str(e.value)
    assert len(str(e.value).splitlines()) == 1


def test_config_contradicting_tensor_shapes(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["mamba_head_dim"] = 12  # the tensors were written with 10
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        holotron.load(ckpt)
    msg = str(e.value)
    assert "wrong shape" in msg and "config.json contradicts" in msg
    assert ("backbone.layers.{0,3}.mixer.in_proj.weight  checkpoint [116, 32] in model.safetensors, "
            "model expects [132, 32]") in msg
    assert "backbone.layers.{0,3}.mixer.norm.weight  checkpoint [40] in model.safetensors, model expects [48]" in msg
    assert len(msg.splitlines()) < 25


def test_missing_and_unexpected_tensors_grouped_on_one_screen(model, tmp_path):
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith("mixer.D")}
    for i in range(40):
        sd[f"backbone.layers.{i}.mixer.extra_bias"] = torch.zeros(3)
    sd["mtp.head.weight"] = torch.zeros(2, 2)
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model.config.to_hf()))
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        holotron.load(folder)
    msg = str(e.value)
    assert "missing from the checkpoint (2):" in msg and "backbone.layers.{0,3}.mixer.D  [4]" in msg
    assert "unexpected, not in the model (41):" in msg
    assert "backbone.layers.{0-39}.mixer.extra_bias  [3]  (model.safetensors)" in msg
    assert "mtp.head.weight  [2, 2]  (model.safetensors)" in msg
    assert len(msg.splitlines()) < 12


def test_index_naming_a_tensor_its_shard_lacks(sharded):
    idx_path = sharded / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    name = "backbone.norm_f.weight"
    first = sorted(set(idx["weight_map"].values()))[0]
    if idx["weight_map"][name] == first:
        first = sorted(set(idx["weight_map"].values()))[1]
    idx["weight_map"][name] = first
    idx_path.write_text(json.dumps(idx))
    with pytest.raises(CheckpointError, match=re.escape(first) + r": the index lists 1 tensors this file does not "
                                                                 r"hold, e.g. backbone.norm_f.weight"):
        holotron.load(sharded)


def test_unsupported_layer_type_names_config_and_field(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["hybrid_override_pattern"] = "M*E-M"
    cfg.pop("layers_block_type")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"config.json: hybrid_override_pattern\[2\] is 'E': mixture-of-experts"):
        holotron.load(ckpt)


def test_unknown_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="LlamaForCausalLM.*is not a model holotron knows.*NemotronHForCausalLM"):
        holotron.load(ckpt)


def test_no_weights_or_no_config(ckpt):
    (ckpt / "model.safetensors").rename(ckpt / "weights.safetensors")
    with pytest.raises(CheckpointError,
                       match="no model.safetensors and no model.safetensors.index.json .found weights.safetensors"):
        holotron.load(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match="no config.json"):
        holotron.load(ckpt)


def test_registry_builds_other_architectures(model, ckpt):
    """A VL model plugs in with register_model; load_into is the generic strict loader."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["TinyWrapper"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    weights.register_model("TinyWrapper", "holotron.weights:build_text_model")
    try:
        _same(model, holotron.load(ckpt))
    finally:
        weights._REGISTRY.pop("TinyWrapper")


def test_load_into_a_wrapper_with_a_prefix(model, tmp_path):
    """The same loader fills a module whose names carry a prefix (as the VL model's language_model.*)."""
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.language_model = HybridLM(model.config)

    sd = {f"language_model.{k}": v for k, v in model.state_dict().items()}
    save_file(sd, str(tmp_path / "w.safetensors"))
    with torch.device("meta"):
        w = Wrapper()
    weights.load_into(w, tmp_path / "w.safetensors", dtype=torch.bfloat16)
    assert w.language_model.lm_head.weight.dtype == torch.bfloat16
    assert w.language_model.backbone.layers[0].mixer.A_log.dtype == torch.float32
    assert torch.equal(w.language_model.backbone.norm_f.weight.float(),
                       model.backbone.norm_f.weight.to(torch.bfloat16).float())


class _Hooked(torch.nn.Module):
    """A stand-in for the VL model: a prefix, a checkpoint-shaped tensor, extra JSON files."""

    seen: dict = {}

    def __init__(self, cfg: dict, preprocessor: dict | None):
        super().__init__()
        from holotron.config import TextConfig
        self.config = TextConfig.from_hf(cfg)
        self.language_model = HybridLM(self.config)
        self.prefix = torch.nn.Parameter(torch.empty(0, 4))  # row count known only from the checkpoint
        _Hooked.seen["preprocessor"] = preprocessor

    def adapt_to_checkpoint(self, shapes):
        self.prefix = torch.nn.Parameter(torch.empty(*shapes["prefix"], device=self.prefix.device))
        return ["prefix"]

    def extra_files(self):
        return {"preprocessor_config.json": {"image_size": 512}}


def build_hooked(cfg, preprocessor=None):
    return _Hooked(cfg, preprocessor)


def test_vl_style_hooks_preprocessor_adapt_and_extra_files(model, tmp_path):
    weights.register_model("HookedForTest", "test_weights:build_hooked")
    try:
        m = _Hooked(model.config.to_hf(), None)
        m.language_model.load_state_dict(model.state_dict())
        m.prefix = torch.nn.Parameter(torch.randn(3, 4))
        weights.save_pretrained(m, tmp_path / "vl")
        cfg = json.loads((tmp_path / "vl" / "config.json").read_text())
        cfg["architectures"] = ["HookedForTest"]
        (tmp_path / "vl" / "config.json").write_text(json.dumps(cfg))
        assert json.loads((tmp_path / "vl" / "preprocessor_config.json").read_text()) == {"image_size": 512}
        back = holotron.load(tmp_path / "vl")
        assert _Hooked.seen["preprocessor"] == {"image_size": 512}
        assert torch.equal(back.prefix, m.prefix)
        _same(back.language_model, model)
    finally:
        weights._REGISTRY.pop("HookedForTest")


def test_integer_tensor_for_a_floating_parameter(model, tmp_path):
    sd = dict(model.state_dict())
    sd["backbone.layers.0.mixer.A_log"] = torch.arange(4, dtype=torch.int64)
    folder = tmp_path / "int"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model.config.to_hf()))
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError,
                       match=r"wrong dtype \(1\):\n    backbone.layers.0.mixer.A_log  I64 in model.safetensors"):
        holotron.load(folder)


def test_models_do_not_offer_the_loader():
    """holotron.load / holotron.save_pretrained are the one door to checkpoints."""
    from holotron.model import Holotron
    for cls in (HybridLM, Holotron):
        assert not hasattr(cls, "from_pretrained") and not hasattr(cls, "save_pretrained"), cls


# ----------------------------------------------------------------------------- device and dtype, up front


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_cuda_without_a_gpu_is_refused_before_any_file_is_read(ckpt, monkeypatch):
    from holotron import devices

    read = []
    monkeypatch.setattr(weights, "read_header", lambda p: read.append(p))
    for target in (ckpt, ckpt.parent / "absent"):  # an absent folder too: the device is checked first
        with pytest.raises(weights.DeviceError) as e:
            holotron.load(target, device="cuda")
        msg = str(e.value)
        assert msg.startswith("device='cuda': CUDA was asked for but torch sees no GPU (torch ") and "\n" not in msg
        assert torch.__version__ in msg and msg.endswith("use device='cpu'")
        assert "safetensors" not in msg and "pin_memory" not in msg
    assert read == []
    with pytest.raises(weights.DeviceError, match=r"device='cuda:1': CUDA was asked for"):
        weights.load_into(HybridLM(tiny_config()), ckpt / "model.safetensors", device=torch.device("cuda", 1))
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_dtype("auto", "auto") == torch.float32


@pytest.mark.parametrize("device", ["nonsense", "cuda:x", "meta", "gpu0", 2.5, ""])
def test_unknown_device_is_one_clear_line(ckpt, device):
    with pytest.raises(weights.DeviceError) as e:
        holotron.load(ckpt, device=device)
    msg = str(e.value)
    assert "\n" not in msg and (repr(str(device)) in msg or type(device).__name__ in msg)
    assert "'cpu', 'cuda', 'cuda:N'" in msg and "RuntimeError" not in msg


@pytest.mark.parametrize("dtype", ["float33", "int8", torch.int8, "", 16, torch.complex64])
def test_unknown_dtype_is_one_clear_line(ckpt, dtype):
    with pytest.raises(weights.DeviceError) as e:
        holotron.load(ckpt.parent / "absent", dtype=dtype)  # refused before the folder is looked at
    msg = str(e.value)
    assert msg.startswith("dtype") and "\n" not in msg and "'bfloat16'" in msg


def test_dtype_names_and_devices_that_work(model, ckpt):
    from holotron.devices import resolve_device, resolve_dtype

    for name, want in (("bf16", torch.bfloat16), ("torch.float16", torch.float16), ("FP32", torch.float32),
                       (torch.bfloat16, torch.bfloat16), (None, None)):
        assert resolve_dtype(name) == want
    assert resolve_device(None) == resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert holotron.load(ckpt, dtype="bf16", device="cpu").lm_head.weight.dtype == torch.bfloat16
    _same(model, holotron.load(ckpt, device=torch.device("cpu")))


# ----------------------------------------------------------------------------- saving: the target, modes


def _modes(folder):
    return {p.name: oct(p.stat().st_mode & 0o777) for p in [folder, *folder.iterdir()]}


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077], ids=["022", "002", "077"])
def test_saved_files_and_folders_follow_the_umask(model, tmp_path, mask):
    old = os.umask(mask)
    try:
        new = tmp_path / "deep" / "new"
        weights.save_pretrained(model, new, max_shard_size=20_000)  # a new folder (and a new parent)
        existing = tmp_path / "existing"
        existing.mkdir()
        weights.save_pretrained(model, existing)  # into an existing folder
    finally:
        os.umask(old)
    for folder in (new, tmp_path / "deep"):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o777 & ~mask), folder
    for folder in (new, existing):
        files = _modes(folder)
        files.pop(folder.name)
        assert len(files) > 1 and set(files.values()) == {oct(0o666 & ~mask)}, files


def test_save_onto_an_existing_file_is_refused_before_writing(model, tmp_path):
    target = tmp_path / "ckpt"
    target.write_text("not a folder")
    with pytest.raises(OSError) as e:
        weights.save_pretrained(model, target)
    msg = str(e.value)
    assert msg == f"save_pretrained: {target} exists and is not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"] and target.read_text() == "not a folder"


def test_save_under_a_file_is_refused_naming_the_path(model, tmp_path):
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "sub" / "ckpt"
    with pytest.raises(OSError) as e:
        weights.save_pretrained(model, target)
    msg = str(e.value)
    assert msg == f"save_pretrained: cannot create {target}: {tmp_path / 'file'} is a file, not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_save_under_a_read_only_folder_names_the_path(model, tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: let access() answer as it does for everyone else
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro and mode & os.W_OK else real(p, mode))
    try:
        for target in (ro / "ckpt", ro / "a" / "b"):
            with pytest.raises(PermissionError) as e:
                weights.save_pretrained(model, target)
            assert str(e.value) == f"save_pretrained: cannot create {target}: {ro} is not writable"
        with pytest.raises(PermissionError, match=f"^save_pretrained: cannot write into {re.escape(str(ro))}: "):
            weights.save_pretrained(model, ro)  # the folder itself exists but cannot be written
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_os_failures_name_the_users_path_never_a_temporary_one(model, tmp_path, monkeypatch):
    """The checks pass but the OS refuses (a read-only mount, a quota): the error still names the path
    given, and the parents made for the save are removed again."""
    import tempfile

    def refuse(prefix="", dir=None, **kw):
        raise PermissionError(13, "Permission denied", str(Path(dir) / f"{prefix}x1y2z3"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    target = tmp_path / "made" / "ckpt"
    with pytest.raises(PermissionError) as e:
        weights.save_pretrained(model, target)
    assert str(e.value) == f"save_pretrained: cannot create {target}: Permission denied"
    assert list(tmp_path.iterdir()) == []


def test_failed_save_into_new_parents_removes_them(model, tmp_path, monkeypatch):
    import safetensors.torch as st

    def broken(tensors, path, metadata=None):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(st, "save_file", broken)
    target = tmp_path / "a" / "b" / "ckpt"
    with pytest.raises(OSError) as e:
        weights.save_pretrained(model, target)
    assert ".tmp" not in str(e.value) and str(target) in str(e.value) and "No space left" in str(e.value)
    assert list(tmp_path.iterdir()) == []
