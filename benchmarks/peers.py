"""The benchmark-only peers of the SSD scan, loaded at benchmark time from ignored folders, never dependencies.

- mamba_ssm's Triton SSD (``mamba_chunk_scan_combined``, forward and backward): its pure Python + Triton
  files copied into ``.peers/mamba_ssm/`` (repository root, git-ignored; ``.peers/mamba_ssm/PEER_VERSION``
  names the commit), package ``__init__`` files emptied so that no CUDA extension is imported.
- flash-linear-attention's ``chunk_simple_gla`` (fla-core, pure Python + Triton), installed from a wheel
  carried in ``.whl/``: ``python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site
  .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH``.

Each loader returns ``(function, version)`` or ``(None, why)``; a missing peer is reported, never fatal.
The adapters map holotron's ``ssd_scan`` inputs (x, dt, A, B, C, D, dt_bias, softplus) onto each peer's.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
PEERS = os.path.join(ROOT, ".peers")


def _path():
    if os.path.isdir(PEERS) and PEERS not in sys.path:
        sys.path.insert(0, PEERS)


def cpu_shims():
    """Let the peers' host code run under TRITON_INTERPRET=1 on a CPU-only torch (dry runs only): a no-op
    ``torch.cuda.device``, a fake multiprocessor count, and autotuners that take their first config
    instead of timing (the interpreter has no benchmarker)."""
    import contextlib
    import types

    import torch
    import triton.runtime.autotuner as at
    torch.cuda.device = lambda i=None: contextlib.nullcontext()
    torch.cuda.get_device_properties = lambda d=None: types.SimpleNamespace(multi_processor_count=4)
    at.Autotuner._bench = lambda self, *a, config=None, **k: [0.0, 0.0, 0.0]


def load_mamba():
    """mamba_ssm's ``mamba_chunk_scan_combined`` from ``.peers/``: (fn, 'mamba_ssm VERSION @COMMIT') or (None, why)."""
    _path()
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # noqa: BLE001  (a benchmark-only peer: report and go on)
        return None, f"mamba_ssm not importable ({type(e).__name__}: {str(e)[:200]}); is .peers/ carried?"
    ver = "mamba_ssm ?"
    try:
        lines = open(os.path.join(PEERS, "mamba_ssm", "PEER_VERSION")).read().splitlines()
        commit = next((w for ln in lines for w in ln.split() if len(w) == 40), "?")
        v = next((ln.split("=")[1].strip().strip('"') for ln in lines if "__version__" in ln), "?")
        ver = f"mamba_ssm {v} @{commit[:12]}"
    except OSError:
        pass
    return mamba_chunk_scan_combined, ver


def load_fla(dry: bool = False):
    """FLA's ``chunk_simple_gla``: (fn, 'fla-core VERSION') or (None, why). ``dry``: FLA's naive recurrent
    twin instead (its Triton kernels do not run in the interpreter), to exercise the plumbing only."""
    try:
        import fla
        if dry:
            from fla.ops.simple_gla.naive import naive_recurrent_simple_gla as f
            return f, f"fla-core {getattr(fla, '__version__', '?')} (dry: naive recurrent stand-in)"
        from fla.ops.simple_gla import chunk_simple_gla
        return chunk_simple_gla, f"fla-core {getattr(fla, '__version__', '?')}"
    except Exception as e:  # noqa: BLE001
        return None, f"fla not importable ({type(e).__name__}: {str(e)[:200]}); is the fla-core wheel installed?"


def mamba_call(fn, kw, final_state=True):
    """``mamba_chunk_scan_combined`` on holotron's inputs: chunk 128, D per head, dt_bias, softplus, B and C
    grouped; returns (y, final state (b, h, p, n)) or y alone."""
    return fn(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], chunk_size=128, D=kw["D"], dt_bias=kw["dt_bias"],
              dt_softplus=True, return_final_states=final_state)


def fla_prepare(kw, heads: int):
    """chunk_simple_gla's inputs for the same recurrence, without D: q = C, k = B dt, v = x, g = dt A, with
    B and C expanded to every head. Differentiable (dx, ddt, dA, dB, dC, ddt_bias come back through it)."""
    import torch.nn.functional as F
    dt = F.softplus(kw["dt"].float() + kw["dt_bias"])  # (b, l, H) fp32
    rep = heads // kw["B"].shape[2]
    q = kw["C"].repeat_interleave(rep, dim=2).contiguous()
    k = (kw["B"].float().repeat_interleave(rep, dim=2) * dt[..., None]).to(kw["x"].dtype).contiguous()
    return dict(q=q, k=k, v=kw["x"].contiguous(), g=(dt * kw["A"]).contiguous())


def fla_call(fn, fa, final_state=True):
    """(o, final state (b, h, p, n) fp32) or o alone; FLA's state is (b, h, k=n, v=p)."""
    o, ht = fn(fa["q"], fa["k"], fa["v"], g=fa["g"], scale=1.0, output_final_state=final_state)
    return (o, ht.transpose(-1, -2)) if final_state else o
