"""The one-token decode step's kernels: its linear layers with their neighbours taken in, and its attention.

    y = norm_linear(x, norm, lin, act=None, out_dtype=None)   lin(norm(x)); act "relu2": relu(.)^2
    x = linear_residual(v, lin, residual, gnorm=None)         residual + lin(gnorm.normed(v) or v)
    y = decode_attention(q, k, v, n_keys)                     one query token per row against its cache

The mixers' ``step`` (holotron/mamba2.py, attention.py, layers.py) and ``HybridLM.step`` call these. At one
row (``FUSED_MAX_ROWS``) each linear op is one launch of the GEMV kernel (``holotron.quant.gemv``: the block's
RMSNorm computed in the projection's pass over x, the MLP's relu^2 and the residual add in its epilogue, FP8
weights widened in registers; Mamba2's group norm a small kernel of its own before out_proj); at
2-16 rows the kernel's ``tl.dot`` tile read the 12B's weights at 45-55% of copy bandwidth where cuBLAS reached
76-91% (bench_gemv.py on an H200, 2026-12-04), so above one row the norms run as row kernels
(holotron/kernels/rows_triton.py, group_norm_triton.py; with FP8 weights the activations' per-row
quantisation in the same pass) before the product, which is the skinny Triton product with the relu^2 and
the residual add in its epilogue (holotron/kernels/skinny_mm_triton.py) up to ``MM_ROWS`` rows (16-bit
weights) or where ``quant.skinny_fp8`` says so (FP8), the layer's own product elsewhere. The attention of
the new token reads its row's filled slots with a split-over-keys kernel (holotron/kernels/attn_decode_triton.py)
at any batch. Elsewhere they are the plain composition of the modules, the same ops as the prefill path, so a CPU / fp32
model decodes exactly as before (docs/architecture.md, "The decode step").

The kernels run when a 16-bit (or FP8) layer without bias meets 16-bit activations (fp32 ones too for the
GEMV), no autograd records them, and the switch allows it: ``fused_decode("auto")`` (the default: CUDA
only), ``"on"`` (also Triton's CPU interpreter: tests), ``"off"`` (never: the benchmark's side-by-side).
``HOLOTRON_FUSED_DECODE`` sets it per process. Each kernel is a ``torch.library`` custom op, so a
``torch.compile``d step keeps it whole.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from . import quant
from .kv_cache import dequantize_kv
from .quant import GEMV_MAX_ROWS, FP8Linear, gemv

__all__ = ["norm_linear", "linear_residual", "decode_attention", "fused_decode", "MODES"]

MODES = ("auto", "on", "off")
FUSED_MAX_ROWS = 1  # the GEMV path's rows (see above)
# rows up to which 16-bit weights multiply through the skinny Triton product (above FUSED_MAX_ROWS);
# HOLOTRON_MM_ROWS. 0 (cuBLAS) by default: at 128 rows the 12B's bf16 decode step ran at 7,916 tokens/s with it,
# 8,335 without (bench_serving.py, H200, 2026-12-04)
MM_ROWS = quant.env_rows("HOLOTRON_MM_ROWS", 0)
_mode = os.environ.get("HOLOTRON_FUSED_DECODE", "auto")
if _mode not in MODES:
    import warnings

    warnings.warn(f"HOLOTRON_FUSED_DECODE={_mode!r} is not one of {MODES}; using 'auto'", stacklevel=1)
    _mode = "auto"
# HOLOTRON_FUSED_RELU2=0 turns off the one-kernel relu^2 (``relu2`` below), on by default wherever the kernels of
# this module run; the same bits as torch's two kernels on the GPU (tests/test_decode_ops.py)
RELU2 = os.environ.get("HOLOTRON_FUSED_RELU2", "1") not in ("", "0", "off", "false")
_WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


class fused_decode:
    """``with fused_decode("off"): ...`` (or call it once to set the mode for the process)."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"fused_decode: mode must be one of {MODES}, got {mode!r}")
        global _mode
        self._old, _mode = _mode, mode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global _mode
        _mode = self._old


