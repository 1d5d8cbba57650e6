"""RADIO encoder: patch order, CPE position interpolation, strict loading (names, optional tensors, errors),
the 12B module tree on the meta device, and the whole encoder + projector against transformers."""

import json
import re

import pytest
import torch
from helpers import assert_close

from holotron.vision import Projector, RadioVisionModel, VisionConfig, embed_tiles, interpolate_pos_embed, pixel_shuffle
from holotron.vision.radio import patchify

# ---------------------------------------------------------------------------------------------- strict loading
# ``load_vision_state_dict(vision_model, mlp1, state_dict)`` takes a flat dict of the checkpoint's names, loads
# every ``vision_model.*`` / ``mlp1.*`` tensor strictly and returns the optional tensors it found; a missing
# tensor, an unknown name or a wrong shape raises VisionWeightsError with a short grouped message (per-block
# names folded into ``blocks.{j}``). It checks the module tree against checkpoint names here; checkpoints
# themselves are loaded by holotron.weights.

# tensors a RADIO checkpoint may hold beyond the ViT itself (regexes on names below vision_model.)
OPTIONAL_TENSORS = (
    r"radio_model\.input_conditioner\.norm_(mean|std)",
    r"radio_model\.summary_idxs",
    r"radio_model\.model\.patch_generator\.video_embedder\.weight",
    r"radio_model\.model\.blocks\.\d+\.layer_scale[12]\.lambda1",
)


class VisionWeightsError(ValueError):
    """The vision tensors of a checkpoint do not match holotron's module tree; the message names them."""


def _fold(names) -> list[str]:
    """Fold 'x.blocks.3.y' over block indices: ['x.blocks.{j}.y (j in 0-31)']."""
    groups: dict[str, list[int]] = {}
    for n in names:
        m = re.search(r"\.blocks\.(\d+)\.", n)
        key = n if m is None else n[: m.start()] + ".blocks.{j}." + n[m.end():]
        groups.setdefault(key, [])
        if m is not None:
            groups[key].append(int(m.group(1)))
    out = []
    for key, idx in sorted(groups.items()):
        if not idx:
            out.append(key)
            continue
        idx = sorted(idx)
        contiguous = len(idx) > 1 and idx == list(range(idx[0], idx[-1] + 1))
        ranges = "j in " + (f"{idx[0]}-{idx[-1]}" if contiguous else ",".join(map(str, idx)))
        out.append(f"{key} ({ranges})")
    return out


def load_vision_state_dict(vision_model: torch.nn.Module, mlp1: torch.nn.Module | None,
                           state_dict: dict[str, torch.Tensor],
                           *, source: str = "the state dict", assign: bool = False) -> list[str]:
    """Load ``vision_model.*`` (and ``mlp1.*`` unless ``mlp1`` is None) strictly; returns the optional tensors found."""
    problems: list[str] = []
    parts = [("vision_model.", vision_model)] + ([("mlp1.", mlp1)] if mlp1 is not None else [])
    found: list[str] = []
    for prefix, module in parts:
        sub = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not sub:
            problems.append(f"no tensors named {prefix}* in {source}")
            continue
        try:
            res = module.load_state_dict(sub, strict=False, assign=assign)
        except RuntimeError as e:  # shape mismatches; torch lists every one
            shapes = re.findall(r"size mismatch for ([\w.]+): copying a param with shape (torch.Size\(\[[^\]]*\]\)) "
                                r"from checkpoint, the shape in current model is (torch.Size\(\[[^\]]*\]\))", str(e))
            if not shapes:
                raise VisionWeightsError(f"loading {prefix}* from {source}: {e}") from e
            for name, got, want in shapes:
                problems.append(f"wrong shape: {prefix}{name} is {got[11:-1]} in {source}, "
                                f"holotron expects {want[11:-1]}")
            continue
        if res.missing_keys:
            problems.append(f"missing from {source}: " + "; ".join(prefix + n for n in _fold(res.missing_keys)))
        if res.unexpected_keys:
            problems.append(f"unknown names in {source} (not part of holotron's {prefix.rstrip('.')}): "
                            + "; ".join(prefix + n for n in _fold(res.unexpected_keys)))
        if prefix == "vision_model.":
            found = [prefix + n for n in _fold(k for k in sub if any(re.fullmatch(p, k) for p in OPTIONAL_TENSORS))]
    if problems:
        raise VisionWeightsError("vision weights do not match:\n  " + "\n  ".join(problems))
    return found

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=4, max_img_size=64,
            image_size=32, projector_hidden_size=40, projector_output_size=24, num_prefix_tokens=5)


