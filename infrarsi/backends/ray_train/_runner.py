"""One trial as a Ray Train V2 ``TorchTrainer`` job, launched from a killable runner actor.

Why an actor: ``trainer.fit()`` blocks and has no deadline. Running it inside a zero-CPU actor
lets the driver wait with a timeout and, on a hang, kill the actor; the Train controller and its
workers are owned by that actor, so Ray tears them down with it and frees their resources.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from infrarsi.backends.ray_train._classify import classify
from infrarsi.trial import ErrorKind, TrialStatus

# Ray Train's worker poll keeps its default interval (2 s): a poll runs Python in every rank's
# process while it trains (the train function is a thread there), and at 0.25 s a fresh trial's
# steps read ~5% slower than the same steps in a warm pool worker (warm/fresh 0.947, 95% CI
# 0.918-0.976, 8 pairs; at 2 s 1.006, 0.951-1.065: scripts/bench_trial.py --pool). The price is
# up to one interval of latency after the last step; fresh trials are opt-in (the pool is not).

# Ray Train's preemption watcher is one more actor per job (a Python process started while the
# ranks run, polling the GCS): a trial has no failure budget to spend on a preemption notice
# (max_failures=0; a lost node is recorded as WORKER_LOST either way). Read by the controller.
_PREEMPTION_WATCHER = "0"


@dataclass(frozen=True)
class TrainerOutcome:
    """What one TorchTrainer job came back with (it crosses the runner actor's boundary, so it
    is a plain picklable record). ``ok``: ``value`` is rank 0's result dict from the harness
    (step times, loss trace, peak memory per rank, ...). Not ok: the classified ``status``,
    ``error_kind`` and ``message``. ``t_submit``/``t_end``: wall clock around the job.
    ``pool``: ``{"group", "warm"}`` when the trial ran on a warm worker group (None: fresh)."""

    ok: bool
    t_submit: float
    t_end: float
    value: dict[str, Any] | None = None
    status: TrialStatus | None = None
    error_kind: ErrorKind | None = None
    message: str = ""
    pool: dict[str, Any] | None = None

    @property
    def wall_seconds(self) -> float:
        return self.t_end - self.t_submit

    @classmethod
    def failed(cls, t_submit: float, status: TrialStatus, kind: ErrorKind | None,
               message: str) -> TrainerOutcome:
        return cls(False, t_submit, time.time(), status=status, error_kind=kind, message=message)

    @classmethod
    def from_pool(cls, reply: dict[str, Any], *, t_submit: float) -> TrainerOutcome:
        """The warm pool's plain reply (``ok``/``value`` or ``status``/``error_kind``/``message``,
        with ``group``, ``warm``, ``t_end``) as an outcome."""
        pool = {"group": reply["group"], "warm": reply["warm"]} if "group" in reply else None
        if reply.get("ok"):
            return cls(True, t_submit, reply["t_end"], value=reply.get("value"), pool=pool)
        kind = reply.get("error_kind")
        return cls(False, t_submit, reply["t_end"], status=TrialStatus(reply["status"]),
                   error_kind=ErrorKind(kind) if kind else None,
                   message=reply.get("message", ""), pool=pool)


# Folders of a workspace that are never code or data of the job.
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "runs", ".pytest_cache", ".mypy_cache"}
# A workspace is shipped in the trial's payload; a file past this is the job's bulk data, which
# workers must read from shared storage instead.
MAX_SHIPPED_FILE_BYTES = 32 * 2**20


def read_workspace(root: Path) -> dict[str, bytes]:
    """The workspace's files (any type: code, data, configs) by relative path, to ship to
    workers on any node."""
    from infrarsi.errors import WorkloadError

    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not p.is_file() or _SKIP_DIRS.intersection(rel.parts[:-1]) or p.suffix == ".pyc":
            continue
        if p.stat().st_size > MAX_SHIPPED_FILE_BYTES:
            raise WorkloadError(
                f"{p} is {p.stat().st_size / 2**20:.0f} MiB; a workspace ships every file to the "
                f"workers (at most {MAX_SHIPPED_FILE_BYTES // 2**20} MiB each): keep large data "
                "outside the workspace and read it by absolute path from storage every worker "
                "sees")
        files[str(rel)] = p.read_bytes()
    return files


def _materialize(files: dict[str, bytes | str]) -> str:
    root = Path(tempfile.mkdtemp(prefix="infrarsi-ws-"))
    for rel, content in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            dest.write_text(content)
        else:
            dest.write_bytes(content)
    return str(root)


def run_rank(payload: dict[str, Any], on_workspace=None) -> dict[str, Any] | None:
    """One rank's trial (a Train worker's or a warm pool worker's): the workspace materialized
    in a folder of its own (``on_workspace(path)`` is told where), the harness run, every rank's
    peak memory gathered. Rank 0 returns the trial's result for all ranks."""
    import torch.distributed as dist

    from infrarsi.harness import train_worker

    payload = dict(payload)
    workspace = _materialize(payload.pop("workspace_files"))
    if on_workspace is not None:
        on_workspace(workspace)
    try:
        out = train_worker({**payload, "workspace": workspace})
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    peaks = [out["peak_memory_bytes"]]
    if dist.is_available() and dist.is_initialized():
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, out["peak_memory_bytes"])
    out["peak_memory_bytes_per_rank"] = peaks
    return out if out.get("rank", 0) == 0 else None


