"""Model configurations: small dataclasses parsed from, and written back to, Hugging Face ``config.json``.

``TextConfig`` describes the Nemotron-H hybrid language model (docs/architecture.md, section 2). It is read
with ``TextConfig.from_hf(dict)``, which accepts every spelling seen in published checkpoints, and
refuses (with ``ConfigError`` naming the field) any feature holotron does not implement instead of
silently ignoring it. ``to_hf()`` writes a ``config.json`` that transformers and vLLM both read.

``VisionConfig`` (``holotron/vision/config.py``) and ``HolotronConfig`` (``holotron/model.py``)
live beside their models; ``holotron.config`` re-exports them on first use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["ConfigError", "TextConfig", "LAYER_KINDS", "parse_float"]


class ConfigError(ValueError):
    """A config.json that holotron cannot use; the message names the field."""


# pattern character -> layer kind (hybrid_override_pattern); the long names are layers_block_type's
LAYER_KINDS = {"M": "mamba", "*": "attention", "-": "mlp"}
_BLOCK_TYPE_TO_CHAR = {
    "mamba": "M", "linear_attention": "M",
    "attention": "*", "full_attention": "*",
    "mlp": "-",
}
_CHAR_TO_BLOCK_TYPE = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
_MOE = ("E", "moe")

# older checkpoints spell these fields differently: old name -> field name
_ALIASES = {
    "mamba_n_groups": "n_groups",
    "mamba_d_conv": "conv_kernel",
    "mamba_d_state": "ssm_state_size",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_chunk_size": "chunk_size",
    "mamba_dt_limit": "time_step_limit",
    "attention_head_dim": "head_dim",
    "rms_norm_eps": "layer_norm_epsilon",
}


def parse_float(v, name: str) -> float:
    """A float from JSON: a number, "Infinity"/"inf" strings, or transformers 5's {"__float__": "Infinity"}."""
    if isinstance(v, dict) and set(v) == {"__float__"}:
        v = v["__float__"]
    if isinstance(v, bool):
        raise ConfigError(f"{name}: expected a number, got {v!r}")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)  # accepts "Infinity", "-Infinity", "inf", "nan"
        except ValueError:
            pass
    raise ConfigError(f"{name}: expected a number, got {v!r}")


