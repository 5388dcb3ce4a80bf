"""The init stage: run the baseline at the fixed seed and lock the contract.

It sits above :mod:`infrarsi.contract` and :mod:`infrarsi.backends` (it runs the baseline through
the Ray Train backend, which itself reads contracts), so it is a module of its own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.contract import Contract, TaskSpec, load_task, lock
from infrarsi.errors import ContractError, WorkloadError
from infrarsi.rundir import point_latest
from infrarsi.trial import TrialRecord

__all__ = ["InitResult", "init", "init_task"]


@dataclass(frozen=True)
class InitResult:
    """What ``infrarsi init`` ends with: the locked ``contract``, where it went
    (``contract_path``, inside ``run_dir``) and the ``baseline`` trial that measured its loss
    reference."""

    contract: Contract
    contract_path: Path
    baseline: TrialRecord

    @property
    def run_dir(self) -> Path:
        return self.contract_path.parent

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "contract_path": str(self.contract_path),
                "contract_sha256": self.contract.sha256, "work": self.contract.work.to_dict(),
                "loss_reference": dict(self.contract.loss_reference),
                "baseline": self.baseline.to_dict()}


def init(task: str | Path | TaskSpec, *, run_dir: str | Path | None = None,
         local_mode: bool = False) -> InitResult:
    """Lock the contract of ``task`` (a task spec YAML path or a :class:`TaskSpec`): run the
    baseline once at the fixed seed, hash the frozen files, write ``contract.json`` into
    ``run_dir`` (default: the spec's ``run_dir``) and make it the last run (``LATEST``).

    Raises :class:`~infrarsi.errors.ContractError` when the baseline does not run."""
    contract, path, record = init_task(task, run_dir=Path(run_dir) if run_dir else None,
                                       local_mode=local_mode)
    return InitResult(contract, path, record)


def baseline_failed(record: TrialRecord, baseline: dict[str, Any], spec: TaskSpec) -> str:
    """Why the baseline did not run, with the fix that fits how it ended: memory savers only
    for an out-of-memory baseline (for a crash they would be the wrong advice)."""
    where = f"search.baseline of {spec.name}'s task spec ({spec.base_dir or 'the YAML'})"
    if record.status.value == "oom":
        fix = (f"Change {where} to use less memory (a smaller micro_batch_size, "
               "activation_checkpointing: full) or raise hardware.memory_capacity_gib")
    else:
        fix = f"Fix what the error above names, or change {where}"
    kind = f", {record.error_kind.value}" if record.error_kind else ""
    return (f"the baseline config {baseline} did not run ({record.status.value}{kind}): "
            f"{record.error_message}. {fix}, then re-run `infrarsi init`.")


def init_task(task: str | Path | TaskSpec, *, run_dir: Path | None = None,
              local_mode: bool = False) -> tuple[Contract, Path, TrialRecord]:
    """Lock the contract of ``task``: returns (contract, path of contract.json, baseline record).

    The loss reference is measured through the same trial path as every later trial (a Ray
    Train job of the baseline config), so the reference and the trials share the harness.
    """
    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.workloads import build_torch_space
    from infrarsi.workloads.shape import shape_stats

    spec = task if isinstance(task, TaskSpec) else load_task(task)
    run_dir = Path(run_dir) if run_dir else spec.run_path()
    measured = None
    if spec.workload.adapter and not spec.workload.script:
        # The entry contract (functions, data, loss), checked before any trial.
        from infrarsi.harness.stats import adapter_stats

        baseline_mb = build_torch_space(spec).defaults()["micro_batch_size"]
        measured = adapter_stats(spec, micro_batch_size=baseline_mb)
    backend = RayTrainBackend(spec, local_mode=local_mode)
    baseline = backend.baseline_config()
    record = backend.execute(baseline, trial_id="init-baseline")
    if not record.ok and "WorkloadError" in record.error_message:
        raise WorkloadError(f"the baseline trial stopped on your workload code: "
                            f"{record.error_message}")
    if not record.ok:
        raise ContractError(baseline_failed(record, baseline, spec))
    # the shape: measured from the adapter's model, else from the YAML's; an own loop's
    # (workload.script) is measured by the baseline trial itself (record.extra)
    if measured is None and spec.workload.shape is not None:
        measured = shape_stats(spec)
    stats = {**(measured or {}), **record.extra}
    if spec.workload.adapter:
        stats["tokens_per_step"] = record.tokens_per_step
    contract = lock(spec, baseline_config=baseline, loss_trace=record.loss_trace,
                    model_stats=stats)
    path = contract.save(run_dir)
    point_latest(run_dir)
    # the saved contract carries its checksum (the in-memory one from lock() has none yet)
    return Contract.load(path.parent), path, record
