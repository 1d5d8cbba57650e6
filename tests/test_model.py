"""The Holotron VL model end to end: the tiny checkpoint in the real format, processor -> model ->
generate on a PNG, logits against transformers' nemotron_h_omni, prefill + decode == full forward with an
image prefix, batches of images with different tile counts, the <image> count check, both config
spellings, a hub-style cache offline, and bf16."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import assert_close, rel_rms
from PIL import Image
from tiny_lm import scan_backend_of_the_device  # noqa: F401 (autouse fixture)
from tiny_vl import (
    END_OF_TURN_ID,
    IMAGE_TOKEN_ID,
    MAX_NUM_TILES,
    TILE,
    TOKENS_PER_TILE,
    randomize_vl_,
    tiny_vl,
    tiny_vl_config,
    write_tiny_vl_checkpoint,
)

import holotron
from holotron.config import ConfigError
from holotron.generate import generate
from holotron.model import Holotron, HolotronConfig, ImageTokenError
from holotron.processor import ModelNotFoundError, Processor
from holotron.weights import CheckpointError

IMG_START, IMG_END = 19, 20


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_vl_checkpoint(tmp_path_factory.mktemp("vl") / "tiny-vl", seed=3)


@pytest.fixture(scope="module")
def model(ckpt):
    return holotron.load(ckpt)


@pytest.fixture(scope="module")
def processor(ckpt):
    return Processor.from_pretrained(ckpt)


def _png(path, w, h, seed):
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return path


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """Three screenshots: 1 tile (no thumbnail), 2x1 tiles + thumbnail, 3x1 tiles + thumbnail."""
    d = tmp_path_factory.mktemp("png")
    return {1: _png(d / "square.png", 40, 36, 0), 3: _png(d / "wide.png", 96, 40, 1),
            4: _png(d / "wider.png", 100, 30, 2)}


def _ask(text, image=True):
    content = ([{"type": "image"}] if image else []) + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def _image_prompt(tiles, before=(5, 40, 41), after=(42, 43, 44, 45, 46)):
    """Token ids: text, <img> + <image> x (tiles x 16) + </img>, text."""
    return list(before) + [IMG_START] + [IMAGE_TOKEN_ID] * (tiles * TOKENS_PER_TILE) + [IMG_END] + list(after)


def _tiles(n, seed):
    return torch.randn(n, 3, TILE, TILE, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------
# the tiny checkpoint: real format, loader, processor, generate on a PNG
# ------------------------------------------------------------------------------------------------

def test_tiny_checkpoint_is_in_the_real_format(ckpt):
    files = {p.name for p in ckpt.iterdir()}
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json",
            "tokenizer.json", "tokenizer_config.json"} <= files
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["NemotronH_Nano_VL_V2"] and cfg["model_type"] == "NemotronH_Nano_VL_V2"
    assert cfg["img_context_token_id"] == IMAGE_TOKEN_ID and cfg["img_context_token"] == "<image>"
    assert (cfg["img_start_token"], cfg["img_end_token"]) == ("<img>", "</img>")
    assert cfg["vit_hidden_size"] == cfg["vision_config"]["hidden_size"] == 32
    assert cfg["force_image_size"] == TILE and cfg["ps_version"] == "v2" and cfg["downsample_ratio"] == 0.5
    assert cfg["llm_config"]["hidden_size"] == 32 and "text_config" not in cfg and "image_token_id" not in cfg
    pre = json.loads((ckpt / "preprocessor_config.json").read_text())
    assert (pre["image_size"], pre["max_num_tiles"], pre["use_thumbnail"]) == (TILE, MAX_NUM_TILES, True)
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert END_OF_TURN_ID in gen["eos_token_id"]
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) <= cfg["llm_config"]["vocab_size"]


def test_load_and_processor_share_the_folder(model, processor):
    assert isinstance(model, Holotron) and not model.training
    assert model.config.tokens_per_tile == TOKENS_PER_TILE
    assert processor.image_token_id == model.config.image_token_id == IMAGE_TOKEN_ID
    assert processor.vocab_size <= model.config.text.vocab_size
    assert END_OF_TURN_ID in model.generation_config["eos_token_id"]
    assert END_OF_TURN_ID in processor.stop_token_ids


@torch.no_grad()
def test_png_prompt_through_processor_model_and_generate(model, processor, pngs):
    batch = processor(_ask("click the search button"), images=pngs[3])
    assert batch.num_tiles.tolist() == [3] and batch.pixel_values.shape == (3, 3, TILE, TILE)
    ids = batch.input_ids
    assert int((ids == IMAGE_TOKEN_ID).sum()) == 3 * TOKENS_PER_TILE
    logits = model(**batch)  # the processor's whole output, num_tiles included, is the model's input
    assert logits.shape == (1, ids.shape[1], model.config.text.vocab_size) and torch.isfinite(logits).all()

    n = 6
    new = generate(model, ids, n, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values,
                   eos_token_id=[])
    assert new.shape == (1, n)
    # greedy tokens are the argmax of a full teacher-forced forward over prompt + answer
    full = model(torch.cat([ids, new], 1), pixel_values=batch.pixel_values)
    assert torch.equal(full[:, ids.shape[1] - 1:-1].argmax(-1), new)
    assert isinstance(processor.decode(new[0]), str)
    # and the image reaches the answer: another screenshot changes the logits
    other = model(ids, pixel_values=batch.pixel_values.flip(-1))
    assert rel_rms(other[:, -1], logits[:, -1]) > 1e-2


@torch.no_grad()
def test_image_embeds_and_inputs_embeds_paths_equal_pixel_values(model):
    ids = torch.tensor([_image_prompt(2)])
    px = _tiles(2, 1)
    ref = model(ids, px)
    emb = model.embed_images(px)
    assert emb.shape == (2, TOKENS_PER_TILE, 32)
    assert torch.equal(model(ids, image_embeds=emb), ref)
    assert torch.equal(model(ids, image_embeds=emb.reshape(-1, 32)), ref)
    assert torch.equal(model(inputs_embeds=model.embed_inputs(ids, px)), ref)
    # the image rows sit at the <image> positions, in order (tile, token row-major); the text rows are the table's
    x = model.embed_inputs(ids, px)[0]
    pos = (ids[0] == IMAGE_TOKEN_ID).nonzero().squeeze(1)
    assert torch.equal(x[pos], emb.reshape(-1, 32))
    assert torch.equal(x[:3], model.language_model.backbone.embeddings.weight[ids[0, :3]])


def test_gradients_reach_the_vision_tower_and_projector():
    model = tiny_vl(seed=4).train()
    ids = torch.tensor([_image_prompt(1)])
    model(ids, _tiles(1, 5))[0, -1].logsumexp(-1).backward()
    for name in ("vision_model.radio_model.model.patch_generator.embedder.weight",
                 "vision_model.radio_model.model.blocks.0.attn.qkv.weight", "mlp1.1.weight", "mlp1.3.weight",
                 "language_model.backbone.layers.0.mixer.in_proj.weight"):
        g = model.get_parameter(name).grad
        assert g is not None and g.abs().max() > 0, name


# ------------------------------------------------------------------------------------------------
# transformers' nemotron_h_omni as an independent oracle
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """transformers' NemotronH_Omni_Reasoning_V3 (random tiny weights, fp32, the dt clamp removed), its
    save_pretrained folder (the newer config spelling), and holotron.load of that folder."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("transformers.models.nemotron_h_omni")
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3

    vc = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, patch_size=4, max_img_size=64,
              num_cls_tokens=1, num_registers=3, mlp_ratio=2.0, video_temporal_patch_size=2)
    tc = dict(vocab_size=96, hidden_size=32, layers_block_type=["mamba", "attention", "mlp", "mamba"],
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48, mamba_num_heads=4,
              mamba_head_dim=10, n_groups=2, ssm_state_size=8, conv_kernel=4, chunk_size=8,
              num_nextn_predict_layers=0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg = transformers.NemotronH_Omni_Reasoning_V3_Config(
        vision_config=vc, text_config=tc, projector_hidden_size=48, vision_hidden_size=32,
        image_token_id=IMAGE_TOKEN_ID, force_image_size=TILE)
    torch.manual_seed(0)
    hf = NemotronH_Omni_Reasoning_V3(cfg).float().eval()
    randomize_vl_(hf, seed=5)
    n = 0
    for m in hf.modules():  # transformers' torch Mamba prefill clamps dt >= time_step_min; the real kernels do not
        if hasattr(m, "time_step_limit"):
            m.time_step_limit = (0.0, float("inf"))
            n += 1
    assert n == 2, "transformers' Mamba mixer no longer has time_step_limit"
    folder = tmp_path_factory.mktemp("hf_omni")
    hf.save_pretrained(folder)
    return hf, folder, holotron.load(folder)


def _hf_logits(hf, ids, tiles):
    patches = hf.vision_model.embeddings._image_to_patches(tiles).flatten(0, 1)  # their packed input
    grid = torch.tensor([[TILE // 4, TILE // 4]] * tiles.shape[0])
    return hf(input_ids=ids, pixel_values=patches, image_grid_hw=grid, use_cache=False).logits


def test_transformers_checkpoint_uses_the_newer_spelling(hf_pair):
    _, folder, ours = hf_pair
    cfg = json.loads((folder / "config.json").read_text())
    assert {"text_config", "image_token_id", "vision_hidden_size"} <= set(cfg)
    assert not {"llm_config", "img_context_token_id", "vit_hidden_size"} & set(cfg)
    assert isinstance(ours, Holotron) and ours.config.image_token_id == IMAGE_TOKEN_ID
    assert ours.vision_model.num_prefix == 4 and ours.config.text.layer_kinds == ["mamba", "attention", "mlp", "mamba"]


@torch.no_grad()
def test_logits_match_transformers(hf_pair):
    hf, _, ours = hf_pair
    # two rows of one length: row 0 one 3-tile image, row 1 two 1-tile images (their batch is unpadded)
    row0 = _image_prompt(3, before=(5, 40, 41, 42), after=(43, 44))
    row1 = _image_prompt(1, before=(60,), after=(61, 62)) + _image_prompt(1, before=(63,), after=tuple(range(64, 80)))
    assert len(row0) == len(row1)
    ids = torch.tensor([row0, row1])
    tiles = _tiles(5, 2)
    ref = _hf_logits(hf, ids, tiles)
    got = ours(ids, tiles)
    assert ref.abs().max() > 1.0  # not a degenerate random model
    assert_close(got, ref, name="VL logits vs transformers")
    # one row alone, and the image positions matter to both
    assert_close(ours(ids[:1], tiles[:3]), _hf_logits(hf, ids[:1], tiles[:3]), name="one row")
    assert rel_rms(ours(ids[:1], tiles[:3] * 0.5), ref[:1]) > 1e-2


@torch.no_grad()
def test_holotron_save_reads_back_in_transformers(hf_pair, tmp_path):
    """holotron writes the real checkpoint's spelling (llm_config, img_context_token_id, vit_hidden_size);
    transformers reads it (its legacy names) into the same model."""
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3

    hf, folder, ours = hf_pair
    hf_cfg = json.loads((folder / "config.json").read_text())
    parsed = HolotronConfig.from_hf(hf_cfg)
    assert HolotronConfig.from_hf(json.loads(json.dumps(parsed.to_hf()))) == parsed
    holotron.save_pretrained(ours, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {"llm_config", "img_context_token_id", "vit_hidden_size"} <= set(written)
    back = NemotronH_Omni_Reasoning_V3.from_pretrained(tmp_path / "out").float().eval()
    for m in back.modules():
        if hasattr(m, "time_step_limit"):
            m.time_step_limit = (0.0, float("inf"))
    assert back.config.image_token_id == IMAGE_TOKEN_ID and back.config.vision_hidden_size == 32
    ids = torch.tensor([_image_prompt(2)])
    tiles = _tiles(2, 6)
    assert_close(_hf_logits(back, ids, tiles), ours(ids, tiles), name="holotron-saved checkpoint in transformers")


# ------------------------------------------------------------------------------------------------
# prefill + decode == full forward; batches of images with different tile counts
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
@pytest.mark.parametrize("split", [None, 3])
def test_prefill_then_decode_equals_full_forward_with_image_prefix(model, split):
    prompt = _image_prompt(2, before=(5, 40, 41, 42, 43))  # 5 + 34 + 5 = 44 tokens: not a multiple of chunk 8
    answer = [70, 71, 72, 73, 74, 75, 76]
    ids = torch.tensor([prompt + answer])
    px = _tiles(2, 3)
    full = model(ids, px)

    T = len(prompt)
    state = model.new_state(1)
    if split is None:
        parts = [model(ids[:, :T], px, state=state)]
    else:  # prefill in two calls: the text before the image, then the image and the rest
        parts = [model(ids[:, :split], state=state), model(ids[:, split:T], px, state=state)]
    for t in range(T, ids.shape[1]):
        parts.append(model(ids[:, t:t + 1], state=state))
    assert state.seqlen == ids.shape[1]
    assert_close(torch.cat(parts, 1), full, name="prefill + decode vs full forward")


@torch.no_grad()
def test_batch_with_different_tile_counts_equals_each_alone(model, processor, pngs):
    prompts = [_ask("click the blue icon in the top left corner of the window"), _ask("open")]
    images = [pngs[1], pngs[4]]
    batch = processor(prompts, images=images)
    assert batch.num_tiles.tolist() == [1, 4]
    mask = batch.attention_mask.bool()
    assert not mask[0].all() or not mask[1].all()  # left padding happened
    logits = model(**batch)
    n = 6
    new = generate(model, batch.input_ids, n, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values,
                   eos_token_id=[])
    for b in range(2):
        alone = processor(prompts[b], images=images[b])
        assert torch.equal(alone.input_ids[0], batch.input_ids[b][mask[b]])
        ref = model(**alone)
        assert_close(logits[b][mask[b]], ref[0], name=f"row {b} at real positions")
        ref_new = generate(model, alone.input_ids, n, pixel_values=alone.pixel_values, eos_token_id=[])
        assert torch.equal(new[b], ref_new[0]), (b, new[b], ref_new[0])


# ------------------------------------------------------------------------------------------------
# the <image> positions must match the images
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def test_image_token_count_must_match(model):
    two = _tiles(2, 4)
    with pytest.raises(ImageTokenError, match=r"input_ids hold 16 <image> positions but the images give 32 "
                                              r"embeddings \(2 tiles x 16 tokens\)"):
        model(torch.tensor([_image_prompt(1)]), two)                      # too few placeholders
    with pytest.raises(ImageTokenError, match=r"hold 48 <image> positions but the images give 32 embeddings"):
        model(torch.tensor([_image_prompt(3)]), two)                      # too many placeholders
    with pytest.raises(ImageTokenError, match=r"hold 0 <image> positions but the images give 32 embeddings"):
        model(torch.tensor([[5, 40, 41, 42]]), two)                       # images without placeholders
    with pytest.raises(ImageTokenError, match=r"hold 32 <image> positions \(id 18\) but no pixel_values were given"):
        model(torch.tensor([_image_prompt(2)]))                           # placeholders without images
    with pytest.raises(ImageTokenError, match=r"hold 16 <image> positions but the images give 17 embeddings"):
        model(torch.tensor([_image_prompt(1)]), image_embeds=torch.zeros(17, 32))
    for bad in (torch.tensor([_image_prompt(1)]), torch.tensor([_image_prompt(3)])):  # also through generate
        with pytest.raises(ImageTokenError, match="build the prompt with holotron.Processor"):
            generate(model, bad, 2, pixel_values=two)


@torch.no_grad()
def test_num_tiles_checks_each_image(model, processor, pngs):
    """With the processor's num_tiles, an image whose tiles land in another image's placeholders is an
    error even when the totals agree."""
    batch = processor([_ask("open"), _ask("close")], images=[pngs[1], pngs[3]])
    assert batch.num_tiles.tolist() == [1, 3]
    swapped = dict(batch, num_tiles=torch.tensor([3, 1]))
    with pytest.raises(ImageTokenError, match=r"image 0 \(row 0\) has 16 <image> positions but its 3 tiles give 48"):
        model(**swapped)
    with pytest.raises(ImageTokenError, match=r"num_tiles says 5 tiles but pixel_values hold 4"):
        model(**dict(batch, num_tiles=torch.tensor([1, 4])))
    with pytest.raises(ImageTokenError, match=r"2 images in num_tiles but 3 runs of <image> positions"):
        extra = torch.cat([batch.input_ids, torch.tensor([[40, 41, 42], [IMG_START, IMAGE_TOKEN_ID, IMG_END]])], 1)
        model(extra, batch.pixel_values, num_tiles=batch.num_tiles)


# ------------------------------------------------------------------------------------------------
# config.json: both spellings, round trip, refusals
# ------------------------------------------------------------------------------------------------

def _newer_spelling(d: dict) -> dict:
    d = dict(d)
    d["text_config"] = d.pop("llm_config")
    d["image_token_id"] = d.pop("img_context_token_id")
    d["vision_hidden_size"] = d.pop("vit_hidden_size")
    d["architectures"], d["model_type"] = ["NemotronH_Omni_Reasoning_V3"], "nemotron_h_omni"
    return d


def test_config_both_spellings_and_round_trip(ckpt):
    d = json.loads((ckpt / "config.json").read_text())
    pre = json.loads((ckpt / "preprocessor_config.json").read_text())
    old = HolotronConfig.from_hf(d, pre)
    new = HolotronConfig.from_hf(_newer_spelling(d), pre)
    assert old == new == tiny_vl_config()
    assert (old.text.hidden_size, old.vision.hidden_size, old.image_token_id) == (32, 32, IMAGE_TOKEN_ID)
    assert old.vision.max_num_tiles == MAX_NUM_TILES and old.tokens_per_tile == TOKENS_PER_TILE
    # to_hf writes the real checkpoint's spelling, whichever was read, and reads back equal
    for cfg in (old, new):
        out = cfg.to_hf()
        assert out["architectures"] == ["NemotronH_Nano_VL_V2"]
        assert {"llm_config", "img_context_token_id", "vit_hidden_size"} <= set(out)
        assert not {"text_config", "image_token_id", "vision_hidden_size"} & set(out)
        assert HolotronConfig.from_hf(json.loads(json.dumps(out)), cfg.vision.to_preprocessor_config()) == cfg
    # fields holotron does not model are kept for to_hf
    d2 = dict(d, video_pruning_rate=0.0, template="nemotron")
    assert HolotronConfig.from_hf(d2).to_hf()["template"] == "nemotron"


@pytest.mark.parametrize("change, message", [
    ({"audio_config": {"hidden_size": 8}}, r"audio_config: the audio branch is not implemented"),
    ({"sound_config": {"hidden_size": 8}}, r"audio_config: the audio branch is not implemented"),
    ({"ps_version": "v1"}, r"ps_version 'v1': only 'v2' is implemented \('v1' transposes the"),
    ({"img_context_token_id": 512}, r"img_context_token_id / image_token_id: expected a token id below vocab_size "
                                    r"512, got 512"),
    ({"img_context_token_id": -1}, r"expected a token id below vocab_size 512, got -1"),
    ({"img_context_token_id": True}, r"expected a token id below vocab_size 512, got True"),
    ({"img_context_token_id": None}, r"expected a token id below vocab_size 512, got None"),
    ({"llm_config": None}, r"llm_config / text_config: missing or not an object"),
    ({"vit_hidden_size": 64}, r"vit_hidden_size / vision_hidden_size \(64\) != the vision tower width \(32\)"),
])
def test_config_refusals(ckpt, change, message):
    d = {**json.loads((ckpt / "config.json").read_text()), **change}
    with pytest.raises(ConfigError, match=message):
        HolotronConfig.from_hf(d)


def test_load_names_the_config_file_in_refusals(ckpt, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(ckpt, folder)
    d = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**d, "audio_config": {"hidden_size": 8}}))
    with pytest.raises(ConfigError, match=r"m/config.json: audio_config: the audio branch is not implemented"):
        holotron.load(folder)


# ------------------------------------------------------------------------------------------------
# a repo id in a hub-style cache, offline
# ------------------------------------------------------------------------------------------------

def test_repo_id_from_the_hub_cache_offline(ckpt, model, tmp_path, monkeypatch):
    import huggingface_hub.constants  # imported before HF_HOME changes: its constants keep the old cache

    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-vl"
    shutil.copytree(ckpt, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # after huggingface_hub was imported: read at call time
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert huggingface_hub.constants.HF_HUB_CACHE != str(tmp_path / "hub")

    loaded = holotron.load("acme/tiny-vl")
    assert isinstance(loaded, Holotron)
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    proc = Processor.from_pretrained("acme/tiny-vl")
    assert proc.image_token_id == IMAGE_TOKEN_ID and proc.encode("<img>") == [IMG_START]

    with pytest.raises(CheckpointError) as err:
        holotron.load("acme/missing")
    msg = str(err.value)
    assert msg.startswith("acme/missing: not a local folder, and HF_HUB_OFFLINE is set "
                          "and it is not in the local cache")
    assert str(tmp_path / "hub") in msg and "\n" not in msg
    with pytest.raises(ModelNotFoundError) as err2:  # the processor goes through the same resolver
        Processor.from_pretrained("acme/missing")
    assert str(err2.value) == msg


# ------------------------------------------------------------------------------------------------
# bf16
# ------------------------------------------------------------------------------------------------

@torch.no_grad()
def test_bf16_runs_and_stays_close_to_fp32(ckpt, model, processor, pngs):
    half = holotron.load(ckpt, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert half.vision_model.radio_model.model.patch_generator.embedder.weight.dtype == torch.bfloat16
    assert half.mlp1[1].weight.dtype == torch.bfloat16
    assert half.language_model.backbone.layers[0].mixer.A_log.dtype == torch.float32  # SSM constants stay fp32
    batch = processor(_ask("click the button"), images=pngs[3])
    ref = model(**batch)
    got = half(**batch)
    assert got.dtype == torch.float32  # logits are fp32 whatever the model dtype
    assert_close(got, ref, torch.bfloat16, rtol=5e-2, name="bf16 vs fp32 logits")
    new = generate(half, batch.input_ids, 4, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values,
                   eos_token_id=[])
    assert new.shape == (1, 4)
    state = half.new_state(1)
    half(**batch, state=state)
    assert state.layers[0].ssm.dtype == torch.float32  # the recurrent state stays fp32 too


def test_tiny_builder_is_deterministic_and_checks_the_vocab(tmp_path):
    a, b = tiny_vl(seed=1), tiny_vl(seed=1)
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.mlp1[1].weight, tiny_vl(seed=2).mlp1[1].weight)
    with pytest.raises(ValueError, match=r"vocab_size 256 does not cover the tokenizer's 512"):
        write_tiny_vl_checkpoint(tmp_path / "small", model=tiny_vl(config=tiny_vl_config(text={"vocab_size": 256})))