def _ids(v, name: str) -> tuple[int, ...]:
    """eos/bos ids: null, an int, or a list of ints -> a tuple."""
    if v is None:
        return ()
    if isinstance(v, bool):
        raise ConfigError(f"{name}: expected a token id or a list of ids, got {v!r}")
    if isinstance(v, int):
        return (v,)
    if isinstance(v, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        return tuple(v)
    raise ConfigError(f"{name}: expected a token id or a list of ids, got {v!r}")


def _pattern(d: dict) -> str:
    """The layer layout as a pattern string ('M' Mamba2, '*' attention, '-' MLP) from either spelling."""
    pat, lbt = d.get("hybrid_override_pattern"), d.get("layers_block_type")
    if lbt is not None:
        if not isinstance(lbt, (list, tuple)) or not all(isinstance(s, str) for s in lbt):
            raise ConfigError(f"layers_block_type: expected a list of strings, got {lbt!r}")
        chars = []
        for i, s in enumerate(lbt):
            if s in _MOE:
                raise ConfigError(f"layers_block_type[{i}] is {s!r}: mixture-of-experts layers are not supported "
                                  "by holotron")
            if s not in _BLOCK_TYPE_TO_CHAR:
                raise ConfigError(f"layers_block_type[{i}] is {s!r}: unknown layer type "
                                  f"(known: {sorted(_BLOCK_TYPE_TO_CHAR)})")
            chars.append(_BLOCK_TYPE_TO_CHAR[s])
        from_list = "".join(chars)
        if pat is not None and pat != from_list:
            raise ConfigError(f"hybrid_override_pattern {pat!r} contradicts layers_block_type "
                              f"(which reads {from_list!r})")
        pat = from_list
    if pat is None:
        raise ConfigError("config has neither hybrid_override_pattern nor layers_block_type: "
                          "the layer layout is unknown")
    if not isinstance(pat, str) or not pat:
        raise ConfigError(f"hybrid_override_pattern: expected a non-empty string, got {pat!r}")
    for i, ch in enumerate(pat):
        if ch == "E":
            raise ConfigError(f"hybrid_override_pattern[{i}] is 'E': mixture-of-experts layers are not supported "
                              "by holotron")
        if ch not in LAYER_KINDS:
            raise ConfigError(f"hybrid_override_pattern[{i}] is {ch!r}: unknown layer type "
                              "(known: 'M' Mamba2, '*' attention, '-' MLP)")
    n = d.get("num_hidden_layers")
    if n is not None and d.get("layers_block_type") is None and n != len(pat):
        raise ConfigError(f"num_hidden_layers is {n} but hybrid_override_pattern has {len(pat)} layers")
    return pat


@dataclass
class TextConfig:
    """Nemotron-H hybrid LM. Symbols: D model width, H/P/N/G Mamba heads/headdim/state/groups, K conv kernel.

    Defaults are the Nemotron-Nano-12B-v2 values (docs/architecture.md, section 2).
    """

    vocab_size: int = 131072
    hidden_size: int = 5120                 # D
    hybrid_override_pattern: str = "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-"
    # attention (GQA, no positional encoding)
    num_attention_heads: int = 40
    num_key_value_heads: int = 8
    head_dim: int = 128
    # MLP: down(relu(up(x))^2)
    intermediate_size: int = 20480
    # Mamba2
    mamba_num_heads: int = 128              # H
    mamba_head_dim: int = 80                # P; d_inner = H * P
    ssm_state_size: int = 128               # N
    n_groups: int = 8                       # G; head h reads B, C of group h // (H / G)
    conv_kernel: int = 4                    # K
    use_conv_bias: bool = True
    chunk_size: int = 128                   # scan chunk: numerics / speed only
    time_step_limit: tuple[float, float] = (0.0, math.inf)  # clamp of softplus(dt + dt_bias); (0, inf) = none
    # shared
    layer_norm_epsilon: float = 1e-5
    residual_in_fp32: bool = False          # keep the residual stream in fp32 (16-bit models only)
    # tokens
    bos_token_id: int | None = 1
    eos_token_id: tuple[int, ...] = (2,)
    pad_token_id: int | None = 0
    max_position_embeddings: int | None = None  # informational: there is no position embedding
    dtype: str | None = field(default=None, compare=False)  # the checkpoint's dtype name, informational
    extra: dict = field(default_factory=dict, repr=False, compare=False)  # other fields, written back by to_hf

    def __post_init__(self):
        self.eos_token_id = (_ids(self.eos_token_id, "eos_token_id") if not isinstance(self.eos_token_id, tuple)
                             else self.eos_token_id)
        self.time_step_limit = tuple(float(v) for v in self.time_step_limit)
        self.validate()

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_hidden_layers(self) -> int:
        return len(self.hybrid_override_pattern)

    @property
    def layer_kinds(self) -> list[str]:
        """Per layer: "mamba", "attention" or "mlp"."""
        return [LAYER_KINDS[c] for c in self.hybrid_override_pattern]

    @property
    def mamba_d_inner(self) -> int:        # H * P
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:       # channels of xBC = x | B | C
        return self.mamba_d_inner + 2 * self.n_groups * self.ssm_state_size

    @property
    def mamba_in_proj_size(self) -> int:   # z | xBC | dt
        return self.mamba_d_inner + self.mamba_conv_dim + self.mamba_num_heads

    def validate(self) -> None:
        def pos(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                     "conv_kernel", "chunk_size"):
            pos(name)
        _pattern({"hybrid_override_pattern": self.hybrid_override_pattern})
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                              f"num_key_value_heads ({self.num_key_value_heads})")
        if self.mamba_num_heads % self.n_groups:
            raise ConfigError(f"mamba_num_heads ({self.mamba_num_heads}) must be a multiple of "
                              f"n_groups ({self.n_groups})")
        lo, hi = self.time_step_limit
        if math.isnan(lo) or math.isnan(hi) or lo < 0 or lo > hi:
            raise ConfigError(f"time_step_limit must be (low, high) with 0 <= low <= high, got {self.time_step_limit}")
        if not self.layer_norm_epsilon > 0:
            raise ConfigError(f"layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon}")

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf(cls, d: dict) -> "TextConfig":
        """Parse a Nemotron-H ``config.json`` dict (or a VL checkpoint's ``llm_config`` / ``text_config``)."""
        if not isinstance(d, dict):
            raise ConfigError(f"expected a config dict, got {type(d).__name__}")
        d = dict(d)
        for old, new in _ALIASES.items():
            if old in d:
                if new in d and d[new] is not None and d[new] != d[old]:
                    raise ConfigError(f"{old} ({d[old]!r}) contradicts {new} ({d[new]!r})")
                d[new] = d.pop(old)

        # features holotron does not implement: refuse, naming the field
        def refuse(name, ok, why):
            if name in d and not ok(d[name]):
                raise ConfigError(f"{name}={d[name]!r} is not supported by holotron: {why}")
        refuse("num_nextn_predict_layers", lambda v: not v, "multi-token prediction heads are not implemented")
        refuse("sliding_window", lambda v: v is None, "sliding-window attention is not implemented")
        refuse("mlp_hidden_act", lambda v: v == "relu2", "only relu2 MLPs exist in Nemotron-H")
        refuse("mamba_hidden_act", lambda v: v == "silu", "the Mamba2 conv activation is SiLU")
        for b in ("attention_bias", "mlp_bias", "use_bias", "mamba_proj_bias"):
            refuse(b, lambda v: not v, "Nemotron-H projections have no bias")
        refuse("tie_word_embeddings", lambda v: not v, "Nemotron-H has an untied lm_head")

        pattern = _pattern(d)
        kw = {"hybrid_override_pattern": pattern}
        known = {f for f in cls.__dataclass_fields__} - {"extra", "hybrid_override_pattern"}
        for name in known:
            if name in d and d[name] is not None:
                kw[name] = d[name]
        if "dtype" not in kw and d.get("torch_dtype") is not None:
            kw["dtype"] = d["torch_dtype"]
        for name in ("bos_token_id", "pad_token_id"):
            if name in d:  # explicitly null stays null
                kw[name] = d[name]
        if "eos_token_id" in d:
            kw["eos_token_id"] = _ids(d["eos_token_id"], "eos_token_id")
        if "time_step_limit" in d:
            tl = d["time_step_limit"]
            if not isinstance(tl, (list, tuple)) or len(tl) != 2:
                raise ConfigError(f"time_step_limit: expected [low, high], got {tl!r}")
            kw["time_step_limit"] = (parse_float(tl[0], "time_step_limit[0]"), parse_float(tl[1], "time_step_limit[1]"))
        if "layer_norm_epsilon" in kw:
            kw["layer_norm_epsilon"] = parse_float(kw["layer_norm_epsilon"], "layer_norm_epsilon")
        for name in ("bos_token_id", "pad_token_id"):
            v = kw.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
                raise ConfigError(f"{name}: expected a token id or null, got {v!r}")
        kw["extra"] = {k: v for k, v in d.items() if k not in known and k not in _DROP_ON_WRITE}
        return cls(**kw)

    def to_hf(self) -> dict:
        """A ``config.json`` dict for ``NemotronHForCausalLM`` (read by transformers 4.x/5.x and vLLM)."""
        out = dict(self.extra)
        eos = list(self.eos_token_id)
        out.update({
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "hybrid_override_pattern": self.hybrid_override_pattern,
            "layers_block_type": [_CHAR_TO_BLOCK_TYPE[c] for c in self.hybrid_override_pattern],
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "mlp_hidden_act": "relu2",
            "mamba_num_heads": self.mamba_num_heads,
            "mamba_head_dim": self.mamba_head_dim,
            "mamba_hidden_act": "silu",
            "ssm_state_size": self.ssm_state_size,
            "n_groups": self.n_groups,
            "conv_kernel": self.conv_kernel,
            "use_conv_bias": self.use_conv_bias,
            "chunk_size": self.chunk_size,
            "time_step_limit": list(self.time_step_limit),  # json writes inf as Infinity, which all readers accept
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "residual_in_fp32": self.residual_in_fp32,
            "attention_bias": False, "mlp_bias": False, "use_bias": False, "mamba_proj_bias": False,
            "tie_word_embeddings": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
            "pad_token_id": self.pad_token_id,
        })
        if self.max_position_embeddings is not None:
            out["max_position_embeddings"] = self.max_position_embeddings
        if self.dtype is not None:
            out["torch_dtype"] = self.dtype
        return out

    # ------------------------------------------------------------------ parameter count
    def num_parameters(self) -> int:
        D = self.hidden_size
        per = {
            "mamba": (D * self.mamba_in_proj_size + self.mamba_conv_dim * self.conv_kernel
                      + (self.mamba_conv_dim if self.use_conv_bias else 0) + 3 * self.mamba_num_heads
                      + self.mamba_d_inner + self.mamba_d_inner * D),
            "attention": 2 * D * self.num_attention_heads * self.head_dim
                         + 2 * D * self.num_key_value_heads * self.head_dim,
            "mlp": 2 * D * self.intermediate_size,
        }
        layers = sum(per[k] + D for k in self.layer_kinds)  # + the block's norm
        return layers + 2 * self.vocab_size * D + D


_ELSEWHERE = {"VisionConfig": "holotron.vision.config", "HolotronConfig": "holotron.model"}


def __getattr__(name: str):
    """Lazy re-exports (importing them here eagerly would be circular)."""
    if name in _ELSEWHERE:
        import importlib
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module 'holotron.config' has no attribute {name!r}")


# written by other tools, meaningless here (auto_map names remote code holotron never runs); the
# training-only fields (initializer_range, dropouts, time_step_min/max/floor, ...) are kept in extra
_DROP_ON_WRITE = {"auto_map", "architectures", "model_type", "transformers_version", "_name_or_path",
                  "num_hidden_layers", "layers_block_type", "hybrid_override_pattern", "torch_dtype",
                  "mtp_layers_block_type"}
