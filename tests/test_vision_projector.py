"""Pixel shuffle (v2) channel order on hand-built grids, and the mlp1 projector's names and maths."""

import pytest
import torch
from helpers import assert_close

from holotron.vision import Projector, VisionConfig, pixel_shuffle


def _coord_grid(T, gh, gw):
    """Features whose two channels are the patch's (row, col), plus a third channel holding the tile index."""
    r, c = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    x = torch.stack([r, c], -1).reshape(1, gh * gw, 2).expand(T, -1, -1)
    t = torch.arange(T).view(T, 1, 1).expand(T, gh * gw, 1)
    return torch.cat([x, t], -1).float()  # (T, gh*gw, 3)


@pytest.mark.parametrize("gh,gw", [(4, 4), (2, 6), (6, 2), (32, 32)])
def test_pixel_shuffle_channel_order_hand_built(gh, gw):
    x = _coord_grid(2, gh, gw)
    y = pixel_shuffle(x, gh, gw, 2)
    assert y.shape == (2, (gh // 2) * (gw // 2), 4 * 3)
    for t in range(2):
        for i in range(gh // 2):
            for j in range(gw // 2):
                tok = y[t, i * (gw // 2) + j].view(4, 3)  # 4 slices of the 3 input channels
                want = [(2 * i, 2 * j), (2 * i, 2 * j + 1), (2 * i + 1, 2 * j), (2 * i + 1, 2 * j + 1)]
                assert tok[:, :2].tolist() == [list(map(float, w)) for w in want], (t, i, j)
                assert (tok[:, 2] == t).all()


def test_pixel_shuffle_spec_example_32x32():
    """The 12B case: [1024, 1280] -> [256, 5120]; token (i, j) = [x(2i,2j) | x(2i,2j+1) | x(2i+1,2j) | x(2i+1,2j+1)]."""
    torch.manual_seed(0)
    x = torch.randn(1, 1024, 1280)
    y = pixel_shuffle(x, 32, 32)
    assert y.shape == (1, 256, 5120)
    grid = x.view(32, 32, 1280)
    for i, j in [(0, 0), (0, 15), (15, 0), (7, 11), (15, 15)]:
        want = torch.cat([grid[2 * i, 2 * j], grid[2 * i, 2 * j + 1],
                          grid[2 * i + 1, 2 * j], grid[2 * i + 1, 2 * j + 1]])
        assert torch.equal(y[0, i * 16 + j], want)


def test_pixel_shuffle_merge_3_block_read_row_by_row():
    x = _coord_grid(1, 3, 6)
    y = pixel_shuffle(x, 3, 6, 3)
    assert y.shape == (1, 2, 27)
    tok = y[0, 1].view(9, 3)[:, :2].tolist()
    assert tok == [[float(r), float(c)] for r in range(3) for c in range(3, 6)]


def test_pixel_shuffle_rejects_bad_grids():
    with pytest.raises(ValueError, match="not divisible"):
        pixel_shuffle(torch.zeros(1, 15, 4), 3, 5)
    with pytest.raises(ValueError, match="do not form"):
        pixel_shuffle(torch.zeros(1, 16, 4), 2, 4)


def test_projector_names_shapes_and_maths():
    cfg = VisionConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1, patch_size=4, max_img_size=32,
                       image_size=16, projector_hidden_size=12, projector_output_size=6)
    mlp1 = Projector.from_config(cfg)
    shapes = {k: tuple(v.shape) for k, v in mlp1.state_dict().items()}
    assert shapes == {"0.weight": (32,), "1.weight": (12, 32), "3.weight": (6, 12)}
    torch.manual_seed(1)
    with torch.no_grad():
        for p in mlp1.parameters():
            p.copy_(torch.randn_like(p))
    x = torch.randn(3, 5, 32)
    w0, w1, w3 = (m.weight.detach().double() for m in (mlp1[0], mlp1[1], mlp1[3]))
    xd = x.double()
    h = w0 * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)  # the norm runs in fp32 whatever the dtype
    want = torch.relu(h @ w1.T).pow(2) @ w3.T
    with torch.no_grad():
        assert_close(mlp1(x), want, torch.float32)


def test_projector_12b_shapes_on_meta():
    with torch.device("meta"):
        mlp1 = Projector.from_config(VisionConfig())
    shapes = {k: tuple(v.shape) for k, v in mlp1.state_dict().items()}
    assert shapes == {"0.weight": (5120,), "1.weight": (20480, 5120), "3.weight": (5120, 20480)}
    assert mlp1[0].eps == 1e-5
