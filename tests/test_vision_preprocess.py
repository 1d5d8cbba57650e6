"""Image preprocessing: the tiling grid (closest ratio, the tie rule), tile order, thumbnail, token counts,
normalisation, agreement with transformers' tiling processor, and bad inputs."""

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image

from holotron.vision import VisionConfig, closest_grid, load_image, preprocess_image
from holotron.vision.preprocess import ImageError, candidate_grids, tile_image

SMALL = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, patch_size=4, max_img_size=64)


def _reference_grid(w, h, tile, max_tiles):
    """The reference processor's selection, candidates in its order (a Python set sorted by tile count)."""
    ratios = sorted({(i, j) for n in range(1, max_tiles + 1) for i in range(1, n + 1) for j in range(1, n + 1)
                     if 1 <= i * j <= max_tiles}, key=lambda r: r[0] * r[1])
    best, best_diff = (1, 1), float("inf")
    for r in ratios:
        d = abs(w / h - r[0] / r[1])
        if d < best_diff:
            best, best_diff = r, d
        elif d == best_diff and w * h > 0.5 * tile * tile * r[0] * r[1]:
            best = r
    return best


# ---------------------------------------------------------------- grid choice

@pytest.mark.parametrize("w,h,grid", [
    (512, 512, (1, 1)),      # square, small: (2,2) ties on ratio but the image is not > half of 4 tiles
    (724, 724, (1, 1)),      # 524,176 px: just under 0.5 * 512^2 * 4 = 524,288
    (725, 725, (2, 2)),      # 525,625 px: just over -> the tie goes to the larger grid
    (1024, 1024, (2, 2)),    # and not (3,3): 1,048,576 < 0.5 * 512^2 * 9
    (1536, 1536, (3, 3)),
    (1024, 1152, (2, 2)),    # 1,179,648 px == 0.5 * 512^2 * 9 exactly: strictly greater is needed for (3,3)
    (1152, 1024, (2, 2)),
    (1280, 720, (2, 1)),     # 16:9 ties between (2,1) and (4,2); 921,600 px < 1,048,576 keeps (2,1)
    (1920, 1080, (4, 2)),    # 2,073,600 px > 1,048,576 takes (4,2)
    (2560, 1440, (4, 2)),
    (768, 512, (3, 2)),      # exactly 3:2
    (600, 400, (3, 2)),
    (1000, 1000 // 3, (3, 1)),  # 3.003: (3,1) 0.003 away; (6,2) is as far but the image is small
    (3000, 1000, (6, 2)),    # exact 3:1 tie with a large image: 12 tiles
    (512, 2048, (1, 4)),
    (1080, 1920, (2, 4)),
    (10000, 100, (12, 1)),   # extreme ratios saturate at max_num_tiles in one row / column
    (100, 10000, (1, 12)),
    (1170, 2532, (2, 4)),    # a phone screenshot: 0.462 is closest to 1/2, and large enough for (2,4)
    (2, 2, (1, 1)),
])
def test_grid_choice_for_aspect_ratios_and_the_tie_rule(w, h, grid):
    assert closest_grid(w, h, 512, 12) == grid
    assert _reference_grid(w, h, 512, 12) == grid


def test_candidate_grids_ordered_by_tile_count():
    grids = candidate_grids(12)
    assert len(grids) == len(set(grids)) == 35
    assert [g[0] * g[1] for g in grids] == sorted(g[0] * g[1] for g in grids)
    assert max(g[0] * g[1] for g in grids) == 12 and (1, 1) == grids[0]


@given(w=st.integers(1, 4000), h=st.integers(1, 4000), max_tiles=st.sampled_from([1, 4, 6, 12, 16]))
@example(w=725, h=725, max_tiles=12)
@example(w=3000, h=1000, max_tiles=12)
@example(w=1, h=4000, max_tiles=12)
def test_grid_is_closest_and_matches_reference_orders(w, h, max_tiles):
    cols, rows = closest_grid(w, h, 512, max_tiles)
    assert 1 <= cols * rows <= max_tiles
    best = min(abs(w / h - i / j) for i, j in candidate_grids(max_tiles))
    assert abs(w / h - cols / rows) == best
    assert (cols, rows) == _reference_grid(w, h, 512, max_tiles)
    tr = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    assert (cols, rows) == tr.get_optimal_tiled_canvas((h, w), (512, 512), 1, max_tiles)


# ---------------------------------------------------------------- tiles, thumbnail, tokens

def test_tile_order_is_row_major_and_thumbnail_last():
    cfg = VisionConfig(**SMALL, image_size=64, max_num_tiles=12)
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255)]
    a = np.zeros((128, 192, 3), np.uint8)  # 3 columns x 2 rows of 64-px blocks: exactly the (3,2) grid
    for k, c in enumerate(colors):
        r, col = divmod(k, 3)
        a[64 * r:64 * r + 64, 64 * col:64 * col + 64] = c
    im = Image.fromarray(a)
    tiles = tile_image(im, 64, 12)
    assert len(tiles) == 7
    for k, c in enumerate(colors):
        assert (np.asarray(tiles[k]) == np.array(c, np.uint8)).all(), f"tile {k}"
    assert np.array_equal(np.asarray(tiles[6]), np.asarray(im.resize((64, 64), Image.Resampling.BICUBIC)))

    px, n = preprocess_image(im, cfg)
    assert px.shape == (7, 3, 64, 64) and px.dtype == torch.float32
    assert n == 7 * cfg.tokens_per_tile == 7 * 64
    mean, std = torch.tensor(cfg.norm_mean), torch.tensor(cfg.norm_std)
    want = (torch.tensor(colors[4], dtype=torch.float32) / 255 - mean) / std  # tile 4 = row 1, column 1
    assert torch.allclose(px[4, :, 10, 10], want, atol=1e-6)


