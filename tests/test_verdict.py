"""The promotion rule (bar = 1 + min_effect, sequential looks with alpha spending), the baseline
sentinel and its drift, and doctor's contention probe."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time

import pytest
from toy_backend import ToyBackend

from infrarsi.doctor.contention import ContentionProbe, contention_summary
from infrarsi.search import InfraRSISearcher, SearchEngine
from infrarsi.search._progress import Progress
from infrarsi.search._session import baseline_drift
from infrarsi.search.searcher import SENTINEL_ORIGIN
from infrarsi.search.verify import (
    FALSE_PROMOTION_RATE,
    judge,
    look_alphas,
    look_schedule,
    verify_candidate,
)


@pytest.mark.parametrize("mde", [0.01, 0.5, 2.0])
def test_a_clear_speedup_with_a_tight_interval_is_promoted_whatever_doctors_mde(mde):
    b = ToyBackend(seed=1, noise=0.02)
    base = b.baseline_config()
    fast = {**base, "precision": "bf16"}  # 1.5x
    v = verify_candidate(b, base, fast, pairs=5, mde=mde, min_effect=0.03, tag="f", max_pairs=10)
    assert v.promoted, v.reason
    assert v.ci_low > 1.03 and len(v.pairs) == 5  # settled at the planned look
    assert v.mde == mde  # recorded as the planning figure, not used as a bar


def test_the_bar_is_the_users_min_effect():
    b = ToyBackend(seed=1, noise=0.02)
    base = b.baseline_config()
    fast = {**base, "precision": "bf16"}
    v = verify_candidate(b, base, fast, pairs=5, min_effect=0.8, tag="f", max_pairs=10)
    assert not v.promoted and v.speedup > 1.4  # a real 1.5x, below a 1.8x bar


@pytest.mark.parametrize("seed", range(10))
def test_an_aa_pair_set_is_refused(seed):
    b = ToyBackend(seed=seed, noise=0.10)
    base = b.baseline_config()
    v = verify_candidate(b, base, dict(base), pairs=5, min_effect=0.03, tag="aa", max_pairs=10)
    assert not v.promoted, v.reason


def test_alpha_spending_keeps_the_false_promotion_rate_over_all_looks():
    """Log ratios drawn exactly at the bar (true speedup 1 + min_effect, the worst case the rule
    guards): the sequential rule promotes at most the stated 5% (+ Monte Carlo slack); testing
    every look at the full 5% would not (it fails this test)."""
    rng = random.Random(0)
    looks = look_schedule(5, 17)
    assert looks == [5, 8, 12, 17]
    spent = look_alphas(looks)
    assert sum(spent) == pytest.approx(FALSE_PROMOTION_RATE)
    n, sd = 6000, 0.1
    bar = 1.03

    def rate(alphas):
        promoted = 0
        for _ in range(n):
            logs = [rng.gauss(math.log(bar), sd) for _ in range(looks[-1])]
            for k, (m, a) in enumerate(zip(looks, alphas, strict=True)):
                d, *_ = judge([(math.exp(x), 1.0) for x in logs[:m]], min_effect=0.03, alpha=a,
                              final=k == len(looks) - 1, cap=looks[-1])
                if d != "continue":
                    promoted += d == "promote"
                    break
        return promoted / n

    se = math.sqrt(FALSE_PROMOTION_RATE * (1 - FALSE_PROMOTION_RATE) / n)
    assert rate(spent) <= FALSE_PROMOTION_RATE + 2 * se
    assert rate([FALSE_PROMOTION_RATE] * len(looks)) > FALSE_PROMOTION_RATE + 2 * se


def test_an_open_verdict_is_extended_and_a_settled_one_stops_early():
    b = ToyBackend(seed=3, noise=0.15)
    base = b.baseline_config()
    same = verify_candidate(b, base, dict(base), pairs=4, min_effect=0.03, tag="s",
                            max_pairs=12)
    assert not same.promoted and len(same.pairs) < 12 or "does not clear" in same.reason
    extended = 0
    for seed in range(6):
        b = ToyBackend(seed=seed, noise=0.15)
        v = verify_candidate(b, base, {**base, "precision": "bf16"}, pairs=3, min_effect=0.03,
                             tag="n", max_pairs=12)
        extended += len(v.pairs) > 3
        assert v.looks == [3, 5, 8, 12]
    assert extended >= 1


def _toy_engine(b: ToyBackend, budget: int) -> SearchEngine:
    return SearchEngine(b.space, b.workload, b.hardware, budget=budget, seed=0)


def test_the_searcher_remeasures_the_baseline_as_a_sentinel_outside_the_budget():
    b = ToyBackend(seed=0, noise=0.01)
    seen = []
    s = InfraRSISearcher(_toy_engine(b, 7), sentinel=b.baseline_config(), sentinel_every=3,
                         sentinel_first=1, search_trials=7,
                         on_record=lambda tid, rec, origin, live: seen.append(origin))
    for i in range(20):
        cfg = s.suggest(f"t{i}")
        if cfg == InfraRSISearcher.FINISHED:
            break
        rec = b.execute(cfg, trial_id=f"t{i}")
        s.on_trial_complete(f"t{i}", {"record": rec.to_dict(), "objective": 1.0})
    assert seen[0] == SENTINEL_ORIGIN and seen[4] == SENTINEL_ORIGIN and seen[8] == SENTINEL_ORIGIN
    assert seen.count(SENTINEL_ORIGIN) == 3  # first, then after 3 and 6 search trials
    assert len(s.engine.observations) == 7  # the budget is spent on search trials only
    assert all(o["origin"] != SENTINEL_ORIGIN for o in s.engine.observations)


def test_the_sentinels_drift_from_doctors_baseline_is_reported():
    lines: list[str] = []
    table = Progress(lines.append, baseline_step_s=0.514)
    drift = baseline_drift(0.243, 0.514, trial_cv=0.10)
    assert drift["drift"] == pytest.approx(0.243 / 0.514 - 1) and drift["notable"]
    table.sentinel(drift)
    assert "-52.7% from doctor's 514.0 ms" in lines[-1] and "DRIFT" in lines[-1]
    quiet = baseline_drift(0.250, 0.243, trial_cv=0.05)
    assert not quiet["notable"]
    table.sentinel(quiet)
    assert "DRIFT" not in lines[-1] and "+2.9%" in lines[-1]


def test_contention_summary_flags_busy_cores_steal_and_other_gpu_users():
    assert not contention_summary(other_cores=0.1, steal=0.0, load_per_core=0.3,
                                  cores=2)["contended"]
    busy = contention_summary(other_cores=1.0, steal=0.0, load_per_core=1.2, cores=2)
    assert busy["contended"] and "1.00 of 2 cores" in busy["summary"]
    assert contention_summary(other_cores=0.0, steal=0.2, load_per_core=None, cores=2)["contended"]
    gpu = {"other_processes": [4242], "utilization": 0.9}
    assert contention_summary(other_cores=0.0, steal=0.0, load_per_core=None, cores=2,
                              gpu=gpu)["contended"]


def test_the_probe_sees_a_process_outside_our_tree_keep_a_core_busy():
    # a busy loop reparented away from us (the shell exits): not ours, like another job
    code = "import time\nend = time.time() + 6\nwhile time.time() < end:\n    pass\n"
    pid = int(subprocess.check_output(
        ["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!', code]).strip())
    try:
        time.sleep(0.3)
        with ContentionProbe() as probe:
            time.sleep(2.0)
        assert probe.result["other_cores"] >= 0.5, probe.result
        assert probe.result["contended"]
    finally:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass


# ---- trial length fitted to the noise (item 4) ----------------------------------------------
def _noise(sw: float, sb: float, steps: int = 5, repeats: int = 3) -> dict:
    from infrarsi.doctor.noise import mde_for

    return {"within_cv": sw, "sigma_between": sb, "measured_steps": steps, "repeats": repeats,
            "confidence": 0.95, "mde": mde_for(sb, sw, steps, 5)}


def test_step_jitter_lengthens_the_trials_and_between_run_shifts_add_pairs():
    from infrarsi.search.verify import MAX_LENGTHEN, plan_pairs, plan_trial_length

    jittery = _noise(sw=0.20, sb=0.01)
    steps, why = plan_trial_length(jittery, steps=5, overhead_steps=10.0)
    assert 5 < steps <= MAX_LENGTHEN * 5 and "jitter dominates" in why
    assert plan_trial_length(jittery, steps=5, overhead_steps=10.0, max_steps=8)[0] == 8
    shifty = _noise(sw=0.02, sb=0.10)
    steps, why = plan_trial_length(shifty, steps=5, overhead_steps=10.0)
    assert steps == 5 and "more pairs" in why
    # the pairs the planner asks for: more under the shifts, fewer once the trials are longer
    assert plan_pairs(shifty, min_effect=0.03, expected_speedup=1.15, default=5, cap=20) > 5
    few = plan_pairs(jittery, min_effect=0.03, expected_speedup=1.15, default=3, cap=40, steps=5)
    long_ = plan_pairs(jittery, min_effect=0.03, expected_speedup=1.15, default=3, cap=40,
                       steps=20)
    assert long_ < few
    assert plan_trial_length(None, steps=5, overhead_steps=3.0)[0] == 5


def test_trial_overhead_is_the_wall_time_outside_the_measured_steps():
    from infrarsi.search.verify import trial_overhead_steps

    b = ToyBackend(seed=0, noise=0.0)
    rec = b.execute(b.baseline_config())
    from dataclasses import replace

    rec = replace(rec, wall_seconds=sum(rec.step_times_s) + 12 * rec.step_time_s)
    assert trial_overhead_steps([rec]) == pytest.approx(12.0)
    assert trial_overhead_steps([]) is None


def test_longer_simulated_trials_measure_the_same_step_with_less_jitter():
    """Lengthening only adds timed steps: the median step of a long trial estimates the same
    step time (same mean log median), with a smaller pair-to-pair SD when jitter dominates."""
    from infrarsi.backends.simulator import SimulatorBackend
    from infrarsi.backends.simulator.params import SimParams

    params = SimParams(noise_step_cv=0.15, noise_trial_cv=0.002)
    short = SimulatorBackend.builtin("dense-single-node", seed=3, params=params)
    long_ = short.with_measured_steps(25)
    assert long_.params.measured_steps == 25 and short.params.measured_steps == 5
    base = short.baseline_config()

    def logs(backend, n=60):
        return [math.log(backend.execute(base).step_time_s) for _ in range(n)]

    s, lg = logs(short), logs(long_)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    sd = lambda xs: math.sqrt(sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1))  # noqa: E731
    assert abs(mean(s) - mean(lg)) < 0.03
    assert sd(lg) < 0.7 * sd(s)
    assert len(long_.execute(base).step_times_s) == 25


def test_a_lengthened_real_trial_times_more_steps_of_the_same_work(tmp_path):
    """The harness with more measured steps: the same loss trace on the common steps (the
    same work per step), the same per-step clock, only more timed steps."""
    from conftest import copy_task

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import load_task

    backend = RayTrainBackend(load_task(copy_task(tmp_path)), local_mode=True)
    longer = backend.with_measured_steps(backend.spec.timing.measured_steps + 3)
    assert longer.spec.timing.measured_steps == backend.spec.timing.measured_steps + 3
    assert backend.spec.timing.measured_steps == 5  # the original is untouched
    pa, pb = backend.payload(backend.baseline_config()), longer.payload(backend.baseline_config())
    assert pa["config"] == pb["config"] and pa["workspace_files"] == pb["workspace_files"]
    assert {k: v for k, v in pa["task"].items() if k != "timing"} == \
        {k: v for k, v in pb["task"].items() if k != "timing"}
    one = {**backend.baseline_config(), "num_workers": 1}  # local mode: one in-process rank
    a, b = backend.execute(one), longer.execute(one)
    assert a.ok and b.ok, (a.error_message, b.error_message)
    assert len(b.step_times_s) == len(a.step_times_s) + 3
    assert b.loss_trace[: len(a.loss_trace)] == pytest.approx(a.loss_trace, rel=1e-6)


# ---- one advice for doctor and the report ----------------------------------------------------
def test_doctor_and_the_report_give_the_same_advice():
    from types import SimpleNamespace

    from infrarsi.doctor.advice import verification_advice
    from infrarsi.doctor.record import DoctorRecord
    from infrarsi.report._data import pairs_advice

    # the demo's case: the shifts between doctor's repeats alone exceed any reachable target
    shifty = _noise(sw=0.01, sb=0.228)
    doctor = verification_advice(shifty, target=0.05, pairs=5)
    assert doctor["remedy"] == "quiet" and "--pairs" not in doctor["text"]
    verdict = {"speedup": 1.08, "min_effect": 0.03, "ci_low": 0.95,
               "pairs": [(1.0, 1.0)] * 5}
    report = pairs_advice(SimpleNamespace(doctor=DoctorRecord(noise=shifty)), verdict)
    assert "--pairs" not in report and "neither" in report, report
    # a quiet machine: both say how many pairs
    quiet = _noise(sw=0.01, sb=0.03)
    doctor = verification_advice(quiet, target=0.05, pairs=5)
    report = pairs_advice(SimpleNamespace(doctor=DoctorRecord(noise=quiet)),
                          {**verdict, "speedup": 1.03 * 1.05})
    assert doctor["required_pairs"] and f"--pairs {doctor['required_pairs']}" in doctor["text"]
    assert f"--pairs {doctor['required_pairs']}" in report, report
    # an estimate below the bar: no number of pairs promotes it
    below = pairs_advice(SimpleNamespace(doctor=DoctorRecord(noise=quiet)),
                         {**verdict, "speedup": 1.01})
    assert "not promote it" in below


# ---- the simulator's noise calibrated to A/A trials -----------------------------------------
def test_fit_noise_recovers_the_simulators_own_noise_from_aa_pairs():
    from infrarsi.backends.simulator import SimulatorBackend
    from infrarsi.backends.simulator.noise import fit_noise
    from infrarsi.backends.simulator.params import SimParams

    truth = SimParams(noise_step_cv=0.05, noise_trial_cv=0.03, noise_drift_cv=0.15,
                      noise_drift_rho=0.9, noise_stall_prob=0.05, noise_stall_factor=3.0,
                      measured_steps=10)
    b = SimulatorBackend.builtin("dense-single-node", seed=7, params=truth)
    base = b.baseline_config()
    trials = [list(b.execute(base).step_times_s) for _ in range(400)]
    fit = fit_noise(trials)
    assert fit["noise_step_cv"] == pytest.approx(0.05, rel=0.2)
    assert fit["noise_stall_prob"] == pytest.approx(0.05, abs=0.015)
    assert fit["noise_stall_factor"] == pytest.approx(3.0, rel=0.2)
    assert fit["noise_drift_cv"] == pytest.approx(0.15, rel=0.35)
    assert fit["noise_trial_cv"] == pytest.approx(0.03, abs=0.02)
    # the drift is shared by a pair's two trials: pairing cancels most of it
    assert fit["pair_log_ratio_sd"] < 0.1
    with pytest.raises(ValueError, match="two A/A pairs"):
        fit_noise(trials[:3])


def test_the_default_simulator_noise_is_unchanged_by_the_machine_model():
    """Off by default: a config's noise depends on its own run count only (as before the machine
    model), so trials of other configs in between change nothing; a drifting machine is shared,
    so with the drift on they do."""
    from infrarsi.backends.simulator import SimulatorBackend
    from infrarsi.backends.simulator.params import SimParams
    from infrarsi.space import config_key

    def runs(params, interleave):
        b = SimulatorBackend.builtin("dense-single-node", seed=2, params=params)
        base = b.baseline_config()
        other = next(c for c in b.space.enumerate() if config_key(c) != config_key(base))
        out = []
        for _ in range(3):
            if interleave:
                b.execute(other)
            out.append(b.execute(base).step_times_s)
        return out

    default = SimParams()
    assert default.noise_drift_cv == 0 and default.noise_stall_prob == 0
    assert runs(default, False) == runs(default, True)
    drifting = SimParams(noise_drift_cv=0.1)
    assert runs(drifting, False) != runs(drifting, True)


def test_the_run_stage_lengthens_both_sides_when_jitter_dominates_within_the_timeout():
    from dataclasses import replace
    from types import SimpleNamespace

    from infrarsi.backends.simulator import SimulatorBackend
    from infrarsi.search.run_stage import _verification_backend

    sim = SimulatorBackend.builtin("dense-single-node", seed=0)
    rec = sim.execute(sim.baseline_config())
    rec = replace(rec, wall_seconds=sum(rec.step_times_s) + 30 * rec.step_time_s)
    lines: list[str] = []

    def session(backend, timeout_s):
        spec = SimpleNamespace(timing=SimpleNamespace(measured_steps=5),
                               trial=SimpleNamespace(timeout_s=timeout_s))
        return SimpleNamespace(spec=spec, backend=backend, baseline_records=[rec],
                               baseline_step_s=rec.step_time_s, progress=lines.append)

    jittery = _noise(sw=0.20, sb=0.01)
    backend, steps = _verification_backend(session(sim, 1e6), jittery)
    assert steps == 20 and backend is not sim and backend.params.measured_steps == 20
    assert "20 measured steps instead of 5" in lines[-1]
    # the trial timeout bounds the length: half of it holds the overhead and 8 more steps
    short = (30 + 8) * 2 * rec.step_time_s
    assert _verification_backend(session(sim, short), jittery)[1] == 8
    # a backend that cannot lengthen its trials keeps them (and says so)
    toy = ToyBackend()
    backend, steps = _verification_backend(session(toy, 1e6), jittery)
    assert backend is toy and steps == 5 and "5 measured steps" in lines[-1]
    # between-run shifts dominate: the length stays
    assert _verification_backend(session(sim, 1e6), _noise(sw=0.02, sb=0.10))[1] == 5


@pytest.mark.parametrize(("seed", "candidate"), [(1, {"precision": "bf16"}), (3, {})])
def test_the_progress_table_judges_at_the_verdicts_looks_and_ends_with_the_reports_headline(
        seed, candidate):
    """The pair lines test the bar only at the verification's looks, at their levels, so the
    table's last look says what the verdict decided; its summary gives the report's figures."""
    from types import SimpleNamespace

    from infrarsi.report._sections import verdict_line
    from infrarsi.search.run_stage import RunOutcome

    b = ToyBackend(seed=seed, noise=0.05)
    base = b.baseline_config()
    lines: list[str] = []
    table = Progress(lines.append, baseline_step_s=None, baseline_config=base)
    looks = look_schedule(5, 10)
    table.verify_start(1, 1, 5, {**base, **candidate}, looks, look_alphas(looks))
    last: dict = {}

    def on_record(rec, origin):
        last[origin] = rec
        if origin == "verify:candidate":
            table.verify_pair(last["verify:baseline"], rec, bar=1.03)

    v = verify_candidate(b, base, {**base, **candidate}, pairs=5, max_pairs=10, min_effect=0.03,
                         tag="t", on_record=on_record)
    judged = [ln for ln in lines if "lower bound" in ln]
    assert judged and f"lower bound {v.ci_low:.3f}" in judged[-1]
    assert ("clears the bar" in judged[-1]) == v.promoted
    assert len(judged) == looks.index(len(v.pairs)) + 1  # one judgement per look taken
    assert all("clears" not in ln and "below" not in ln for ln in lines if ln not in judged)
    table.summary(RunOutcome("r", 1, None, verdicts=[v], promoted=v if v.promoted else None))
    if v.promoted:
        _, head = verdict_line(SimpleNamespace(promoted=v.to_dict(), partial=None))
        figures = f"{v.speedup:.3f}x faster per step ({v.confidence:.0%} CI [{v.ci_low:.3f}, " \
                  f"{v.ci_high:.3f}], {len(v.pairs)} interleaved A/B pairs"
        assert figures in head.replace("**", "") and figures in lines[-1]
        assert "precision fp32->bf16" in lines[-1]
    else:
        assert lines[-1].startswith("promoted: nothing")


def test_trial_processes_run_at_the_drivers_priority():
    """Ray's workers default to nice 15: a busy process elsewhere then slows every trial ~10x.
    The Ray InfraRSI starts gives its workers, and the actors they start, the driver's."""
    code = (
        "import os, ray\n"
        "from infrarsi.backends.ray_train.backend import _ensure_ray\n"
        "_ensure_ray()\n"
        "@ray.remote\n"
        "class Inner:\n"
        "    def nice(self): return os.nice(0)\n"
        "@ray.remote\n"
        "class Outer:\n"
        "    def nice(self): return os.nice(0), ray.get(Inner.options(num_cpus=0).remote()"
        ".nice.remote())\n"
        "print('NICE', os.nice(0), *ray.get(Outer.options(num_cpus=0).remote().nice.remote()))\n"
        "ray.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("NICE")), None)
    assert line is not None, out.stderr[-2000:]
    driver, outer, inner = map(int, line.split()[1:])
    assert outer == inner == driver, line


def test_the_tables_baseline_is_the_median_of_the_recent_sentinels():
    """One noisy sentinel (246 ms between 318 and 320) does not move every later speedup."""
    from types import SimpleNamespace

    from infrarsi.search._session import RunSession

    lines: list[str] = []
    table = Progress(lines.append, baseline_step_s=0.3245)
    session = SimpleNamespace(doctor_baseline_step_s=0.3245, noise={"trial_cv": 0.08},
                              sentinels=[], baseline_step_s=0.3245, doctor_contended=False,
                              _sentinel_series=[])
    for i, step in enumerate([0.318, 0.246, 0.320]):
        rec = SimpleNamespace(ok=True, step_time_s=step, step_times_s=[step], trial_id=f"s{i}")
        RunSession.sentinel_measured(session, rec, table)
    assert table.baseline_step_s == session.baseline_step_s == pytest.approx(0.318)
    assert "median of the last 3 sentinels, 318.0 ms" in lines[-1]
