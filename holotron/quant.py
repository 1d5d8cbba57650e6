"""FP8 weights for the language model's linear layers, and the skinny matrix product they decode through.

    model = holotron.load(path, device="cuda", quantize="fp8")   # or quantize_(model, "fp8") on a loaded one
    y = gemv(x, weight, scale, residual)                          # x @ W^T * scale + residual, M <= 16 rows

Format: float8_e4m3fn weights (out, in) with one fp32 scale per output channel, ``scale = absmax(row) / 448``
(448 is e4m3's largest finite value), so every row uses the whole e4m3 range; ``W ~ q * scale[:, None]``.
Quantised: the LM's Mamba in_proj / out_proj, attention q / k / v / o, MLP up / down, and lm_head only when
asked (``lm_head=True``). The embedding, the norms, the Mamba A_log / D / dt_bias, conv1d and the whole
vision tower and projector keep their dtype. At one row (decoding one sequence) activations are not quantised:
x stays bf16 (or fp32), the weights are widened in registers (exact: every e4m3 value is a bf16 value), sums are fp32,
and the scale is applied once per output. Above one row on CUDA (prefill, decode batches) x is quantised
too, per row (``absmax(row) / 448``), and the product runs on the FP8 tensor cores (``torch._scaled_mm``,
fp32 accumulation, both scales applied to the output): twice the bf16 matmul rate and half the weight bytes,
at the cost of rounding x to e4m3 (``W8A8 = False`` turns it off: the widened weights in a bf16 matmul).
Accuracy against bf16: ``dev/probes/fp8_accuracy.py`` and docs/benchmarks.md.

``gemv`` is the dispatcher: the Triton kernel (``holotron/kernels/gemv_triton.py``) on CUDA, or under
TRITON_INTERPRET=1 on the CPU, for at most 16 rows; its PyTorch twin ``gemv_ref`` otherwise.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FP8Linear", "quantize_", "quantize_weight", "quantizer", "gemv", "gemv_ref", "fp8_matmul",
           "quantize_rows", "scaled_matmul", "MODES", "FP8_MAX"]

MODES = ("fp8",)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0           # torch.finfo(torch.float8_e4m3fn).max
GEMV_MAX_ROWS = 16        # above this, a matmul: FP8 x FP8 on CUDA (W8A8), else on the widened weight
W8A8 = True               # above one row on CUDA, quantise x per row and multiply on the FP8 tensor cores
# where the skinny Triton product (holotron/kernels/skinny_mm_triton.py) replaces torch._scaled_mm: up to
# FP8_GEMM_ROWS rows for every layer, and up to FP8_NARROW_ROWS rows for layers of at most FP8_NARROW_N outputs
# (few column strips, K split over programs: at 128 rows the 12B's out_proj / down took 0.028 / 0.045 ms there
# against 0.029 / 0.053 for _scaled_mm, which stayed ahead on the wide layers; bench_mm.py, H200, 2026-12-04).
# HOLOTRON_FP8_GEMM_ROWS / HOLOTRON_FP8_NARROW_ROWS (0: never)
def env_rows(name: str, default: int) -> int:
    """A row count from the environment variable ``name``: ``default`` when unset; a value that is not a
    non-negative integer is reported in one line (a warning naming the variable) and ``default`` is used."""
    raw = os.environ.get(name, "").strip()
    if raw.isdigit():
        return int(raw)
    if raw:
        import warnings

        warnings.warn(f"{name}={raw!r} is not a non-negative integer number of rows; using {default}", stacklevel=2)
    return default


FP8_GEMM_ROWS = env_rows("HOLOTRON_FP8_GEMM_ROWS", 64)
FP8_NARROW_ROWS = env_rows("HOLOTRON_FP8_NARROW_ROWS", 128)
FP8_NARROW_N = 8192
_W_DTYPES = (torch.bfloat16, torch.float16, torch.float32, FP8)
_X_TRITON = (torch.bfloat16, torch.float16, torch.float32)


# ----------------------------------------------------------------------------- the skinny matrix product


def gemv_ref(x, weight, scale=None, residual=None, *, norm=None, eps=1e-5, act=None, out_dtype=None, config=None):
    """The naive twin of the kernel, in fp32 (float64 for float64 x), cast to ``out_dtype`` (default x's):
    ``act(rmsnorm(x) @ W^T * scale) + residual``, where rmsnorm (when ``norm`` (K,) is given) is
    ``x / sqrt(mean(x^2) + eps) * norm`` and act is None or "relu2" (relu(v)^2). x (..., K), weight (N, K),
    scale (N,), residual (..., N). ``config`` is ignored (the kernel's launch settings)."""
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    xx = x.to(ct)
    if norm is not None:
        xx = xx * torch.rsqrt(xx.pow(2).mean(-1, keepdim=True) + eps) * norm.to(ct)
    y = xx @ weight.to(ct).T
    if scale is not None:
        y = y * scale.to(ct)
    if act == "relu2":
        y = torch.relu(y).square()
    if residual is not None:
        y = y + residual.to(ct)
    return y.to(out_dtype or x.dtype)


def _check(x, weight, scale, residual, norm=None, act=None):
    def expect(ok, msg):
        if not ok:
            raise ValueError(f"gemv: {msg}")

    expect(x.is_floating_point() and x.dim() >= 1, f"x must be a floating tensor (..., K), got {x.dtype} "
                                                   f"{tuple(x.shape)}")
    expect(weight.dim() == 2 and weight.shape[1] == x.shape[-1],
           f"weight must be (N, K={x.shape[-1]}), got {tuple(weight.shape)}")
    expect(weight.dtype in _W_DTYPES, f"weight dtype must be one of {_W_DTYPES}, got {weight.dtype}")
    expect(weight.dtype != FP8 or scale is not None, "a float8 weight needs its per-channel scale")
    if scale is not None:
        expect(tuple(scale.shape) == (weight.shape[0],) and scale.dtype == torch.float32,
               f"scale must be float32 ({weight.shape[0]},), got {scale.dtype} {tuple(scale.shape)}")
    if residual is not None:
        want = (*x.shape[:-1], weight.shape[0])
        expect(tuple(residual.shape) == want, f"residual must be {want}, got {tuple(residual.shape)}")
    if norm is not None:
        expect(tuple(norm.shape) == (x.shape[-1],), f"norm must be ({x.shape[-1]},), got {tuple(norm.shape)}")
    expect(act in (None, "relu2"), f"act must be None or 'relu2', got {act!r}")
    for name, t in (("weight", weight), ("scale", scale), ("residual", residual), ("norm", norm)):
        expect(t is None or t.device == x.device, f"{name} is on {t.device if t is not None else ''}, x on {x.device}")


def gemv(x, weight, scale=None, residual=None, *, norm=None, eps=1e-5, act=None, out_dtype=None, config=None,
         backend=None):
    """``y = act(rmsnorm(x) @ W^T (* scale)) (+ residual)``, y (..., N) in ``out_dtype`` (default x's dtype).

    x (..., K) bf16 / fp16 / fp32; weight (N, K) bf16 / fp16 / fp32 or float8_e4m3fn (then ``scale`` (N,)
    fp32 is required); residual (..., N); ``norm`` (K,): an RMSNorm weight applied to x first (``eps``);
    ``act``: None or "relu2". ``backend``: None (the Triton kernel where it can run and M = x.numel() / K
    <= 16, else ``gemv_ref``), "triton" or "ref". ``config``: the kernel's launch settings (``pick_config``'s
    keys), for benchmarks."""
    from .kernels import _triton_usable

    _check(x, weight, scale, residual, norm, act)
    k, n = x.shape[-1], weight.shape[0]
    m = math.prod(x.shape[:-1])
    kw = dict(norm=norm, eps=eps, act=act, out_dtype=out_dtype)
    if backend is None:
        ok = m <= GEMV_MAX_ROWS and x.dtype in _X_TRITON and _triton_usable(x.device) is None and k > 0
        backend = "triton" if ok else "ref"
    if backend == "ref":
        return gemv_ref(x, weight, scale, residual, **kw)
    if backend != "triton":
        raise ValueError(f"gemv: backend must be None, 'triton' or 'ref', got {backend!r}")
    why = _triton_usable(x.device)
    if why is not None or m > GEMV_MAX_ROWS or x.dtype not in _X_TRITON:
        raise ValueError(f"gemv: the Triton kernel cannot run here: {why or f'{m} rows of {x.dtype} x'}")
    from .kernels.gemv_triton import gemv_triton

    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    r = None if residual is None else residual.reshape(m, n)
    y = gemv_triton(x.reshape(m, k), w, scale, r, config=config, **kw)
    return y.view(*x.shape[:-1], n)


# ----------------------------------------------------------------------------- FP8 weights


@torch.no_grad()
def quantize_weight(w: torch.Tensor, rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) weight -> (float8_e4m3fn codes (out, in), fp32 scales (out,)), ``absmax(row) / 448`` per
    row (1 for an all-zero row). Done ``rows`` rows at a time: the fp32 temporary stays small."""
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for i in range(0, w.shape[0], rows):
        blk = w[i:i + rows].float()
        s = blk.abs().amax(dim=1) / FP8_MAX
        s = torch.where(s > 0, s, torch.ones_like(s))
        q[i:i + rows] = (blk / s[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
        scale[i:i + rows] = s
    return q, scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (float8_e4m3fn codes (M, K), fp32 scales (M, 1)), ``absmax(row) / 448`` per row: one Triton
    kernel on CUDA (holotron/kernels/rows_triton.py), torch ops elsewhere."""
    if x.is_cuda:
        from .kernels.rows_triton import row_norm_quant

        return row_norm_quant(x if x.stride(-1) == 1 else x.contiguous(), None, quant=True)
    xs = x.abs().amax(-1, keepdim=True).float().clamp_min(1e-12) / FP8_MAX
    return (x.float() / xs).clamp(-FP8_MAX, FP8_MAX).to(FP8), xs


def scaled_matmul(xq: torch.Tensor, xs: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """(xq * xs) @ (q * scale)^T on the FP8 tensor cores: xq (M, K) e4m3 with scales (M, 1), q (N, K) e4m3 with
    scales (N,); fp32 accumulation, -> (M, N) in ``out_dtype``. On CUDA where ``skinny_fp8`` says so the skinny
    Triton kernel (holotron/kernels/skinny_mm_triton.py), else ``torch._scaled_mm``."""
    if xq.is_cuda and skinny_fp8(xq.shape[0], q.shape[0]):
        from .kernels.skinny_mm_triton import skinny_mm

        return skinny_mm(xq, q, xs, scale, out_dtype=out_dtype)
    return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=scale[None, :], out_dtype=out_dtype)


def skinny_fp8(m: int, n: int) -> bool:
    """Whether an (m rows) x (n outputs) FP8 product runs through the skinny Triton kernel (see FP8_GEMM_ROWS)."""
    return m <= FP8_GEMM_ROWS or (m <= FP8_NARROW_ROWS and n <= FP8_NARROW_N)


def fp8_matmul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (..., K) bf16 / fp16 quantised per row to e4m3 (``quantize_rows``), times the e4m3 weight q (N, K) on
    the tensor cores (``scaled_matmul``) -> (..., N) in x's dtype. CUDA (sm 89+), or torch's CPU kernel."""
    k = x.shape[-1]
    xq, xs = quantize_rows(x.reshape(-1, k))
    return scaled_matmul(xq, xs, q, scale, x.dtype).view(*x.shape[:-1], q.shape[0])


@dataclass(frozen=True)
class WeightSpec:
    """What ``FP8Linear.weight`` answers: the shape, dtype and device an ``nn.Linear`` weight would have.
    Callers read ``lin.weight.dtype`` / ``.device`` to cast inputs and to allocate caches (holotron/lm.py's
    lm_head call, holotron/attention.py's ``new_state``); those keep working. It holds no values: code that
    multiplies by ``.weight`` directly fails loudly instead of reading float8 codes as numbers."""
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device


class FP8Linear(nn.Module):
    """A bias-optional linear layer with float8_e4m3fn weights and per-output-channel fp32 scales.

    Buffers: ``weight_fp8`` (out, in) float8_e4m3fn, ``weight_scale`` (out,) fp32, ``bias`` (out,) or None.
    ``forward(x)`` is ``nn.Linear``'s: y (..., out) in x's dtype. On CUDA one row goes through the GEMV kernel
    (``gemv``), more rows through ``fp8_matmul`` (W8A8; at 2-16 rows ``torch._scaled_mm`` beat the GEMV's
    ``tl.dot`` tile on an H200, bench_gemv.py 2026-12-04); any other device (or ``W8A8 = False``) multiplies
    by the widened codes (exact) and applies the scales to the fp32 / output values. ``.to(dtype)`` changes the
    compute dtype (``weight.dtype``), never the stored codes; ``.to(device)`` moves them.
    """

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.out_features, self.in_features = q.shape
        self.register_buffer("weight_fp8", q)
        self.register_buffer("weight_scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        # the compute dtype and device, carried by an empty tensor so nn.Module's .to() / .half() move it
        self.register_buffer("_like", torch.empty(0, dtype=dtype, device=q.device), persistent=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> FP8Linear:
        q, s = quantize_weight(lin.weight.detach())
        bias = None if lin.bias is None else lin.bias.detach()
        return cls(q, s, bias, dtype=lin.weight.dtype)

    @property
    def weight(self) -> WeightSpec:
        return WeightSpec(self.weight_fp8.shape, self._like.dtype, self.weight_fp8.device)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dense weight ``q * scale`` (out, in) in ``dtype`` (default the compute dtype)."""
        return (self.weight_fp8.float() * self.weight_scale[:, None]).to(dtype or self._like.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.numel() // max(x.shape[-1], 1)
        if x.is_cuda and (m == 1 or (m <= GEMV_MAX_ROWS and not W8A8)):
            y = gemv(x, self.weight_fp8, self.weight_scale)
        elif self.w8a8(x):
            y = fp8_matmul(x, self.weight_fp8, self.weight_scale)
        else:
            ct = x.dtype if x.dtype in _X_TRITON else torch.float32
            y = (F.linear(x.to(ct), self.weight_fp8.to(ct)).float() * self.weight_scale).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def w8a8(self, x: torch.Tensor) -> bool:
        """Whether rows of x (above one) go through the FP8 tensor cores: CUDA, ``W8A8`` on, 16-bit x, and
        both sides a multiple of 16 (``torch._scaled_mm``'s and the Triton product's alignment)."""
        return (x.is_cuda and W8A8 and x.dtype in (torch.bfloat16, torch.float16) and self.in_features % 16 == 0
                and self.out_features % 16 == 0)

    def _apply(self, fn, recurse=True):
        q, s = self._buffers.pop("weight_fp8"), self._buffers.pop("weight_scale")
        try:
            super()._apply(fn, recurse)  # the compute dtype / device probe and the bias
        finally:
            dev = self._like.device
            self._buffers["weight_fp8"], self._buffers["weight_scale"] = q.to(dev), s.to(dev)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"float8_e4m3fn per-channel scales, compute {self._like.dtype}")


# ----------------------------------------------------------------------------- swapping a model's layers


def _language_model(model: nn.Module) -> nn.Module:
    lm = getattr(model, "language_model", model)  # a Holotron holds its HybridLM there
    if not (hasattr(lm, "backbone") and hasattr(lm.backbone, "layers") and hasattr(lm, "lm_head")):
        raise ValueError(f"quantize: {type(model).__name__} has no Nemotron-H language model "
                         "(backbone.layers and lm_head)")
    return lm


def targets(model: nn.Module, lm_head: bool = False) -> list[str]:
    """Names (in ``model``) of the linear layers ``quantize_`` swaps: every ``nn.Linear`` of the LM's blocks
    (Mamba in_proj / out_proj, attention q / k / v / o, MLP up / down), and lm_head when asked."""
    lm = _language_model(model)
    prefix = "language_model." if lm is not model else ""
    names = [f"{prefix}backbone.layers.{n}" for n, m in lm.backbone.layers.named_modules() if isinstance(m, nn.Linear)]
    if lm_head and isinstance(lm.lm_head, nn.Linear):
        names.append(f"{prefix}lm_head")
    return names


def _swap(model: nn.Module, name: str) -> None:
    parent, _, leaf = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    lin = getattr(owner, leaf)
    if isinstance(lin, nn.Linear):
        setattr(owner, leaf, FP8Linear.from_linear(lin))


def _check_mode(mode) -> None:
    if mode not in MODES:
        raise ValueError(f"quantize must be None or one of {', '.join(map(repr, MODES))}, got {mode!r}")


@torch.no_grad()
def quantize_(model: nn.Module, mode: str = "fp8", *, lm_head: bool = False) -> nn.Module:
    """Swap the LM's linear layers (``targets``) for ``FP8Linear`` in place, one layer at a time; returns
    ``model``. Everything else (embedding, norms, Mamba A_log / D / dt_bias, conv1d, vision tower) is left as
    it is. Already-swapped layers are skipped."""
    _check_mode(mode)
    for name in targets(model, lm_head):
        _swap(model, name)
    return model


def quantizer(model: nn.Module, mode: str = "fp8", *, lm_head: bool = False):
    """For loading shard by shard: a callable ``after(tensor_name)`` to call once each tensor is assigned;
    it swaps a target layer as soon as all its tensors are loaded, so its bf16 weight is freed right away."""
    _check_mode(mode)
    pending = set(targets(model, lm_head))

    def after(name: str) -> None:
        owner = name.rpartition(".")[0]
        if owner in pending:
            lin = model.get_submodule(owner)
            if not any(t.is_meta for t in lin.parameters()):
                _swap(model, owner)
                pending.discard(owner)

    return after