def test_thumbnail_only_with_several_tiles_and_when_enabled():
    im = Image.new("RGB", (1000, 500), (10, 20, 30))
    cfg = VisionConfig(**SMALL, image_size=64)
    assert preprocess_image(Image.new("RGB", (64, 64)), cfg).pixel_values.shape[0] == 1  # one tile: no thumbnail
    assert (preprocess_image(im, cfg).pixel_values.shape[0]
            == closest_grid(1000, 500, 64, 12)[0] * closest_grid(1000, 500, 64, 12)[1] + 1)
    no_thumb = VisionConfig(**SMALL, image_size=64, use_thumbnail=False)
    assert preprocess_image(im, no_thumb).pixel_values.shape[0] == 8  # (4,2), 1000x500 > 0.5 * 64^2 * 8
    one = VisionConfig(**SMALL, image_size=64, max_num_tiles=1)
    assert preprocess_image(im, one).pixel_values.shape[0] == 1


@pytest.mark.parametrize("w,h,tiles", [(512, 512, 1), (1280, 720, 3), (1920, 1080, 9), (3000, 1000, 13)])
def test_token_counts_at_the_real_tile_size(w, h, tiles):
    px, n = preprocess_image(Image.new("RGB", (w, h), (200, 100, 50)), VisionConfig())
    assert px.shape == (tiles, 3, 512, 512)
    assert n == 256 * tiles  # 256 .. 3,328 image tokens per image


@given(w=st.integers(2, 300), h=st.integers(2, 300), max_tiles=st.integers(1, 12), thumb=st.booleans())
def test_tile_count_and_tokens_for_any_size(w, h, max_tiles, thumb):
    cfg = VisionConfig(**SMALL, image_size=16, max_num_tiles=max_tiles, use_thumbnail=thumb)
    px, n = preprocess_image(Image.new("RGB", (w, h), (1, 2, 3)), cfg)
    cols, rows = closest_grid(w, h, 16, max_tiles)
    t = cols * rows + (1 if thumb and cols * rows > 1 else 0)
    assert px.shape == (t, 3, 16, 16)
    assert n == t * cfg.tokens_per_tile == t * 4
    assert torch.isfinite(px).all()


