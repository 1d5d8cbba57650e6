"""Timing shared by the benchmark scripts (run as ``python3 benchmarks/NAME.py``, so this folder is on sys.path)."""

from __future__ import annotations

import statistics
import time

import torch


def times_ms(fn, warmup: int, reps: int, device) -> list[float]:
    """Milliseconds per call, one measurement per call (CUDA events on a GPU, a synchronised clock otherwise)."""
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    out = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def median_ms(fn, warmup: int, reps: int, device) -> float:
    """The median of ``times_ms``."""
    return statistics.median(times_ms(fn, warmup, reps, device))


def captured(fn, device, after=None) -> torch.cuda.CUDAGraph:
    """``fn`` captured in a CUDA graph, after two warm-up calls on a side stream as the decode engine does
    (Triton compiles, cuBLAS picks its workspaces); ``after()`` runs after each warm-up call (e.g. to put back
    the lengths a pass advanced)."""
    device = torch.device(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
            if after is not None:
                after()
    torch.cuda.current_stream(device).wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def per_call_us(fn, reps: int, device) -> float:
    """Microseconds a call of ``fn``: on a GPU the median replay of a CUDA graph of ``reps`` calls (after one
    eager call: Triton compiles) over ``reps``; elsewhere one timed call."""
    device = torch.device(device)
    if device.type != "cuda":
        return median_ms(fn, 0, 1, device) * 1e3
    fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return median_ms(g.replay, 2, 10, device) * 1e3 / reps
