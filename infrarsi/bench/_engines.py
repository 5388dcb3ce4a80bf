"""Two ways to drive one search: through Ray Tune as a user would, or inline in this process.

Both run the very same search-algorithm objects through the same protocol (Tune's
``set_search_properties``, ``suggest``, ``on_trial_result``, ``on_trial_complete``), one trial at
a time, with the same trial body (:func:`execute_trial`). A trial's draw among duplicate table
rows is seeded by (run seed, trial ordinal), so for a fixed seed both engines give the same
trajectory (tested); the inline engine only skips Tune's own per-trial and per-Tuner overhead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune.search import SearchAlgorithm, Searcher
from ray.tune.search.basic_variant import BasicVariantGenerator

from infrarsi.backends.base import Backend
from infrarsi.bench._peers import METRIC
from infrarsi.trial import TrialRecord

__all__ = ["CONFIG_KEY", "TrialFailed", "Trajectory", "execute_trial", "run_inline", "run_tune"]

CONFIG_KEY = "__config_key"  # random search's categorical over legal configs (JSON config keys)


class TrialFailed(Exception):
    """Raised by the trainable for a failed trial when the peer sees OOM as an errored trial."""


@dataclass
class Trajectory:
    """What one search did: its records in trial order and its wall time."""

    records: list[TrialRecord] = field(default_factory=list)
    wall_s: float = 0.0
    not_run: int = 0
    fallbacks: int = 0
    guard_log: list[tuple[int, int]] = field(default_factory=list)

    def prefix(self, n: int) -> Trajectory:
        """The first ``n`` trials: what the same search with budget ``n`` does, for a searcher
        that ignores its budget (wall time pro rata)."""
        if n >= len(self.records):
            return self
        nr, fb = self.guard_log[n - 1] if len(self.guard_log) >= n else (self.not_run, self.fallbacks)
        return Trajectory(self.records[:n], self.wall_s * n / max(len(self.records), 1), nr, fb,
                          self.guard_log[:n])


def _trial_seed(run_seed: int, ordinal: int) -> int:
    return (run_seed * 1_000_003 + ordinal * 7919) % (2**31)


def execute_trial(backend: Backend, config: dict[str, Any], run_seed: int,
                  ordinal: int) -> tuple[TrialRecord, dict[str, Any]]:
    """The trial body shared by both engines: run ``config``, return the record and the result
    a trainable reports (``objective`` is None for a failed trial)."""
    config = dict(config)
    if CONFIG_KEY in config:
        config = json.loads(config.pop(CONFIG_KEY))
    if hasattr(backend, "reseed"):
        backend.reseed(_trial_seed(run_seed, ordinal))
    record = backend.execute(config, trial_id=f"t{ordinal:05d}")
    result = {METRIC: backend.objective(record), "status": record.status.value,
              "device_seconds": record.device_seconds, "record": record.to_dict()}
    return record, result


def _trainable(config, *, backend, run_seed, ledger, oom_as_error):
    """The Tune function trainable: one short trial, one report (or an error)."""
    from ray import tune

    ordinal = len(os.listdir(ledger))  # trials run one at a time: files so far = ordinal
    record, result = execute_trial(backend, config, run_seed, ordinal)
    tmp = Path(ledger) / f".{ordinal:05d}.tmp"
    tmp.write_text(json.dumps(record.to_dict()))
    os.replace(tmp, Path(ledger) / f"{ordinal:05d}.json")
    if oom_as_error and not record.ok:
        raise TrialFailed(record.summary())
    tune.report(result)


def run_tune(alg: SearchAlgorithm, backend: Backend, *, budget: int, seed: int, mode: str,
             oom_as_error: bool, param_space: dict | None = None) -> Trajectory:
    """One search through ``tune.Tuner`` with a light run config (no checkpoints, no loggers)."""
    from ray import tune

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    with tempfile.TemporaryDirectory(prefix="infrarsi-bench-") as tmp:
        ledger = Path(tmp) / "ledger"
        ledger.mkdir()
        trainable = tune.with_parameters(_trainable, backend=backend, run_seed=seed,
                                         ledger=str(ledger), oom_as_error=oom_as_error)
        tuner = tune.Tuner(
            tune.with_resources(trainable, {"cpu": 1}),
            param_space=param_space or {},
            tune_config=tune.TuneConfig(search_alg=alg, num_samples=budget, metric=METRIC,
                                        mode=mode, max_concurrent_trials=1, reuse_actors=True),
            run_config=tune.RunConfig(
                storage_path=str(Path(tmp) / "storage"), name="bench", verbose=0, callbacks=[],
                log_to_file=False,
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
                failure_config=tune.FailureConfig(max_failures=0)),
        )
        t0 = time.perf_counter()
        with _quiet_tune():  # an OOM raised by an as-is peer's trial is expected, not news
            tuner.fit()
        wall = time.perf_counter() - t0
        records = [TrialRecord.from_dict(json.loads(p.read_text()))
                   for p in sorted(ledger.glob("*.json"))]
    return _with_guard_stats(Trajectory(records, wall), alg)


@contextlib.contextmanager
def _quiet_tune():
    log = logging.getLogger("ray.tune")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def run_inline(alg: SearchAlgorithm, backend: Backend, *, budget: int, seed: int, mode: str,
               oom_as_error: bool, param_space: dict | None = None) -> Trajectory:
    """The same search driven in-process through the Searcher protocol Tune uses."""
    t0 = time.perf_counter()
    traj = Trajectory()
    if isinstance(alg, BasicVariantGenerator):
        configs = _variants(param_space or {}, budget, seed)
        for i, config in enumerate(configs):
            traj.records.append(execute_trial(backend, config, seed, i)[0])
    else:
        alg.set_search_properties(METRIC, mode, param_space or {})
        for i in range(budget):
            tid = f"inline_{i:05d}"
            config = alg.suggest(tid)
            if config is None or config == Searcher.FINISHED:
                break  # a sequential searcher with nothing to suggest has finished
            record, result = execute_trial(backend, config, seed, i)
            result = {**result, "training_iteration": 1, "done": True}  # as Tune adds them
            traj.records.append(record)
            if oom_as_error and not record.ok:
                alg.on_trial_complete(tid, None, error=True)
            else:
                alg.on_trial_result(tid, result)
                alg.on_trial_complete(tid, result)
    traj.wall_s = time.perf_counter() - t0
    return _with_guard_stats(traj, alg)


def _variants(param_space: dict, n: int, seed: int) -> list[dict]:
    """What BasicVariantGenerator(random_state=seed) draws for ``n`` samples."""
    from ray.tune.search.sample import _BackwardsCompatibleNumpyRng
    from ray.tune.search.variant_generator import generate_variants

    rng = _BackwardsCompatibleNumpyRng(seed)
    out = []
    for _ in range(n):
        _, spec = next(iter(generate_variants({"config": param_space}, random_state=rng)))
        out.append(spec["config"])
    return out


def _with_guard_stats(traj: Trajectory, alg: Any) -> Trajectory:
    if isinstance(getattr(alg, "not_run", None), int):
        traj.not_run, traj.fallbacks, traj.guard_log = alg.not_run, alg.fallbacks, list(alg.log)
    return traj
