"""What the Triton scan, its backward and the decode step share: the ``@triton.jit`` helpers (dt
processing, the matrix product in the right precision, tiles through tensor descriptors or masked
pointers: ``_desc`` / ``_tile`` / ``_put``, and of (P, N) state matrices: ``_sdesc`` / ``_sload`` /
``_sstore``), token-major views, the operand precision, when descriptors may be used (``_tma_ok``) and
their scratch allocator, and the one allocator of the buffers the kernels fill (``empty``).

Decay math, accumulation and the state are fp32; the matrix products take fp32 operands in IEEE
precision for fp32 inputs (no TF32) and half operands for bf16 / fp16 inputs. float64 inputs are
computed in fp32.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Every buffer the wrappers of ssd_triton_scan.py, ssd_triton_backward.py and ssd_triton_step.py hand
# to a kernel comes from ``empty`` below, which calls this. Tests swap it for a NaN-filled allocation, so an
# element a kernel should have written but did not shows up as NaN.
_empty = torch.empty


def empty(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised buffer for a kernel to fill (through ``_empty``, looked up at each call)."""
    return _empty(*shape, dtype=dtype, device=device)

_DOT_MIN = 16  # compiled tl.dot needs every block dimension >= 16


def _p2(v: int, lo: int = _DOT_MIN) -> int:
    return max(lo, triton.next_power_of_2(v))


@triton.jit
def _process_dt(dt, bias, lo, hi, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP: tl.constexpr):
    """dt (fp32) -> clamp(softplus?(dt + bias), lo, hi), as torch's F.softplus (threshold 20)."""
    if HAS_BIAS:
        dt = dt + bias
    if SOFTPLUS:
        sp = tl.log(1.0 + tl.exp(tl.minimum(dt, 20.0)))
        dt = tl.where(dt > 20.0, dt, tl.where(dt < -15.0, tl.exp(dt), sp))
    if CLAMP:
        dt = tl.minimum(tl.maximum(dt, lo), hi)
    return dt


@triton.jit
def _seq_span(cu_ptr, s, L, VARLEN: tl.constexpr):
    """(first token, end token) of sequence ``s``: a ``cu_seqlens`` segment, or batch row s of L tokens."""
    if VARLEN:
        t_seq = tl.load(cu_ptr + s).to(tl.int32)
        t_end = tl.load(cu_ptr + s + 1).to(tl.int32)
    else:
        t_seq = s * L
        t_end = t_seq + L
    return t_seq, t_end


@triton.jit
def _state_in(init_ptr, base, ns, cols, N, mn, mp, BN: tl.constexpr, BP: tl.constexpr, HAS_INIT: tl.constexpr):
    """The forward scans' state, transposed (dstate x columns) in fp32, of the (P, N) state rows ``cols`` at
    ``base`` (0 without an initial state), with its offsets and mask for the stores that follow."""
    off = ns[:, None] + cols[None, :] * N
    mask = mn[:, None] & mp[None, :]
    if HAS_INIT:
        st = tl.load(init_ptr + base + off, mask=mask, other=0.0).to(tl.float32)
    else:
        st = tl.zeros([BN, BP], dtype=tl.float32)
    return st, off, mask


