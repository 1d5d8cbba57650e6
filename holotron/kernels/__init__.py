"""The SSD (Mamba2) scan: one signature, several backends.

    y, final_state = ssd_scan(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                              dt_limit=(0.0, inf), initial_state=None, cu_seqlens=None,
                              chunk_size=128, backend=None)
    y = ssd_step(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                 dt_limit=(0.0, inf), backend=None)
    y = conv_step(conv, x, weight, bias=None, backend=None)     # Mamba2's conv window, one decode token
    y = ssd_scan_rows(x, dt, A, B, C, state, rows, ...)         # states read and written at state[rows]
    y = conv_seq(x, conv, weight, bias=None, counts=None, backend=None, rows=None)   # a chunk's causal conv

Shapes (b batch, l seqlen, h heads, p headdim, g groups, n dstate):
    x (b, l, h, p)   dt (b, l, h)   A (h,) fp32 < 0   B, C (b, l, g, n)   D (h,) or (h, p)
    z like x (y *= silu(z))   initial_state / final_state (b, h, p, n) fp32
    cu_seqlens (s+1,) int with b == 1: s packed sequences, states are then (s, h, p, n)

Backends: "naive" (sequential recurrence, the ground truth), "chunked" (the SSD chunked algorithm in
PyTorch, any device), "triton" (fused Triton kernels; CUDA, or the CPU under TRITON_INTERPRET=1).
``backend=None`` picks the fastest one that works for the tensors' device and logs once why a faster
one is off. The backend is chosen here, at the op boundary, never inside an ``nn.Module``.

See ``holotron/kernels/README.md`` for the recurrence and the chunked algorithm.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
from collections.abc import Callable

import torch

__all__ = ["ssd_scan", "ssd_scan_rows", "ssd_step", "conv_step", "conv_seq", "available_backends", "use_backend",
           "BACKENDS"]

BACKENDS = ("naive", "chunked", "triton")

log = logging.getLogger("holotron.kernels")
_said: set[str] = set()


def _say_once(msg: str) -> None:
    if msg not in _said:
        _said.add(msg)
        log.info(msg)


@functools.cache  # find_spec costs microseconds on every decode step otherwise
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _triton_usable(device: torch.device) -> str | None:
    """None when the Triton backend can run on ``device``, else the reason it cannot."""
    if not _triton_installed():
        return "triton is not installed (pip install triton, Linux only)"
    if device.type == "cuda":
        return None
    if _triton_interpret():
        return None
    return f"tensors are on {device.type}; Triton needs CUDA (or TRITON_INTERPRET=1 for the slow interpreter)"


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Backends that can run on ``device``, slowest first."""
    out = ["naive", "chunked"]
    if _triton_usable(torch.device(device)) is None:
        out.append("triton")
    return out


# ----------------------------------------------------------------------------- argument checks


def _shape(t: torch.Tensor) -> str:
    return "(" + _dims(t.shape) + ")"


def _dims(dims) -> str:
    return ", ".join(str(s) for s in dims)


