"""``VisionConfig``: the RADIO encoder, the pixel-shuffle projector and the image preprocessing in one
small dataclass.

Read from a VL ``config.json`` (and optionally ``preprocessor_config.json``) with
``VisionConfig.from_hf(config, preprocessor)``. The vision tower is described either the way the real
checkpoint does it (``vision_config.version`` / ``vision_config.args.model``, e.g. ``radio_v2.5-h``, a
ViT-H/16) or with explicit sizes under the field names of transformers' ``RadioConfig``
(``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``patch_size``, ``mlp_ratio``), which
is how small test models are described. Anything holotron does not implement is refused by name, and
a field of the wrong type or out of range is a ``ConfigError`` naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["VisionConfig", "RADIO_VERSIONS", "CLIP_MEAN", "CLIP_STD"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# ViT body by name: (width, depth, heads, patch). `version` names (RADIO) and timm model names (args.model).
RADIO_VERSIONS = {
    "radio_v2.5-b": (768, 12, 12, 16),
    "radio_v2.5-l": (1024, 24, 16, 16),
    "radio_v2.5-h": (1280, 32, 16, 16),
    "vit_base_patch16_224": (768, 12, 12, 16),
    "vit_large_patch16_224": (1024, 24, 16, 16),
    "vit_huge_patch16_224": (1280, 32, 16, 16),
}


def _config_error() -> type:
    # holotron.config re-exports VisionConfig, so it is imported lazily here (no import cycle)
    from ..config import ConfigError

    return ConfigError


def _error(msg: str) -> Exception:
    return _config_error()(msg)


@dataclass
class VisionConfig:
    # --- RADIO ViT ---
    hidden_size: int = 1280         # D, ViT width
    num_hidden_layers: int = 32     # depth
    num_attention_heads: int = 16   # head dim = D / heads = 80
    patch_size: int = 16            # P: a patch is P x P pixels, flattened (c, yy, xx) -> 3 P^2
    mlp_ratio: float = 4.0          # MLP hidden = D * mlp_ratio = 5120
    layer_norm_eps: float = 1e-6
    max_img_size: int = 2048        # the position table covers max_img_size / P patches per side (128)
    num_prefix_tokens: int | None = None  # CLS + registers; None: taken from the checkpoint tensor
    final_norm: bool = False        # RADIO's ViT norm after the last block (`args.model_norm`); off for C-RADIO
    version: str | None = None      # e.g. "radio_v2.5-h", kept for to_hf()
    # --- preprocessing ---
    image_size: int = 512           # S: tile side (`force_image_size` / preprocessor `image_size`)
    max_num_tiles: int = 12
    use_thumbnail: bool = True
    norm_mean: tuple[float, float, float] = CLIP_MEAN
    norm_std: tuple[float, float, float] = CLIP_STD
    # --- pixel shuffle + mlp1 ---
    downsample_ratio: float = 0.5
    ps_version: str = "v2"
    projector_hidden_size: int = 20480
    projector_output_size: int = 5120  # the language model's hidden size
    projector_norm_eps: float = 1e-5
    extra: dict = field(default_factory=dict, repr=False)  # vision_config fields kept only for to_hf()

    def __post_init__(self):
        _check_types(self)
        D, H, P = self.hidden_size, self.num_attention_heads, self.patch_size
        if any(s <= 0 for s in self.norm_std):
            raise _error(f"norm_std: every value must be > 0, got {self.norm_std}")
        if D % H:
            raise _error(f"vision hidden_size ({D}) must be a multiple of num_attention_heads ({H})")
        if self.max_img_size % P:
            raise _error(f"max_img_size ({self.max_img_size}) must be a multiple of patch_size ({P})")
        if self.ps_version != "v2":
            raise _error(f"ps_version {self.ps_version!r}: only 'v2' is implemented ('v1' transposes the token grid)")
        k = 1 / self.downsample_ratio
        if abs(k - round(k)) > 1e-9 or round(k) < 1:
            raise _error(f"downsample_ratio {self.downsample_ratio}: must be 1/k for an integer k")
        if self.image_size % (P * self.merge):
            raise _error(
                f"image_size ({self.image_size}) must be a multiple of patch_size * {self.merge} "
                f"({P * self.merge}) for the pixel shuffle"
            )
        if self.max_num_tiles < 1:
            raise _error(f"max_num_tiles must be >= 1, got {self.max_num_tiles}")

    # ---- derived sizes ----
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def intermediate_size(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def pos_grid(self) -> int:
        """Side of the learned position-embedding grid (128 for 2048 / 16)."""
        return self.max_img_size // self.patch_size

    @property
    def merge(self) -> int:
        """Pixel-shuffle block side: 2 for downsample_ratio 0.5."""
        return round(1 / self.downsample_ratio)

    @property
    def projector_input_size(self) -> int:
        return self.hidden_size * self.merge**2

    @property
    def tokens_per_tile(self) -> int:
        """Image tokens one tile becomes: (S / P / merge)^2 = 256 for 512 / 16 / 2."""
        return (self.image_size // self.patch_size // self.merge) ** 2

    # ---- Hugging Face config.json ----
    @classmethod
    def from_hf(cls, config: dict, preprocessor: dict | None = None) -> "VisionConfig":
        """From a VL ``config.json`` dict (NemotronH_Nano_VL_V2 or transformers' nemotron_h_omni form)
        and the optional ``preprocessor_config.json`` dict. Anything unreadable is a ConfigError."""
        try:
            return cls._from_hf(config, preprocessor)
        except (TypeError, AttributeError, KeyError, ZeroDivisionError, OverflowError, ValueError) as e:
            if isinstance(e, _config_error()):
                raise
            raise _error(f"config.json / preprocessor_config.json: the vision settings cannot be read "
                         f"({type(e).__name__}: {e})") from None

    @classmethod
    def _from_hf(cls, config: dict, preprocessor: dict | None) -> "VisionConfig":
        if not isinstance(config, dict):
            raise _error(f"config: expected a dict (config.json), got {type(config).__name__}")
        vc = config.get("vision_config")
        if not isinstance(vc, dict):
            raise _error("vision_config: missing or not an object in config.json")
        kw = _vit_fields(vc)

        top = {
            "downsample_ratio": config.get("downsample_ratio"),
            "ps_version": config.get("ps_version"),
            "projector_hidden_size": config.get("projector_hidden_size"),
            "use_thumbnail": config.get("use_thumbnail"),
            "norm_mean": config.get("norm_mean"),
            "norm_std": config.get("norm_std"),
            "max_num_tiles": config.get("max_num_tiles"),
        }
        top["image_size"] = config.get("force_image_size")
        llm = config.get("llm_config") or config.get("text_config") or {}
        if not isinstance(llm, dict):
            raise _error(f"llm_config / text_config: expected an object, got {type(llm).__name__}")
        top["projector_output_size"] = llm.get("hidden_size")
        kw.update({k: v for k, v in top.items() if v is not None})

        vit_hidden = config.get("vit_hidden_size", config.get("vision_hidden_size"))
        if vit_hidden is not None and vit_hidden != kw.get("hidden_size", cls.hidden_size):
            raise _error(
                f"vit_hidden_size / vision_hidden_size ({vit_hidden}) != the vision tower width "
                f"({kw.get('hidden_size', cls.hidden_size)}) from vision_config"
            )
        if config.get("patch_size") is not None and config["patch_size"] != kw.get("patch_size", cls.patch_size):
            raise _error(f"patch_size ({config['patch_size']}) != vision_config patch size ({kw.get('patch_size')})")

        if preprocessor is not None and not isinstance(preprocessor, dict):
            raise _error(f"preprocessor_config.json: expected an object, got {type(preprocessor).__name__}")
        if preprocessor:
            pp = {
                "image_size": preprocessor.get("image_size", preprocessor.get("force_image_size")),
                "max_num_tiles": preprocessor.get("max_num_tiles", preprocessor.get("max_dynamic_patch")),
                "use_thumbnail": preprocessor.get("use_thumbnail"),
                "norm_mean": preprocessor.get("norm_mean", preprocessor.get("image_mean")),
                "norm_std": preprocessor.get("norm_std", preprocessor.get("image_std")),
            }
            if isinstance(pp["image_size"], dict):  # {"height": .., "width": ..}
                h, w = pp["image_size"].get("height"), pp["image_size"].get("width")
                if h != w:
                    raise _error(f"preprocessor image_size {pp['image_size']}: tiles must be square")
                pp["image_size"] = h
            for k, v in pp.items():
                if v is None:
                    continue
                if k in top and top[k] is not None and not _same(top[k], v):
                    raise _error(f"{k}: config.json says {top[k]!r}, preprocessor_config.json says {v!r}")
                kw[k] = v
        if "norm_mean" in kw:
            kw["norm_mean"] = tuple(kw["norm_mean"])
        if "norm_std" in kw:
            kw["norm_std"] = tuple(kw["norm_std"])
        return cls(**kw)

    def to_hf(self) -> dict:
        """The VL-level fields of ``config.json`` (NemotronH_Nano_VL_V2 spelling) with ``vision_config``."""
        vc = dict(self.extra)
        if self.version is not None:
            vc["version"] = self.version
        vc.update(
            hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, patch_size=self.patch_size,
            mlp_ratio=self.mlp_ratio, layer_norm_eps=self.layer_norm_eps, max_img_size=self.max_img_size,
        )
        if self.num_prefix_tokens is not None:
            vc["num_prefix_tokens"] = self.num_prefix_tokens
        if self.final_norm:
            vc["final_norm"] = True
        return {
            "force_image_size": self.image_size, "patch_size": self.patch_size,
            "downsample_ratio": self.downsample_ratio, "ps_version": self.ps_version,
            "use_thumbnail": self.use_thumbnail, "vit_hidden_size": self.hidden_size,
            "projector_hidden_size": self.projector_hidden_size, "max_num_tiles": self.max_num_tiles,
            "norm_mean": list(self.norm_mean), "norm_std": list(self.norm_std),
            "vision_config": vc,
        }

    def to_preprocessor_config(self) -> dict:
        return {
            "image_size": self.image_size, "max_num_tiles": self.max_num_tiles,
            "use_thumbnail": self.use_thumbnail, "norm_mean": list(self.norm_mean),
            "norm_std": list(self.norm_std),
        }


# field -> largest value a real config could hold (far above the 12B model's); larger is a broken config
_INT_FIELDS = {"hidden_size": 1 << 16, "num_hidden_layers": 1024, "num_attention_heads": 4096, "patch_size": 1024,
               "max_img_size": 1 << 16, "image_size": 1 << 14, "max_num_tiles": 1024, "projector_hidden_size": 1 << 20,
               "projector_output_size": 1 << 20}
_FLOAT_FIELDS = ("mlp_ratio", "layer_norm_eps", "downsample_ratio", "projector_norm_eps")


def _check_types(cfg: VisionConfig) -> None:
    """Every field of the right type and in range (configs are files from outside), as a ConfigError."""
    for name, most in _INT_FIELDS.items():
        v = getattr(cfg, name)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
            raise _error(f"vision {name} must be an integer in [1, {most}], got {v!r}")
        setattr(cfg, name, v)
    for name in _FLOAT_FIELDS:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise _error(f"vision {name} must be a positive number, got {v!r}")
        setattr(cfg, name, float(v))
    if cfg.num_prefix_tokens is not None and (isinstance(cfg.num_prefix_tokens, bool) or not isinstance(
            cfg.num_prefix_tokens, int) or not 0 <= cfg.num_prefix_tokens <= 1024):
        raise _error(f"vision num_prefix_tokens must be an integer in [0, 1024] or null, got {cfg.num_prefix_tokens!r}")
    for name in ("use_thumbnail", "final_norm"):
        if not isinstance(getattr(cfg, name), bool):
            raise _error(f"vision {name} must be true or false, got {getattr(cfg, name)!r}")
    if not isinstance(cfg.ps_version, str) or not (cfg.version is None or isinstance(cfg.version, str)):
        raise _error(f"vision ps_version / version must be text, got {cfg.ps_version!r} / {cfg.version!r}")
    for name in ("norm_mean", "norm_std"):
        v = getattr(cfg, name)
        ok = isinstance(v, (list, tuple)) and len(v) == 3 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
        if not ok:
            raise _error(f"{name}: expected 3 numbers, got {v!r}")
        setattr(cfg, name, tuple(float(x) for x in v))


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


_RADIO_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "patch_size", "mlp_ratio")


def _vit_fields(vc: dict) -> dict:
    """The ViT sizes of ``vision_config``: from explicit sizes (RadioConfig names) or from the name."""
    kw: dict = {}
    args = vc.get("args") or {}
    if not isinstance(args, dict):
        raise _error(f"vision_config.args: expected an object, got {type(args).__name__}")
    name = args.get("model") or vc.get("version")
    if name is not None:
        if name not in RADIO_VERSIONS:
            if not all(f in vc for f in _RADIO_FIELDS[:3]):
                raise _error(
                    f"vision_config: unknown RADIO model {name!r} (known: {', '.join(sorted(RADIO_VERSIONS))}); "
                    f"give explicit sizes ({', '.join(_RADIO_FIELDS)}) instead"
                )
        else:
            D, L, H, P = RADIO_VERSIONS[name]
            kw.update(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, patch_size=P)
    if vc.get("version") is not None:
        kw["version"] = vc["version"]
    for f in _RADIO_FIELDS:
        if vc.get(f) is not None:
            if f in kw and kw[f] != vc[f]:
                raise _error(f"vision_config.{f} = {vc[f]} contradicts the model name {name!r} ({kw[f]})")
            kw[f] = vc[f]
    if "intermediate_size" in vc and vc["intermediate_size"] is not None:
        kw["mlp_ratio"] = vc["intermediate_size"] / kw.get("hidden_size", VisionConfig.hidden_size)
    if not kw.get("hidden_size") and name is None:
        raise _error("vision_config: neither a RADIO version / args.model nor explicit sizes (hidden_size, ...)")

    # what the module tree cannot honour is refused by name
    if vc.get("use_swiglu_ffn"):
        raise _error("vision_config.use_swiglu_ffn: the SwiGLU RADIO MLP is not implemented")
    if vc.get("hidden_act", "gelu") not in ("gelu", "gelu_pytorch_exact"):
        raise _error(f"vision_config.hidden_act {vc['hidden_act']!r}: only exact GELU is implemented")
    if vc.get("qkv_bias") is False:
        raise _error("vision_config.qkv_bias = false is not implemented (RADIO has qkv biases)")
    if vc.get("num_channels", 3) != 3:
        raise _error(f"vision_config.num_channels {vc['num_channels']}: only RGB (3) is implemented")
    if args.get("vitdet_window_size") or vc.get("vitdet_window_size"):
        raise _error("vision_config: windowed (ViTDet) attention is not implemented")
    if vc.get("adaptor_names"):
        raise _error(f"vision_config.adaptor_names {vc['adaptor_names']}: RADIO adaptors are not implemented")
    for key in ("feature_normalizer_config", "inter_feature_normalizer_config"):
        if vc.get(key):
            raise _error(f"vision_config.{key}: RADIO feature normalizers are not implemented")

    if vc.get("layer_norm_eps") is not None:
        kw["layer_norm_eps"] = float(vc["layer_norm_eps"])
    for key in ("max_img_size", "max_resolution"):
        if vc.get(key) is not None:
            kw["max_img_size"] = int(vc[key])
            break
    else:
        if args.get("cpe_max_size") is not None:
            kw["max_img_size"] = int(args["cpe_max_size"])
    if args.get("model_norm") or vc.get("final_norm"):
        kw["final_norm"] = True
    n_prefix = _num_prefix(vc, args)
    if n_prefix is not None:
        kw["num_prefix_tokens"] = n_prefix
    known = set(_RADIO_FIELDS) | {"version", "layer_norm_eps", "max_img_size", "final_norm", "num_prefix_tokens"}
    kw["extra"] = {k: v for k, v in vc.items() if k not in known}
    return kw


def _num_prefix(vc: dict, args: dict) -> int | None:
    """CLS + register tokens, when the config states them (the checkpoint tensor is the final word)."""
    if vc.get("num_prefix_tokens") is not None:
        return int(vc["num_prefix_tokens"])
    if vc.get("num_cls_tokens") is not None or vc.get("num_registers") is not None:  # RadioConfig
        return int(vc.get("num_cls_tokens") or 0) + int(vc.get("num_registers") or 0)
    if "teachers" in args or "register_multiple" in args or "cpe_num_registers" in args:  # RADIO args
        teachers = {t["name"] if isinstance(t, dict) else t for t in args.get("teachers") or []}
        n_cls = len(teachers) if args.get("cls_token_per_teacher") and teachers else 1
        if args.get("cpe_num_registers"):
            return n_cls + int(args["cpe_num_registers"])
        rm = args.get("register_multiple")
        return n_cls + (rm - n_cls % rm if rm else 0)
    return None