@triton.jit
def _put_y(y, xv, Dv, zd, yd, y_ptr, row, rows, cols, s_z_t, s_y_t, Q: tl.constexpr, BP: tl.constexpr,
           TMA: tl.constexpr, MASK_P: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """The forward scans' last step of a chunk: y (fp32) + D x, times silu(z), written to ``yd``'s tile in
    ``y_ptr``'s dtype."""
    if HAS_D:
        y += Dv * xv.to(tl.float32)
    if HAS_Z:
        zv = _tile(zd, row, rows, cols, s_z_t, Q, BP, TMA, MASK_P).to(tl.float32)
        y = y * zv * tl.sigmoid(zv)
    _put(yd, row, rows, cols, s_y_t, y.to(y_ptr.dtype.element_ty), Q, BP, TMA, MASK_P)


@triton.jit
def _load_D(D_ptr, h, P, cols, HAS_D: tl.constexpr, D_PER_CHANNEL: tl.constexpr):
    """The forward scans' skip weight D of head ``h`` for the columns ``cols``: per channel (1, BP), per head (a
    scalar), or 0.0 without D."""
    if HAS_D:
        if D_PER_CHANNEL:
            Dv = tl.load(D_ptr + h * P + cols, mask=cols < P, other=0.0).to(tl.float32)[None, :]
        else:
            Dv = tl.load(D_ptr + h).to(tl.float32)
    else:
        Dv = 0.0
    return Dv


@triton.jit
def _seq_descs(x_ptr, B_ptr, C_ptr, y_ptr, z_ptr, t_seq64, rows, h, g, p0, P, N, s_x_t, s_x_h, s_b_t, s_b_g,
               s_c_t, s_c_g, s_z_t, s_z_h, s_y_t, s_y_h, BR: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
               TMA: tl.constexpr, HAS_Z: tl.constexpr):
    """The forward scans' tiles of a sequence (``rows`` tokens from row ``t_seq64``) for head ``h`` (group ``g``)
    from column ``p0``: ``_desc``s of x, B, C, y and z (y's when there is no z: not read), tiles of BR rows."""
    xd = _desc(x_ptr + t_seq64 * s_x_t + h * s_x_h + p0, rows, P - p0, s_x_t, BR, BP, TMA)
    bd = _desc(B_ptr + t_seq64 * s_b_t + g * s_b_g, rows, N, s_b_t, BR, BN, TMA)
    cd = _desc(C_ptr + t_seq64 * s_c_t + g * s_c_g, rows, N, s_c_t, BR, BN, TMA)
    yd = _desc(y_ptr + t_seq64 * s_y_t + h * s_y_h + p0, rows, P - p0, s_y_t, BR, BP, TMA)
    if HAS_Z:
        zd = _desc(z_ptr + t_seq64 * s_z_t + h * s_z_h + p0, rows, P - p0, s_z_t, BR, BP, TMA)
    else:
        zd = yd
    return xd, bd, cd, yd, zd


@triton.jit
def _mm(a, b, like, OPS: tl.constexpr):
    """a @ b with fp32 accumulation. OPS: "half" casts the operands to like's dtype (bf16 / fp16),
    "ieee" multiplies fp32 operands in full precision (never TF32), "tf32" fp32 operands in TF32."""
    if OPS == "half":
        return tl.dot(a.to(like.dtype), b.to(like.dtype))
    elif OPS == "ieee":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))


@triton.jit
def _smm(a, b, like, OPS: tl.constexpr, state_ptr):
    """a @ b where one operand is a stored chunk state or state gradient (``state_ptr`` points at them): states
    stored in fp32 under half inputs (BWD_CONFIG["STATES"] "fp32") take fp32 operands at tf32 precision, which
    keeps their extra precision (dev/probes/grad_rounding.py); otherwise ``_mm``."""
    if OPS == "half" and state_ptr.dtype.element_ty == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        return _mm(a, b, like, OPS)


@triton.jit
def _desc(base, rows, cols, stride, BR: tl.constexpr, BC: tl.constexpr, TMA: tl.constexpr):
    """A tensor descriptor (TMA) of a (rows, cols) matrix at ``base`` with row stride ``stride``: tiles of
    (BR, BC); reads past its edges give 0, writes there are dropped. Without TMA, ``base`` itself."""
    if TMA:
        return tl.make_tensor_descriptor(base, shape=[rows, cols], strides=[stride, 1], block_shape=[BR, BC])
    else:
        return base


@triton.jit
def _tile_ptrs(base, row, rows, cols, stride, BR: tl.constexpr, BC: tl.constexpr, MASK_C: tl.constexpr):
    """The addresses and mask of the (BR, BC) tile at ``row`` of a (rows, cols) matrix at ``base``."""
    r = tl.arange(0, BR)
    c = tl.arange(0, BC)
    m = (row + r < rows)[:, None]
    if MASK_C:
        m = m & (c < cols)[None, :]
    return base + row.to(tl.int64) * stride + r[:, None] * stride + c[None, :], m


@triton.jit
def _tile(desc, row, rows, cols, stride, BR: tl.constexpr, BC: tl.constexpr, TMA: tl.constexpr,
          MASK_C: tl.constexpr):
    """The (BR, BC) tile at ``row`` of ``_desc``'s matrix (0 past its edges)."""
    if TMA:
        return desc.load([row, 0])
    else:
        ptrs, m = _tile_ptrs(desc, row, rows, cols, stride, BR, BC, MASK_C)
        return tl.load(ptrs, mask=m, other=0.0)