@torch.library.custom_op("holotron::decode_linear", mutates_args=())
def _decode_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                   residual: torch.Tensor | None, norm: torch.Tensor | None, eps: float, act: str,
                   out_dtype: torch.dtype) -> torch.Tensor:
    return gemv(x, weight, scale, residual, norm=norm, eps=eps, act=act or None, out_dtype=out_dtype,
                backend="triton")


@_decode_linear.register_fake
def _(x, weight, scale, residual, norm, eps, act, out_dtype):
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=out_dtype)


def _group_norm_rows(v: torch.Tensor, weight: torch.Tensor, groups: int, eps: float, out: torch.Tensor) -> None:
    """The group-norm kernel over v's rows (..., K), written into ``out`` (v's shape, contiguous)."""
    from .kernels.group_norm_triton import group_rms_norm_triton

    k = v.shape[-1]
    v2 = v.reshape(-1, k)
    group_rms_norm_triton(v2 if v2.stride(-1) == 1 else v2.contiguous(), weight, groups, eps, out.view(-1, k))


@torch.library.custom_op("holotron::group_rms_norm", mutates_args=())
def _group_rms_norm(v: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    _group_norm_rows(v, weight, groups, eps, out)
    return out


@_group_rms_norm.register_fake
def _(v, weight, groups, eps):
    return torch.empty_like(v)


@torch.library.custom_op("holotron::group_rms_norm_into", mutates_args=("out",))
def _group_rms_norm_into(v: torch.Tensor, weight: torch.Tensor, groups: int, eps: float, out: torch.Tensor) -> None:
    _group_norm_rows(v, weight, groups, eps, out)


def kernels_ok(x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """The switch and the device allow this module's kernels for x, and autograd records none of x and
    ``params`` (the kernels have no backward)."""
    if _mode == "off" or x.shape[-1] == 0:
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *params)):
        return False
    if not x.is_cuda:
        from .kernels import _triton_usable

        return _mode == "on" and _triton_usable(x.device) is None
    return True


def _weights(x: torch.Tensor, lin: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, scale) for the GEMV kernel, or None where it does not run (see the module docstring)."""
    if isinstance(lin, FP8Linear):
        w, s = lin.weight_fp8, lin.weight_scale
    elif type(lin) is nn.Linear:
        w, s = lin.weight, None
    else:
        return None
    if lin.bias is not None or w.dtype not in _WEIGHT_DTYPES or x.dtype not in (torch.bfloat16, torch.float16,
                                                                                    torch.float32):
        return None
    if not kernels_ok(x, w) or x.numel() // x.shape[-1] > min(FUSED_MAX_ROWS, GEMV_MAX_ROWS):
        return None
    return w, s


@torch.library.custom_op("holotron::row_norm", mutates_args=())
def _row_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from .kernels.rows_triton import row_norm_quant

    return row_norm_quant(x, weight, eps)[0]


@_row_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op("holotron::relu2", mutates_args=())
def _relu2(x: torch.Tensor) -> torch.Tensor:
    from .kernels.rows_triton import relu2 as relu2_triton

    return relu2_triton(x)


@_relu2.register_fake
def _(x):
    return torch.empty_like(x)


def row_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``RMSNorm`` of x (..., K) with ``weight`` (K,) as the decode step's row kernel (fp32 inside, x's dtype out),
    or None where this module's kernels do not run for x (autograd recording, the switch, the device)."""
    if x.numel() == 0 or not kernels_ok(x, weight):
        return None
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    return _row_norm(x2 if x2.stride(-1) == 1 else x2.contiguous(), weight, eps).view(x.shape)


def relu2(y: torch.Tensor) -> torch.Tensor:
    """``relu(y) ** 2`` (the MLP's activation): one Triton pass where this module's kernels run (no autograd),
    torch's two kernels elsewhere."""
    if RELU2 and y.is_contiguous() and kernels_ok(y):
        return _relu2(y)
    return F.relu(y).square()


