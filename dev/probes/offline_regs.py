"""Probe: registers and spills of a Triton kernel for an H100/H200 (sm_90), compiled on a machine without a
GPU (triton's own ptxas). Codegen of this machine's triton, not necessarily the GPU machine's.

    python dev/probes/offline_regs.py scan [KEY=VALUE ...]     # the forward scan at the 12B sizes
    python dev/probes/offline_regs.py flat [KEY=VALUE ...]     # the forward across a group's heads (FLAT)
    python dev/probes/offline_regs.py dx [KEY=VALUE ...]       # the backward's dx / ddt kernel (_bwd_dx)
    python dev/probes/offline_regs.py dbc [KEY=VALUE ...]      # the backward's dB / dC kernel (_bwd_dbc)
    python dev/probes/offline_regs.py dstates [KEY=VALUE ...]  # the chunks' own state-gradient terms
    python dev/probes/offline_regs.py state [KEY=VALUE ...]    # the state-gradient pass (_bwd_spass)
    python dev/probes/offline_regs.py walk [KEY=VALUE ...]     # the state gradient as one walk (BWD_CONFIG WALK)
    python dev/probes/offline_regs.py tp_states|tp_pass|tp_out [KEY=VALUE ...]   # SCAN_CONFIG TWO_PASS's kernels
    python dev/probes/offline_regs.py attn [QUANT=True] [KEY=VALUE ...]  # the chunk attention (CHUNK_ATTN_CONFIG)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


def compile_info(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 2, maxnreg=None,
                 attrs=None):
    """(registers, spill stores, spill loads, shared bytes) of fn compiled for sm_90."""
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    opts = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        opts["maxnreg"] = maxnreg
    k = triton.compile(src, target=TARGET, options=opts)
    ptx = k.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    exe = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas-blackwell")
    extra = [f"-maxrregcount={maxnreg}"] if maxnreg else []
    r = subprocess.run([exe, "-v", "--gpu-name=sm_90a", *extra, f.name, "-o", "/dev/null"], capture_output=True,
                       text=True)
    txt = r.stderr + r.stdout
    if "Used" not in txt:
        raise RuntimeError(txt[-2000:])
    regs = int(re.search(r"Used (\d+) registers", txt).group(1))
    st = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", txt)
    return dict(regs=regs, spill_st=int(st.group(1)), spill_ld=int(st.group(2)), shared=k.metadata.shared)


def scan_info(flat=False, **over):
    from holotron.kernels.ssd_triton_flat import _scan_flat, heads_per_block
    from holotron.kernels.ssd_triton_scan import _scan_seq

    fn = _scan_flat if flat else _scan_seq
    sig = {}
    names = list(fn.arg_names)
    ptrs = {"x_ptr": "*bf16", "dt_ptr": "*bf16", "A_ptr": "*fp32", "B_ptr": "*bf16", "C_ptr": "*bf16",
            "D_ptr": "*fp32", "z_ptr": "*bf16", "bias_ptr": "*fp32", "init_ptr": "*fp32", "y_ptr": "*bf16",
            "final_ptr": "*fp32", "states_ptr": "*bf16", "cu_ptr": "*i32", "choff_ptr": "*i32",
            "dec_ptr": "*fp32", "rows_ptr": "*i64"}
    const = dict(HAS_D=True, D_PER_CHANNEL=False, HAS_Z=False, HAS_INIT=False, HAS_BIAS=True, SOFTPLUS=True,
                 CLAMP=False, VARLEN=False, STORE_STATES=False, Q=32, BP=64, BN=128, MASK_P=True, MASK_N=False,
                 TMA=True, OPS="half", NS=3, ROWS=False)
    warps = over.pop("num_warps", 4)
    maxnreg = over.pop("maxnreg", None)
    if flat:
        const.update(MASK_P=False, NH=heads_per_block(80, 16, over.get("BP", 64)))
    const.update(over)
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n in ptrs:
            sig[n] = ptrs[n]
        elif n in ("lo", "hi"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    return compile_info(fn, sig, const, warps, const["NS"], maxnreg)


# the backward's integer arguments at the 12B sizes (batch 2 x 1000 tokens, contiguous tensors): as at a launch,
# those equal to 1 become constants and multiples of 16 are marked divisible by 16 (as are all pointers)
BWD_INTS = dict(n_seq=2, H=128, P=80, N=128, HPG=16, n_rows=32, s_x_t=10240, s_x_h=80,
                s_dt_t=128, s_dt_h=1, s_b_t=1024, s_b_g=128, s_c_t=1024, s_c_g=128, s_dy_t=10240, s_dy_h=80,
                s_dx_t=10240, s_dx_h=80, n_pb=2, s_db_t=1024, s_db_g=128, s_dc_t=1024, s_dc_g=128, n_nb=2,
                n_blk=10, PN=10240)


def bwd_info(kernel="seq", **over):
    """The backward's kernels at the 12B sizes: bf16, H=128, P=80 (PP=128), N=128, G=8, chunk 64, headdim blocks
    of 32 (dx kernel: NPB=3 for BWD_CONFIG's P_LOOP), dstate blocks of 64 and the headdim whole (dB / dC kernel:
    PK=32 NPK=3 for BLOCK_PK 32), 4 warps, 2 stages. Pointer dtypes not named
    below are fp32; keyword overrides set constexprs (and num_warps, num_stages, maxnreg, dtype of the inputs,
    ``states`` the dtype of the stored states and state gradients)
    or, when named in BWD_INTS, integer arguments."""
    from holotron.kernels import ssd_triton_backward as bw
    from holotron.kernels import ssd_triton_bwd_walk as wk

    fn = dict(dbc=bw._bwd_dbc, dx=bw._bwd_dx, dstates=bw._bwd_dstates, state=bw._bwd_spass,
              walk=wk._bwd_dswalk)[kernel]
    bf16 = {"x_ptr", "B_ptr", "C_ptr", "dy_ptr", "st_ptr", "dst_ptr", "dx_ptr", "dB_ptr", "dC_ptr", "u_ptr"}
    i32 = {"cu_ptr", "choff_ptr", "cseq_ptr"}
    ints = dict(BWD_INTS)
    const = dict(HAS_D=True, D_PER_CHANNEL=False, HAS_DFINAL=False, HAS_INIT=True, Q=64, QP=64, PP=128, NP=128,
                 BP=32, NB=64, OPS="half", NS=2, TMA=False, NNB=2, NBLK=16, BLK=1024, HPP=1, NPB=1, PK=128, NPK=1,
                 SS=False)
    warps = over.pop("num_warps", 4)
    stages = over.pop("num_stages", 3)  # the launch default
    maxnreg = over.pop("maxnreg", None)
    half = "*" + over.pop("dtype", "bf16")  # the inputs' dtype (fp32: with OPS=ieee)
    states = "*" + over.pop("states", half[1:])  # the stored states' and state gradients' (BWD_CONFIG STATES)
    for k in [k for k in over if k in ints]:
        ints[k] = over.pop(k)
    const.update(over)
    names = list(fn.arg_names)
    cnames = {names[i] for i in fn.constexprs}
    const = {k: v for k, v in const.items() if k in cnames}
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in cnames:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = (states if n in ("st_ptr", "dst_ptr", "u_ptr") else half if n in bf16
                      else "*i32" if n in i32 else "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif ints.get(n) == 1:
            sig[n] = "constexpr"
            const[n] = 1
        else:
            sig[n] = "i32"
            if ints.get(n, 1) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return compile_info(fn, sig, const, warps, stages, maxnreg, attrs)


def two_pass_info(kernel="tp_out", **over):
    """SCAN_CONFIG TWO_PASS's kernels (ssd_triton_twopass.py) at the 12B sizes: bf16 inputs and chunk states,
    H=128, P=80 in headdim blocks of 64, N=128, G=8, chunk 128 (output rows 64 a program), tiles through tensor
    descriptors, 4 warps; keyword
    overrides set constexprs (and num_warps, maxnreg, ``states`` the chunk states' dtype)."""
    from holotron.kernels import ssd_triton_twopass as tp

    fn = getattr(tp, "_" + kernel)
    warps = over.pop("num_warps", 4)
    maxnreg = over.pop("maxnreg", None)
    states = "*" + over.pop("states", "bf16")
    const = dict(HAS_D=True, D_PER_CHANNEL=False, HAS_Z=False, HAS_BIAS=True, SOFTPLUS=True, CLAMP=False,
                 HAS_INIT=False, Q=128, QR=64, BP=64, BN=128, MASK_P=True, MASK_N=False, OPS="half", BLK=1024,
                 TMA=True)
    const.update(over)
    names = list(fn.arg_names)
    cnames = {names[i] for i in fn.constexprs}
    const = {k: v for k, v in const.items() if k in cnames}
    half = {"x_ptr", "dt_ptr", "B_ptr", "C_ptr", "z_ptr", "y_ptr"}
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in cnames:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = "*bf16" if n in half else states if n == "states_ptr" else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in ("lo", "hi"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    return compile_info(fn, sig, const, warps, 2, maxnreg, attrs)


def attn_info(**over):
    """The chunk attention (``_chunk_attn``, holotron/kernels/attn_chunk_triton.py) at the 12B sizes: head dim 128,
    bf16 queries, a bf16 cache (``QUANT=True``: FP8 codes with fp32 scales), ``CHUNK_ATTN_CONFIG``'s blocks, warps
    and stages unless overridden."""
    from holotron.kernels.attn_chunk_triton import CHUNK_ATTN_CONFIG, _chunk_attn

    quant = bool(over.pop("QUANT", False))
    warps = over.pop("num_warps", CHUNK_ATTN_CONFIG["num_warps"] or 8)
    stages = over.pop("num_stages", CHUNK_ATTN_CONFIG["num_stages"])
    const = dict(HD_PAD=128, BLOCK_M=CHUNK_ATTN_CONFIG["BLOCK_M"], BLOCK_N=CHUNK_ATTN_CONFIG["BLOCK_N"], F32=False,
                 QUANT=quant)
    const.update(over)
    cache = "*fp8e4nv" if quant else "*bf16"
    ptrs = {"q_ptr": "*bf16", "k_ptr": cache, "v_ptr": cache, "ks_ptr": "*fp32", "vs_ptr": "*fp32", "o_ptr": "*bf16",
            "rows_ptr": "*i64", "starts_ptr": "*i64", "counts_ptr": "*i64"}
    sig = {n: "constexpr" if n in const else ptrs.get(n, "fp32" if n == "scale" else "i32")
           for n in _chunk_attn.arg_names}
    return compile_info(_chunk_attn, sig, const, warps, stages)


def _val(v):
    if v in ("True", "False"):
        return v == "True"
    try:
        return int(v)
    except ValueError:
        return v


if __name__ == "__main__":
    what = sys.argv[1]
    over = {k: _val(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])}
    if what in ("scan", "flat"):
        print(scan_info(what == "flat", **over))
    elif what in ("dx", "dbc", "dstates", "state", "walk"):
        print(bwd_info(what, **over))
    elif what in ("tp_states", "tp_pass", "tp_out"):
        print(two_pass_info(what, **over))
    elif what == "attn":
        print(attn_info(**over))
    else:
        raise SystemExit(f"unknown kernel {what!r}: scan, flat, dx, dbc, dstates, state, walk, tp_states, tp_pass, "
                         f"tp_out or attn")
