"""InfraRSISearcher inside your own ``tune.Tuner``: the searcher is a plain Tune search algorithm.

The trainable below is all a user writes: run one trial of the suggested config on a backend
and report the whole record (not only the metric), so an OOM teaches the memory model instead
of vanishing. With ``early_stop=True`` the searcher adds a hint to each config that lets a
clearly slow trial stop after a few measured steps; ``split_stop_hint`` takes it out.

    .venv/bin/python scripts/example_tuner.py                          # simulated 8-GPU cluster
    .venv/bin/python scripts/example_tuner.py --task configs/tasks/cpu_dense.yaml --budget 4

``--task`` runs real Ray Train trials of a task spec on this machine (no contract: the loss is
not checked here; ``infrarsi run`` is the full pipeline with contract, bank and verification).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def _backend(task: str | None, simulator: str):
    if task:
        from infrarsi.backends.ray_train import RayTrainBackend
        from infrarsi.contract import load_task

        return RayTrainBackend(load_task(task))
    from infrarsi.backends.simulator import SimulatorBackend

    return SimulatorBackend.builtin(simulator, seed=0)


def main(argv: list[str] | None = None) -> int:
    from infrarsi.backends.simulator import SimulatorBackend

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", help="a task spec: real Ray Train trials (default: the simulator)")
    ap.add_argument("--simulator", default=SimulatorBackend.builtin_names()[0],
                    choices=SimulatorBackend.builtin_names())
    ap.add_argument("--budget", type=int, default=12)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray
    from ray import tune

    from infrarsi.proposers import ExpertProposer
    from infrarsi.search import InfraRSISearcher, SearchEngine
    from infrarsi.search.searcher import split_stop_hint

    backend = _backend(args.task, args.simulator)
    # the offline expert's knob priors, as `infrarsi run` uses them (no LLM needed)
    priors = ExpertProposer().priors({"space": backend.space, "hardware": backend.hardware})
    engine = SearchEngine(backend.space, backend.workload, backend.hardware, budget=args.budget,
                          baseline=backend.baseline_config(), include_baseline=True,
                          objective=backend.objective, priors=priors)
    searcher = InfraRSISearcher(engine, early_stop=True)

    def trainable(config):
        config, stop_slower_than_s = split_stop_hint(config)
        record = backend.execute(config, trial_id=tune.get_context().get_trial_id(),
                                 stop_slower_than_s=stop_slower_than_s)
        tune.report({"objective": backend.objective(record) or 0.0, "record": record.to_dict()})

    # Trials at the driver's CPU priority (Ray's workers default to nice 15, so on a busy machine
    # a real trial would time the other load instead of the config).
    from infrarsi.backends.ray_train import with_trial_priority

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", runtime_env=with_trial_priority())
    try:
        with tempfile.TemporaryDirectory() as storage:
            tuner = tune.Tuner(
                trainable,
                tune_config=tune.TuneConfig(search_alg=searcher, num_samples=args.budget,
                                            metric="objective", mode="max",
                                            max_concurrent_trials=1),
                run_config=tune.RunConfig(storage_path=storage, verbose=0),
            )
            tuner.fit()
    finally:
        ray.shutdown()
    from infrarsi.trial import TrialRecord

    for obs in engine.observations:
        print(f"{obs['origin'][:24]:<24} {TrialRecord.from_dict(obs['record']).summary()[:110]}")
    best = engine.best()
    if best is None:
        print("no trial ran to the end")
        return 1
    record, value = best
    from infrarsi.space import config_key

    baseline = config_key(backend.space.normalize(backend.baseline_config()))
    base = next((backend.objective(r) for r in engine.records
                 if r.ok and config_key(r.config) == baseline), None)
    gain = f" ({value / base:.2f}x the baseline)" if base else ""
    print(f"best: {value:,.0f} tokens/s{gain} with {record.config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