@torch.library.custom_op("holotron::row_norm_quant", mutates_args=())
def _row_norm_quant(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    from .kernels.rows_triton import row_norm_quant

    return row_norm_quant(x, weight, eps, quant=True)


@_row_norm_quant.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, dtype=torch.float8_e4m3fn), x.new_empty(x.shape[0], 1, dtype=torch.float32)


@torch.library.custom_op("holotron::rows_mm", mutates_args=())
def _rows_mm(x: torch.Tensor, w: torch.Tensor, xs: torch.Tensor | None, ws: torch.Tensor | None,
             residual: torch.Tensor | None, act: str, out_dtype: torch.dtype) -> torch.Tensor:
    from .kernels.skinny_mm_triton import skinny_mm

    return skinny_mm(x, w, xs, ws, residual, act or None, out_dtype)


@_rows_mm.register_fake
def _(x, w, xs, ws, residual, act, out_dtype):
    return x.new_empty(x.shape[0], w.shape[0], dtype=out_dtype)


def _rows_ok(x: torch.Tensor, norm: nn.Module | None, lin: nn.Module) -> bool:
    """Whether ``_rows_linear`` serves x: 16-bit x, the layer's compute dtype x's, and the kernels allowed for x,
    the norm's weight and the layer's weight (autograd records none of them)."""
    w = lin.weight_fp8 if isinstance(lin, FP8Linear) else lin.weight
    return x.dtype in (torch.bfloat16, torch.float16) and lin.weight.dtype == x.dtype \
        and kernels_ok(x, w, None if norm is None else norm.weight)


