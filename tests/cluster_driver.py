"""A search driver for the multi-node and fault tests, run as its own process on the cluster.

    RAY_ADDRESS=127.0.0.1:PORT python tests/cluster_driver.py --task T.yaml --budget 3 \
        --bank sqlite:///b.sqlite --events ev.jsonl --out out.json

It is the run stage's search loop without contract, doctor and verification (each of those
costs real trials that these tests cannot afford on a 2-core box): Ray Tune drives
InfraRSISearcher; every trial is one Ray Train job through RayTrainBackend in a Tune trial
process that holds no CPU; every finished trial is one bank row. It joins the cluster from
``RAY_ADDRESS`` as ``ray job submit`` would run it on the head.

Events (one JSON object per line) let the test time faults from outside: ``start`` when a trial
body begins, ``done`` when the searcher has the record and the bank row is written.
``--out`` gets the summary: trials, bank counts, stop reason, seconds until every CPU was free
again after the search.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

TRIAL_DRIVER_RESOURCE = "infrarsi_trial_driver"


def emit(path: str, **event) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"t": time.time(), "pid": os.getpid(), **event}) + "\n")


def trainable(config, *, spec_dict, events, startup_allowance, pool_name=None):
    from ray import tune

    import infrarsi.backends.ray_train.backend as rt
    from infrarsi.contract import TaskSpec

    if startup_allowance is not None:  # the tests' budget for Train startup, not a user knob
        rt.STARTUP_ALLOWANCE_S = float(startup_allowance)
    backend = rt.RayTrainBackend(TaskSpec.from_dict(spec_dict), pool_name=pool_name)
    trial_id = tune.get_context().get_trial_id()
    emit(events, event="start", trial_id=trial_id, config=config)
    record = backend.execute(config, trial_id=trial_id)
    # As JSON: Tune flattens nested dicts in results ("record/config/...") before the searcher
    # sees them, and record_from_result reads a dict or its JSON under "record".
    tune.report({"objective": backend.objective(record) or 0.0,
                 "record": json.dumps(record.to_dict())})


class Recorder:
    """The searcher's ``on_record``: one bank row and one ``done`` event per finished trial.

    Tune pickles the search algorithm when the Tuner is built; a live bank (SQLAlchemy engine)
    does not pickle, so this holds the URL and opens the bank on first use.
    """

    def __init__(self, url: str, run_id: str, events: str) -> None:
        self.url, self.run_id, self.events = url, run_id, events
        self._bank = None

    def __getstate__(self):
        return {**self.__dict__, "_bank": None}

    def __call__(self, trial_id, record, origin, live) -> None:
        from infrarsi.bank import ExperienceBank

        if self._bank is None:
            self._bank = ExperienceBank.open(self.url, seed=False)
        outcome = self._bank.record_trial(self.run_id, record, origin)
        emit(self.events, event="done", trial_id=trial_id, status=record.status.value,
             error_kind=record.error_kind.value if record.error_kind else None,
             message=record.error_message[:500], device_seconds=record.device_seconds,
             wall_seconds=record.wall_seconds, bank=outcome)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", required=True)
    p.add_argument("--budget", type=int, required=True)
    p.add_argument("--bank", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--startup-allowance", type=float)
    p.add_argument("--inline", action="store_true",
                   help="run each trial from this process, without Tune (the backend alone)")
    args = p.parse_args(argv)

    import ray

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.bank import ExperienceBank
    from infrarsi.contract import load_task
    from infrarsi.search import SearchEngine
    from infrarsi.trial import SoftwareVersions

    spec = load_task(args.task)
    backend = RayTrainBackend(spec)
    bank = ExperienceBank.open(args.bank, seed=False)
    run_id = bank.start_run(spec.name, "fault-test", backend.workload, backend.hardware,
                            SoftwareVersions.current())
    engine = SearchEngine(backend.space, backend.workload, backend.hardware, budget=args.budget,
                          n_init=args.budget, baseline=backend.baseline_config(),
                          include_baseline=True, objective=backend.objective)

    on_record = Recorder(args.bank, run_id, args.events)

    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, configure_logging=False)
    total_cpu = ray.cluster_resources().get("CPU", 0)
    if args.inline:
        tune_errors = _run_inline(engine, spec, args, on_record)
    else:
        tune_errors = _run_tune(engine, spec, args, on_record)
    from infrarsi.backends.ray_train._pool import shutdown_process_pool

    shutdown_process_pool()  # as the run stage does at its end: the warm groups' CPUs are free
    summary = _summary(ray, engine, bank, run_id, total_cpu, tune_errors)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    bank.close()
    return 0


def _run_inline(engine, spec, args, on_record) -> list[str]:
    import infrarsi.backends.ray_train.backend as rt

    if args.startup_allowance is not None:
        rt.STARTUP_ALLOWANCE_S = float(args.startup_allowance)
    backend = rt.RayTrainBackend(spec)
    for i in range(args.budget):
        trial_id = f"inline{i:03d}"
        sug = engine.suggest(trial_id)
        if sug is None:
            break
        emit(args.events, event="start", trial_id=trial_id, config=sug.config)
        record = backend.execute(sug.config, trial_id=trial_id)
        engine.observe(record, sug.origin, trial_id=trial_id)
        on_record(trial_id, record, sug.origin, None)
    return []


def _run_tune(engine, spec, args, on_record) -> list[str]:
    from ray import tune

    from infrarsi.backends.ray_train._pool import process_pool
    from infrarsi.search import InfraRSISearcher

    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    fn = tune.with_parameters(trainable, spec_dict=spec.to_dict(), events=args.events,
                              startup_allowance=args.startup_allowance,
                              pool_name=process_pool()[0])  # the driver's warm worker pool
    tuner = tune.Tuner(
        tune.with_resources(fn, {"cpu": 0, "custom_resources": {TRIAL_DRIVER_RESOURCE: 1}}),
        tune_config=tune.TuneConfig(search_alg=InfraRSISearcher(engine, on_record=on_record),
                                    num_samples=args.budget, max_concurrent_trials=1),
        run_config=tune.RunConfig(
            name="faults", storage_path=str(Path(args.out).parent / "tune"), verbose=0,
            log_to_file=False, failure_config=tune.FailureConfig(max_failures=0),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grid = tuner.fit()
    return [f"{type(e).__name__}: {e}"[:3000] for e in grid.errors]


def _summary(ray, engine, bank, run_id, total_cpu, tune_errors) -> dict:
    t0, freed_s = time.time(), None
    while time.time() - t0 < 60:  # every CPU back: the trials' workers are gone
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0) > 0:
            freed_s = time.time() - t0
            break
        time.sleep(0.25)
    return {
        "run_id": run_id, "trials": len(engine.observations), "stop_reason": engine.stop_reason,
        "counts": bank.count_trials(run_id), "freed_s": freed_s,
        "cpu_total_start": total_cpu, "cpu_total_end": ray.cluster_resources().get("CPU", 0),
        "trial_ids": [o["record"]["trial_id"] for o in engine.observations],
        "tune_errors": tune_errors,
    }


if __name__ == "__main__":
    sys.exit(main())
