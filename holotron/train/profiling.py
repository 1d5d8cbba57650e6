"""``--profile N``: where a step's time goes. ``torch.profiler`` records N steps after the first
``PROFILE_SKIP + 1`` (start-up, allocator and autotuning warm-up) and ``write_profile`` writes a table of
the busiest operators to OUT/profile.txt, once."""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["PROFILE_SKIP", "start_profiler", "write_profile"]

PROFILE_SKIP = 5  # steps left out of a --profile (start-up, allocator and autotuning warm-up)


def start_profiler(steps: int, device: torch.device) -> torch.profiler.profile | None:
    """A started profiler that records ``steps`` steps after ``PROFILE_SKIP`` + 1 (call its ``step()`` after
    each training step), or None when ``steps`` is 0."""
    if not steps:
        return None
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, schedule=torch.profiler.schedule(
        skip_first=PROFILE_SKIP, wait=0, warmup=1, active=steps, repeat=1))
    prof.start()
    return prof


def write_profile(prof, path: Path, device: torch.device, steps: int, log) -> None:
    """Stop ``prof`` and write its operator table (sorted by device time on CUDA, else CPU time) to ``path``."""
    prof.stop()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"# holotron.train --profile {steps}: steps {PROFILE_SKIP + 2}-{PROFILE_SKIP + 1 + steps} "
                   f"of this run, sorted by {key}\n{table}\n")
    os.replace(tmp, path)
    log(f"profile of {steps} steps written to {path}")
