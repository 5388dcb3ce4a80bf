"""The ray_train backend: each trial is a real Ray Train torch job (gloo on CPU, nccl on GPU).

By default trials run in a warm pool of worker groups that stay alive across trials with the same
process-level settings (``_pool``); ``fresh_processes=True`` runs every trial as its own
``TorchTrainer`` job in new processes.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
import time
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray

from infrarsi.backends.base import Backend
from infrarsi.backends.ray_train import _pool
from infrarsi.backends.ray_train._reaper import reap_orphaned_placement_groups
from infrarsi.backends.ray_train._runner import (
    TrainerOutcome,
    TrialRunner,
    read_workspace,
    run_trainer,
    scaling_kwargs,
)
from infrarsi.contract import Contract, TaskSpec
from infrarsi.errors import ConfigError
from infrarsi.harness.clock import true_step_times
from infrarsi.live import PROGRESS_ENV
from infrarsi.space import Rule, SearchSpace
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)
from infrarsi.workloads import build_torch_space
from infrarsi.workloads.shape import shape_stats

GIB = 2**30
# Time to start a Train worker group on a busy 2-core box is ~30 s; the trial timeout in the
# task spec covers the training itself, so the driver allows this much on top of it.
STARTUP_ALLOWANCE_S = 120.0


def workload_signature(spec: TaskSpec, measured: Mapping[str, Any] | None = None
                       ) -> WorkloadSignature:
    """The bank's key of this workload. An adapter workload's comes from its ``measured``
    shape (the contract's ``work.shape``, else read from the model now); a reference
    workload's from the YAML shape."""
    wl, shape = spec.workload, spec.workload.shape
    if wl.adapter:
        # An own-loop script's shape is known only once it ran: the baseline measures it and
        # the contract keeps it; before that (init's baseline) the signature has zeros.
        m = measured or (dict.fromkeys(("num_params", "num_layers", "hidden_size", "num_heads",
                                        "seq_len", "vocab_size"), 0)
                         if wl.script else _adapter_shape(spec))
        return WorkloadSignature(
            model_family=wl.family, num_params=int(m["num_params"]),
            num_layers=int(m["num_layers"]), hidden_size=int(m["hidden_size"]),
            num_heads=int(m["num_heads"]), seq_len=int(m["seq_len"]),
            global_batch_size=wl.global_batch_size, num_experts=0, top_k=0,
            vocab_size=int(m["vocab_size"]), name=spec.name)
    stats = shape_stats(spec)
    return WorkloadSignature(
        model_family=wl.family,
        num_params=int(stats["num_params"]),
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_heads=shape.num_heads,
        seq_len=wl.seq_len,
        global_batch_size=wl.global_batch_size,
        num_experts=shape.num_experts,
        top_k=shape.top_k,
        vocab_size=shape.vocab_size,
        name=spec.name,
    )


def _adapter_shape(spec: TaskSpec) -> dict[str, Any]:
    from infrarsi.harness.stats import adapter_stats

    return adapter_stats(spec)


def hardware_fingerprint(spec: TaskSpec) -> HardwareFingerprint:
    """The hardware trials run on. On CUDA the GPU's own name ("NVIDIA H200": the bank's
    transfer across GPU types reads it) and total memory (what an OOM is censored at), unless
    the spec states them."""
    hw = spec.hardware
    capacity = int((hw.memory_capacity_gib or 0) * GIB)
    name = hw.device_name or hw.device
    if hw.device == "cuda" and not (hw.device_name and capacity):
        gpu_name, gpu_memory = _gpu_facts()
        name, capacity = hw.device_name or gpu_name, capacity or gpu_memory
    return HardwareFingerprint(
        device_name=name,
        memory_bytes=capacity,
        devices_per_node=hw.max_workers,
        num_nodes=1,
        interconnect=hw.interconnect,
        peak_flops=hw.peak_flops or 0.0,
    )


def _gpu_properties() -> tuple[str, int]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return props.name, int(props.total_memory)


def _gpu_facts() -> tuple[str, int]:
    """(name, total memory) of this process's GPU; without one (a CPU-only head node driving
    GPU workers), of a GPU the cluster lends a one-GPU Ray task."""
    import torch

    if torch.cuda.is_available():
        return _gpu_properties()
    _ensure_ray()
    if not ray.cluster_resources().get("GPU"):
        raise ConfigError(
            "hardware.device is 'cuda' but neither this process nor the Ray cluster has a GPU "
            f"(cluster resources: {sorted(ray.cluster_resources())}): connect to a GPU cluster "
            "(RAY_ADDRESS=...) or set hardware.device: cpu in the task spec")
    probe = ray.remote(num_gpus=1, num_cpus=0)(_gpu_properties)
    return tuple(ray.get(probe.remote(), timeout=STARTUP_ALLOWANCE_S))


def _one_rank(config: Mapping[str, Any]) -> str | None:
    if config.get("num_workers", 1) == 1:
        return None
    return (f"--local-mode runs one rank in this process, but this config asks for "
            f"num_workers={config['num_workers']}; run without --local-mode (trials then run as "
            "Ray Train jobs, on a local Ray when no cluster is set), or give the task a 1-worker "
            "baseline (search.baseline.num_workers: 1)")


# Local mode (ScalingConfig(num_workers=0)) has exactly one rank: configs that need more are
# illegal there, so the search never proposes them and a multi-worker baseline fails up front.
_ONE_RANK_IN_THIS_PROCESS = Rule("local_mode", _one_rank)


class RayTrainBackend(Backend):
    """Runs trials of a task spec as Ray Train ``TorchTrainer`` jobs.

    ``contract`` (from ``infrarsi init``) turns on the invariant checks: frozen files are
    re-hashed before any trial, and a trial whose first K losses drift from the reference or
    whose work per step differs comes back ``REJECTED``. ``workspace`` overrides the spec's
    workspace (an isolated, patched copy). ``local_mode`` runs the train function in this
    process with ``ScalingConfig(num_workers=0)`` (fast unit tests; no real workers).
    ``profile`` adds one profiled, unmeasured step after the measured ones (doctor's phase
    profile): the record's ``phase_times_s`` and ``extra["profile"]``.

    ``fresh_processes=False`` (the default) runs trials in this driver's warm pool of worker
    groups (``_pool``); ``pool_name`` names the pool a run's driver started (Tune's trial
    processes pass it; without it this process starts its own). ``fresh_processes=True``: every
    trial is a new ``TorchTrainer`` job (new worker processes and process group).
    The record's ``extra["pool"]`` says which group ran a pooled trial and whether it was warm.
    ``untrusted_code=True`` (a workspace with proposed patches): a pooled trial runs in a
    group of its own, retired after it (``_pool`` says why).
    """

    name = "ray_train"

    def __init__(self, spec: TaskSpec, *, contract: Contract | None = None,
                 workspace: Path | None = None, local_mode: bool = False,
                 storage_path: str | None = None, profile: bool = False,
                 fresh_processes: bool = False, pool_name: str | None = None,
                 untrusted_code: bool = False) -> None:
        self.spec = spec
        self.untrusted_code = untrusted_code
        self.fresh_processes = fresh_processes
        self.pool_name = pool_name
        self.profile = profile
        self.contract = contract
        if contract is not None:
            contract.verify_frozen()
        self.workspace = Path(workspace) if workspace else spec.workspace_path()
        self.local_mode = local_mode
        self.storage_path = storage_path or os.path.join(tempfile.gettempdir(), "infrarsi-ray-results")
        self._space = build_torch_space(spec)
        if local_mode:
            self._space = self._space.with_knobs((), [_ONE_RANK_IN_THIS_PROCESS])
        measured = contract.work.shape if contract is not None and spec.workload.adapter else None
        self._workload = workload_signature(spec, measured)
        self._tokens_per_step = (contract.work.tokens_per_step if contract is not None
                                 else spec.workload.tokens_per_step)
        self._hardware = hardware_fingerprint(spec)

    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def workload(self) -> WorkloadSignature:
        return self._workload

    @property
    def hardware(self) -> HardwareFingerprint:
        return self._hardware

    def baseline_config(self) -> dict[str, Any]:
        if self.contract is not None:
            return self._space.normalize(self.contract.baseline_config)
        return self._space.defaults()

    def with_measured_steps(self, steps: int) -> RayTrainBackend:
        """Trials whose harness times ``steps`` steps: the task's ``timing.measured_steps`` in
        the payload (the harness owns the clock; each step is timed as before)."""
        other = copy.copy(self)
        other.spec = dataclasses.replace(
            self.spec, timing=dataclasses.replace(self.spec.timing, measured_steps=int(steps)))
        return other

    # ---- one trial --------------------------------------------------------------------
    def payload(self, config: Mapping[str, Any]) -> dict[str, Any]:
        capacity = self._hardware.memory_bytes if self.spec.hardware.device == "cpu" else None
        return {
            "task": self.spec.to_dict(),
            "config": dict(config),
            "workspace_files": read_workspace(self.workspace),
            "capacity_bytes": capacity,
            **({"profile": True} if self.profile else {}),
            # where rank 0 writes its live state for the run's view (infrarsi.live)
            **({"progress_path": p} if (p := os.environ.get(PROGRESS_ENV)) else {}),
        }

    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                stop_slower_than_s: float | None = None) -> TrialRecord:
        config = self._space.normalize(config)  # raises IllegalConfigError: never reaches Ray
        trial_id = trial_id or uuid.uuid4().hex[:8]
        devices = 1 if self.local_mode else config["num_workers"]
        outcome = self._launch(config, stop_slower_than_s)
        wall = outcome.wall_seconds
        common = {
            "trial_id": trial_id,
            "config": config,
            "backend": self.name,
            "workload": self._workload,
            "hardware": self._hardware,
            "memory_capacity_bytes": self._hardware.memory_bytes or None,
            "tokens_per_step": self._tokens_per_step,
            "device_seconds": wall * devices,
            "wall_seconds": wall,
        }
        if not outcome.ok:
            status = outcome.status
            return TrialRecord(
                status=status,
                error_kind=outcome.error_kind,
                error_message=outcome.message,
                memory_censor_bytes=self._hardware.memory_bytes if status is TrialStatus.OOM else None,
                # a tampered clock: the outside timer's true step times (never the fake ones)
                step_times_s=true_step_times(outcome.message) if status is TrialStatus.REJECTED else (),
                **common,
            )
        return self._ok_record(outcome, config, common)

    def _ok_record(self, outcome: TrainerOutcome, config: dict[str, Any],
                   common: dict[str, Any]) -> TrialRecord:
        value = outcome.value or {}
        extra = {k: value[k] for k in ("num_params", "flops_per_token", "profile", "stopped_early",
                                       "shape")
                 if k in value}
        if outcome.pool is not None:
            extra["pool"] = outcome.pool
        status, kind, message = TrialStatus.OK, None, ""
        if self.contract is not None:
            problem = self.contract.check_work(value.get("tokens_per_step"))
            problem = problem or self.contract.check_loss(value.get("loss_trace", ()), config["precision"])
            if problem:
                status, message = TrialStatus.REJECTED, problem
        first = value.get("t_first_measured_step")
        return TrialRecord(
            status=status,
            error_kind=kind,
            error_message=message,
            step_times_s=value.get("step_times_s", ()),
            peak_memory_bytes=value.get("peak_memory_bytes_per_rank"),
            loss_trace=value.get("loss_trace", ()),
            phase_times_s=value.get("phase_times_s") or {},
            startup_seconds=(first - outcome.t_submit) if first else None,
            extra=extra,
            **{**common, "tokens_per_step": value.get("tokens_per_step", common["tokens_per_step"])},
        )

    def _launch(self, config: dict[str, Any], stop_slower_than_s: float | None) -> TrainerOutcome:
        payload = self.payload(config)
        if stop_slower_than_s:
            payload["stop_slower_than_s"] = float(stop_slower_than_s)
        cuda = self.spec.hardware.device == "cuda"
        backend = "nccl" if cuda else "gloo"
        timeout = float(self.spec.trial.timeout_s)
        # The collective timeout sits past the trial timeout so that a deadlocked collective
        # is ended by the trial timeout (and classified as a hang), not by gloo.
        collective_timeout = int(timeout + STARTUP_ALLOWANCE_S + 60)
        scaling = scaling_kwargs(config, device=self.spec.hardware.device,
                                 placement_strategy=self.spec.trial.placement_strategy)
        if self.local_mode:
            return run_trainer(payload, scaling, backend=backend, collective_timeout_s=collective_timeout,
                               storage_path=self.storage_path, local_mode=True)
        _ensure_ray()
        message = (f"trial exceeded its time limit of {timeout:g} s (+{STARTUP_ALLOWANCE_S:g} s "
                   "startup allowance); a hang or deadlocked collective. Raise trial.timeout_s "
                   "in the task spec if the workload is just slow.")
        pool = None if self.fresh_processes else self._pool()
        if pool is not None:
            key = _pool.group_key(config, device=self.spec.hardware.device, backend=backend,
                                  collective_timeout_s=collective_timeout,
                                  placement_strategy=self.spec.trial.placement_strategy,
                                  code=_pool.code_digest(payload["workspace_files"]),
                                  single_use=self.untrusted_code)
            return self._launch_pooled(pool, key, payload, timeout + STARTUP_ALLOWANCE_S, message)
        self._make_room(config)
        t0 = time.time()
        runner = TrialRunner.remote()
        ref = runner.run.remote(payload, scaling, backend, collective_timeout, self.storage_path)
        ready, _ = ray.wait([ref], timeout=timeout + STARTUP_ALLOWANCE_S)
        if ready:
            try:
                return ray.get(ready[0])
            except ray.exceptions.RayError as e:  # the runner itself died (node lost)
                ray.kill(runner, no_restart=True)
                reap_orphaned_placement_groups()  # its controller's placement group
                return TrainerOutcome.failed(t0, TrialStatus.ERROR, ErrorKind.WORKER_LOST, f"{type(e).__name__}: {e}")
            finally:
                ray.kill(runner, no_restart=True)
        ray.kill(runner, no_restart=True)  # takes the Train controller and its workers with it
        reap_orphaned_placement_groups()
        return TrainerOutcome.failed(t0, TrialStatus.ERROR, ErrorKind.TIMEOUT, message)

    # ---- the warm pool ----------------------------------------------------------------
    def _pool(self):
        """The pool this backend's trials run in; None (fresh processes) when a named pool is
        gone (its driver ended): a trial process cannot own a pool that outlives it."""
        if self.pool_name:
            pool = _pool.connect(self.pool_name)
            if pool is None:
                warnings.warn(f"the warm worker pool {self.pool_name!r} is gone; this trial runs "
                              "in fresh processes", RuntimeWarning, stacklevel=3)
            return pool
        return _pool.process_pool()[1]

    def _launch_pooled(self, pool, key: dict[str, Any], payload: dict[str, Any], limit_s: float,
                       message: str) -> TrainerOutcome:
        t0 = time.time()
        ref = pool.run.remote(key, payload, t0 + limit_s, message)
        try:  # the pool ends a hung trial at the deadline; the grace covers its own reply
            outcome = ray.get(ref, timeout=limit_s + 60.0)
        except ray.exceptions.GetTimeoutError:
            return TrainerOutcome.failed(t0, TrialStatus.ERROR, ErrorKind.TIMEOUT, message)
        except ray.exceptions.RayError as e:  # the pool actor itself died (its node lost)
            return TrainerOutcome.failed(t0, TrialStatus.ERROR, ErrorKind.WORKER_LOST,
                                         f"{type(e).__name__}: {e}")
        return TrainerOutcome.from_pool(outcome, t_submit=t0)

    def _make_room(self, config: dict[str, Any]) -> None:
        """Before a fresh trial: this process's idle warm groups that hold resources (GPU
        groups; an idle CPU group holds none) give them back when the cluster has too few free
        for the trial's workers."""
        pool = _pool.existing_process_pool()
        if pool is None:
            return
        need = {"CPU": config["num_workers"] * config["num_threads"],
                **({"GPU": config["num_workers"]} if self.spec.hardware.device == "cuda" else {})}
        free = ray.available_resources()
        if any(free.get(r, 0.0) < v for r, v in need.items()):
            ray.get(pool.retire_idle.remote(holding_only=True))

    def close(self) -> None:
        """Retire this process's idle warm groups (their CPUs and GPUs are free again)."""
        pool = None if self.local_mode else _pool.existing_process_pool()
        if pool is not None:
            try:
                ray.get(pool.retire_idle.remote(), timeout=60)
            except ray.exceptions.RayError:
                pass



def _ensure_ray() -> None:
    if not ray.is_initialized():
        from infrarsi.backends.ray_train._priority import with_trial_priority

        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False,
                 log_to_driver=False, configure_logging=False, runtime_env=with_trial_priority())


