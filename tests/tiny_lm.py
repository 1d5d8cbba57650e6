"""Tiny Nemotron-H language models and checkpoints for tests (no download, random weights).

    cfg = tiny_config(hybrid_override_pattern="M*-M")   # a small TextConfig (chunk_size 8)
    model = tiny_lm(cfg, seed=0)                          # a HybridLM with O(1) activations
    folder = write_checkpoint(model, tmp_path / "ckpt")   # config.json + safetensors (sharded if asked)
    hf = hf_model(cfg, seed=0)                            # transformers' NemotronHForCausalLM, same recipe

``randomize_`` gives every parameter a value that keeps activations O(1) and the Mamba dynamics
non-trivial (dt in [0.01, 0.5], A in [-16, -1]), by parameter name, so it works on holotron's and on
transformers' modules alike. The later VL tests reuse ``tiny_config`` / ``tiny_lm`` for the language model.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import holotron
from holotron import kernels
from holotron.config import TextConfig
from holotron.lm import HybridLM

TINY = dict(
    vocab_size=96, hidden_size=32, hybrid_override_pattern="M*-M",
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
    mamba_num_heads=4, mamba_head_dim=10, ssm_state_size=8, n_groups=2, conv_kernel=4, chunk_size=8,
    bos_token_id=1, eos_token_id=(2,), pad_token_id=0,
)


def random_ids(n: int, seed: int, lo: int = 3, hi: int = 96) -> torch.Tensor:
    """n token ids in [lo, hi) from a seeded generator (the tiny vocabulary, special ids left out)."""
    return torch.randint(lo, hi, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def scan_backend_of_the_device():
    """Run the models on the scan backend ``backend=None`` picks for the device *without* the test
    conftest's TRITON_INTERPRET=1: "chunked" on a CPU (the interpreter is ~50x slower per decode step;
    the Triton path is checked at model level by its own test). Import it into a test module to use it.
    Tiny models also run single-threaded: their ops are too small to split, and two threads on a
    busy two-core machine made a decode step ~6x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with kernels.use_backend(None if torch.cuda.is_available() else "chunked"):
            yield
    finally:
        torch.set_num_threads(threads)


def tiny_config(**overrides) -> TextConfig:
    return TextConfig(**{**TINY, **overrides})


@torch.no_grad()
def randomize_(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)

    def rn(*shape):
        return torch.randn(*shape, generator=g)

    def ru(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=g)

    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        shape = p.shape
        if leaf == "A_log":
            v = torch.log(ru(*shape, lo=1.0, hi=16.0))
        elif leaf == "dt_bias":
            dt = torch.exp(ru(*shape, lo=math.log(0.01), hi=math.log(0.5)))
            v = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
        elif leaf == "D":
            v = 1.0 + 0.3 * rn(*shape)
        elif name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            v = 1.0 + 0.2 * rn(*shape)
        elif "conv1d" in name:
            v = (0.5 if leaf == "weight" else 0.1) * rn(*shape)
        elif "embeddings" in name or "embed_tokens" in name:
            v = rn(*shape)
        elif p.dim() == 2:  # Linear (out, in)
            v = rn(*shape) / math.sqrt(shape[1])
        else:
            v = 0.1 * rn(*shape)
        p.copy_(v.to(p.dtype))
    return model


def tiny_lm(cfg: TextConfig | None = None, seed: int = 0, dtype: torch.dtype = torch.float32) -> HybridLM:
    model = HybridLM(cfg or tiny_config())
    randomize_(model, seed)
    return model.to(dtype).eval()


def write_checkpoint(model: nn.Module, folder, max_shard_size="5GB", generation_config: dict | None = None) -> Path:
    """Save ``model`` with holotron's own writer (sharded below ``max_shard_size``)."""
    if generation_config is not None:
        model.generation_config = generation_config
    holotron.save_pretrained(model, folder, max_shard_size=max_shard_size)
    return Path(folder)


def hf_config_dict(cfg: TextConfig) -> dict:
    """The config.json of ``cfg`` as transformers' NemotronHConfig kwargs."""
    d = cfg.to_hf()
    for k in ("architectures", "model_type", "torch_dtype", "num_hidden_layers", "hybrid_override_pattern"):
        d.pop(k, None)
    return d


def hf_model(cfg: TextConfig, seed: int = 0, clamp_dt: bool = False):
    """transformers' NemotronHForCausalLM for ``cfg`` (fp32, eval), randomized like ``tiny_lm``.

    transformers <= 5.24's pure-torch Mamba prefill clamps dt >= time_step_min (its decode does not); the
    real kernels, holotron and transformers >= 5.25 clamp to ``time_step_limit`` (0, inf) only. Unless
    ``clamp_dt``, the mixers' limit is set to (0, inf) so the comparison is fair on either version.
    """
    from transformers import NemotronHConfig, NemotronHForCausalLM

    model = NemotronHForCausalLM(NemotronHConfig(**hf_config_dict(cfg))).float().eval()
    randomize_(model, seed)
    if not clamp_dt:
        n = 0
        for m in model.modules():
            if hasattr(m, "time_step_limit"):
                m.time_step_limit = (0.0, math.inf)
                n += 1
        assert n == cfg.layer_kinds.count("mamba"), "transformers' Mamba mixer no longer has time_step_limit"
    return model