def _expect(cond: bool, msg: Callable[[], str]) -> None:
    """Raises ValueError(msg()) unless cond: the message (shapes, dtypes) is formatted only on failure,
    since the checks run on every call of the kernels (52 scans or steps per forward of the 12B model)."""
    if not cond:
        raise ValueError(msg())


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_common(name_x, x, dt, A, B, C, D, z, dt_bias, dt_limit, lead: tuple[int, ...]):
    """Checks shared by scan and step; ``lead`` is the leading dims of x before (h, p)."""
    _expect(x.dtype in _FLOATS, lambda: f"{name_x} must be a floating tensor, got dtype {x.dtype}")
    h, p = x.shape[-2], x.shape[-1]
    _expect(tuple(dt.shape) == (*lead, h), lambda: f"dt must have shape ({_dims(lead)}, heads={h}), got {_shape(dt)}")
    _expect(dt.dtype in _FLOATS, lambda: f"dt must be a floating tensor, got dtype {dt.dtype}")
    _expect(A.dim() == 1 and A.shape[0] == h, lambda: f"A must have shape (heads={h},), got {_shape(A)}")
    _expect(A.dtype in (torch.float32, torch.float64), lambda: f"A must be float32 (it is -exp(A_log)), got {A.dtype}")
    _expect(B.dim() == x.dim() and tuple(B.shape[:-2]) == lead,
            lambda: f"B must have shape ({_dims(lead)}, groups, dstate), got {_shape(B)}")
    _expect(tuple(C.shape) == tuple(B.shape), lambda: f"C must have the shape of B {_shape(B)}, got {_shape(C)}")
    g = B.shape[-2]
    _expect(g >= 1 and h % g == 0, lambda: f"heads ({h}) must be divisible by groups ({g}) of B and C")
    for nm, t in (("B", B), ("C", C)):
        _expect(t.dtype == x.dtype, lambda: f"{nm} must have the dtype of {name_x} ({x.dtype}), got {t.dtype}")
    if z is not None:
        _expect(tuple(z.shape) == tuple(x.shape),
                lambda: f"z must have the shape of {name_x} {_shape(x)}, got {_shape(z)}")
        _expect(z.dtype == x.dtype, lambda: f"z must have the dtype of {name_x} ({x.dtype}), got {z.dtype}")
    if D is not None:
        _expect(tuple(D.shape) in ((h,), (h, p)),
                lambda: f"D must have shape (heads={h},) or (heads={h}, headdim={p}), got {_shape(D)}")
        _expect(D.dtype in _FLOATS, lambda: f"D must be floating, got {D.dtype}")
    if dt_bias is not None:
        _expect(tuple(dt_bias.shape) == (h,), lambda: f"dt_bias must have shape (heads={h},), got {_shape(dt_bias)}")
        _expect(dt_bias.dtype in _FLOATS, lambda: f"dt_bias must be floating, got {dt_bias.dtype}")
    _expect(len(tuple(dt_limit)) == 2, lambda: f"dt_limit must be a pair (low, high), got {dt_limit!r}")
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    _expect(not math.isnan(lo) and not math.isnan(hi) and lo <= hi,
            lambda: f"dt_limit must satisfy low <= high, got {dt_limit!r}")
    dev = x.device
    for nm, t in (("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias)):
        if t is not None:
            _expect(t.device == dev,
                    lambda: f"{nm} is on {t.device} but {name_x} is on {dev}: put all inputs on one device")
    return (lo, hi)


def _check_scan(x, dt, A, B, C, D, z, dt_bias, dt_limit, initial_state, cu_seqlens, chunk_size):
    _expect(x.dim() == 4, lambda: f"x must have shape (batch, seqlen, heads, headdim), got {_shape(x)}")
    b, l, h, p = x.shape
    _expect(b >= 1 and l >= 1 and h >= 1 and p >= 1, lambda: f"x must be non-empty, got {_shape(x)}")
    limit = _check_common("x", x, dt, A, B, C, D, z, dt_bias, dt_limit, (b, l))
    _expect(isinstance(chunk_size, int) and chunk_size >= 1,
            lambda: f"chunk_size must be a positive int, got {chunk_size!r}")
    n_seq = b
    if cu_seqlens is not None:
        _expect(b == 1, lambda: f"cu_seqlens needs batch == 1 (sequences packed along seqlen), got batch {b}")
        _expect(cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 2,
                lambda: f"cu_seqlens must be a 1-d tensor [0, l1, l1+l2, ..., seqlen], got {_shape(cu_seqlens)}")
        _expect(not cu_seqlens.is_floating_point() and not cu_seqlens.is_complex(),
                lambda: f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
        n_seq = cu_seqlens.numel() - 1
        if not (cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing()):
            # the values need a host copy: skipped while a CUDA graph is being captured (no sync allowed
            # there; the eager call before the capture has checked the same kind of input)
            cs = cu_seqlens.detach().to("cpu", torch.int64)
            _expect(int(cs[0]) == 0, lambda: f"cu_seqlens must start at 0, got {int(cs[0])}")
            _expect(bool((cs[1:] > cs[:-1]).all()),
                    lambda: f"cu_seqlens must be strictly increasing, got {cs.tolist()}")
            _expect(int(cs[-1]) == l, lambda: f"cu_seqlens must end at seqlen ({l}), got {int(cs[-1])}")
    if initial_state is not None:
        want = (n_seq, h, p, B.shape[-1])
        _expect(tuple(initial_state.shape) == want,
                lambda: f"initial_state must have shape {want} (sequences, heads, headdim, dstate), "
                f"got {_shape(initial_state)}")
        _expect(initial_state.dtype in (torch.float32, torch.float64),
                lambda: f"initial_state must be float32, got {initial_state.dtype}")
        _expect(initial_state.device == x.device,
                lambda: f"initial_state is on {initial_state.device} but x is on {x.device}")
    return limit


def _check_step(state, x, dt, A, B, C, D, z, dt_bias, dt_limit):
    _expect(x.dim() == 3, lambda: f"x must have shape (batch, heads, headdim), got {_shape(x)}")
    b, h, p = x.shape
    limit = _check_common("x", x, dt, A, B, C, D, z, dt_bias, dt_limit, (b,))
    want = (b, h, p, B.shape[-1])
    _expect(tuple(state.shape) == want,
            lambda: f"state must have shape {want} (batch, heads, headdim, dstate), got {_shape(state)}")
    _expect(state.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16),
            lambda: f"state must be float32 (or bfloat16 / float16 to halve its bytes), got {state.dtype}")
    _expect(state.device == x.device, lambda: f"state is on {state.device} but x is on {x.device}")
    return limit


# ----------------------------------------------------------------------------- dispatch

_default_backend: str | None = os.environ.get("HOLOTRON_SSD_BACKEND") or None


class use_backend:
    """The one switch: ``with use_backend("naive"): model(ids)`` runs every ``backend=None`` call
    (the models' calls) on that backend. Also settable for a process with HOLOTRON_SSD_BACKEND."""

    def __init__(self, name: str | None):
        if name is not None and name not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} or None, got {name!r}")
        self.name = name

    def __enter__(self):
        global _default_backend
        self._old, _default_backend = _default_backend, self.name
        return self

    def __exit__(self, *exc):
        global _default_backend
        _default_backend = self._old
        return False



def _pick(backend: str | None, device: torch.device, op: str, fallback: str) -> str:
    if backend is None:
        backend = _default_backend
    if backend is not None:
        _expect(backend in BACKENDS, lambda: f"backend must be one of {BACKENDS} or None, got {backend!r}")
        if backend == "triton":
            why = _triton_usable(device)
            _expect(why is None, lambda: f"backend='triton' cannot run here: {why}")
        return backend
    why = _triton_usable(device)
    if why is None and device.type != "cuda":
        # the interpreter is a debugging aid (~50x slower than PyTorch on the CPU): only an explicit
        # backend="triton" or use_backend("triton") gets it
        why = (f"tensors are on {device.type}; TRITON_INTERPRET=1 is set, but the interpreter is only used "
               "when asked for (backend='triton')")
    if why is None:
        return "triton"
    _say_once(f"holotron.kernels: {op} uses the '{fallback}' backend because the Triton one is off: {why}")
    return fallback


def ssd_scan(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
             dt_limit=(0.0, math.inf), initial_state=None, cu_seqlens=None, chunk_size=128,
             backend=None):
    """The SSD scan over a whole sequence. Returns ``(y, final_state)``: y like x, state fp32.

    Per head h with state S (headdim x dstate), for t = 1..T:
        dt_t = clamp(softplus?(dt_t + dt_bias), *dt_limit)
        S_t  = exp(dt_t * A) * S_{t-1} + dt_t * x_t B_t^T
        y_t  = S_t C_t + D * x_t,  then  y_t *= silu(z_t)  when z is given.
    """
    limit = _check_scan(x, dt, A, B, C, D, z, dt_bias, dt_limit, initial_state, cu_seqlens, chunk_size)
    name = _pick(backend, x.device, "ssd_scan", "chunked")
    if name == "naive":
        from .ssd_naive import ssd_scan_naive as fn
    elif name == "chunked":
        from .ssd_chunked import ssd_scan_chunked as fn
    elif torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                         for t in (x, dt, A, B, C, D, z, dt_bias, initial_state)):
        asked = backend is not None or _default_backend is not None
        if x.device.type == "cuda" and x.dtype not in (torch.bfloat16, torch.float16) and not asked:
            # the backward's fp32 tiles at a real layer's headdim and dstate exceed an SM's shared memory
            _say_once("holotron.kernels: ssd_scan with gradients on fp32 CUDA tensors uses the 'chunked' "
                      "backend (the Triton backward is for bf16 / fp16)")
            from .ssd_chunked import ssd_scan_chunked as fn
        else:
            from .ssd_triton_autograd import ssd_scan_triton_train as fn  # Triton forward + Triton backward
    else:
        from .ssd_triton_scan import ssd_scan_triton as fn
    return fn(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=limit,
              initial_state=initial_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size)