def _randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def _tiny(**kw):
    cfg = VisionConfig(**{**TINY, **kw})
    return cfg, _randomize(RadioVisionModel(cfg)), _randomize(Projector.from_config(cfg), 1)


def _checkpoint(vm, mlp1):
    sd = {f"vision_model.{k}": v.clone() for k, v in vm.state_dict().items()}
    sd.update({f"mlp1.{k}": v.clone() for k, v in mlp1.state_dict().items()})
    sd["language_model.backbone.norm_f.weight"] = torch.ones(24)  # another part's tensor: not ours, left alone
    return sd


# ---------------------------------------------------------------- patches and positions

def test_patchify_order_row_major_channel_major():
    x = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).view(2, 3, 8, 12)
    p = patchify(x, 4)  # (2, 2*3, 48)
    assert p.shape == (2, 6, 48)
    for t in range(2):
        for r in range(2):
            for c in range(3):
                want = x[t, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4].reshape(-1)  # (c, yy, xx)
                assert torch.equal(p[t, r * 3 + c], want)


def test_pos_embed_identity_at_full_grid_and_block_average_when_halved():
    G, D = 4, 3
    pos = torch.randn(1, G * G, D)
    assert torch.equal(interpolate_pos_embed(pos, G, G), pos)
    # m = max(2, 1) = 2: halving with align_corners=False averages each 2x2 block; then the top-left 2x1 window
    out = interpolate_pos_embed(pos, 2, 1)
    grid = pos.view(G, G, D)
    want = torch.stack([grid[0:2, 0:2].mean((0, 1)), grid[2:4, 0:2].mean((0, 1))])
    assert_close(out[0], want, torch.float32)
    # align_corners=True would have picked the corner rows instead
    assert not torch.allclose(out[0], torch.stack([grid[0, 0], grid[3, 0]]), atol=1e-3)


def test_pos_embed_crop_is_top_left_of_square_resize():
    G, D = 8, 5
    pos = torch.randn(1, G * G, D)
    square = interpolate_pos_embed(pos, 6, 6).view(6, 6, D)
    assert torch.equal(interpolate_pos_embed(pos, 6, 3).view(6, 3, D), square[:, :3])
    assert torch.equal(interpolate_pos_embed(pos, 2, 6).view(2, 6, D), square[:2])
    big = interpolate_pos_embed(pos, 12, 20)  # upsampling past the table works too
    assert big.shape == (1, 240, D)


