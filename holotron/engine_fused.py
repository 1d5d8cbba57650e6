"""The decode engine's hand-fused step (``Engine(..., fuse=True)``): one token through every layer with
the element-wise work around the matmuls (norms, the conv window, dt, relu^2, residuals) in
``torch.compile``d per-layer pieces; the scan step and attention as in ``Engine._step_body``
(``holotron/engine.py``). The same math in a different order: logits agree to rounding, not bit for bit.

``FusedStep`` is a base class of ``Engine``, written against its attributes (``lm``, ``state``, ``tokens``,
``_views``, ``_slots``, ``max_len``, ``_finish_step``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import kernels

__all__ = ["FusedStep"]


class FusedStep:
    """``Engine._step_fused`` and what it needs of the engine beyond the plain step."""

    def _step_fused(self, b: int) -> None:
        """``Engine._step_body`` with the element-wise work in compiled pieces (see ``Engine``'s ``fuse``)."""
        fused = _Fused
        lm = self.lm
        lengths = self.state.lengths[:b].clamp(max=self.max_len - 1)
        key_mask = (self._slots[None, :] <= lengths[:, None])[:, None, None]
        x = lm.backbone.embeddings(self.tokens[:b, None])
        if lm.config.residual_in_fp32:
            x = x.float()
        for blk, st in zip(lm.backbone.layers, self._views[b]):
            m, nw, eps = blk.mixer, blk.norm.weight, blk.norm.eps
            if blk.kind == "mamba":
                z, xc, dt = fused.mamba_in(x, nw, eps, m.in_proj.weight, st.conv, m.conv1d.weight, m.conv1d.bias,
                                           m.dt_bias, m.d_inner, m.conv_dim, m.n_heads)
                xs, B, C = xc.split([m.d_inner, m.n_groups * m.d_state, m.n_groups * m.d_state], dim=-1)
                y = kernels.ssd_step(st.ssm, xs.view(b, m.n_heads, m.head_dim), dt, self._A[id(m)],
                                     B.view(b, m.n_groups, m.d_state), C.view(b, m.n_groups, m.d_state), D=m.D)
                x = fused.mamba_out(y.reshape(b, 1, m.d_inner), z, m.norm.weight, m.norm.groups, m.norm.eps,
                                    m.out_proj.weight, x)
            elif blk.kind == "attention":
                q, k, v = fused.attn_in(x, nw, eps, m.q_proj.weight, m.k_proj.weight, m.v_proj.weight)
                hkv, hd = m.n_kv_heads, m.head_dim
                slot = lengths.view(b, 1, 1, 1).expand(b, hkv, 1, hd)
                st.k.scatter_(2, slot, k.view(b, hkv, 1, hd))
                st.v.scatter_(2, slot, v.view(b, hkv, 1, hd))
                y = torch.nn.functional.scaled_dot_product_attention(
                    q.view(b, hkv, m.n_heads // hkv, hd), st.k, st.v, attn_mask=key_mask)
                x = fused.attn_out(y.reshape(b, 1, m.n_heads * hd), m.o_proj.weight, x)
            else:
                x = fused.mlp(x, nw, eps, m.up_proj.weight, m.down_proj.weight)
        logits = fused.head(x, lm.backbone.norm_f.weight, lm.backbone.norm_f.eps, lm.lm_head.weight)
        self._finish_step(logits, b)

    @property
    def _A(self) -> dict:
        """A = -exp(A_log) per Mamba mixer (fp32), computed once for the fused step."""
        if not hasattr(self, "_A_cache"):
            with torch.inference_mode():
                self._A_cache = {id(blk.mixer): -torch.exp(blk.mixer.A_log.float())
                                 for blk in self.lm.backbone.layers if blk.kind == "mamba"}
        return self._A_cache


# ---------------------------------------------------------------------------- the fused step's pieces
# One layer's element-wise work around its matmuls, in the modules' math (layers.RMSNorm,
# layers.GatedRMSNorm, Mamba2Mixer._conv, the relu^2 MLP), as plain functions that torch.compile fuses
# into a few kernels; x (b, 1, D). Compiled on first use, batch dimension dynamic (one compile each).

def _compiled(fn):
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True)
        return compiled(*args)

    call.eager = fn
    return call


def _rms(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.float() * xf).to(x.dtype)


@_compiled
def _f_mamba_in(x, norm_w, eps: float, in_w, conv, conv_w, conv_b, dt_bias, d_inner: int, conv_dim: int, heads: int):
    """norm -> in_proj -> (z, silu(conv over the updated window), softplus(dt + dt_bias)); ``conv`` updated in place."""
    h = _rms(x.to(norm_w.dtype), norm_w, eps)
    z, xBC, dt = F.linear(h, in_w).split([d_inner, conv_dim, heads], dim=-1)
    win = torch.cat([conv[:, :, 1:], xBC.transpose(1, 2).to(conv.dtype)], dim=2)  # (b, c, K)
    conv.copy_(win)
    xc = (win * conv_w[:, 0, :]).sum(-1)
    if conv_b is not None:
        xc = xc + conv_b
    xc = F.silu(xc).to(xBC.dtype)                                                 # (b, c)
    dt = F.softplus(dt[:, 0].float() + dt_bias.float())                           # (b, H) fp32
    return z, xc, dt


@_compiled
def _f_mamba_out(y, z, gnorm_w, groups: int, eps: float, out_w, x):
    """x + out_proj(GatedRMSNorm(y, z))."""
    v = y.float() * F.silu(z.float())
    vg = v.unflatten(-1, (groups, -1))
    vg = vg * torch.rsqrt(vg.pow(2).mean(-1, keepdim=True) + eps)
    h = (gnorm_w.float() * vg.flatten(-2)).to(y.dtype)
    return x + F.linear(h, out_w)


@_compiled
def _f_attn_in(x, norm_w, eps: float, q_w, k_w, v_w):
    h = _rms(x.to(norm_w.dtype), norm_w, eps)
    return F.linear(h, q_w), F.linear(h, k_w), F.linear(h, v_w)


@_compiled
def _f_attn_out(y, o_w, x):
    return x + F.linear(y, o_w)


@_compiled
def _f_mlp(x, norm_w, eps: float, up_w, down_w):
    h = _rms(x.to(norm_w.dtype), norm_w, eps)
    return x + F.linear(F.relu(F.linear(h, up_w)).square(), down_w)


@_compiled
def _f_head(x, norm_w, eps: float, lm_w):
    h = _rms(x.to(norm_w.dtype), norm_w, eps)
    return F.linear(h[:, 0].to(lm_w.dtype), lm_w).float()


class _Fused:
    mamba_in, mamba_out, attn_in, attn_out, mlp, head = (staticmethod(_f_mamba_in), staticmethod(_f_mamba_out),
                                                         staticmethod(_f_attn_in), staticmethod(_f_attn_out),
                                                         staticmethod(_f_mlp), staticmethod(_f_head))
