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
