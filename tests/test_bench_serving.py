"""``benchmarks/bench_serving.py``'s serving section on a tiny model on the CPU: repeated timed runs report the
median run's figures and every run's rate, sorted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (autouse: chunked scan, one thread)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_serving  # noqa: E402

from holotron.config import TextConfig  # noqa: E402
from holotron.engine import Engine  # noqa: E402


def test_serving_repeats_report_the_median_run_of_the_same_workload():
    dev = torch.device("cpu")
    lm = bench_serving.build(TextConfig(**bench_serving.SMALL), dev, torch.float32)
    pre = Engine(lm, max_batch=1, max_len=96, cuda_graph=False).prefix(torch.randint(0, 512, (24,)))
    out = bench_serving.serving(lm, pre, 6, 2, 4, dev, warmup=False, repeats=3)
    runs = out["tokens_per_s_runs"]
    assert out["repeats"] == 3 and len(runs) == 3 and runs == sorted(runs)
    assert out["tokens_per_s"] == runs[1] and out["warmup_run_s"] is None
    assert out["all_done"] and out["new_tokens"] >= 6 * 16   # 16..64 new tokens a request
    assert out["tokens_per_s"] == out["new_tokens"] / out["seconds"]


@pytest.mark.parametrize("bad", [["--budget", "-1"], ["--budget", "inf"], ["--batches", "0"], ["--batches", "8,x"],
                                 ["--batches", ""], ["--states", "fp64"], ["--states", "fp32,"]])
def test_bad_flags_are_one_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as e:
        bench_serving.main(["--small", "--decode-only", *bad])
    assert e.value.code == 2 and repr(bad[1]) in capsys.readouterr().err
