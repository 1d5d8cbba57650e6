"""One attention layer's KV cache, ``KVCache``: keys and values in the model's dtype, or FP8 (e4m3) codes with
one scale per (row, KV head, slot), and that format's helpers.

    k8, ks = quantize_kv(k)          k (..., hd) -> codes (..., hd) float8_e4m3fn, scales (...) fp32
    k = dequantize_kv(k8, ks, dtype) codes * scales, in ``dtype``
    kv_dtype_for(kv_dtype, device)   None (the model's dtype) or torch.float8_e4m3fn, else one clear error

``scale = absmax(key or value vector over head_dim) / 448`` (448: e4m3's largest finite value), so each
slot's largest element maps to +-448 and no element of a real checkpoint's outlier keys saturates; a vector
of zeros keeps scale 0 (and decodes to zeros). The rounding is to nearest: an element's error is at most
1/16 of its magnitude (e4m3 has 3 mantissa bits), or half the smallest subnormal step (2^-10 * scale) for the
elements below 2^-6 * scale. A value already of the form code * scale, with one element at +-448, comes back
exactly.

The scales are stored in fp32, not bf16: at head_dim 128 they add 4 bytes to the 128 of a slot's codes (3 %),
where bf16 scales would save 1.5 % of the cache but round every scale to 8 bits (a relative error of up to
2^-9 on every element of the slot, on top of e4m3's) and could map the largest element past 448 unless
rounded up; fp32 keeps the per-element bound above exact and the kernels' scale loads trivial.

Indexed writes and row moves of FP8 codes go through ``raw`` (a uint8 view of the same bytes: index_put_,
scatter_, index_select and index_copy_ are defined for uint8 on every device); ``KVCache.tensors()`` hands
them out that way. Every write of keys and values into an FP8 cache quantizes (``Attention`` in
holotron/attention.py); the attention kernels (holotron/kernels/attn_decode_triton.py, attn_chunk_triton.py)
read the codes and scales themselves, the eager attention paths dequantize only the slots they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVCache", "FP8", "FP8_MAX", "quantize_kv", "dequantize_kv", "raw", "kv_dtype_for", "kv_slot_bytes"]

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_DTYPE = torch.float32
KV_DTYPE_FORMS = "kv_dtype=None (the model's dtype) or kv_dtype=torch.float8_e4m3fn"


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., hd) -> (float8_e4m3fn codes (..., hd), fp32 scales (...)): one scale per vector, absmax / 448."""
    xf = x.float()
    scale = xf.abs().amax(-1) / FP8_MAX
    div = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (xf / div[..., None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8), scale


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Codes (..., hd) and scales (...) -> (..., hd) in ``dtype`` (the product in fp32, rounded once)."""
    return (codes.float() * scale[..., None]).to(dtype)


def raw(t: torch.Tensor) -> torch.Tensor:
    """The same bytes as uint8 where ``t`` is float8_e4m3fn (for indexed copies), else ``t`` itself."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def kv_slot_bytes(n_kv_heads: int, head_dim: int, kv_dtype: torch.dtype | None, model_dtype: torch.dtype) -> int:
    """Bytes one token's keys and values take in one attention layer: codes plus scales for FP8."""
    if kv_dtype == FP8:
        return 2 * n_kv_heads * (head_dim + torch.empty(0, dtype=SCALE_DTYPE).element_size())
    return 2 * n_kv_heads * head_dim * torch.empty(0, dtype=model_dtype).element_size()


def kv_dtype_for(kv_dtype, device: torch.device | str, model_dtype: torch.dtype | None = None,
                 who: str = "Engine") -> torch.dtype | None:
    """``kv_dtype`` as the state's allocators take it: None for the model's own dtype (also when the model's
    dtype is passed), ``torch.float8_e4m3fn`` for the FP8 cache; anything else, or FP8 on a device whose
    attention kernels cannot read it, is a ValueError of one line naming the argument and what to pass."""
    if kv_dtype is None or (model_dtype is not None and kv_dtype == model_dtype):
        return None
    if kv_dtype != FP8:
        raise ValueError(f"{who}: kv_dtype={kv_dtype!r} is not supported; pass {KV_DTYPE_FORMS}")
    dev = torch.device(device)
    if dev.type == "cuda":
        cap = torch.cuda.get_device_capability(dev)
        if cap < (8, 9):
            raise ValueError(f"{who}: kv_dtype=torch.float8_e4m3fn needs a GPU of compute capability 8.9 or newer "
                             f"(the attention kernels read e4m3), {torch.cuda.get_device_name(dev)} is "
                             f"{cap[0]}.{cap[1]}; pass kv_dtype=None")
    elif dev.type not in ("cpu", "meta"):
        raise ValueError(f"{who}: kv_dtype=torch.float8_e4m3fn runs on CUDA (compute capability 8.9+) or the CPU, "
                         f"not on {dev.type}; pass kv_dtype=None")
    return FP8


@dataclass
class KVCache:
    """One attention layer: keys and values of every consumed position (slots [0, seqlen) are filled).

    In the model's dtype, or FP8 (``kv_dtype=torch.float8_e4m3fn``): then ``k`` / ``v`` hold e4m3 codes and
    ``k_scale`` / ``v_scale`` one fp32 scale per (row, KV head, slot) (this module's docstring)."""

    k: torch.Tensor  # (B, Hkv, capacity, head_dim)
    v: torch.Tensor  # (B, Hkv, capacity, head_dim)
    k_scale: torch.Tensor | None = None  # (B, Hkv, capacity) fp32: FP8 caches only
    v_scale: torch.Tensor | None = None

    @classmethod
    def allocate(cls, shape: tuple[int, int, int, int], device, dtype: torch.dtype, kv_dtype: torch.dtype | None = None,
                 zero: bool = True) -> "KVCache":
        """A cache of ``shape`` (B, Hkv, capacity, head_dim) in ``dtype``, or FP8 codes (zero bytes: +0) and fp32
        scales when ``kv_dtype`` is torch.float8_e4m3fn. ``zero=False``: uninitialised."""
        new = torch.zeros if zero else torch.empty
        if kv_dtype_for(kv_dtype, device, dtype, who="KVCache") is None:
            return cls(k=new(shape, device=device, dtype=dtype), v=new(shape, device=device, dtype=dtype))
        codes = [new(shape, device=device, dtype=torch.uint8).view(FP8) for _ in range(2)]
        scales = [new(shape[:3], device=device, dtype=SCALE_DTYPE) for _ in range(2)]
        return cls(codes[0], codes[1], scales[0], scales[1])

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def _quantized_pairs(self, k: torch.Tensor, v: torch.Tensor):
        """(codes, scales, quantized codes, their scales) for k then v: what every FP8 write stores."""
        return [(raw(c), s, *quantize_kv(x)) for c, s, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v))]

    def write(self, index: tuple, k: torch.Tensor, v: torch.Tensor) -> None:
        """FP8 caches: k, v (..., hd) quantized into ``codes[index]`` (``index`` a basic index of the first three
        dimensions: rows, heads, slots), their scales into ``scales[index]``."""
        for codes, scales, c, s in self._quantized_pairs(k, v):
            codes[index] = raw(c)
            scales[index] = s

    def read(self, index: tuple, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """FP8 caches: the keys and values of ``[index]`` dequantized to ``dtype`` (only those slots)."""
        return (dequantize_kv(self.k[index], self.k_scale[index], dtype),
                dequantize_kv(self.v[index], self.v_scale[index], dtype))

    def put(self, rows: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """FP8 caches: k, v (b, t, Hkv, hd) quantized into slots ``slots`` (b, t) of rows ``rows`` (b, t), one
        indexed write each for codes and scales (the chunk's write, ``Attention._attend_static``)."""
        for codes, scales, c, s in self._quantized_pairs(k, v):
            codes.transpose(1, 2).index_put_((rows, slots), raw(c))
            scales.transpose(1, 2).index_put_((rows, slots), s)

    def put_step(self, slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """FP8 caches: one token per row of rows [0, b): k, v (b, Hkv, 1, hd) quantized into slot ``slot``
        (b, Hkv, 1, hd), the scales into ``slot[..., 0]`` (the decode step's write, ``Attention._attend_step``)."""
        b = k.shape[0]
        for codes, scales, c, s in self._quantized_pairs(k, v):
            codes[:b].scatter_(2, slot, raw(c))
            scales[:b].scatter_(2, slot[..., 0], s)

    @property
    def quantized(self) -> bool:
        return self.k_scale is not None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor of the cache, each (B, Hkv, capacity, ...): (k, v), or for FP8 the codes as uint8 views
        (``raw``: indexed copies of any kind) and the scales. Row moves and snapshots copy these."""
        if self.k_scale is None:
            return self.k, self.v
        return raw(self.k), raw(self.v), self.k_scale, self.v_scale

    @classmethod
    def of(cls, ts) -> "KVCache":
        """A cache over tensors in the form ``tensors()`` hands out (FP8 codes as uint8), kept as they are:
        views stay views (holotron/state_stacks.py)."""
        cache = cls(ts[0], ts[1])
        cache._set(list(ts))
        return cache

    def _set(self, ts) -> None:
        if len(ts) == 2:
            self.k, self.v = ts
        else:
            self.k, self.v, self.k_scale, self.v_scale = ts[0].view(FP8), ts[1].view(FP8), ts[2], ts[3]

    def rows(self, b: int) -> "KVCache":
        """Rows [0, b) as views (in-place updates reach this cache)."""
        if self.k_scale is None:
            return KVCache(k=self.k[:b], v=self.v[:b])
        return KVCache(self.k[:b], self.v[:b], self.k_scale[:b], self.v_scale[:b])

    def nbytes(self, used: int | None = None) -> int:
        total = sum(t.nbytes for t in self.tensors())
        if used is None:
            return total
        return total // max(self.capacity, 1) * used

    def slot_bytes(self) -> int:
        """Bytes of one token of one row (codes and scales for FP8)."""
        return sum(t[0, :, 0].nbytes for t in self.tensors())

    def grow(self, capacity: int, keep: int) -> None:
        """Reallocate to ``capacity`` slots, keeping the first ``keep``."""
        new = []
        for t in self.tensors():
            n = t.new_zeros(t.shape[0], t.shape[1], capacity, *t.shape[3:])
            n[:, :, :keep] = t[:, :, :keep]
            new.append(n)
        self._set(new)

    def select(self, index: torch.Tensor) -> None:
        self._set([t.index_select(0, index.to(device=t.device, dtype=torch.long)) for t in self.tensors()])