def train_fn(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Runs in every Ray Train worker (a fresh trial)."""
    return run_rank(payload)


def scaling_kwargs(config: dict[str, Any], *, device: str, placement_strategy: str) -> dict[str, Any]:
    resources = {"CPU": config["num_threads"]}
    return {
        "num_workers": config["num_workers"],
        "use_gpu": device == "cuda",
        "resources_per_worker": resources,
        "placement_strategy": placement_strategy,
    }


def run_trainer(payload: dict[str, Any], scaling: dict[str, Any], *, backend: str,
                collective_timeout_s: int, storage_path: str, local_mode: bool = False) -> TrainerOutcome:
    """Build and fit the TorchTrainer; never raises: failures come back classified."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", _PREEMPTION_WATCHER)
    t0 = time.time()
    try:
        trainer = _trainer_without_per_job_actors(TorchTrainer)(
            train_fn,
            train_loop_config=payload,
            scaling_config=ScalingConfig(**({"num_workers": 0} if local_mode else scaling)),
            torch_config=TorchConfig(backend=backend, timeout_s=collective_timeout_s),
            run_config=RunConfig(
                name=f"infrarsi-{uuid.uuid4().hex[:8]}",
                storage_path=storage_path,
                failure_config=FailureConfig(max_failures=0),
            ),
        )
        result = trainer.fit()
        return TrainerOutcome(True, t0, time.time(), value=result.return_value)
    except Exception as e:  # noqa: BLE001 - every failure becomes a record
        status, kind, message = classify(e)
        return TrainerOutcome.failed(t0, status, kind, message)


# Ray Train V2's per-job actors a trial does without (class names of the callbacks that start them).
_UNUSED_PER_JOB_CALLBACKS = ("DatasetsCallback", "PlacementGroupCleanerCallback")


@functools.cache  # one subclass per trainer class, not one per trial
def _trainer_without_per_job_actors(trainer_cls):
    """``trainer_cls`` without two per-job actors of Ray Train V2 that a trial does not need:

    - Ray Data's ``DatasetManager`` when the job is given no Ray Dataset (trials read their data
      in the harness, never through Ray Data). Workers accept a train context without a shard
      provider (``Worker.init_train_context``'s default None).
    - the detached ``PlacementGroupCleaner``, which removes the job's placement group if its
      controller dies: a trial's killed controller leaves an orphan that
      ``_reaper.reap_orphaned_placement_groups`` removes (Ray's cleaner looks its controller up
      through the state API, which cannot find its cluster where several Ray instances run).

    Why: both start while the ranks already run, and keep working during the measured steps. On
    a machine the ranks fill, that CPU comes out of their steps: the Ray Data actor's start-up
    (a Python process importing ray.data, ~1 CPU-s) made a fresh trial's step read ~1.9x a warm
    pool trial's on 2 cores; the cleaner's once-a-second state-API poll took ~2 ms of CPU per
    ~0.16 s step (``scripts/bench_trial.py --pool --cpu-times``). ``_create_default_callbacks``
    is Ray's private seam; on a Ray without it nothing changes."""

    class Trainer(trainer_cls):
        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            unused = set(_UNUSED_PER_JOB_CALLBACKS)
            if getattr(self, "datasets", None):
                unused.discard("DatasetsCallback")
            return [c for c in callbacks if type(c).__name__ not in unused]

    Trainer.__name__ = Trainer.__qualname__ = trainer_cls.__name__
    return Trainer


@ray.remote(num_cpus=0, max_restarts=0)
class TrialRunner:
    """Holds one trial's TorchTrainer; killing this actor ends the trial and frees its workers."""

    def run(self, payload: dict[str, Any], scaling: dict[str, Any], backend: str,
            collective_timeout_s: int, storage_path: str) -> TrainerOutcome:
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
        return run_trainer(payload, scaling, backend=backend,
                           collective_timeout_s=collective_timeout_s, storage_path=storage_path)