def ssd_scan_rows(x, dt, A, B, C, state, rows, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                  dt_limit=(0.0, math.inf), chunk_size=128, backend=None):
    """``ssd_scan`` of a batch whose row i starts from ``state[rows[i]]`` and leaves its final state there, in
    place, rounded once to state's dtype: state (R, heads, headdim, dstate) fp32 / bf16 / fp16, rows (batch,)
    integer, distinct. Returns y. The Triton scan reads and writes those rows inside its
    launch (no gathered copy, no fp32 copy); the other backends gather, scan in fp32 and scatter."""
    limit = _check_scan(x, dt, A, B, C, D, z, dt_bias, dt_limit, None, None, chunk_size)
    b, _, h, p = x.shape
    _expect(state.dim() == 4 and tuple(state.shape[1:]) == (h, p, B.shape[-1]),
            lambda: f"state must have shape (rows, heads={h}, headdim={p}, dstate={B.shape[-1]}), got {_shape(state)}")
    _expect(state.dtype in (torch.float32, torch.bfloat16, torch.float16) and state.device == x.device,
            lambda: f"state must be a float32 / bfloat16 / float16 tensor on {x.device}, got {state.dtype} on "
                    f"{state.device}")
    _expect(tuple(rows.shape) == (b,) and not rows.is_floating_point(),
            lambda: f"rows must be an integer tensor of shape (batch={b},), got {(rows.dtype, _shape(rows))}")
    name = _pick(backend, x.device, "ssd_scan", "chunked")
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, dt, A, B, C, D, z, dt_bias))
    if name == "triton" and not grad and state.is_contiguous():
        from .ssd_triton_scan import SCAN_CONFIG, ssd_scan_triton_fwd

        if not (SCAN_CONFIG.get("FLAT") or SCAN_CONFIG.get("TWO_PASS")):
            return ssd_scan_triton_fwd(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                       dt_limit=limit, initial_state=state, chunk_size=chunk_size,
                                       state_rows=rows).y
    rows = rows.to(state.device)
    y, final = ssd_scan(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=limit,
                        initial_state=state.index_select(0, rows).float(), chunk_size=chunk_size, backend=backend)
    state.index_copy_(0, rows, final.to(state.dtype))
    return y