@triton.jit
def _put(desc, row, rows, cols, stride, val, BR: tl.constexpr, BC: tl.constexpr, TMA: tl.constexpr,
         MASK_C: tl.constexpr):
    """Writes the (BR, BC) tile ``val`` at ``row`` of ``_desc``'s matrix (nothing past its edges)."""
    if TMA:
        desc.store([row, 0], val)
    else:
        ptrs, m = _tile_ptrs(desc, row, rows, cols, stride, BR, BC, MASK_C)
        tl.store(ptrs, val, mask=m)


@triton.jit
def _sdesc(base, n_mat, P, N, BP: tl.constexpr, NP: tl.constexpr, TMA: tl.constexpr):
    """A tensor descriptor of n_mat (P, N) row-major matrices at ``base`` (states, state gradients): tiles of
    (BP, NP) blocks of one matrix, nothing read or written past its P rows or N columns. Without TMA,
    ``base``."""
    if TMA:
        return tl.make_tensor_descriptor(base, shape=[n_mat, P, N], strides=[P * N, N, 1], block_shape=[1, BP, NP])
    else:
        return base


@triton.jit
def _smat_ptrs(base, mat, p0, n0, P, N, BP: tl.constexpr, NP: tl.constexpr):
    """The addresses and mask of the (BP, NP) block at row p0, column n0 of the (P, N) matrix ``mat`` at
    ``base``."""
    r = p0 + tl.arange(0, BP)
    c = n0 + tl.arange(0, NP)
    return base + mat.to(tl.int64) * P * N + r[:, None] * N + c[None, :], (r < P)[:, None] & (c < N)[None, :]


@triton.jit
def _sload(desc, mat, p0, n0, P, N, BP: tl.constexpr, NP: tl.constexpr, TMA: tl.constexpr):
    """The (BP, NP) block at row p0, column n0 of matrix ``mat`` of ``_sdesc``'s (0 past its edges)."""
    if TMA:
        return tl.reshape(desc.load([mat, p0, n0]), (BP, NP))
    else:
        ptrs, m = _smat_ptrs(desc, mat, p0, n0, P, N, BP, NP)
        return tl.load(ptrs, mask=m, other=0.0)


@triton.jit
def _sstore(desc, mat, p0, n0, P, N, val, BP: tl.constexpr, NP: tl.constexpr, TMA: tl.constexpr):
    """Writes the (BP, NP) tile ``val`` at row p0, column n0 of matrix ``mat`` of ``_sdesc``'s (nothing past
    its edges)."""
    if TMA:
        desc.store([mat, p0, n0], tl.reshape(val, (1, BP, NP)))
    else:
        ptrs, m = _smat_ptrs(desc, mat, p0, n0, P, N, BP, NP)
        tl.store(ptrs, val, mask=m)


_SMS = {}


def _sm_count(dev: torch.device) -> int:
    """Multiprocessors of a CUDA device (1 elsewhere), looked up once per device."""
    if dev.type != "cuda":
        return 1
    if dev not in _SMS:
        _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _SMS[dev]


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """(b, l, *rest) -> (b * l, *rest), a view when the strides allow; last dim unit-stride."""
    t = t.reshape(-1, *t.shape[2:])
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t


def _dot_ops(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return "ieee"
    if dtype == torch.bfloat16 and _interpreting():
        return "tf32"  # the interpreter (triton 3.9) multiplies bf16 dot operands as raw bits
    return "half"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _tma_ok(elsize: int, tensors, offsets) -> bool:
    """Tensor descriptors need 16-byte aligned addresses, row strides and column offsets."""
    return (all(t.data_ptr() % 16 == 0 and t.stride(0) * elsize % 16 == 0 for t in tensors)
            and all(v * elsize % 16 == 0 for v in offsets))


def _ensure_allocator() -> None:
    """Device-made tensor descriptors need a global scratch buffer per launch: from torch's allocator
    (so CUDA-graph capture takes it from the graph's pool), unless the caller set one."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream):
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    return torch.empty(size, dtype=torch.int8, device=dev)
