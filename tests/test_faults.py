"""Faults of the search loop itself, with real Ray Tune, a real bank and real processes, but
simulator trials (milliseconds), so each test takes seconds to a minute:

* trials that crash, whose process dies, or that fail the ordinary way: one bank row each;
* an OOM storm (every candidate above capacity): the search must stop and say why;
* the bank's PostgreSQL server restarted mid-search: writes retried, none lost or duplicated.

The faults that need Ray Train worker processes and nodes are in test_faults_cluster.py.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from infrarsi.backends.simulator import SimulatorBackend, SimWorkload

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
soak = importlib.util.module_from_spec(_spec)
sys.modules["soak"] = soak  # dataclasses look their module up while it executes ...
_spec.loader.exec_module(soak)
del sys.modules["soak"]  # ... then Tune must pickle the trainable by value (not importable)

# A few thousand legal configs keep the engine's suggestions fast (the full built-in spaces
# cost seconds per suggestion on a 2-core box).
SMALL = {"micro_batch_size": (1, 2, 4), "context_parallel_degree": (1,), "compile": ("off",)}
FIRST_RUN = {"data_parallel_degree": 8, "zero_stage": 3, "activation_checkpointing": "full",
             "micro_batch_size": 1}


def sim(model: str = "llama-3.1-8b", name: str = "faults-8b") -> SimulatorBackend:
    return SimulatorBackend(SimWorkload(name, model, "H100-80GB", 1, 4096, 256,
                                       baseline=FIRST_RUN, restrict=SMALL))


def test_crashed_dead_and_failed_trials_each_leave_one_row(ray_local, tmp_path):
    url = f"sqlite:///{tmp_path / 'bank.sqlite'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = soak.run_soak(sim(), trials=12, bank_url=url, fail_every=3)
    # Trials 3, 6, 9, 12 fail on purpose: raise, process exit, an error record, raise.
    assert res.trials_run == res.tune_trials == 12
    assert res.rows["total"] == 12 == res.distinct_trial_ids and res.rows["open"] == 0
    assert res.bank_outcomes == {"inserted": 12}
    assert res.statuses.get("error/crash") == 3  # raised twice + the process that died
    assert res.statuses.get("error/communication") == 1


def test_a_record_reported_as_a_dict_survives_tunes_flattening():
    """Tune hands searchers ``flatten_dict(result)``: ``{"record": {...}}`` arrives as
    ``record/config/...`` keys. Unread, every trial would be recorded as a crash at no cost."""
    from ray.tune.utils import flatten_dict

    from infrarsi.search import record_from_result
    from infrarsi.trial import ErrorKind, TrialRecord, TrialStatus

    backend = sim()
    ok = backend.execute(backend.baseline_config(), trial_id="t1")
    failed = TrialRecord(trial_id="t2", config=ok.config, status=TrialStatus.ERROR,
                         error_kind=ErrorKind.WORKER_LOST, backend="ray_train",
                         workload=ok.workload, hardware=ok.hardware, device_seconds=12.5)
    for rec in (ok, failed):
        flat = flatten_dict({"objective": 1.0, "record": rec.to_dict()})
        assert "record" not in flat
        assert record_from_result(flat) == rec
    assert record_from_result({"objective": 1.0}) is None


def test_oom_storm_stops_the_search_and_says_why(ray_local, tmp_path):
    storm = sim("llama-3-70b", "faults-70b-on-8")  # 70B on 8 GPUs: nothing fits
    url = f"sqlite:///{tmp_path / 'bank.sqlite'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = soak.run_soak(storm, trials=12, bank_url=url, fail_every=0)
    assert set(res.statuses) == {"oom"}
    assert res.rows["total"] == res.trials_run  # every OOM kept: censored information
    assert res.trials_run < 12, f"spent {res.trials_run} trials on an OOM storm"
    assert res.stop_reason and "memory" in res.stop_reason


@pytest.mark.postgres
def test_bank_restart_mid_search_loses_and_duplicates_nothing(ray_local):
    url = os.environ.get("INFRARSI_TEST_POSTGRES_URL")
    ctl = os.environ.get("INFRARSI_TEST_POSTGRES_CTL")
    if not url or not ctl:
        pytest.skip("needs the server scripts/with_postgres.sh starts (INFRARSI_TEST_POSTGRES_CTL)")
    restart: dict[str, float] = {}

    def on_trial(n: int) -> None:
        if n == 4:  # right after the 4th row: the next writes meet a restarting server
            t0 = time.time()
            subprocess.Popen([*shlex.split(ctl), "-m", "fast", "-w", "restart"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            restart["t"] = t0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = soak.run_soak(sim(), trials=10, bank_url=url, fail_every=0, on_trial=on_trial)
    assert "t" in restart
    assert res.trials_run == 10
    assert res.rows["total"] == 10 == res.distinct_trial_ids and res.rows["open"] == 0
    assert res.bank_outcomes == {"inserted": 10}
