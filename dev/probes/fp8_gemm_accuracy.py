"""The skinny FP8 product's accuracy against float64, with and without promotion of Hopper's FP8 accumulator
(``ACC_K``: products summed in the tensor cores before each promotion to fp32), next to torch._scaled_mm.

    PYTHONPATH=. python3 dev/probes/fp8_gemm_accuracy.py        # CUDA"""

import torch

from holotron import quant
from holotron.kernels.skinny_mm_triton import pick, skinny_mm

for n, k in ((22656, 5120), (5120, 10240), (5120, 20480), (1024, 5120)):
    for m in (8, 64, 128, 200):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        q, s = quant.quantize_weight(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5)
        xq, xs = quant.quantize_rows(x)
        exact = (xq.double() * xs.double()) @ (q.double() * s.double()[:, None]).T
        smm = torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=s[None, :], out_dtype=torch.float32)
        errs = {"smm": ((smm.double() - exact).abs().max() / exact.abs().max()).item()}
        for acc_k in (32, 0):  # 0: a whole BLOCK_K
            cfg = dict(pick(m, n, k, q.dtype, x.device), ACC_K=acc_k)
            y = skinny_mm(xq, q, xs, s, out_dtype=torch.float32, config=cfg)
            errs[f"acc_k {acc_k}"] = ((y.double() - exact).abs().max() / exact.abs().max()).item()
        print(f"N {n:>6} K {k:>6} M {m:>4}: " + "  ".join(f"{a} {e:.2e}" for a, e in errs.items()), flush=True)