def _rows_linear(x: torch.Tensor, norm: nn.Module | None, lin: nn.Module, act: str | None = None,
                 residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``act(lin(norm(x))) + residual`` above FUSED_MAX_ROWS, where ``_rows_ok``:
    the norm in one kernel (for FP8 weights on CUDA with it the activations' quantisation), then the skinny
    product with act and the residual in its epilogue, or above its rows the layer's own product."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    m = x2.shape[0]
    dtype = out_dtype or (lin.weight.dtype if residual is None else torch.promote_types(residual.dtype,
                                                                                          lin.weight.dtype))
    r2 = None if residual is None else residual.reshape(m, -1)
    if isinstance(lin, FP8Linear) and lin.bias is None and lin.w8a8(x):
        xq, xs = _row_norm_quant(x2, norm.weight, norm.eps) if norm is not None else quant.quantize_rows(x2)
        if quant.skinny_fp8(m, lin.out_features):
            return _rows_mm(xq, lin.weight_fp8, xs, lin.weight_scale, r2, act or "", dtype).view(*x.shape[:-1], -1)
        y = quant.scaled_matmul(xq, xs, lin.weight_fp8, lin.weight_scale, x.dtype)
    else:
        h = _row_norm(x2, norm.weight, norm.eps) if norm is not None else x2
        if m <= MM_ROWS and type(lin) is nn.Linear and lin.bias is None:
            return _rows_mm(h, lin.weight, None, None, r2, act or "", dtype).view(*x.shape[:-1], -1)
        y = lin(h)
    if act == "relu2":
        y = relu2(y)
    y = y.view(*x.shape[:-1], y.shape[-1])
    return (y if residual is None else residual + y).to(dtype)


def norm_linear(x: torch.Tensor, norm: nn.Module | None, lin: nn.Module, act: str | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``lin(norm(x))`` (``norm`` an ``RMSNorm`` or None), then relu^2 when ``act == "relu2"``; x (..., K).
    The result is in the layer's compute dtype, or ``out_dtype``."""
    ws = _weights(x, lin)
    if ws is None:
        if _rows_ok(x, norm, lin):
            return _rows_linear(x, norm, lin, act, out_dtype=out_dtype)  # more rows: row kernels, skinny product
        h = x if norm is None else norm(x.to(norm.weight.dtype))
        y = lin(h.to(lin.weight.dtype))
        if act == "relu2":
            y = relu2(y)
        return y if out_dtype is None else y.to(out_dtype)
    g, eps = (None, 1e-5) if norm is None else (norm.weight, norm.eps)
    return _decode_linear(x, ws[0], ws[1], None, g, eps, act or "", out_dtype or lin.weight.dtype)


def group_normed(v: torch.Tensor, gnorm: nn.Module, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gnorm.normed(v)``: Mamba2's ``GatedRMSNorm`` of an already gated v (..., K), as one kernel where this
    module's kernels run and v is 16-bit. With ``out`` (v's shape, contiguous: rows of a larger buffer), the
    result is written there and ``out`` returned (a mixed pass's parts, no concatenation)."""
    fast = kernels_ok(v, gnorm.weight) and v.dtype in (torch.bfloat16, torch.float16)
    if out is None:
        return _group_rms_norm(v, gnorm.weight, gnorm.groups, gnorm.eps) if fast else gnorm.normed(v.float(), v.dtype)
    if out.shape != v.shape or not out.is_contiguous():
        raise ValueError(f"group_normed: out must be contiguous with v's shape {tuple(v.shape)}, got "
                         f"{tuple(out.shape)}")
    if fast and out.dtype == v.dtype:
        _group_rms_norm_into(v, gnorm.weight, gnorm.groups, gnorm.eps, out)
    else:
        out.copy_(gnorm.normed(v.float(), v.dtype))
    return out


def linear_residual(v: torch.Tensor, lin: nn.Module, residual: torch.Tensor | None, gnorm: nn.Module | None = None
                    ) -> torch.Tensor:
    """``residual + lin(v)``, or ``residual + lin(gnorm.normed(v))`` with Mamba2's ``GatedRMSNorm`` (v already
    gated); without ``residual``, ``lin(...)`` alone. v (..., K), residual (..., N)."""
    if gnorm is not None:
        v = group_normed(v, gnorm)
    ws = _weights(v, lin)
    if ws is None:
        if _rows_ok(v, None, lin):
            return _rows_linear(v, None, lin, residual=residual)  # more rows: the skinny product
        out = lin(v)
        return out if residual is None else residual + out
    dtype = lin.weight.dtype if residual is None else torch.promote_types(residual.dtype, lin.weight.dtype)
    return _decode_linear(v, ws[0], ws[1], residual, None, 1e-5, "", dtype)


@torch.library.custom_op("holotron::attn_decode", mutates_args=())
def _attn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                 k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.Tensor:
    from .kernels.attn_decode_triton import attn_decode_triton

    return attn_decode_triton(q, k, v, n_keys, k_scale, v_scale)


@_attn_decode.register_fake
def _(q, k, v, n_keys, k_scale, v_scale):
    return torch.empty_like(q)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_keys: torch.Tensor,
                     k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q (b, Hkv, r, hd) against the cache k, v (b, Hkv, L, hd): row i attends to its slots [0, n_keys[i]).
    The split-over-keys kernel (holotron/kernels/attn_decode_triton.py, reading the filled slots only) where
    it runs (any batch; same switch as the linear ops), else ``F.scaled_dot_product_attention`` with the
    mask of those slots. An FP8 cache (e4m3 k, v with ``k_scale`` / ``v_scale`` (b, Hkv, L), holotron/kv_cache.py):
    the kernel reads codes and scales; the plain path dequantizes the rows' slots (all L: static shapes)."""
    ok = kernels_ok(q, k, v) and q.dtype in (torch.bfloat16, torch.float16, torch.float32) \
        and k.stride(-1) == 1 and v.stride(-1) == 1
    if not ok:
        if k_scale is not None:
            k, v = dequantize_kv(k, k_scale, q.dtype), dequantize_kv(v, v_scale, q.dtype)
        mask = torch.arange(k.shape[2], device=k.device)[None, :] < n_keys[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None])
    return _attn_decode(q, k, v, n_keys, k_scale, v_scale)