def ssd_step(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
             dt_limit=(0.0, math.inf), backend=None, active=None):
    """One decode step: updates ``state`` (batch, heads, headdim, dstate) in place, returns y
    (batch, heads, headdim). ``active`` (batch,) integer or bool, optional: rows where it is 0 get y but
    their state is not written (the decode engine's rows that are not decoding)."""
    limit = _check_step(state, x, dt, A, B, C, D, z, dt_bias, dt_limit)
    _expect(active is None or tuple(active.shape) == (x.shape[0],),
            lambda: f"active must have shape (batch={x.shape[0]},), got {_shape(active)}")
    name = _pick(backend, x.device, "ssd_step", "naive")
    if name in ("naive", "chunked"):  # one token: the chunked algorithm is the recurrence itself
        from .ssd_naive import ssd_step_naive as fn
    else:
        from .ssd_triton_step import ssd_step_triton as fn
    return fn(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=limit,
              active=active)


def conv_step(conv, x, weight, bias=None, backend=None, active=None):
    """The causal depthwise conv of one decode token: ``conv`` (batch, channels, K) holds the last K
    inputs, oldest first, and slides by one in place (x (batch, channels) enters last); returns
    silu(sum_k conv[..., k] * weight[:, k] + bias) (batch, channels) in x's dtype. weight (channels, K)
    or (channels, 1, K). ``active`` (batch,) integer or bool: rows where it is 0 get their output
    but keep their window (the decode engine's rows that are not decoding). Naive twin:
    ``holotron/kernels/conv_naive.py``; Triton: ``holotron/kernels/conv_step_triton.py``."""
    c, K = conv.shape[1:]
    weight = weight.reshape(weight.shape[0], -1)
    _expect(x.dim() == 2 and tuple(x.shape) == (conv.shape[0], c),
            lambda: f"x must have shape (batch={conv.shape[0]}, channels={c}), got {_shape(x)}")
    _expect(tuple(weight.shape) == (c, K),
            lambda: f"weight must have shape (channels={c}, K={K}), got {_shape(weight)}")
    _expect(bias is None or tuple(bias.shape) == (c,), lambda: f"bias must have shape (channels={c},), got "
            f"{_shape(bias) if bias is not None else None}")
    _expect(active is None or tuple(active.shape) == (conv.shape[0],),
            lambda: f"active must have shape (batch={conv.shape[0]},), got {_shape(active)}")
    if _pick(backend, x.device, "conv_step", "naive") == "triton":
        from .conv_step_triton import conv_step_triton
        return conv_step_triton(conv, x, weight.contiguous(), bias, active)
    from .conv_naive import conv_step_naive
    return conv_step_naive(conv, x, weight, bias, active)


