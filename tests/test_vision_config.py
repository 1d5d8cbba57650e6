"""VisionConfig: the real checkpoint's form (version / args.model), transformers' RadioConfig names,
preprocessor_config.json, derived sizes, refusals by name, and the config.json round trip."""

import pytest

from holotron.config import ConfigError
from holotron.vision import VisionConfig
from holotron.vision.config import CLIP_MEAN, CLIP_STD

# the VL config.json fields of the vision part, in the NemotronH_Nano_VL_V2 spelling
REAL = {
    "architectures": ["NemotronH_Nano_VL_V2"], "model_type": "NemotronH_Nano_VL_V2",
    "force_image_size": 512, "patch_size": 16, "downsample_ratio": 0.5, "use_thumbnail": True, "ps_version": "v2",
    "img_context_token_id": 18, "vit_hidden_size": 1280, "projector_hidden_size": 20480,
    "norm_mean": list(CLIP_MEAN), "norm_std": list(CLIP_STD),
    "vision_config": {
        "version": "radio_v2.5-h", "patch_size": 16, "max_resolution": 2048, "preferred_resolution": [768, 768],
        "adaptor_names": None, "vitdet_window_size": None, "feature_normalizer_config": None,
        "args": {"model": "vit_huge_patch16_224", "cpe_max_size": 2048, "cls_token_per_teacher": True,
                 "teachers": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "a"}], "register_multiple": 8},
    },
    "llm_config": {"hidden_size": 5120, "model_type": "nemotron_h"},
}
PREPROCESSOR = {"image_size": 512, "max_num_tiles": 12, "use_thumbnail": True,
                "norm_mean": list(CLIP_MEAN), "norm_std": list(CLIP_STD)}


def test_real_checkpoint_form():
    cfg = VisionConfig.from_hf(REAL, PREPROCESSOR)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.patch_size) == (1280, 32, 16, 16)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.pos_grid, cfg.layer_norm_eps) == (80, 5120, 128, 1e-6)
    assert cfg.num_prefix_tokens == 3 + 5  # 3 distinct teachers, one CLS each, registers up to a multiple of 8
    assert (cfg.image_size, cfg.max_num_tiles, cfg.use_thumbnail, cfg.tokens_per_tile) == (512, 12, True, 256)
    assert (cfg.projector_input_size, cfg.projector_hidden_size, cfg.projector_output_size) == (5120, 20480, 5120)
    assert cfg.norm_mean == CLIP_MEAN and cfg.norm_std == CLIP_STD and not cfg.final_norm
    assert cfg.version == "radio_v2.5-h"


def test_version_alone_and_defaults_without_preprocessor():
    cfg = VisionConfig.from_hf({"vision_config": {"version": "radio_v2.5-l"}, "text_config": {"hidden_size": 64},
                                "projector_hidden_size": 128})
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (1024, 24, 16)
    assert cfg.num_prefix_tokens is None  # taken from the checkpoint tensor at load time
    assert (cfg.image_size, cfg.max_num_tiles, cfg.projector_output_size) == (512, 12, 64)


def test_transformers_radio_config_names():
    hf = {"model_type": "nemotron_h_omni", "force_image_size": None, "downsample_ratio": 0.5,
          "projector_hidden_size": 40, "vision_hidden_size": 32,
          "vision_config": {"model_type": "radio", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                            "patch_size": 4, "mlp_ratio": 3.0, "layer_norm_eps": 1e-5, "max_img_size": 64,
                            "num_cls_tokens": 2, "num_registers": 3, "hidden_act": "gelu", "use_swiglu_ffn": False},
          "text_config": {"hidden_size": 24}}
    cfg = VisionConfig.from_hf(hf, {"image_size": {"height": 32, "width": 32}, "image_mean": [0.5, 0.5, 0.5],
                                    "image_std": [0.5, 0.5, 0.5]})
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.patch_size) == (32, 2, 2, 4)
    assert (cfg.intermediate_size, cfg.layer_norm_eps, cfg.pos_grid, cfg.num_prefix_tokens) == (96, 1e-5, 16, 5)
    assert (cfg.image_size, cfg.tokens_per_tile, cfg.norm_mean) == (32, 16, (0.5, 0.5, 0.5))


@pytest.mark.parametrize("change,match", [
    ({"vision_config": {"version": "radio_v9-x"}}, "unknown RADIO model 'radio_v9-x'"),
    ({"vision_config": {"version": "radio_v2.5-h", "hidden_size": 1024}}, "contradicts the model name"),
    ({"vit_hidden_size": 1024}, "vit_hidden_size"),
    ({"ps_version": "v1"}, "ps_version 'v1'"),
    ({"downsample_ratio": 0.3}, "downsample_ratio 0.3"),
    ({"force_image_size": 500}, "image_size \\(500\\) must be a multiple"),
    ({"vision_config": {**REAL["vision_config"], "args": {**REAL["vision_config"]["args"], "vitdet_window_size": 8}}},
     "ViTDet"),
    ({"vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "use_swiglu_ffn": True}},
     "use_swiglu_ffn"),
    ({"vit_hidden_size": 30, "vision_config": {"hidden_size": 30, "num_hidden_layers": 1, "num_attention_heads": 4}},
     "multiple of num_attention_heads"),
    ({"vision_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "hidden_act": "quick_gelu"}},
     "hidden_act"),
    ({"vision_config": {"version": "radio_v2.5-h", "adaptor_names": ["clip"]}}, "adaptor"),
    ({"vision_config": None}, "vision_config"),
    ({"norm_std": [0.2, 0.0, 0.2]}, "norm_std"),
])
def test_refusals_name_the_field(change, match):
    with pytest.raises(ConfigError, match=match):
        VisionConfig.from_hf({**REAL, **change})


def test_preprocessor_conflicts_are_errors_and_its_extra_fields_count():
    with pytest.raises(ConfigError, match="image_size: config.json says 512, preprocessor_config.json says 448"):
        VisionConfig.from_hf(REAL, {**PREPROCESSOR, "image_size": 448})
    with pytest.raises(ConfigError, match="norm_mean"):
        VisionConfig.from_hf(REAL, {**PREPROCESSOR, "norm_mean": [0.485, 0.456, 0.406]})
    with pytest.raises(ConfigError, match="use_thumbnail: config.json says True"):
        VisionConfig.from_hf(REAL, {"use_thumbnail": False})
    cfg = VisionConfig.from_hf({k: v for k, v in REAL.items() if k != "use_thumbnail"},
                               {"max_num_tiles": 6, "use_thumbnail": False})
    assert (cfg.max_num_tiles, cfg.use_thumbnail) == (6, False)
    with pytest.raises(ConfigError, match="square"):
        VisionConfig.from_hf(REAL, {"image_size": {"height": 512, "width": 448}})


def test_config_json_round_trip():
    cfg = VisionConfig.from_hf(REAL, PREPROCESSOR)
    out = {**cfg.to_hf(), "llm_config": {"hidden_size": 5120}}
    again = VisionConfig.from_hf(out, cfg.to_preprocessor_config())
    assert again == cfg
    assert out["vision_config"]["version"] == "radio_v2.5-h" and out["vision_config"]["args"]["register_multiple"] == 8