@pytest.mark.parametrize("w,h", [(300, 100), (91, 57), (37, 300), (200, 200), (64, 64), (640, 100)])
def test_pixels_match_transformers_tiling_processor(w, h):
    """transformers' GotOcr2 processor (PIL backend) implements the same InternVL tiling: identical tiles."""
    tr = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    cfg = VisionConfig(**SMALL, image_size=64)
    proc = tr.GotOcr2ImageProcessorPil(crop_to_patches=True, size={"height": 64, "width": 64}, min_patches=1,
                                       max_patches=12, image_mean=list(cfg.norm_mean), image_std=list(cfg.norm_std))
    im = Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8))
    ref = proc(im, return_tensors="pt")["pixel_values"]
    ours = preprocess_image(im, cfg).pixel_values
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref.float(), atol=1e-5)


def test_normalisation_uses_the_config():
    cfg = VisionConfig(**SMALL, image_size=16, norm_mean=(0.5, 0.25, 0.0), norm_std=(0.5, 0.25, 2.0))
    px = preprocess_image(Image.new("RGB", (16, 16), (255, 0, 51)), cfg).pixel_values
    assert torch.allclose(px[0, :, 0, 0], torch.tensor([1.0, -1.0, 0.1]), atol=1e-6)


# ---------------------------------------------------------------- modes

def _rgb(im):
    return np.asarray(load_image(im)).astype(int)


def test_alpha_is_flattened_on_white():
    a = np.array([[[255, 0, 0, 0], [0, 0, 0, 255]], [[0, 0, 0, 128], [10, 20, 30, 255]]], np.uint8)
    out = _rgb(Image.fromarray(a, "RGBA"))
    assert out[0, 0].tolist() == [255, 255, 255]   # fully transparent red -> white
    assert out[0, 1].tolist() == [0, 0, 0]
    assert np.abs(out[1, 0] - 127).max() <= 1      # half-transparent black -> mid grey
    assert out[1, 1].tolist() == [10, 20, 30]
    la = Image.fromarray(np.array([[[0, 0], [0, 255]], [[100, 255], [200, 0]]], np.uint8), "LA")
    assert _rgb(la)[:, :, 0].tolist() == [[255, 0], [100, 255]]


def test_palette_with_transparency_and_without():
    p = Image.new("P", (2, 2), 0)
    p.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    p.putpixel((1, 1), 1)
    assert _rgb(p)[1, 1].tolist() == [255, 0, 0] and _rgb(p)[0, 0].tolist() == [0, 0, 0]
    p.info["transparency"] = 0
    assert _rgb(p)[0, 0].tolist() == [255, 255, 255] and _rgb(p)[1, 1].tolist() == [255, 0, 0]
    buf = io.BytesIO()
    p.save(buf, "PNG")
    assert _rgb(buf.getvalue())[0, 0].tolist() == [255, 255, 255]  # the same through a PNG file


def test_sixteen_bit_and_integer_and_float_greyscale_are_scaled():
    a16 = np.array([[0, 257], [32896, 65535]], np.uint16)
    im16 = Image.fromarray(a16)
    assert im16.mode == "I;16"
    assert _rgb(im16)[:, :, 0].tolist() == [[0, 1], [128, 255]]
    big_endian = Image.frombytes("I;16B", (2, 2), a16.astype(">u2").tobytes())
    assert _rgb(big_endian)[:, :, 0].tolist() == [[0, 1], [128, 255]]
    buf = io.BytesIO()
    im16.save(buf, "PNG")  # a 16-bit greyscale PNG (opens as I;16 or I depending on Pillow)
    assert _rgb(buf.getvalue())[:, :, 1].tolist() == [[0, 1], [128, 255]]
    i32 = Image.fromarray(np.array([[0, 100], [200, 255]], np.int32))  # mode I, fits in 8 bits: taken as is
    assert i32.mode == "I" and _rgb(i32)[:, :, 2].tolist() == [[0, 100], [200, 255]]
    i32_16 = Image.fromarray(np.array([[0, 257], [32896, 65535]], np.int32))  # mode I, 16-bit range
    assert _rgb(i32_16)[:, :, 2].tolist() == [[0, 1], [128, 255]]
    f = Image.fromarray(np.array([[0.0, 0.5], [1.0, 0.25]], np.float32))
    assert _rgb(f)[:, :, 0].tolist() == [[0, 128], [255, 64]]
    with pytest.raises(ImageError, match="NaN"):
        load_image(Image.fromarray(np.array([[np.nan, 0], [0, 0]], np.float32)))


