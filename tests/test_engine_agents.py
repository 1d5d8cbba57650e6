"""The agents-at-concurrency benchmark (``benchmarks/bench_agents.py``) end to end on tiny models: its
``--small`` sweep runs on the CPU (with fewer engine rows than agents, so sessions wait in host memory),
every agent session completes all its turns, and the JSON it writes holds positive throughputs and
latencies."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (autouse: chunked scan, one thread)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_agents  # noqa: E402


def test_small_agent_sweep_completes_every_turn(tmp_path):
    rc = bench_agents.main(["--small", "--agents", "1,3", "--turns", "2", "--prefill-tokens", "64", "--max-rows", "2",
                            "--no-plot", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "bench_agents.json").read_text())
    assert res["command"].startswith("PYTHONPATH=. python3 benchmarks/bench_agents.py --small")
    rows = res["rows"]
    assert {(r["model"], r["case"], r["agents"]) for r in rows} == {
        (m, c, n) for m in ("hybrid", "attention") for c in ("one-tile", "twelve-tile") for n in (1, 3)}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["all_turns_completed"] and r["errors"] == 0
        assert r["turns_completed"] == r["turns_expected"] == 2 * r["agents"]
        assert r["rows"] == min(r["agents"], 2)
        assert (r["sessions_on_host_peak"] > 0) == (r["agents"] > 2)
        assert r["output_tokens"] >= r["turns_expected"] * 6   # 6..10 new tokens a turn with --small
        assert r["prompt_tokens"] >= r["turns_expected"] * r["image_tokens_per_turn"]
        assert r["output_tokens_per_s"] > 0 and r["total_tokens_per_s"] > r["output_tokens_per_s"]
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] and 0 < r["latency_p50_s"] <= r["latency_p95_s"]
        assert r["engine_decode_tokens_per_s"] > 0 and r["graph_tokens_per_s"] > 0
    assert res["largest_agents_ok"] == {m: {"one-tile": 3, "twelve-tile": 3} for m in ("hybrid", "attention")}


def test_small_agent_run_with_an_fp8_kv_cache_records_it_and_counts_its_bytes(tmp_path):
    rc = bench_agents.main(["--small", "--agents", "3", "--turns", "2", "--models", "hybrid", "--cases", "one-tile",
                            "--prefill-tokens", "64", "--max-rows", "2", "--no-plot", "--kv-dtype", "fp8",
                            "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "bench_agents.json").read_text())
    assert res["kv_dtype"] == "fp8" and res["command"].endswith("--kv-dtype fp8 --out " + str(tmp_path))
    (r,) = res["rows"]
    assert r["status"] == "ok" and r["all_turns_completed"] and r["sessions_on_host_peak"] > 0
    cfg = bench_agents.configs(True)["hybrid"][0]
    n_attn = cfg.layer_kinds.count("attention")
    # FP8: head_dim codes and one fp32 scale per KV head and slot, for keys and values
    assert r["state_kv_bytes_per_row"] == n_attn * 2 * cfg.num_key_value_heads * (cfg.head_dim + 4) * r["max_len"]


def test_small_agent_run_with_the_vision_stream_serves_every_turn_and_records_it(tmp_path):
    rc = bench_agents.main(["--small", "--agents", "3", "--turns", "2", "--models", "hybrid", "--cases", "twelve-tile",
                            "--prefill-tokens", "64", "--max-rows", "2", "--no-plot", "--vision-stream", "on",
                            "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "bench_agents.json").read_text())
    assert res["vision_stream"] == "on"
    (r,) = res["rows"]
    assert r["status"] == "ok" and r["all_turns_completed"] and r["errors"] == 0
    assert r["vision_tiles"] == r["turns_expected"] * r["tiles"]


def test_small_agent_run_with_a_host_limit_drops_and_replays_sessions_and_counts_each_prompt_once(tmp_path):
    rc = bench_agents.main(["--small", "--agents", "3", "--turns", "3", "--models", "attention", "--cases",
                            "one-tile", "--prefill-tokens", "64", "--max-rows", "1", "--no-plot",
                            "--host-limit-gib", "0", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "bench_agents.json").read_text())
    assert res["host_limit_gib"] == 0
    (r,) = res["rows"]
    assert r["status"] == "ok" and r["all_turns_completed"] and r["errors"] == 0
    assert r["sessions_on_host_peak"] == 0 and r["sessions_dropped"] > 0
    assert r["replayed_turns"] > 0 and r["replayed_tokens"] > 0
    assert r["vision_tiles"] > r["turns_expected"] * r["tiles"]   # replayed screenshots are encoded again
    plan = bench_agents.make_plan(3, 3, r["image_tokens_per_turn"], (8, 16), (6, 10), 512, res["workload"]["seed"])
    assert r["prompt_tokens"] == sum(ids.numel() for a in plan for ids, _ in a)   # replays not counted


def test_small_agent_run_with_fp8_weights_swaps_the_language_model_linears_and_serves_every_turn(tmp_path,
                                                                                                   monkeypatch):
    from holotron import quant

    swapped = []
    real = quant.quantize_
    monkeypatch.setattr(quant, "quantize_", lambda m, mode: swapped.append(real(m, mode)) or swapped[-1])
    rc = bench_agents.main(["--small", "--agents", "2", "--turns", "2", "--models", "hybrid", "--cases", "one-tile",
                            "--prefill-tokens", "64", "--no-plot", "--quantize", "fp8", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "bench_agents.json").read_text())
    assert res["quantize"] == "fp8" and res["command"].endswith("--quantize fp8 --out " + str(tmp_path))
    (r,) = res["rows"]
    assert r["status"] == "ok" and r["all_turns_completed"] and r["errors"] == 0
    (model,) = swapped
    lm = model.language_model
    assert sum(isinstance(m, quant.FP8Linear) for m in lm.modules()) > 0
    assert [n for n, m in lm.named_modules() if type(m) is torch.nn.Linear] == ["lm_head"]   # kept in bf16
    assert not any(isinstance(m, quant.FP8Linear) for m in model.vision_model.modules())


@pytest.mark.parametrize("limit", [None, "0.5", "0.9", "100"])
def test_sessions_that_would_not_fit_on_the_host_are_skipped_unless_a_host_limit_bounds_them(tmp_path, monkeypatch,
                                                                                             limit):
    monkeypatch.setattr(bench_agents, "host_available", lambda: 2**30)   # a host with 1 GiB free
    monkeypatch.setattr(bench_agents, "row_bytes", lambda *a, **k: {"total": 2**30})   # 1 GiB a session
    args = ["--small", "--agents", "3", "--turns", "1", "--models", "hybrid", "--cases", "one-tile", "--max-rows",
            "1", "--prefill-tokens", "64", "--no-plot", "--out", str(tmp_path)]
    assert bench_agents.main(args + ([] if limit is None else ["--host-limit-gib", limit])) == 0
    (r,) = json.loads((tmp_path / "bench_agents.json").read_text())["rows"]
    if limit == "0.5":   # 2 sessions past the row would take 2 GiB: bounded to 0.5 GiB, it runs
        assert r["status"] == "ok" and r["all_turns_completed"]
    else:
        assert r["status"] == "skipped (host memory)"
        assert ("--host-limit-gib 0.9 is more than 80% of the 1 GiB available" if limit == "0.9" else
                "need up to 2 GiB, 1 GiB available") in r["why"]   # a limit above the need does not bind


@pytest.mark.parametrize("bad", [["--margin-gib", "-1"], ["--quantize", "int4"], ["--host-limit-gib", "-2"],
                                 ["--margin-gib", "nan"], ["--cases", "two-tile"],
                                 ["--agents", "0"], ["--agents", "4,x"], ["--turns", "0"], ["--budget", "-3"],
                                 ["--prefill-tokens", "0"], ["--prefill-min-tokens", "-5"], ["--max-rows", "0"],
                                 ["--step-prompt-max", "-1"]])
def test_bad_flags_are_one_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as e:
        bench_agents.main(["--small", *bad])
    assert e.value.code == 2 and bad[1] in capsys.readouterr().err


def test_step_alone_is_timed_with_its_rows_active_and_leaves_the_engine_as_it_was(monkeypatch):
    # after a run every turn is done and every row inactive; an inactive row skips its Mamba state stores, so
    # timing the step on those rows timed less than a step of the run does
    import torch
    from tiny_lm import tiny_lm

    from holotron.engine import Engine
    from holotron.state import MambaState

    eng = Engine(tiny_lm(), max_batch=4, max_len=64)
    reqs = [eng.submit(torch.arange(3, 3 + 5 + i), max_new_tokens=3) for i in range(3)]
    eng.run()
    assert all(r.done for r in reqs) and int(eng.active.sum()) == 0
    mamba = next(st for st in eng.state.layers if isinstance(st, MambaState))
    before = {k: t.clone() for k, t in (("active", eng.active), ("tokens", eng.tokens), ("lengths", eng.state.lengths))}
    seen = []

    def once(fn, warmup, reps, device):
        ssm = mamba.ssm.clone()
        seen.append(eng.active.tolist())
        fn()
        seen.append(bool((mamba.ssm[:2] != ssm[:2]).any()))   # the timed step wrote the rows' states
        return [1.0]

    monkeypatch.setattr(bench_agents, "times_ms", once)
    assert bench_agents.step_ms(eng, 2, 1) == 1.0
    assert seen == [[1, 1, 0, 0], True]
    assert torch.equal(eng.active, before["active"]) and torch.equal(eng.tokens, before["tokens"])
    assert torch.equal(eng.state.lengths, before["lengths"])


def test_a_run_cut_by_its_deadline_counts_only_the_turns_that_finished():
    # the deadline has passed when the loop starts: every agent's first turn is submitted, none runs; closing the
    # sessions afterwards cancels those turns, which must not count them as completed
    import argparse

    import torch

    text, vision = bench_agents.configs(True)["hybrid"]
    model = bench_agents.build_vl(text, vision, torch.device("cpu"), torch.float32)
    plan = bench_agents.make_plan(3, 2, model.config.tokens_per_tile, (8, 16), (6, 10), text.vocab_size)
    max_len = -(-(max(bench_agents.history(a) for a in plan) + 64) // 256) * 256
    args = argparse.Namespace(small=True, prefill_tokens=64, phase_timing="on", ssm_dtype=torch.float32,
                              kv_dtype=None, overlap="auto", mixed="auto", prefill_graphs="auto",
                              step_prompt_max=None, prefill_min_tokens=0, vision_stream="off")
    r = bench_agents.run_agents(model, plan, 1, 2, max_len, args, deadline=0.0)
    assert r["status"] == "cut (time)" and r["turns_expected"] == 6
    assert r["turns_completed"] == 0 and r["output_tokens"] == 0 and not r["all_turns_completed"]


def test_a_run_reports_its_warm_up_and_progress_while_it_goes(tmp_path, monkeypatch, capsys):
    """Every ``PROGRESS_S`` seconds a run prints its progress and writes it to the JSON's "running" entry (what a
    run killed from outside leaves behind); the entry is gone once the row is written."""
    monkeypatch.setattr(bench_agents, "PROGRESS_S", 0.0)
    seen = []
    real_save = json.dump

    def spy(obj, f, **kw):
        if "running" in obj:
            seen.append(json.loads(json.dumps(obj["running"], default=str)))
        return real_save(obj, f, **kw)

    monkeypatch.setattr(bench_agents.json, "dump", spy)
    rc = bench_agents.main(["--small", "--agents", "3", "--turns", "2", "--models", "hybrid", "--cases", "one-tile",
                            "--prefill-tokens", "64", "--max-rows", "2", "--no-plot", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "warm-up" in out and "mixed_graphs" in out and "progress s " in out and "turns_done" in out
    assert seen and set(seen[0]["warmup"]) == {"chunk_graphs"} and seen[0]["agents"] == 3
    last = seen[-1]
    assert set(last["warmup"]) == {"chunk_graphs", "vision_graphs", "mixed_graphs", "warm_turns"}
    assert last["progress"]["turns_expected"] == 6 and 0 <= last["progress"]["turns_done"] <= 6
    res = json.loads((tmp_path / "bench_agents.json").read_text())
    row = res["rows"][0]
    assert "running" not in res and row["status"] == "ok"
    # the timeline (s, turns done, tokens) of every progress line and the end, for comparing runs at equal shares
    tl = row["timeline"]
    assert len(tl) >= 2 and tl[-1] == [round(row["wall_s"], 1), 6, row["prompt_tokens"] + row["output_tokens"]]
    assert all(a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2] for a, b in zip(tl, tl[1:]))


def test_the_watchdog_prints_the_stack_of_a_step_that_takes_too_long(tmp_path, monkeypatch, capfd):
    """``--watchdog S``: a step that has not returned after S seconds leaves every thread's Python stack on stderr
    (where a run that hangs on the GPU waits), and the run goes on."""
    real = bench_agents.Engine.step
    slow = []

    def step(self):
        if not slow:
            slow.append(1)
            time.sleep(1.6)
        return real(self)

    monkeypatch.setattr(bench_agents.Engine, "step", step)
    rc = bench_agents.main(["--small", "--agents", "2", "--turns", "1", "--models", "hybrid", "--cases", "one-tile",
                            "--prefill-tokens", "64", "--no-plot", "--watchdog", "1", "--out", str(tmp_path)])
    assert rc == 0
    err = capfd.readouterr().err
    assert "Timeout (0:00:01)!" in err and "in step" in err
    assert json.loads((tmp_path / "bench_agents.json").read_text())["rows"][0]["status"] == "ok"
