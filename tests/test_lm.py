"""HybridLM: config parsing, the 12B layout on the meta device, prefill/decode and padding invariants."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import assert_close
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)

import holotron
from holotron import kernels
from holotron.config import ConfigError, TextConfig
from holotron.lm import HybridLM
from holotron.state import KVCache, MambaState

# ----------------------------------------------------------------------------- config


def _hf(**kw):
    d = {"hybrid_override_pattern": "M-*", "hidden_size": 32, "vocab_size": 96}
    d.update(kw)
    return d


def test_pattern_and_layers_block_type_agree():
    a = TextConfig.from_hf(_hf(hybrid_override_pattern="M-M*-"))
    b = TextConfig.from_hf({"hidden_size": 32, "vocab_size": 96,
                            "layers_block_type": ["linear_attention", "mlp", "linear_attention", "full_attention",
                                                  "mlp"]})
    assert a.hybrid_override_pattern == b.hybrid_override_pattern == "M-M*-"
    assert a.layer_kinds == ["mamba", "mlp", "mamba", "attention", "mlp"]
    with pytest.raises(ConfigError, match="contradicts layers_block_type"):
        TextConfig.from_hf(_hf(hybrid_override_pattern="M-", layers_block_type=["mlp", "linear_attention"]))


def test_old_spellings_and_head_dim_alias():
    c = TextConfig.from_hf(_hf(mamba_n_groups=4, mamba_d_conv=3, mamba_chunk_size=16, mamba_conv_bias=False,
                               attention_head_dim=64, rms_norm_eps=1e-6, mamba_dt_limit=[0.0, 1e9]))
    assert (c.n_groups, c.conv_kernel, c.chunk_size, c.use_conv_bias, c.head_dim) == (4, 3, 16, False, 64)
    assert c.layer_norm_epsilon == 1e-6 and c.time_step_limit == (0.0, 1e9)
    with pytest.raises(ConfigError, match="mamba_n_groups .* contradicts n_groups"):
        TextConfig.from_hf(_hf(mamba_n_groups=4, n_groups=2))


@pytest.mark.parametrize("eos, want", [(2, (2,)), ([2, 12], (2, 12)), (None, ())])
def test_eos_int_list_or_null(eos, want):
    c = TextConfig.from_hf(_hf(eos_token_id=eos, bos_token_id=None, pad_token_id=None))
    assert c.eos_token_id == want and c.bos_token_id is None and c.pad_token_id is None


@pytest.mark.parametrize("text", ['[0.0, Infinity]', '[0.0, {"__float__": "Infinity"}]', '[0.0, "inf"]'])
def test_time_step_limit_infinity_spellings(text):
    c = TextConfig.from_hf(json.loads('{"hybrid_override_pattern": "M", "time_step_limit": %s}' % text))
    assert c.time_step_limit == (0.0, math.inf)


@pytest.mark.parametrize("kw, field", [
    (dict(hybrid_override_pattern="M-E*"), r"hybrid_override_pattern\[2\] is 'E': mixture-of-experts"),
    (dict(hybrid_override_pattern=None, layers_block_type=["mlp", "moe"]), r"layers_block_type\[1\] is 'moe'"),
    (dict(hybrid_override_pattern="M-X"), r"hybrid_override_pattern\[2\] is 'X': unknown layer type"),
    (dict(hybrid_override_pattern=None, layers_block_type=["mamba2_conv"]), r"layers_block_type\[0\].*unknown"),
    (dict(num_nextn_predict_layers=1), "num_nextn_predict_layers=1 is not supported.*multi-token prediction"),
    (dict(sliding_window=4096), "sliding_window=4096 is not supported"),
    (dict(mlp_hidden_act="silu"), "mlp_hidden_act='silu' is not supported"),
    (dict(attention_bias=True), "attention_bias=True is not supported"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings=True is not supported"),
    (dict(hybrid_override_pattern=None), "neither hybrid_override_pattern nor layers_block_type"),
    (dict(num_hidden_layers=5), "num_hidden_layers is 5 but hybrid_override_pattern has 3"),
    (dict(mamba_num_heads=6, n_groups=4), r"mamba_num_heads \(6\) must be a multiple of n_groups \(4\)"),
    (dict(time_step_limit=[0.0, "lots"]), r"time_step_limit\[1\]: expected a number"),
    (dict(eos_token_id="2"), "eos_token_id: expected a token id"),
])
def test_unsupported_or_invalid_configs_name_the_field(kw, field):
    d = _hf(**kw)
    if d.get("hybrid_override_pattern") is None:
        d.pop("hybrid_override_pattern")
    with pytest.raises(ConfigError, match=field):
        TextConfig.from_hf(d)


def test_accepted_defaults_of_other_writers():
    """Fields transformers always writes (MoE sizes, mtp_layers_block_type, null sliding window) are fine
    as long as no layer uses them."""
    c = TextConfig.from_hf(_hf(n_routed_experts=8, moe_intermediate_size=7688, num_nextn_predict_layers=0,
                               mtp_layers_block_type=["full_attention", "moe"], sliding_window=None))
    assert c.hybrid_override_pattern == "M-*"


def test_config_round_trip():
    c = tiny_config(hybrid_override_pattern="*M-M", eos_token_id=(2, 12), time_step_limit=(0.0, math.inf))
    text = json.dumps(c.to_hf())
    assert "Infinity" in text
    d = json.loads(text)
    assert d["layers_block_type"] == ["full_attention", "linear_attention", "mlp", "linear_attention"]
    assert TextConfig.from_hf(d) == c


# ----------------------------------------------------------------------------- the real 12B layout


def test_12b_on_meta_device_names_shapes_and_count():
    cfg = TextConfig()  # defaults are Nemotron-Nano-12B-v2's
    with torch.device("meta"):
        model = HybridLM(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert len(cfg.hybrid_override_pattern) == 62
    assert (cfg.layer_kinds.count("mamba"), cfg.layer_kinds.count("attention"),
            cfg.layer_kinds.count("mlp")) == (28, 6, 28)
    want = {
        "backbone.embeddings.weight": (131072, 5120),
        "backbone.norm_f.weight": (5120,),
        "lm_head.weight": (131072, 5120),
        "backbone.layers.0.norm.weight": (5120,),
        "backbone.layers.0.mixer.in_proj.weight": (22656, 5120),
        "backbone.layers.0.mixer.conv1d.weight": (12288, 1, 4),
        "backbone.layers.0.mixer.conv1d.bias": (12288,),
        "backbone.layers.0.mixer.A_log": (128,),
        "backbone.layers.0.mixer.D": (128,),
        "backbone.layers.0.mixer.dt_bias": (128,),
        "backbone.layers.0.mixer.norm.weight": (10240,),
        "backbone.layers.0.mixer.out_proj.weight": (5120, 10240),
        "backbone.layers.1.mixer.up_proj.weight": (20480, 5120),
        "backbone.layers.1.mixer.down_proj.weight": (5120, 20480),
        "backbone.layers.7.mixer.q_proj.weight": (5120, 5120),
        "backbone.layers.7.mixer.k_proj.weight": (1024, 5120),
        "backbone.layers.7.mixer.v_proj.weight": (1024, 5120),
        "backbone.layers.7.mixer.o_proj.weight": (5120, 5120),
    }
    for n, s in want.items():
        assert shapes[n] == s, n
    assert cfg.hybrid_override_pattern[7] == "*"
    # every name is one of the checkpoint's forms
    import re
    pat = re.compile(r"^(backbone\.(embeddings|norm_f)\.weight|lm_head\.weight|"
                     r"backbone\.layers\.\d+\.(norm\.weight|mixer\."
                     r"(in_proj\.weight|conv1d\.(weight|bias)|A_log|D|dt_bias|norm\.weight|out_proj\.weight|"
                     r"[qkvo]_proj\.weight|up_proj\.weight|down_proj\.weight)))$")
    assert all(pat.match(n) for n in shapes), [n for n in shapes if not pat.match(n)]
    per_layer = {}
    for i, kind in enumerate(cfg.layer_kinds):
        per_layer.setdefault(kind, sum(p.numel() for n, p in model.named_parameters()
                                       if n.startswith(f"backbone.layers.{i}.mixer.")))
    assert round(per_layer["mamba"] / 1e6, 1) == 168.5
    assert round(per_layer["attention"] / 1e6, 1) == 62.9
    assert round(per_layer["mlp"] / 1e6, 1) == 209.7
    total = model.num_parameters()
    assert total == cfg.num_parameters()
    assert abs(total / 1e9 - 12.31) < 0.01, total


# ----------------------------------------------------------------------------- prefill + decode


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M-*M"), seed=3)


def _ids(b, t, seed=0, vocab=96):
    return torch.randint(3, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _run_split(model, ids, cuts, mask=None):
    """Logits of ``ids`` fed in pieces cut at ``cuts`` through one state."""
    state = model.new_state(ids.shape[0])
    outs, prev = [], 0
    for c in list(cuts) + [ids.shape[1]]:
        if c > prev:
            outs.append(model(ids[:, prev:c], state=state,
                              attention_mask=None if mask is None else mask[:, :c]))
            prev = c
    return torch.cat(outs, 1), state


@torch.no_grad()
@pytest.mark.parametrize("t", [1, 7, 9, 13, 21])
def test_full_forward_equals_prefill_then_teacher_forced_decode(model, t):
    ids = _ids(2, t, seed=t)
    full = model(ids)
    p = max(1, t // 2 + 1)  # prefill length not a multiple of chunk_size 8 (for t > 1)
    logits, state = _run_split(model, ids, list(range(p, t)))
    assert_close(logits, full, name=f"prefill {p} + decode {t - p}")
    assert state.seqlen == t


@torch.no_grad()
@settings(max_examples=12)
@given(cuts=st.lists(st.integers(1, 22), max_size=4).map(lambda c: sorted(set(c))))
@example(cuts=[8, 16])
@example(cuts=[1, 2, 3])
@example(cuts=[7, 9, 17])
def test_chunked_prefill_in_several_calls_equals_one_call(model, cuts):
    ids = _ids(2, 23, seed=1)
    logits, _ = _run_split(model, ids, cuts)
    assert_close(logits, model(ids), name=f"cuts {cuts}")


@torch.no_grad()
def test_states_after_split_prefill_equal_one_call(model):
    ids = _ids(2, 19, seed=2)
    _, s1 = _run_split(model, ids, [])
    _, s2 = _run_split(model, ids, [5, 6, 14])
    for a, b in zip(s1.layers, s2.layers):
        if isinstance(a, MambaState):
            assert_close(b.conv, a.conv, name="conv window")
            assert_close(b.ssm, a.ssm, name="ssm state")
        elif isinstance(a, KVCache):
            assert_close(b.k[:, :, :19], a.k[:, :, :19], name="keys")


@torch.no_grad()
@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_scan_backends_agree_on_the_model(model, backend):
    """The model under each backend == chunked, prefill + decode: on the GPU when there is one (compiled
    Triton), else on the CPU (Triton through its interpreter)."""
    import copy

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if backend not in kernels.available_backends(dev):
        pytest.skip(f"{backend} cannot run here")
    model = copy.deepcopy(model).to(dev)
    ids = _ids(2, 13, seed=4).to(dev)
    with kernels.use_backend("chunked"):
        ref, _ = _run_split(model, ids, [10, 11, 12])
    with kernels.use_backend(backend):
        got, _ = _run_split(model, ids, [10, 11, 12])
    assert_close(got, ref, name=f"{backend} vs chunked")


# ----------------------------------------------------------------------------- padding


def _left_pad(rows, pad_id=0):
    t = max(len(r) for r in rows)
    ids = torch.full((len(rows), t), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), t, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, t - len(r):] = r
        mask[i, t - len(r):] = 1
    return ids, mask


@torch.no_grad()
@pytest.mark.parametrize("lengths", [(13, 5, 1), (9, 17, 2, 11)])
def test_mixed_length_batch_equals_each_row_alone(model, lengths):
    rows = [_ids(1, n, seed=10 + n)[0] for n in lengths]
    ids, mask = _left_pad(rows, pad_id=7)  # a pad id that is an ordinary token: only the mask may hide it
    t = ids.shape[1]
    batch = model(ids, attention_mask=mask)
    # the same batch through prefill in pieces and decode
    split, state = _run_split(model, ids, [3, t - 2, t - 1], mask=mask)
    cont = _ids(len(rows), 4, seed=99)
    steps = [model(cont[:, i:i + 1], state=state) for i in range(4)]
    for i, r in enumerate(rows):
        n = len(r)
        alone = model(torch.cat([r, cont[i]])[None])
        assert_close(batch[i, t - n:], alone[0, :n], name=f"row {i} full forward")
        assert_close(split[i, t - n:], alone[0, :n], name=f"row {i} split prefill")
        assert_close(torch.cat(steps, 1)[i], alone[0, n:], name=f"row {i} decode after padded prefill")
    assert torch.isfinite(batch).all()


@torch.no_grad()
def test_masked_positions_anywhere_leave_no_trace(model):
    """A pad in the middle or at the end of a call (right padding) is as if absent: the conv window is
    taken from real tokens, dt and x are 0 there, attention skips it."""
    real = _ids(1, 12, seed=5)
    keep = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1])
    ids = torch.full((1, keep.numel()), 9, dtype=torch.long)
    ids[0, keep.bool()] = real[0]
    out, state = _run_split(model, ids, [5, 14], mask=keep[None])
    alone, s_alone = _run_split(model, real, [])
    assert_close(out[0, keep.bool()], alone[0], name="logits at real positions")
    nxt = _ids(1, 3, seed=6)
    a = torch.cat([model(nxt[:, i:i + 1], state=state) for i in range(3)], 1)
    b = torch.cat([model(nxt[:, i:i + 1], state=s_alone) for i in range(3)], 1)
    assert_close(a, b, name="decode after interior and trailing pads")


@torch.no_grad()
def test_a_row_of_pads_only_stays_finite_and_empty(model):
    ids, mask = _left_pad([_ids(1, 6, seed=8)[0], _ids(1, 1, seed=9)[0]])
    state = model.new_state(2)
    first = model(ids[:, :3], state=state, attention_mask=mask[:, :3])  # row 1 is all pads in this call
    assert torch.isfinite(first).all()
    for s in state.layers:
        if isinstance(s, MambaState):
            assert s.ssm[1].abs().max() == 0 and s.conv[1].abs().max() == 0


# ----------------------------------------------------------------------------- the state


@torch.no_grad()
def test_mamba_state_is_constant_size_kv_grows():
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M"), seed=1)
    state = model.new_state(2)
    model(_ids(2, 5), state=state)
    tok = _ids(2, 1, seed=3)
    sizes = {}
    for step in range(1, 1001):
        model(tok, state=state)
        if step in (10, 1000):
            sizes[step] = state.nbytes(used_only=True)
            shapes = [tuple(s.ssm.shape) + tuple(s.conv.shape) for s in state.layers if isinstance(s, MambaState)]
            sizes[step]["shapes"] = shapes
    assert sizes[10]["mamba"] == sizes[1000]["mamba"] > 0
    assert sizes[10]["shapes"] == sizes[1000]["shapes"]
    cfg = model.config
    kv_per_token = 2 * 2 * cfg.num_key_value_heads * cfg.head_dim * 4  # batch 2, k and v, fp32
    assert sizes[1000]["attention"] - sizes[10]["attention"] == 990 * kv_per_token
    assert state.seqlen == 1005


@torch.no_grad()
def test_state_select_drops_and_reorders_rows(model):
    ids = _ids(3, 11, seed=12)
    state = model.new_state(3)
    model(ids, state=state)
    state.select(torch.tensor([2, 0]))
    nxt = _ids(2, 2, seed=13)
    got = torch.cat([model(nxt[:, i:i + 1], state=state) for i in range(2)], 1)
    for j, r in enumerate([2, 0]):
        alone = model(torch.cat([ids[r], nxt[j]])[None])[0, -2:]
        assert_close(got[j], alone, name=f"selected row {r}")
    with pytest.raises(ValueError, match="out of range"):
        state.select([5])


def test_state_is_allocated_per_layer_dtype_and_reserved():
    model = tiny_lm(tiny_config(), seed=0, dtype=torch.bfloat16)
    state = model.new_state(2, capacity=16)
    for blk, s in zip(model.backbone.layers, state.layers):
        if blk.kind == "mamba":
            assert s.ssm.dtype == torch.float32 and s.conv.dtype == torch.bfloat16
            assert s.conv.shape == (2, blk.mixer.conv_dim, 4) and s.ssm.shape == (2, 4, 10, 8)
        elif blk.kind == "attention":
            assert s.k.dtype == torch.bfloat16 and s.capacity == 16
        else:
            assert s is None
    assert model.backbone.layers[0].mixer.A_log.dtype == torch.float32  # kept fp32 by .to(bfloat16)


@torch.no_grad()
def test_bf16_model_tracks_fp32(model):
    ids = _ids(2, 13, seed=14)
    ref = model(ids)
    low = tiny_lm(model.config, seed=3, dtype=torch.bfloat16)
    logits, _ = _run_split(low, ids, [9, 10, 11, 12])
    assert_close(logits, ref, rtol=5e-2, name="bf16 prefill + decode vs fp32")


def test_input_errors(model):
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model()
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(_ids(2, 4), attention_mask=torch.ones(2, 5))
    state = model.new_state(3)
    with pytest.raises(ValueError, match="state holds 3 rows but the input has 2"):
        model(_ids(2, 4), state=state)


@torch.no_grad()
def test_inputs_embeds_equals_input_ids(model):
    ids = _ids(2, 9, seed=15)
    assert torch.equal(model(inputs_embeds=model.backbone.embeddings(ids)), model(ids))
    assert_close(model(ids, logits_to_keep=1), model(ids)[:, -1:], name="logits_to_keep")


def test_public_names():
    assert holotron.HybridLM is HybridLM
    assert holotron.TextConfig is TextConfig


@torch.no_grad()
def test_residual_in_fp32_keeps_the_stream_fp32(model):
    ids = _ids(2, 11, seed=16)
    ref = model(ids)
    cfg = tiny_config(hybrid_override_pattern=model.config.hybrid_override_pattern, residual_in_fp32=True)
    same = tiny_lm(cfg, seed=3)
    assert torch.equal(same(ids), ref)  # a no-op for an fp32 model
    off = tiny_lm(model.config, seed=3, dtype=torch.bfloat16)
    on = tiny_lm(cfg, seed=3, dtype=torch.bfloat16)
    seen = []
    on.backbone.layers[1].register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    got = on(ids)
    assert seen == [torch.float32] and not torch.equal(got, off(ids))
    assert_close(got, ref, rtol=5e-2, name="bf16 with an fp32 residual stream")