def test_cmyk_and_bilevel_and_ycbcr():
    cmyk = Image.new("CMYK", (2, 2), (0, 0, 0, 0))
    cmyk.putpixel((1, 0), (255, 0, 0, 0))
    out = _rgb(cmyk)
    assert out[0, 0].tolist() == [255, 255, 255] and out[0, 1].tolist() == [0, 255, 255]
    assert _rgb(Image.new("1", (3, 3), 1))[0, 0].tolist() == [255, 255, 255]
    assert np.abs(_rgb(Image.new("RGB", (4, 4), (10, 200, 30)).convert("YCbCr"))[0, 0] - [10, 200, 30]).max() <= 2


# ---------------------------------------------------------------- bad input: clear errors naming the file

def _png(w, h):
    """A PNG whose header claims w x h pixels (no real pixel data)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_not_an_image_and_missing_file(tmp_path):
    txt = tmp_path / "notes.txt"
    txt.write_text("hello, not an image")
    with pytest.raises(ImageError, match=r"notes\.txt: not an image"):
        preprocess_image(txt)
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match=r"empty\.png: not an image"):
        preprocess_image(str(empty))
    with pytest.raises(ImageError, match=r"nope\.png: no such file"):
        preprocess_image(tmp_path / "nope.png")
    with pytest.raises(ImageError, match="expected a path"):
        preprocess_image(12345)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_file(tmp_path, fmt):
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ImageError, match=rf"cut\.{fmt.lower()}: cannot decode") as e:
        preprocess_image(path)
    assert isinstance(e.value, ValueError)


def test_zero_size_and_one_pixel_images(tmp_path):
    with pytest.raises(ImageError, match="0x5 pixels"):
        preprocess_image(Image.new("RGB", (0, 5)))
    one = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (255, 0, 0)).save(one)
    with pytest.raises(ImageError, match=r"dot\.png: the image is 1x1 pixels"):
        preprocess_image(one)
    with pytest.raises(ImageError, match="1x300"):
        preprocess_image(Image.new("L", (1, 300)))
    assert preprocess_image(Image.new("RGB", (2, 2)), VisionConfig(**SMALL, image_size=16)).num_tokens == 4


def test_decompression_bomb(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(_png(100_000, 100_000))  # PIL's own bomb check fires in Image.open
    with pytest.raises(ImageError, match=r"bomb\.png: .*decompression bomb"):
        preprocess_image(bomb)
    big = tmp_path / "big.png"
    big.write_bytes(_png(9000, 9000))  # 81 M pixels: under PIL's limit, over holotron's default
    with pytest.raises(ImageError, match=r"big\.png: the image is 9000x9000 = 81000000 pixels, over the limit"):
        preprocess_image(big)
    with pytest.raises(ImageError, match="over the limit of 1000"):
        preprocess_image(Image.new("RGB", (40, 40)), max_pixels=1000)


def test_bytes_and_file_objects(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (40, 20), (9, 8, 7)).save(buf, "PNG")
    cfg = VisionConfig(**SMALL, image_size=16)
    a = preprocess_image(buf.getvalue(), cfg)
    buf.seek(0)
    b = preprocess_image(buf, cfg)
    p = tmp_path / "x.png"
    p.write_bytes(buf.getvalue())
    c = preprocess_image(str(p), cfg)
    assert torch.equal(a.pixel_values, b.pixel_values) and torch.equal(a.pixel_values, c.pixel_values)
    assert a.num_tokens == 3 * 4  # (2,1) + thumbnail
