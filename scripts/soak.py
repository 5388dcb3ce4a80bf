"""Soak: hundreds of simulator trials through the real Ray Tune loop, with injected failures.

    .venv/bin/python scripts/soak.py --trials 300 --fail-every 10
    .venv/bin/python scripts/soak.py --trials 60 --bank postgresql+psycopg://...  # shared bank

Each trial is a Tune trial driven by InfraRSISearcher (one at a time, as `infrarsi run` drives
them) over the simulator backend; every finished trial becomes one bank row through the
searcher's ``on_record``, as in the run stage. Every ``--fail-every``-th trial fails on purpose,
cycling through: the trial body raises before reporting (Tune sees an errored trial, the
searcher records a crash of its config), the trial process dies (``os._exit``: Tune loses the
actor), and the backend returns an ERROR record (a trial that failed the ordinary way).

Prints trials per minute, the driver's memory (RSS) and open file descriptors at start, middle
and end, and the bank's rows against the trials run (exactly one row per trial; none open).
``--out`` writes the same figures as JSON. ``run_soak()`` is the same loop for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = ("raise", "exit", "error_record")
SMALL_SLICE = {"micro_batch_size": (1, 2, 4), "context_parallel_degree": (1,), "compile": ("off",)}
MIB = 2**20


class InjectedFault(RuntimeError):
    """Raised by a trial body on purpose (the soak's injected crash)."""


def _process_figures() -> dict[str, float]:
    import psutil

    p = psutil.Process()
    return {"rss_mib": p.memory_info().rss / MIB, "open_fds": p.num_fds(),
            "threads": p.num_threads()}


class BankRecorder:
    """The searcher's ``on_record``: one bank row per finished trial. Tune pickles the search
    algorithm when the Tuner is built, and a live bank does not pickle: this holds the URL and
    opens the bank on first use (in the driver)."""

    def __init__(self, url: str, run_id: str, on_trial: Callable[[], None] | None = None) -> None:
        self.url, self.run_id, self.on_trial = url, run_id, on_trial
        self.outcomes: dict[str, int] = {}
        self._bank = None

    def __getstate__(self):
        return {**self.__dict__, "_bank": None, "on_trial": None}

    def __call__(self, trial_id, record, origin, live) -> None:
        from infrarsi.bank import ExperienceBank

        if self._bank is None:
            self._bank = ExperienceBank.open(self.url, seed=False, retry_s=120)
        outcome = self._bank.record_trial(self.run_id, record, origin)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if self.on_trial is not None:
            self.on_trial()

    def close(self) -> None:
        if self._bank is not None:
            self._bank.close()
            self._bank = None


def _trainable(config, *, backend, fail_every, counter_dir):
    """One trial. The ordinal comes from a file count (trials run one at a time)."""
    from ray import tune

    from infrarsi.trial import ErrorKind, TrialRecord, TrialStatus

    ordinal = len(os.listdir(counter_dir)) + 1
    Path(counter_dir, f"{ordinal:06d}").touch()
    trial_id = tune.get_context().get_trial_id()
    fault = FAULTS[(ordinal // fail_every - 1) % len(FAULTS)] if fail_every and ordinal % fail_every == 0 else None
    if fault == "raise":
        raise InjectedFault(f"injected crash in trial {ordinal}")
    if fault == "exit":
        os._exit(17)  # the trial's process dies without a word
    record = backend.execute(config, trial_id=trial_id)
    if fault == "error_record":
        record = TrialRecord(trial_id=trial_id, config=record.config, status=TrialStatus.ERROR,
                             error_kind=ErrorKind.COMMUNICATION, backend=record.backend,
                             workload=record.workload, hardware=record.hardware,
                             error_message="injected: peer reset the connection",
                             device_seconds=record.device_seconds)
    tune.report({"objective": backend.objective(record) or 0.0,
                 "record": json.dumps(record.to_dict())})  # JSON: Tune flattens nested dicts


@dataclass
class SoakResult:
    trials_run: int
    tune_trials: int
    wall_s: float
    rows: dict[str, int]
    distinct_trial_ids: int
    stop_reason: str | None
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    bank_outcomes: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def trials_per_min(self) -> float:
        return 60.0 * self.trials_run / max(self.wall_s, 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "trials_per_min": self.trials_per_min}


def run_soak(backend, *, trials: int, bank_url: str, fail_every: int = 10, seed: int = 0,
             trial_resources: dict[str, Any] | None = None,
             on_trial: Callable[[int], None] | None = None) -> SoakResult:
    """Drive ``trials`` Tune trials of ``backend`` with the InfraRSISearcher into the bank.

    Ray must be initialized (or RAY_ADDRESS set). ``on_trial(n)`` is called in the driver after
    the n-th trial's bank row is written (tests inject faults there).
    """
    import ray
    from ray import tune

    from infrarsi.bank import ExperienceBank
    from infrarsi.search import InfraRSISearcher, SearchEngine
    from infrarsi.trial import SoftwareVersions

    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    with ExperienceBank.open(bank_url, seed=False, retry_s=120) as bank:
        run_id = bank.start_run(backend.workload.name or "soak", "soak", backend.workload,
                                backend.hardware, SoftwareVersions.current())
    engine = SearchEngine(backend.space, backend.workload, backend.hardware, budget=trials,
                          seed=seed, objective=backend.objective,
                          baseline=backend.baseline_config(), include_baseline=True)
    figures = {"start": _process_figures()}
    done = [0]

    def after_trial() -> None:
        done[0] += 1
        if done[0] == max(trials // 2, 1):
            figures["middle"] = _process_figures()
        if on_trial is not None:
            on_trial(done[0])

    recorder = BankRecorder(bank_url, run_id, after_trial)
    searcher = InfraRSISearcher(engine, on_record=recorder)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    with tempfile.TemporaryDirectory(prefix="infrarsi-soak-") as tmp:
        counter = Path(tmp) / "ordinals"
        counter.mkdir()
        fn = tune.with_parameters(_trainable, backend=backend, fail_every=fail_every,
                                  counter_dir=str(counter))
        tuner = tune.Tuner(
            tune.with_resources(fn, trial_resources or {"cpu": 1}),
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=trials,
                                        max_concurrent_trials=1, reuse_actors=True),
            run_config=tune.RunConfig(
                name="soak", storage_path=str(Path(tmp) / "tune"), verbose=0, callbacks=[],
                log_to_file=False, failure_config=tune.FailureConfig(max_failures=0),
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False)),
        )
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grid = _quiet(tuner.fit)
        wall = time.perf_counter() - t0
    recorder.close()
    figures["end"] = _process_figures()
    with ExperienceBank.open(bank_url, seed=False, retry_s=120) as bank:
        rows = bank.count_trials(run_id)
        ids = [r.trial_id for r in bank.trials(run_id)]
    statuses: dict[str, int] = {}
    for r in engine.records:
        key = r.status.value + (f"/{r.error_kind.value}" if r.error_kind else "")
        statuses[key] = statuses.get(key, 0) + 1
    return SoakResult(len(engine.observations), len(grid), wall, rows, len(set(ids)),
                      engine.stop_reason, figures, recorder.outcomes, statuses)


def _quiet(fn):
    import logging

    loggers = [logging.getLogger(n) for n in ("ray.tune", "ray.train", "ray")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)  # injected crashes are expected, not news
    try:
        return fn()
    finally:
        for lg, lv in zip(loggers, levels, strict=True):
            lg.setLevel(lv)


def _report(res: SoakResult) -> str:
    f = res.figures
    mid = f.get("middle", f["start"])
    lines = [
        f"trials run          {res.trials_run} (Tune trials {res.tune_trials}) in {res.wall_s:.1f} s"
        f" = {res.trials_per_min:.1f} trials/min",
        f"outcomes            {json.dumps(res.statuses, sort_keys=True)}",
        f"stop reason         {res.stop_reason or '-'}",
        f"driver RSS (MiB)    start {f['start']['rss_mib']:.0f}  middle {mid['rss_mib']:.0f}"
        f"  end {f['end']['rss_mib']:.0f}",
        f"driver open fds     start {f['start']['open_fds']}  middle {mid['open_fds']}"
        f"  end {f['end']['open_fds']}",
        f"driver threads      start {f['start']['threads']}  middle {mid['threads']}"
        f"  end {f['end']['threads']}",
        f"bank rows           {res.rows['total']} (open {res.rows['open']}, distinct trial ids "
        f"{res.distinct_trial_ids}) for {res.trials_run} trials run; writes {res.bank_outcomes}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--fail-every", type=int, default=10,
                   help="inject a failure into every K-th trial (0: none)")
    p.add_argument("--workload", default="dense-single-node",
                   help="simulator built-in workload")
    p.add_argument("--full-space", action="store_true",
                   help="search the built-in workload's whole space (tens of thousands of configs; "
                   "the engine then needs seconds per suggestion) instead of a ~3,500-config slice")
    p.add_argument("--bank", help="bank URL (default: a fresh SQLite file in a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the figures as JSON here")
    args = p.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from dataclasses import replace

    import ray

    from infrarsi.backends.simulator import BUILTIN_WORKLOADS, SimulatorBackend

    ray.init(address=os.environ.get("RAY_ADDRESS") or None, num_cpus=None if os.environ.get(
        "RAY_ADDRESS") else 2, include_dashboard=False, log_to_driver=False,
        configure_logging=False)
    workload = BUILTIN_WORKLOADS[args.workload]
    if not args.full_space:
        workload = replace(workload, restrict={**workload.restrict, **SMALL_SLICE})
    backend = SimulatorBackend(workload, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="infrarsi-soak-bank-") as tmp:
        url = args.bank or f"sqlite:///{tmp}/bank.sqlite"
        res = run_soak(backend, trials=args.trials, bank_url=url, fail_every=args.fail_every,
                       seed=args.seed)
    print(_report(res))
    if args.out:
        Path(args.out).write_text(json.dumps(res.to_dict(), indent=2))
    ray.shutdown()
    ok = res.rows["total"] == res.trials_run == res.distinct_trial_ids and res.rows["open"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
