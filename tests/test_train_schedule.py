"""The learning-rate schedule (holotron/train/optim.py): the warm-up-stable-decay shape, the cosine one as
before, and the progress of a run spread over several jobs continuing across a resume."""

from __future__ import annotations

import math

import pytest

from holotron.train.optim import lr_at, schedule_progress

LR, WARMUP, FLOOR = 1e-3, 0.1, 0.1


def test_wsd_warms_up_holds_the_peak_then_cools_down_linearly_to_the_floor():
    f = lambda p, cooldown=0.2: lr_at(p, LR, WARMUP, FLOOR, schedule="wsd", cooldown=cooldown)  # noqa: E731
    assert f(0.0) == pytest.approx(LR / 100)
    assert f(WARMUP / 2) == pytest.approx(lr_at(WARMUP / 2, LR, WARMUP, FLOOR))  # the same warm-up as cosine
    assert f(WARMUP) == pytest.approx(LR)
    assert f(0.5) == f(0.8) == pytest.approx(LR)                                 # the plateau
    assert f(0.9) == pytest.approx(LR * (1 + FLOOR) / 2)                         # half-way down the cool-down
    assert f(1.0) == pytest.approx(LR * FLOOR)
    assert f(1.5) == f(1.0) and f(-1.0) == f(0.0)                                # clamped
    ps = [i / 400 for i in range(401)]
    vals = [f(p) for p in ps]
    w, c = ps.index(WARMUP), ps.index(0.8)
    assert all(a < b for a, b in zip(vals[:w], vals[1:w + 1]))      # rising during warm-up
    assert all(v == pytest.approx(LR) for v in vals[w:c + 1])       # flat
    assert all(a > b for a, b in zip(vals[c:], vals[c + 1:]))       # falling during the cool-down
    steps = [a - b for a, b in zip(vals[c:], vals[c + 1:])]
    assert max(steps) == pytest.approx(min(steps))                  # ... linearly
    # no cool-down: the peak to the end; a cool-down longer than the run after warm-up starts at its end
    assert f(1.0, cooldown=0.0) == pytest.approx(LR)
    assert f(WARMUP, cooldown=1.0) == pytest.approx(LR)
    assert f((1 + WARMUP) / 2, cooldown=1.0) == pytest.approx(LR * (1 + FLOOR) / 2)
    assert lr_at(0.0, LR, 0.0, FLOOR, schedule="wsd") == pytest.approx(LR)      # no warm-up: the peak at once


def test_cosine_is_unchanged_and_the_default():
    for p in [i / 50 for i in range(51)]:
        t = max(0.0, (p - WARMUP) / (1 - WARMUP))
        want = LR * (0.01 + 0.99 * p / WARMUP) if p < WARMUP else \
            LR * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * t)))
        assert lr_at(p, LR, WARMUP, FLOOR) == pytest.approx(want)
        assert lr_at(p, LR, WARMUP, FLOOR, schedule="cosine", cooldown=0.5) == lr_at(p, LR, WARMUP, FLOOR)


def test_bad_schedule_arguments_are_refused():
    with pytest.raises(ValueError, match="schedule"):
        lr_at(0.5, LR, WARMUP, FLOOR, schedule="linear")
    with pytest.raises(ValueError, match="cooldown"):
        lr_at(0.5, LR, WARMUP, FLOOR, schedule="wsd", cooldown=1.5)
    with pytest.raises(ValueError, match="steps"):
        schedule_progress(0, 0)


def test_progress_is_the_larger_of_steps_and_seconds_clamped():
    assert schedule_progress(50, 100) == 0.5
    assert schedule_progress(50, 100, 999.0, None) == 0.5               # no time budget: steps only
    assert schedule_progress(50, 100, 30.0, 100.0) == 0.5
    assert schedule_progress(20, 100, 70.0, 100.0) == 0.7               # the clock runs out first
    assert schedule_progress(150, 100) == 1.0
    assert schedule_progress(10, 100, 500.0, 100.0) == 1.0
    assert schedule_progress(0, 100, -5.0, 100.0) == 0.0


def test_progress_continues_across_a_resume():
    """Three jobs of one run with a total time budget that ends it before its steps do: each job resumes
    with the global step and the seconds trained before (``elapsed_before``); the schedule picks up where
    the last job stopped (one step's worth further), never back at the warm-up."""
    steps, total, per_job, step_s = 1000, 300.0, 100.0, 0.4  # 250 steps a job; the clock ends the run
    elapsed_before, step, jobs = 0.0, 0, []
    for _job in range(3):
        job_s, trace = 0.0, []
        while step < steps and job_s < per_job:
            trace.append(schedule_progress(step, steps, elapsed_before + job_s, total))
            step += 1
            job_s += step_s
        jobs.append(trace)
        elapsed_before += job_s  # what the checkpoint's train_seconds carries to the next job
    trace = [p for t in jobs for p in t]
    assert trace[0] == 0.0 and trace[-1] == pytest.approx(1.0, abs=0.01)
    assert all(b > a for a, b in zip(trace, trace[1:]))  # never restarts, never stalls
    for prev, nxt in zip(jobs, jobs[1:]):
        assert nxt[0] - prev[-1] == pytest.approx(step_s / total)
    lrs = [lr_at(p, LR, WARMUP, FLOOR, schedule="wsd") for p in trace]
    assert lrs[len(jobs[0])] == pytest.approx(LR)  # the second job starts on the plateau
    assert lrs[-1] == pytest.approx(LR * FLOOR, rel=0.1)  # the last one ends (a step short of) the floor
    # a schedule restarted by each job (step and seconds counted from 0) would have warmed up again
    restarted = lr_at(schedule_progress(0, steps, 0.0, total), LR, WARMUP, FLOOR, schedule="wsd")
    assert restarted == pytest.approx(LR / 100)
