"""The per-worker train function: one trial's training run on one rank.

Runs inside a Ray Train worker (``torch.distributed`` already initialized: gloo on CPU, nccl on
CUDA) or in a plain process (world size 1). The harness owns the work (data, loss, optimizer
steps), the clock and the memory measurement; the user's workspace only builds the model.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from infrarsi.contract.spec import TaskSpec
from infrarsi.errors import IllegalConfigError
from infrarsi.harness import mechanisms as mech
from infrarsi.harness._workspace import load_entry
from infrarsi.harness.adapter_run import AdapterRun
from infrarsi.harness.clock import ClockTamperError, StepClock
from infrarsi.harness.data import global_batch, micro_batches
from infrarsi.harness.layout import Layout, build_mesh
from infrarsi.harness.loss import training_loss
from infrarsi.harness.memory import CpuMemoryMeter, held_state_bytes, raise_if_over_capacity
from infrarsi.harness.pipeline import build_schedule, split_stages
from infrarsi.harness.profile import memory_breakdown, no_phase, profile_step
from infrarsi.harness.stats import count_stats, shape_dict
from infrarsi.harness.tensor_parallel import apply_tensor_parallel
from infrarsi.live import LiveState
from infrarsi.trial import EARLY_STOP_CHECK_STEPS, clearly_slower
from infrarsi.workloads.knobs import derived

# On CPU the memory meter profiles one extra step after every step that counts (off the clock),
# never a warm-up or measured step: a profiler session before the clock slowed the first steps
# after it (1.45x the later steps' median over 46 eager cpu_dense/cpu_moe trials), so the
# measured window followed a settle step. Its loss joins the trace like any step's.
METERED_STEPS = 1


def _dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device(spec: TaskSpec) -> torch.device:
    if spec.hardware.device != "cuda":
        return torch.device("cpu")
    try:
        from ray.train.torch import get_device

        device = get_device()
    except Exception:  # not in a Ray Train worker
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


class _Run:
    """Everything one rank needs for its optimizer steps."""

    def __init__(self, spec: TaskSpec, config: dict[str, Any], device: torch.device) -> None:
        self.spec, self.config, self.device = spec, config, device
        self.rank, self.world = _dist_info()
        wl = spec.workload
        self.accum = derived(config, wl.global_batch_size)["gradient_accumulation_steps"]
        self.aux_weight = float(wl.shape.aux_loss_weight)
        self.model = self.optimizer = None
        self.expert_params: list[torch.nn.Parameter] = []
        # Tensor/pipeline layout: the global batch is split over the data-parallel ranks only.
        self.layout = Layout.from_config(config, self.world)
        self.dp_rank, self.dp_size = self.rank, self.world
        self.mesh = self.schedule = self.pp_group = None
        self.fused: dict[str, int] = {}  # fused projections whose rows TP permuted

    def build(self, entry) -> dict[str, float]:
        cfg = self.config
        ep = int(cfg.get("expert_parallel_degree", 1))
        shape = shape_dict(self.spec)
        group = dist.group.WORLD if dist.is_initialized() else None
        parallel = {"rank": self.rank, "world_size": self.world,
                    "expert_parallel_degree": ep, "group": group}
        torch.manual_seed(self.spec.loss_reference.seed)
        with self.device:
            model = entry.build_model(shape, parallel)
        stats = count_stats(model, shape, ep)
        if ep > 1:
            self.expert_params = list(model.expert_parameters())
        if self.layout.model_parallel:
            self.model = self._build_layout(model, shape)
        else:
            mech.apply_activation_checkpointing(model, cfg["activation_checkpointing"])
            mech.apply_compile(model, cfg["compile"])
            self.model = mech.wrap_data_parallel(model, cfg, self.device, self.expert_params)
        self.optimizer = mech.build_optimizer(
            self.model, cfg["optimizer_impl"], mech.learning_rate(shape["hidden_size"]))
        return stats

    def _build_layout(self, model: torch.nn.Module, shape: dict) -> torch.nn.Module:
        """Pipeline stages, then tensor parallelism, checkpointing, compile and FSDP2 on the
        data-parallel mesh dimension (torchtitan's order); this rank's modules in a ModuleList
        when pipelined."""
        lay, cfg = self.layout, self.config
        self.mesh = build_mesh(lay, self.device.type)
        self.dp_rank, self.dp_size = self.mesh["dp"].get_local_rank(), lay.dp
        modules = [model]
        if lay.pp > 1:
            stages = split_stages(model, lay.pp, lay.virtual_stages, self.mesh["pp"].get_local_rank(),
                                  shape["vocab_size"], self.device)
            modules = [m for _, m in stages]
        for m in modules:
            if lay.tp > 1:
                fused = apply_tensor_parallel(m, self.mesh["tp"], lay.sequence_parallel)
                names = getattr(m, "names", {})
                self.fused.update({names.get(k, k): v for k, v in fused.items()})
            mech.apply_activation_checkpointing(m, cfg["activation_checkpointing"])
            mech.apply_compile(m, cfg["compile"])
            if lay.dp > 1:
                mech.fully_shard_on(m, self.mesh["dp"], bool(cfg["reshard_after_forward"]))
        if lay.pp == 1:
            return modules[0]
        self.pp_group = self.mesh["pp"].get_group()
        self.schedule = build_schedule(stages, lay.pp * lay.virtual_stages, lay.schedule,
                                       self.accum, self._stage_loss, self.device, self.pp_group)
        return torch.nn.ModuleList(modules)

    def _stage_loss(self, output, targets: torch.Tensor) -> torch.Tensor:
        logits, aux = output
        return training_loss(logits, targets, aux, self.aux_weight)

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor, phase) -> torch.Tensor:
        """One ``schedule.step`` (forward and backward of every micro-batch, interleaved as the
        schedule says); the mean micro-batch loss, known on the last stage, sent to every
        pipeline rank."""
        losses: list[torch.Tensor] = []
        with phase("forward"):  # the schedule runs forward and backward together
            with mech.autocast_context(self.config["precision"], self.device):
                self.schedule.step(inputs, target=targets, losses=losses, return_outputs=False)
        total = (torch.stack([x.detach().float() for x in losses]).sum() / self.accum
                 if losses else torch.zeros((), device=self.device))
        dist.all_reduce(total, group=self.pp_group)
        return total

    def step(self, index: int, phase=no_phase) -> torch.Tensor:
        """One optimizer step over this rank's share of the locked global batch.

        ``phase(name)`` labels data/forward/backward/optimizer work for the profiled step
        (``infrarsi.harness.profile``); measured steps use the free default.
        """
        wl, cfg = self.spec.workload, self.config
        with phase("data"):
            batch = global_batch(self.spec.loss_reference.seed, index, wl.global_batch_size,
                                 wl.seq_len, wl.shape.vocab_size)
            micro = list(micro_batches(batch, self.dp_rank, self.dp_size, cfg["micro_batch_size"]))
        if self.schedule is not None:
            with phase("data"):
                inputs = torch.cat([i for i, _ in micro]).to(self.device, non_blocking=True)
                targets = torch.cat([t for _, t in micro]).to(self.device, non_blocking=True)
            total = self._pipeline_step(inputs, targets, phase)
            with phase("optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            return total
        total = torch.zeros((), device=self.device)
        for i, (inputs, targets) in enumerate(micro):
            with phase("data"):
                inputs = inputs.to(self.device, non_blocking=True)
                targets = targets.to(self.device, non_blocking=True)
            with mech.no_sync_context(self.model, i == len(micro) - 1):
                with phase("forward"):
                    with mech.autocast_context(cfg["precision"], self.device):
                        logits, aux = self.model(inputs)
                    loss = training_loss(logits, targets, aux, self.aux_weight) / self.accum
                with phase("backward"):
                    loss.backward()
            total += loss.detach()
        with phase("optimizer"):
            for p in self.expert_params:
                # Owned by one rank, fed by every rank's tokens: average like DDP would.
                if p.grad is not None:
                    p.grad.div_(self.world)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return total


def _check_world(config: dict[str, Any], world: int) -> None:
    if config["num_workers"] != world:
        raise IllegalConfigError(
            f"config num_workers={config['num_workers']} but this job has {world} rank(s); "
            "launch it with ScalingConfig(num_workers=config['num_workers'])"
        )


def train_worker(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one trial's training on this rank and return its measurements (a plain dict).

    ``payload``: ``task`` (TaskSpec.to_dict()), ``config`` (a normalized knob config),
    ``workspace`` (absolute path of the user's workspace copy), ``capacity_bytes`` (emulated
    per-worker memory on CPU, None on CUDA).

    Returns ``rank``, ``world_size``, ``step_times_s`` (measured steps; barrier-synchronized),
    ``loss_trace`` (global mean loss of every step), ``peak_memory_bytes`` (this rank),
    ``phase_times_s``, ``tokens_per_step``, ``t_first_measured_step`` (``time.time()``),
    ``num_params``, ``flops_per_token``; ``stopped_early`` when the trial ended its measurement
    early.

    ``stop_slower_than_s`` (optional, from the searcher): after ``EARLY_STOP_CHECK_STEPS`` measured
    steps, with the loss reference complete, a trial whose every measured step took longer than
    this stops measuring (``stopped_early`` says when and why): its outcome is certain, the
    rest of its steps would only spend device time. The harness still owns the clock, the
    loss check and the work: the hint can only end a trial sooner, never change what it measures.

    Every step boundary is also timestamped by an outside timer process (``clock.StepClock``);
    ``step_times_s`` are its times, and a trial whose in-process clock disagrees raises
    ``ClockTamperError`` (its message gives the true step times). Verification only:
    ``state_checksum`` (True: return a checksum of the parameters and optimizer state after the
    last step) and ``step_guard`` (a callable run at every step boundary).

    Raises ``torch.OutOfMemoryError`` (real on CUDA, emulated on CPU: the message never gives
    the true peak), ``CompileFailure`` when torch.compile fails, ``IllegalConfigError`` when
    ``num_workers`` does not match the job's world size.
    """
    threads = torch.get_num_threads()
    try:
        return _train(payload)
    finally:
        torch.set_num_threads(threads)  # in-process callers keep their own setting


def _train(payload: dict[str, Any]) -> dict[str, Any]:
    spec = TaskSpec.from_dict(payload["task"])
    config = dict(payload["config"])
    capacity = payload.get("capacity_bytes")
    torch.set_num_threads(int(config["num_threads"]))
    rank, world = _dist_info()
    _check_world(config, world)
    device = _device(spec)
    if spec.workload.script:  # the user's own loop, with infrarsi.prepare and infrarsi.step
        from infrarsi.harness.own_loop import train_script

        return train_script(spec, config, payload, device)
    timing, ref = spec.timing, spec.loss_reference
    meter = CpuMemoryMeter() if device.type == "cpu" else None
    measured_from = timing.warmup_steps
    measured_end = measured_from + timing.measured_steps
    total_steps = max(measured_end, ref.steps)

    slow_s = payload.get("stop_slower_than_s")
    stopped: dict[str, Any] | None = None
    # A task without a shape runs the user's adapter (their model, data and loss).
    run = _Run(spec, config, device) if spec.workload.shape is not None else AdapterRun(
        spec, config, device)
    losses: list[torch.Tensor] = []
    clock = StepClock(device, guard=payload.get("step_guard"))
    # the run's live view (rank 0 only): the loop sets a field, a thread writes the file, so
    # no file I/O lands on a step's clock
    live = LiveState(payload.get("progress_path") if rank == 0 else None)
    with load_entry(payload["workspace"], spec.workload.entry) as entry:
        try:
            if meter:
                meter.start()
            live.set("building")
            stats = run.build(entry)
            if meter:
                meter.pause()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for s in range(timing.warmup_steps):
                live.set("warm-up", s + 1, timing.warmup_steps)
                losses.append(run.step(s))
            clock.mark()
            for s in range(measured_from, total_steps):
                losses.append(run.step(s))
                if s < measured_end:
                    clock.mark()
                    live.set("measuring", s + 1 - measured_from, timing.measured_steps)
                    if (slow_s and len(clock.marks) - 1 == EARLY_STOP_CHECK_STEPS
                            and len(losses) >= ref.steps and s + 1 < measured_end):
                        if _stop_on_every_rank(clock.durations(), slow_s, world, device):
                            stopped = {"measured_steps": EARLY_STOP_CHECK_STEPS,
                                       "slower_than_s": slow_s}
                            break
                        clock.restart()  # the decision's collective is on no step's clock
                else:
                    live.set("loss reference", s + 1, total_steps)
            if meter:  # off the clock, after every step that counts; all ranks, then the verdict
                live.set("metering memory")
                s = len(losses)
                with meter.step(s, held_state_bytes(run.optimizer)):
                    losses.append(run.step(s))
                peak = meter.peak_bytes()
                raise_if_over_capacity(peak, capacity)
        except Exception as e:
            if config["compile"] != "off" and mech.is_compile_error(e):
                raise mech.CompileFailure(
                    f"torch.compile(mode={config['compile']!r}) failed: {type(e).__name__}: "
                    f"{str(e)[:2000]}"
                ) from None
            raise
        finally:
            clock.close()
            live.close()
            if meter:
                meter.close()
        tampered = clock.check()
        if tampered:
            raise ClockTamperError(tampered)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
        extra = _profile(run, len(losses), device, peak, world) if payload.get("profile") else {}
        if payload.get("state_checksum"):
            extra["state_checksum"] = state_checksum(run.model, run.optimizer,
                                                     spec.loss_reference.seed)
    trace = torch.stack(losses).float()
    if world > 1:
        dist.all_reduce(trace)
        trace /= world
    tokens_per_step = spec.workload.tokens_per_step
    if isinstance(run, AdapterRun):
        tokens_per_step, stats = _adapter_stats(run, spec, world, device)
    return {
        "rank": rank,
        "world_size": world,
        "step_times_s": clock.durations(),
        "loss_trace": [float(x) for x in trace.cpu()],
        "peak_memory_bytes": int(peak),
        "phase_times_s": {},
        "tokens_per_step": tokens_per_step,
        "t_first_measured_step": clock.wall_marks[0],
        "num_params": int(stats["num_params"]),
        "flops_per_token": float(stats["flops_per_token"]),
        **({"shape": stats["shape"]} if "shape" in stats else {}),
        **extra,  # "phase_times_s" and "profile" of the profiled step, when asked for
        **({"stopped_early": stopped} if stopped else {}),
    }


def _adapter_stats(run: AdapterRun, spec: TaskSpec, world: int, device: torch.device
                   ) -> tuple[int, dict[str, Any]]:
    """Tokens of one global step (every rank's, counted by the user's ``tokens(batch)``) and
    the measured shape with its FLOPs per token."""
    from infrarsi.harness.workload import flops_per_token

    tokens = torch.tensor([int(run.tokens_per_step or 0)], dtype=torch.int64, device=device)
    if world > 1:
        dist.all_reduce(tokens)
    total = int(tokens.item())
    seq_len = total // spec.workload.global_batch_size
    shape = {**run.shape, "seq_len": seq_len}
    return total, {"num_params": shape["num_params"], "shape": shape,
                   "flops_per_token": flops_per_token(shape, seq_len)}


SKETCH_DIM = 8


def _sketch(t: torch.Tensor, seed: int) -> list[float]:
    """[norm, k random projections] of ``t`` in float64: two tensors a and b with the same
    seed give ``|sketch(a) - sketch(b)| / |sketch(b)| ~ |a - b| / |b|`` (Johnson-Lindenstrauss)."""
    if hasattr(t, "full_tensor"):  # a tensor-parallel DTensor: its whole value (a collective)
        t = t.full_tensor()
    x = t.detach().reshape(-1).to("cpu", torch.float64)
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(SKETCH_DIM, x.numel(), generator=g, dtype=torch.float64) / SKETCH_DIM ** 0.5
    return [float(x.norm())] + [float(v) for v in proj @ x]


def state_checksum(model: torch.nn.Module, optimizer, seed: int) -> dict[str, list[float]]:
    """A checksum of the parameters and the optimizer state after the last step (name -> sketch),
    so work skipped on any step, the last included, shows against the baseline's."""
    out: dict[str, list[float]] = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        out[f"param:{name}"] = _sketch(p, seed * 1000 + i)
        for key, v in sorted(optimizer.state.get(p, {}).items()):
            if torch.is_tensor(v) and v.numel() > 1:
                out[f"optim:{name}:{key}"] = _sketch(v, seed * 1000 + i)
    return out


def _stop_on_every_rank(durations: list[float], slow_s: float, world: int,
                        device: torch.device) -> bool:
    """Rank 0 applies the early-stop rule (``clearly_slower``) and broadcasts its decision, so
    all ranks stop together (each rank's clock differs by microseconds; a tie decided
    differently would leave one rank alone in a collective)."""
    flag = torch.tensor([1 if clearly_slower(durations, slow_s) else 0], device=device)
    if world > 1:
        dist.broadcast(flag, src=0)
    return bool(flag.item())


def _profile(run: _Run, index: int, device: torch.device, peak: int, world: int) -> dict[str, Any]:
    """One extra profiled step after everything measured; every rank's profile, gathered.

    A profile that fails is reported (``error``) rather than failing the trial.
    """
    try:
        mine = profile_step(lambda phase: run.step(index, phase), device)
        mine["memory_bytes"] = memory_breakdown(run.model, run.optimizer, run.config, peak)
    except Exception as e:  # noqa: BLE001 - doctor says which parts are missing and goes on
        mine = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    ranks = [mine]
    if world > 1:
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
    good = [r for r in ranks if "phases_s" in r]
    phases = ({k: sum(r["phases_s"][k] for r in good) / len(good) for k in good[0]["phases_s"]}
              if good else {})
    return {"phase_times_s": phases, "profile": {"per_rank": ranks}}

