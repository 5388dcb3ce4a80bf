"""The init stage: run the baseline at the fixed seed and lock the contract."""

from __future__ import annotations

from pathlib import Path

from infrarsi import _home
from infrarsi.contract.contract import CONTRACT_FILE, Contract, lock
from infrarsi.contract.spec import TaskSpec, load_task
from infrarsi.errors import ContractError
from infrarsi.trial import TrialRecord

LATEST_POINTER = "LATEST"


def init_task(task: str | Path | TaskSpec, *, run_dir: Path | None = None,
              local_mode: bool = False) -> tuple[Contract, Path, TrialRecord]:
    """Lock the contract of ``task``: returns (contract, path of contract.json, baseline record).

    The loss reference is measured through the same trial path as every later trial (a Ray
    Train job of the baseline config), so the reference and the trials share the harness.
    """
    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.workloads.shape import shape_stats

    spec = task if isinstance(task, TaskSpec) else load_task(task)
    run_dir = Path(run_dir) if run_dir else spec.run_path()
    backend = RayTrainBackend(spec, local_mode=local_mode)
    baseline = backend.baseline_config()
    record = backend.execute(baseline, trial_id="init-baseline")
    if not record.ok:
        raise ContractError(
            f"the baseline config {baseline} did not run ({record.status.value}"
            f"{', ' + record.error_kind.value if record.error_kind else ''}): "
            f"{record.error_message}. Change search.baseline in {spec.base_dir or 'the task spec'} "
            "(e.g. a smaller micro_batch_size or activation_checkpointing) and re-run init."
        )
    contract = lock(spec, baseline_config=baseline, loss_trace=record.loss_trace,
                    model_stats={**shape_stats(spec), **record.extra})
    path = contract.save(run_dir)
    _point_latest(run_dir)
    return contract, path, record


def _point_latest(run_dir: Path, runs_root: Path | None = None) -> None:
    """Record ``run_dir`` as the last one initialized, in ``<home>/runs/LATEST`` (one pointer
    per home, whatever folder the run lives in or init was started from)."""
    pointer = (runs_root or _home.runs_root()) / LATEST_POINTER
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.write_text(str(run_dir.resolve()) + "\n")


def resolve_run_dir(run_dir: str | Path | None, runs_root: Path | None = None) -> Path:
    """The run directory a later stage works in: the one given, else the last one initialized
    (``<home>/runs/LATEST``, see infrarsi._home; ``runs_root`` replaces ``<home>/runs``)."""
    if run_dir:
        path = Path(run_dir)
    else:
        pointer = (runs_root or _home.runs_root()) / LATEST_POINTER
        if not pointer.is_file():
            raise ContractError(
                f"no run directory given and no run initialized under {pointer.parent} "
                f"(${_home.ENV_HOME}); run `infrarsi init TASK` or pass --run-dir"
            )
        path = Path(pointer.read_text().strip())
    if not (path / CONTRACT_FILE).is_file():
        raise ContractError(f"{path} holds no {CONTRACT_FILE}; run `infrarsi init TASK.yaml` first")
    return path
