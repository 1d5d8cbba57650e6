"""Equivalence with the independent implementation in transformers (NemotronHForCausalLM, CPU fp32).

transformers writes the checkpoint (its ``save_pretrained``: ``backbone.*`` names, its own config.json
with ``{"__float__": "Infinity"}``), holotron loads it with ``holotron.load``, and both compare logits
and greedy tokens. Deviations handled here:

- transformers <= 5.24's pure-torch Mamba prefill clamps dt >= time_step_min; the real kernels,
  holotron and transformers >= 5.25 use ``time_step_limit`` (0, inf) (``hf_model`` removes the clamp;
  ``test_transformers_dt_clamp_is_the_only_known_difference`` shows it is what differed).
- transformers 5.25's ``DynamicCache.get_seq_length`` asks layer 0, which is a ``DummyLayer`` without
  that method when the pattern starts with an MLP layer: forward passes here run with
  ``use_cache=False`` (no cache is needed to compare logits), and the cached-decode comparison is
  skipped, naming the bug, only where transformers itself raises it.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

# the imports below follow the importorskip on purpose: the module is skipped without transformers
from helpers import assert_close  # noqa: E402
from tiny_lm import hf_model, scan_backend_of_the_device, tiny_config  # noqa: E402, F401 (autouse fixture)

import holotron  # noqa: E402
from holotron.generate import generate  # noqa: E402

CONFIGS = {
    # pattern starts and ends with each layer type; headdim 10 (an 80-like non power of two); groups > 1
    "M_start_end": dict(hybrid_override_pattern="M*-M"),
    "attn_start_end": dict(hybrid_override_pattern="*M-*", n_groups=1, num_key_value_heads=1),
    "mlp_start_end": dict(hybrid_override_pattern="-M*-", n_groups=4, num_key_value_heads=4),
    "wider": dict(hybrid_override_pattern="M-M*M-", mamba_num_heads=6, mamba_head_dim=12, n_groups=3,
                  ssm_state_size=16, conv_kernel=3, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
                  hidden_size=48, chunk_size=5),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    cfg = tiny_config(**CONFIGS[request.param])
    hf = hf_model(cfg, seed=11)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return hf, holotron.load(folder), folder


def _ids(b, t, seed):
    return torch.randint(3, 96, (b, t), generator=torch.Generator().manual_seed(seed))


def test_checkpoint_is_transformers_own(pair):
    _, model, folder = pair
    text = (folder / "config.json").read_text()
    assert '"__float__": "Infinity"' in text and "layers_block_type" in text
    from safetensors import safe_open
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(model.state_dict())


@torch.no_grad()
@pytest.mark.parametrize("t", [1, 13, 21])
def test_logits_match_transformers(pair, t):
    hf, model, _ = pair
    ids = _ids(2, t, seed=t)
    ref = hf(ids, use_cache=False).logits
    got = model(ids)
    assert ref.abs().max() > 1.0  # the random model is not degenerate
    assert_close(got, ref, name=f"logits T={t}")


@torch.no_grad()
def test_left_padded_batch_matches_transformers(pair):
    hf, model, _ = pair
    ids = _ids(3, 14, seed=5)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0
    mask[2, :1] = 0
    ref = hf(ids, attention_mask=mask, use_cache=False).logits
    got = model(ids, attention_mask=mask)
    real = mask.bool()
    assert_close(got[real], ref[real], name="padded batch, real positions")


def _transformers_greedy(hf, ids, n, use_cache):
    # an explicit mask: otherwise transformers treats prompt tokens equal to pad_token_id as padding
    return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=use_cache)[:, ids.shape[1]:]


@torch.no_grad()
def test_greedy_generation_matches_transformers_recompute(pair):
    """Our cached decode against transformers recomputing the whole sequence at every step."""
    hf, model, _ = pair
    ids = _ids(2, 11, seed=7)
    ours = generate(model, ids, max_new_tokens=12, eos_token_id=[])
    theirs = _transformers_greedy(hf, ids, 12, use_cache=False)
    assert torch.equal(ours, theirs), (ours, theirs)


@torch.no_grad()
def test_greedy_generation_matches_transformers_cached_decode(pair):
    """Our cached decode against transformers' own cached decode (its Mamba state and KV cache)."""
    hf, model, _ = pair
    ids = _ids(2, 11, seed=7)
    try:
        theirs = _transformers_greedy(hf, ids, 12, use_cache=True)
    except AttributeError as e:
        if "DummyLayer" not in str(e) or not hf.config.layers_block_type[0].startswith("mlp"):
            raise
        pytest.skip(f"transformers {transformers.__version__} bug: its DynamicCache asks layer 0 (an MLP layer, a "
                    f"DummyLayer) for the cached length ({e}); the recompute test covers this pattern")
    ours = generate(model, ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(ours, theirs), (ours, theirs)


@torch.no_grad()
def test_holotron_checkpoint_loads_in_transformers(pair, tmp_path):
    hf, model, _ = pair
    from transformers import NemotronHForCausalLM
    holotron.save_pretrained(model, tmp_path / "out")
    back = NemotronHForCausalLM.from_pretrained(tmp_path / "out").float().eval()
    for m in back.modules():
        if hasattr(m, "time_step_limit"):
            m.time_step_limit = (0.0, float("inf"))
    ids = _ids(2, 9, seed=9)
    assert_close(back(ids, use_cache=False).logits, model(ids), name="holotron-saved checkpoint in transformers")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["NemotronHForCausalLM"] and cfg["model_type"] == "nemotron_h"


@torch.no_grad()
def test_transformers_dt_clamp_is_the_only_known_difference(tmp_path):
    """With dt below time_step_min (1e-3), transformers' clamped prefill differs from the unclamped
    recurrence; without the clamp the two agree. This is why ``hf_model`` removes it."""
    cfg = tiny_config(hybrid_override_pattern="M-M")
    clamped = hf_model(cfg, seed=2, clamp_dt=True)
    for name, p in clamped.named_parameters():
        if name.endswith("dt_bias"):
            p.fill_(-9.0)  # softplus(-9 + small) ~ 1e-4 < time_step_min
    clamped.save_pretrained(tmp_path)
    model = holotron.load(tmp_path)
    ids = _ids(1, 16, seed=3)
    ours = model(ids)
    with_clamp = clamped(ids, use_cache=False).logits
    stock_limits = {tuple(m.time_step_limit) for m in clamped.modules() if hasattr(m, "time_step_limit")}
    for m in clamped.modules():
        if hasattr(m, "time_step_limit"):
            m.time_step_limit = (0.0, float("inf"))
    without = clamped(ids, use_cache=False).logits
    assert_close(ours, without, name="unclamped transformers")
    err = (with_clamp - ours).pow(2).mean().sqrt() / ours.pow(2).mean().sqrt()
    if stock_limits == {(clamped.config.time_step_min, float("inf"))}:
        # transformers <= 5.24: the prefill clamps at time_step_min, and that is all that differs
        assert err > 1e-3, f"the clamp no longer changes anything (relative error {err:.1e})"
    else:
        # transformers >= 5.25 reads the config's time_step_limit (0, inf): stock transformers agrees
        assert stock_limits == {tuple(cfg.time_step_limit)}, stock_limits
        assert_close(ours, with_clamp, name="stock transformers")