def test_encoder_runs_any_multiple_of_patch_and_drops_prefix():
    cfg, vm, _ = _tiny()
    for h, w in [(4, 4), (32, 32), (20, 36), (64, 12)]:
        out = vm(torch.randn(2, 3, h, w))
        assert out.shape == (2, (h // 4) * (w // 4), 32)
        assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="multiple of the patch size"):
        vm(torch.randn(1, 3, 30, 32))
    with pytest.raises(ValueError, match="expected"):
        vm(torch.randn(3, 32, 32))


def test_tiles_are_independent():
    """Attention stays within a tile: a tile's features do not depend on its neighbours in the batch."""
    _, vm, _ = _tiny()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        together, alone = vm(x), vm(x[1:2])
    assert_close(together[1:2], alone, torch.float32)


# ---------------------------------------------------------------- loading

def test_strict_round_trip_and_foreign_prefixes_ignored():
    cfg, vm, mlp1 = _tiny()
    sd = _checkpoint(vm, mlp1)
    vm2, mlp2 = RadioVisionModel(cfg), Projector.from_config(cfg)
    assert load_vision_state_dict(vm2, mlp2, sd) == []
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(embed_tiles(vm2, mlp2, x), embed_tiles(vm, mlp1, x))


def test_prefix_token_count_comes_from_the_checkpoint():
    cfg, vm, mlp1 = _tiny(num_prefix_tokens=7)
    sd = _checkpoint(vm, mlp1)
    fresh = RadioVisionModel(VisionConfig(**{**TINY, "num_prefix_tokens": None}))
    assert fresh.num_prefix == 0
    load_vision_state_dict(fresh, Projector.from_config(cfg), sd)
    assert fresh.num_prefix == 7
    x = torch.randn(1, 3, 16, 16)
    assert torch.equal(fresh(x), vm(x))


def test_load_onto_meta_device_with_assign():
    cfg, vm, mlp1 = _tiny()
    sd = _checkpoint(vm, mlp1)
    sd["vision_model.radio_model.model.blocks.0.layer_scale1.lambda1"] = torch.full((32,), 0.5)
    with torch.device("meta"):
        vm2, mlp2 = RadioVisionModel(VisionConfig(**{**TINY, "num_prefix_tokens": None})), Projector.from_config(cfg)
    load_vision_state_dict(vm2, mlp2, sd, assign=True)
    assert not any(p.is_meta for p in list(vm2.parameters()) + list(mlp2.parameters()))
    assert vm2.num_prefix == 5


def test_optional_tensors_are_loaded_and_reported():
    cfg, vm, mlp1 = _tiny()
    sd = _checkpoint(vm, mlp1)
    base = "vision_model.radio_model."
    sd[base + "input_conditioner.norm_mean"] = torch.tensor(cfg.norm_mean).view(3, 1, 1)
    sd[base + "input_conditioner.norm_std"] = torch.tensor(cfg.norm_std).view(3, 1, 1)
    sd[base + "summary_idxs"] = torch.tensor([0, 1])
    sd[base + "model.patch_generator.video_embedder.weight"] = torch.randn(32, 96)
    for j in range(2):
        sd[base + f"model.blocks.{j}.layer_scale1.lambda1"] = torch.full((32,), 0.5)
        sd[base + f"model.blocks.{j}.layer_scale2.lambda1"] = torch.full((32,), 2.0)
    vm2, mlp2 = RadioVisionModel(cfg), Projector.from_config(cfg)
    found = load_vision_state_dict(vm2, mlp2, sd)
    assert found == [
        "vision_model.radio_model.input_conditioner.norm_mean",
        "vision_model.radio_model.input_conditioner.norm_std",
        "vision_model.radio_model.model.blocks.{j}.layer_scale1.lambda1 (j in 0-1)",
        "vision_model.radio_model.model.blocks.{j}.layer_scale2.lambda1 (j in 0-1)",
        "vision_model.radio_model.model.patch_generator.video_embedder.weight",
        "vision_model.radio_model.summary_idxs",
    ]
    rm = vm2.radio_model
    assert torch.equal(rm.summary_idxs, torch.tensor([0, 1]))
    assert torch.equal(rm.input_conditioner.norm_std, sd[base + "input_conditioner.norm_std"])
    assert rm.model.patch_generator.video_embedder.weight.shape == (32, 96)
    # the layer scales are applied: the output differs from the model without them
    x = torch.randn(1, 3, 16, 16)
    assert not torch.allclose(vm2(x), vm(x), atol=1e-3)
    # and the state dict round-trips with them
    assert set(f"vision_model.{k}" for k in vm2.state_dict()) == {k for k in sd if k.startswith("vision_model.")}


def test_unknown_missing_and_misshapen_tensors_are_named():
    cfg, vm, mlp1 = _tiny()
    sd = _checkpoint(vm, mlp1)
    sd["vision_model.radio_model.model.norm.weight"] = torch.ones(32)
    sd["vision_model.radio_model.model.blocks.1.attn.q_norm.weight"] = torch.ones(16)
    del sd["vision_model.radio_model.model.blocks.0.mlp.fc2.bias"]
    del sd["vision_model.radio_model.model.blocks.1.mlp.fc2.bias"]
    with pytest.raises(VisionWeightsError) as e:
        load_vision_state_dict(RadioVisionModel(cfg), Projector.from_config(cfg), sd, source="ckpt/model.safetensors")
    msg = str(e.value)
    assert "ckpt/model.safetensors" in msg
    assert "vision_model.radio_model.model.norm.weight" in msg
    assert "vision_model.radio_model.model.blocks.{j}.attn.q_norm.weight (j in 1)" in msg
    assert "vision_model.radio_model.model.blocks.{j}.mlp.fc2.bias (j in 0-1)" in msg

    sd = _checkpoint(vm, mlp1)
    sd["mlp1.1.weight"] = torch.zeros(41, 128)
    with pytest.raises(VisionWeightsError, match=r"wrong shape: mlp1\.1\.weight is \[41, 128\]"):
        load_vision_state_dict(RadioVisionModel(cfg), Projector.from_config(cfg), sd)

    with pytest.raises(VisionWeightsError, match=r"no tensors named mlp1\."):
        load_vision_state_dict(RadioVisionModel(cfg), Projector.from_config(cfg),
                               {k: v for k, v in _checkpoint(vm, mlp1).items() if not k.startswith("mlp1.")})


def test_12b_module_tree_on_meta_matches_the_spec():
    cfg = VisionConfig(num_prefix_tokens=16)
    with torch.device("meta"):
        vm, mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    shapes = {f"vision_model.{k}": tuple(v.shape) for k, v in vm.state_dict().items()}
    shapes.update({f"mlp1.{k}": tuple(v.shape) for k, v in mlp1.state_dict().items()})
    p = "vision_model.radio_model.model."
    expected = {
        p + "patch_generator.embedder.weight": (1280, 768),
        p + "patch_generator.pos_embed": (1, 16384, 1280),
        p + "patch_generator.cls_token.token": (16, 1280),
        "mlp1.0.weight": (5120,), "mlp1.1.weight": (20480, 5120), "mlp1.3.weight": (5120, 20480),
    }
    for j in range(32):
        b = f"{p}blocks.{j}."
        expected.update({
            b + "norm1.weight": (1280,), b + "norm1.bias": (1280,),
            b + "norm2.weight": (1280,), b + "norm2.bias": (1280,),
            b + "attn.qkv.weight": (3840, 1280), b + "attn.qkv.bias": (3840,),
            b + "attn.proj.weight": (1280, 1280), b + "attn.proj.bias": (1280,),
            b + "mlp.fc1.weight": (5120, 1280), b + "mlp.fc1.bias": (5120,),
            b + "mlp.fc2.weight": (1280, 5120), b + "mlp.fc2.bias": (1280,),
        })
    assert shapes == expected
    n_vit = sum(v.numel() for v in vm.parameters())
    assert n_vit == 32 * (12 * 1280**2 + 13 * 1280) + 768 * 1280 + 16384 * 1280 + 16 * 1280  # 651.65 M
    assert sum(v.numel() for v in mlp1.parameters()) == 5120 + 2 * 5120 * 20480          # 209.72 M
    blk = vm.radio_model.model.blocks[0]
    assert blk.norm1.eps == 1e-6 and blk.attn.heads == 16 and vm.radio_model.model.norm is None


# ---------------------------------------------------------------- against transformers (optional oracle)

@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    """A tiny transformers nemotron_h_omni model (RADIO tower + projector), random weights, saved to disk."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("transformers.models.nemotron_h_omni")
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3

    torch.manual_seed(0)
    vc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=4, max_img_size=64,
              num_cls_tokens=2, num_registers=3, video_temporal_patch_size=2)
    tc = dict(vocab_size=64, hidden_size=24, layers_block_type=["mlp"], num_attention_heads=2, num_key_value_heads=1,
              head_dim=12, intermediate_size=48, mamba_num_heads=2, mamba_head_dim=8, n_groups=1, ssm_state_size=8,
              num_nextn_predict_layers=0)
    cfg = transformers.NemotronH_Omni_Reasoning_V3_Config(
        vision_config=vc, text_config=tc, projector_hidden_size=40, vision_hidden_size=32, image_token_id=5)
    model = NemotronH_Omni_Reasoning_V3(cfg).eval()
    assert model.vision_final_layernorm is None  # the 12B VL model has no final vision norm
    with torch.no_grad():  # make every tensor matter: non-trivial norms, layer scales and RMSNorm weight
        for name, p in model.named_parameters():
            if not name.startswith("language_model."):
                p.copy_(torch.randn_like(p) * (0.3 if ("norm" in name or "lambda1" in name) else 0.2)
                        + (1.0 if (name.endswith("norm1.weight") or name.endswith("norm2.weight")
                                   or "lambda1" in name or name.endswith("layer_norm.weight")) else 0.0))
    path = tmp_path_factory.mktemp("hf_omni")
    model.save_pretrained(path)
    return model, path


def _load_ours(path):
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text())
    cfg = VisionConfig.from_hf(config, {"image_size": 32})
    vm, mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    found = load_vision_state_dict(vm, mlp1, load_file(path / "model.safetensors"), source=str(path))
    return cfg, vm, mlp1, found


def test_hf_checkpoint_names_load_strictly(hf_tiny):
    _, path = hf_tiny
    cfg, vm, mlp1, found = _load_ours(path)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.patch_size) == (32, 2, 2, 4)
    assert (cfg.projector_hidden_size, cfg.projector_output_size, cfg.num_prefix_tokens) == (40, 24, 5)
    assert vm.num_prefix == 5
    # transformers writes the layer scales, the video embedder and summary_idxs: all known, all loaded
    assert "vision_model.radio_model.model.patch_generator.video_embedder.weight" in found
    assert "vision_model.radio_model.model.blocks.{j}.layer_scale1.lambda1 (j in 0-1)" in found


def test_pos_embed_interpolation_matches_transformers(hf_tiny):
    model, path = hf_tiny
    _, vm, _, _ = _load_ours(path)
    emb = model.vision_model.embeddings
    for gh, gw in [(16, 16), (8, 8), (5, 11), (11, 5), (1, 7), (20, 3), (24, 24)]:
        with torch.no_grad():
            ref = emb._interpolate_position_embedding((gh, gw), torch.float32)
            ours = interpolate_pos_embed(vm.radio_model.model.patch_generator.pos_embed, gh, gw)
            assert_close(ours, ref, torch.float32, name=f"pos {gh}x{gw}")


@pytest.mark.parametrize("hw", [(32, 32), (24, 44), (80, 40), (8, 64)])
def test_encoder_features_match_transformers(hf_tiny, hw):
    model, path = hf_tiny
    _, vm, _, _ = _load_ours(path)
    x = torch.randn(3, 3, *hw, generator=torch.Generator().manual_seed(hw[0] * 100 + hw[1]))
    with torch.no_grad():
        ref = model.vision_model(x).features
        ours = vm(x)
    assert_close(ours, ref, torch.float32, name=f"features {hw}")


def test_encoder_plus_projector_match_transformers(hf_tiny):
    """The whole image path: tiles -> RADIO -> pixel shuffle -> mlp1, against get_image_features (packed input)."""
    model, path = hf_tiny
    _, vm, mlp1, _ = _load_ours(path)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        patches = model.vision_model.embeddings._image_to_patches(x).flatten(0, 1)  # their own packing
        ref = torch.stack(model.get_image_features(patches, torch.tensor([[8, 8]] * 4)).pooler_output)
        ours = embed_tiles(vm, mlp1, x)
        # and their pixel shuffle on our features, to pin the channel order separately
        feats = vm(x)
        theirs_ps = type(model).pixel_shuffle(None, feats.view(4, 8, 8, 32), 0.5).flatten(1, 2)
    assert ours.shape == (4, 16, 24)
    assert_close(ours, ref, torch.float32, name="image embeddings")
    assert torch.equal(pixel_shuffle(feats, 8, 8), theirs_ps)


def test_adapt_then_holotron_weights_loader(hf_tiny, tmp_path):
    """The package's strict safetensors loader checks names against state_dict() before loading:
    adapt_to_checkpoint (from the file header alone) makes the meta-built tree match the checkpoint."""
    import dataclasses

    from safetensors.torch import load_file, save_file

    from holotron.weights import load_into, read_header

    _, path = hf_tiny
    cfg, vm_ref, mlp_ref, _ = _load_ours(path)
    f = tmp_path / "vision.safetensors"
    save_file({k: v for k, v in load_file(path / "model.safetensors").items()
               if k.startswith(("vision_model.", "mlp1."))}, f)
    cfg = dataclasses.replace(cfg, num_prefix_tokens=None)
    with torch.device("meta"):
        box = torch.nn.Module()
        box.vision_model, box.mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    created = box.vision_model.adapt_to_checkpoint({n: s for n, (_, s) in read_header(f).items()},
                                                   prefix="vision_model.")
    assert "radio_model.model.patch_generator.video_embedder" in created and "radio_model.summary_idxs" in created
    load_into(box, f)
    assert box.vision_model.num_prefix == 5
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(embed_tiles(box.vision_model, box.mlp1, x), embed_tiles(vm_ref, mlp_ref, x))
