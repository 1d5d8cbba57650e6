"""Vision side of the VL model: RADIO ViT encoder, pixel shuffle + ``mlp1`` projector, image preprocessing.

    cfg = VisionConfig.from_hf(config_json, preprocessor_json)
    vision_model, mlp1 = RadioVisionModel(cfg), Projector.from_config(cfg)
    pixel_values, num_tokens = preprocess_image("shot.png", cfg)     # (tiles, 3, S, S), thumbnail last
    embeds = embed_tiles(vision_model, mlp1, pixel_values)         # (tiles, 256, LM width)
"""

from .config import VisionConfig
from .preprocess import ImageError, PreprocessedImage, closest_grid, load_image, preprocess_image, tile_image
from .projector import Projector, embed_tiles, pixel_shuffle
from .radio import RadioVisionModel, interpolate_pos_embed

__all__ = [
    "VisionConfig", "RadioVisionModel", "interpolate_pos_embed", "Projector", "pixel_shuffle", "embed_tiles",
    "ImageError", "PreprocessedImage", "preprocess_image",
    "load_image", "closest_grid", "tile_image",
]
