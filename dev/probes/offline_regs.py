"""Probe: registers and spills of a Triton kernel for an H100/H200 (sm_90), compiled on a machine without a
GPU (triton's own ptxas). Codegen of this machine's triton, not necessarily the GPU machine's.

    python dev/probes/offline_regs.py scan [KEY=VALUE ...]     # the forward scan at the 12B sizes
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


def compile_info(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int = 2, maxnreg=None):
    """(registers, spill stores, spill loads, shared bytes) of fn compiled for sm_90."""
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    opts = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        opts["maxnreg"] = maxnreg
    k = triton.compile(src, target=TARGET, options=opts)
    ptx = k.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    exe = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas-blackwell")
    extra = [f"-maxrregcount={maxnreg}"] if maxnreg else []
    r = subprocess.run([exe, "-v", "--gpu-name=sm_90a", *extra, f.name, "-o", "/dev/null"], capture_output=True, text=True)
    txt = r.stderr + r.stdout
    if "Used" not in txt:
        raise RuntimeError(txt[-2000:])
    regs = int(re.search(r"Used (\d+) registers", txt).group(1))
    st = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", txt)
    return dict(regs=regs, spill_st=int(st.group(1)), spill_ld=int(st.group(2)), shared=k.metadata.shared)


def scan_info(**over):
    from holotron.kernels.ssd_triton_scan import _scan_seq

    sig = {}
    names = list(_scan_seq.arg_names)
    ptrs = {"x_ptr": "*bf16", "dt_ptr": "*bf16", "A_ptr": "*fp32", "B_ptr": "*bf16", "C_ptr": "*bf16",
            "D_ptr": "*fp32", "z_ptr": "*bf16", "bias_ptr": "*fp32", "init_ptr": "*fp32", "y_ptr": "*bf16",
            "final_ptr": "*fp32", "states_ptr": "*bf16", "cu_ptr": "*i32", "choff_ptr": "*i32", "dec_ptr": "*fp32"}
    const = dict(HAS_D=True, D_PER_CHANNEL=False, HAS_Z=False, HAS_INIT=False, HAS_BIAS=True, SOFTPLUS=True,
                 CLAMP=False, VARLEN=False, STORE_STATES=False, SEGS=1, STATE_ONLY=False, Q=128, TMA=True, BP0=64, BP1=16,
                 BN=128, MASK_P=False, MASK_N=False, OPS="half", OPS1="half", NS=2)
    warps = over.pop("num_warps", 8)
    maxnreg = over.pop("maxnreg", None)
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
    return compile_info(_scan_seq, sig, const, warps, const["NS"], maxnreg)


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
    print(scan_info(**over))