def conv_seq(x, conv, weight, bias=None, counts=None, backend=None, rows=None):
    """Mamba2's causal depthwise conv over a chunk of tokens: x (batch, T, channels) token-major (a strided
    slice is fine: unit stride over channels); ``conv`` (batch, channels, K) the last K inputs before x, oldest
    first (its last K - 1 enter the conv), set in place to the last K real inputs; None: zeros before x,
    nothing kept. ``counts`` (batch,) integer: row i's first counts[i] tokens are real, the rest pads, read as
    zeros (None: all). Returns silu(causal conv + bias) (batch, T, channels) in x's dtype. weight (channels, K)
    or (channels, 1, K). ``rows`` (batch,) integer, distinct: ``conv`` is a larger buffer (R, channels, K) and
    batch row i's window is conv[rows[i]] (read and updated there; the Triton kernel indexes it, the naive twin
    gathers and scatters). Naive twin (and the path when autograd records any input): ``conv_seq_naive`` in
    ``holotron/kernels/conv_naive.py``; Triton: ``holotron/kernels/conv_seq_triton.py``."""
    _expect(x.dim() == 3, lambda: f"x must have shape (batch, T, channels), got {_shape(x)}")
    b, t, c = x.shape
    weight = weight.reshape(weight.shape[0], -1)
    K = weight.shape[1]
    _expect(weight.shape[0] == c and K >= 1, lambda: f"weight must have shape (channels={c}, K), got {_shape(weight)}")
    _expect(rows is None or (conv is not None and tuple(rows.shape) == (b,) and not rows.is_floating_point()),
            lambda: f"rows must be an integer tensor of shape (batch={b},) with a conv buffer, got "
                    f"{(rows.dtype, _shape(rows)) if rows is not None else None}")
    _expect(conv is None or (tuple(conv.shape) == (b, c, K) if rows is None else
                             (conv.dim() == 3 and tuple(conv.shape[1:]) == (c, K))),
            lambda: f"conv must have shape ({'rows' if rows is not None else f'batch={b}'}, channels={c}, K={K}), "
                    f"got {_shape(conv)}")
    _expect(bias is None or tuple(bias.shape) == (c,), lambda: f"bias must have shape (channels={c},), got "
            f"{_shape(bias) if bias is not None else None}")
    _expect(counts is None or (tuple(counts.shape) == (b,) and not counts.is_floating_point()),
            lambda: f"counts must be an integer tensor of shape (batch={b},), got "
            f"{(counts.dtype, _shape(counts)) if counts is not None else None}")
    grad = torch.is_grad_enabled() and any(v is not None and v.requires_grad for v in (x, weight, bias))
    name = "naive" if grad and backend is None else _pick(backend, x.device, "conv_seq", "naive")
    _expect(not (grad and name == "triton"),
            lambda: "conv_seq: backend='triton' has no backward; an input requires grad "
                                            "(use backend=None or 'naive', or torch.no_grad())")
    if name == "triton" and (conv is None or conv.stride(-1) == 1):  # the window is updated in place
        from .conv_seq_triton import conv_seq_triton
        return conv_seq_triton(x if x.stride(-1) == 1 else x.contiguous(), conv, weight.contiguous(), bias, counts,
                               rows)
    from .conv_naive import conv_seq_naive
    if rows is None:
        return conv_seq_naive(x, conv, weight, bias, counts)
    rows = rows.to(conv.device)
    part = conv.index_select(0, rows)
    out = conv_seq_naive(x, part, weight, bias, counts)
    conv.index_copy_(0, rows, part)
    return out
