"""Real concurrent processes writing one bank; a PostgreSQL restart mid-run. No row lost or
duplicated."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import bank_conformance as bc
import pytest
from bank_conformance import ok_trial, start

from infrarsi.bank import ExperienceBank

bank_url = bc.bank_url  # the shared suite's fixture (SQLite + PostgreSQL)
ROOT = Path(__file__).resolve().parents[1]
WORKER = """
import sys, time
sys.path.insert(0, {tests!r})
from bank_conformance import ok_trial, start
from infrarsi.bank import ExperienceBank
url, wid, n_own, n_shared, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
bank = ExperienceBank.open(url, retry_s=60)
rid = start(bank, run_id="shared-run")
while time.time() < go:
    time.sleep(0.005)
for i in range(max(n_own, n_shared)):
    if i < n_own:
        bank.open_trial(rid, f"w{{wid}}-{{i}}", {{"micro_batch_size": 1}})
        bank.record_trial(rid, ok_trial(f"w{{wid}}-{{i}}", 1 + i % 8, 0.1 + i / 1000))
    if i < n_shared:  # every worker records the same shared trials: duplicates must collapse
        bank.record_trial(rid, ok_trial(f"shared-{{i}}", 2, 0.5))
bank.record_finding(rid, "micro_batch_size", wid, {{"t": 1}}, {{"t": 2}}, False)
bank.close()
print("done", wid)
"""

N_WORKERS, N_OWN, N_SHARED = 3, 40, 15


def test_concurrent_processes_lose_and_duplicate_nothing(bank_url):
    ExperienceBank.open(bank_url).close()
    code = WORKER.format(tests=str(ROOT / "tests"))
    go = time.time() + 4.0  # all workers start writing at the same moment
    procs = [
        subprocess.Popen([sys.executable, "-c", code, bank_url, str(w), str(N_OWN), str(N_SHARED),
                          repr(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT)
        for w in range(N_WORKERS)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    bank = ExperienceBank.open(bank_url)
    ids = [r.trial_id for r in bank.trials("shared-run")]
    assert len(ids) == len(set(ids)) == N_WORKERS * N_OWN + N_SHARED
    assert bank.count_trials("shared-run") == {
        "ok": N_WORKERS * N_OWN + N_SHARED, "oom": 0, "error": 0, "rejected": 0, "open": 0,
        "total": N_WORKERS * N_OWN + N_SHARED}
    assert sorted(f.setting for f in bank.findings()) == list(range(N_WORKERS))
    assert len(bank.list_runs()) == 1
    bank.close()


@pytest.mark.postgres
def test_postgres_restart_mid_run_loses_and_duplicates_nothing(bank_url):
    ctl = os.environ.get("INFRARSI_TEST_POSTGRES_CTL")
    if not bank_url.startswith("postgresql") or not ctl:
        pytest.skip("needs the server scripts/with_postgres.sh started (INFRARSI_TEST_POSTGRES_CTL)")
    bank = ExperienceBank.open(bank_url, retry_s=60)
    rid = start(bank)
    n, errors = 120, []

    def writer() -> None:
        try:
            for i in range(n):
                bank.record_trial(rid, ok_trial(str(i), 1, 0.1 + i / 1000))
                time.sleep(0.01)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(0.3)
    subprocess.run([*shlex.split(ctl), "-m", "fast", "-w", "restart"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t.join(timeout=120)
    assert not errors, errors
    ids = [r.trial_id for r in bank.trials(rid)]
    assert sorted(ids, key=int) == [str(i) for i in range(n)]
    bank.close()
