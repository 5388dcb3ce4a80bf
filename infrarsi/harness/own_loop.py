"""The second way in: the user keeps their own training loop (as with Hugging Face Accelerate).

Their script, unchanged but for two calls::

    model, optimizer, loader = infrarsi.prepare(model, optimizer, loader)
    for x, y in loader:
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        infrarsi.step(loss, tokens=y.numel())   # marks the step; ends the trial when done

Run as a plain script (no trial), both calls return their inputs and do nothing. Launched by
InfraRSI (the task YAML's ``workload.script``; the harness runs it with ``runpy`` in every Ray
Train worker) they apply the trial's mechanism knobs:

* ``prepare`` puts activation checkpointing and ``torch.compile`` on the model's repeated blocks
  (:func:`infrarsi.harness.workload.find_blocks`), wraps it in DDP/FSDP2, runs its forward under
  autocast for ``precision``, sets the optimizer's ``foreach``/``fused`` implementation, and
  turns the loader (which yields the locked *global* batch, ``global_batch_size`` rows) into
  this rank's micro-batches on the device.
* Gradient accumulation over micro-batches is the harness's: the prepared optimizer steps (and
  zeroes) only on the last micro-batch of an optimizer step, after dividing the gradients by the
  accumulation steps (the gradient of the mean loss, as one big batch would give); DDP syncs
  only then. (Gradient clipping in the user's loop between backward and step would see partial
  sums on the other micro-batches: keep micro_batch_size at the per-rank batch, with
  search.restrict, for such a loop.)
* ``step(loss, tokens)`` owns the clock (a barrier-synchronized mark per optimizer step), records
  the loss and the tokens, and raises :class:`TrialComplete` (a ``BaseException``: a user's
  ``except Exception`` does not swallow it) when the trial has all its steps.
"""

from __future__ import annotations

import functools
import runpy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from infrarsi.errors import WorkloadError
from infrarsi.harness import mechanisms as mech
from infrarsi.harness import workload as wlm

__all__ = ["TrialComplete", "prepare", "step"]


class TrialComplete(BaseException):  # noqa: N818 - a control signal, not an error
    """Raised by :func:`step` when the trial has measured all its steps."""


@dataclass
class Session:
    """One trial of an own-loop script on this rank (set by the harness around ``runpy``)."""

    config: dict[str, Any]
    device: torch.device
    ctx: wlm.DataContext
    accum: int
    total_steps: int
    on_step: Any  # callable(step_index) -> None: the harness's clock and meter schedule
    on_prepared: Any = None  # callable() -> None: the model is built and wrapped (the meter)
    losses: list[torch.Tensor] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    micro: int = 0  # micro-batches seen in the current optimizer step
    loss_sum: torch.Tensor | None = None
    tokens_sum: int = 0
    model: nn.Module | None = None
    optimizer: Any = None
    shape: dict[str, int] = field(default_factory=dict)

    @property
    def last_micro(self) -> bool:
        return self.micro == self.accum - 1


_SESSION: Session | None = None


def current() -> Session | None:
    return _SESSION


# ---- the user's calls ------------------------------------------------------------------------
# Knobs a single process applies to itself outside a trial (launch knobs such as num_workers
# and micro_batch_size belong to the user's launcher).
PROCESS_KNOBS = ("activation_checkpointing", "compile", "precision", "optimizer_impl")


def prepare(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
            dataloader: Any = None, *, blocks: nn.Module | None = None,
            settings: str | Path | None = None):
    """``(model, optimizer, dataloader)`` with the trial's knobs applied. ``blocks``: the
    repeated blocks, when automatic detection does not find them.

    Outside a trial they come back unchanged, unless ``settings`` names an existing JSON/YAML
    file (where ``infrarsi apply`` wrote the promoted knobs: the task YAML's ``launch``): its
    ``PROCESS_KNOBS`` are applied then, so the user's own run gets the promoted settings."""
    s = _SESSION
    if s is None:
        return _apply_settings(model, optimizer, blocks, settings), optimizer, dataloader
    cfg = s.config
    model.to(s.device)
    found = blocks if blocks is not None else wlm.find_blocks(model)
    s.shape = wlm.read_shape(model, found)
    if cfg["activation_checkpointing"] != "none":
        mech.apply_activation_checkpointing(model, cfg["activation_checkpointing"],
                                            wlm.require_blocks(found, "activation_checkpointing"))
    if cfg["compile"] != "off":
        mech.apply_compile(model, cfg["compile"], wlm.require_blocks(found, "compile"))
    wrapped = mech.wrap_data_parallel(model, cfg, s.device,
                                      blocks=found if cfg["data_parallel"] == "fsdp" else None)
    if cfg["precision"] != "fp32":
        forward = wrapped.forward

        @functools.wraps(forward)
        def autocast_forward(*args, **kwargs):
            with mech.autocast_context(cfg["precision"], s.device):
                return forward(*args, **kwargs)

        wrapped.forward = autocast_forward
    s.model = wrapped
    if optimizer is not None:
        foreach, fused = _IMPL[cfg["optimizer_impl"]]
        for group in optimizer.param_groups:  # read by torch's optimizers at every step
            group["foreach"], group["fused"] = foreach, fused
        s.optimizer = _AccumulatingOptimizer(optimizer, s)
    loader = _MicroBatches(dataloader, s) if dataloader is not None else None
    if s.on_prepared is not None:
        s.on_prepared()
    return wrapped, s.optimizer or optimizer, loader


def step(loss: torch.Tensor, tokens: int) -> None:
    """Mark the end of one micro-batch's step in the user's loop (after ``optimizer.step()``).
    Outside a trial: nothing. Raises :class:`TrialComplete` after the trial's last step."""
    s = _SESSION
    if s is None:
        return
    if s.model is None:  # measured without the trial's knobs, the trial would mean nothing
        raise WorkloadError("infrarsi.step was called, but the script never called "
                            "infrarsi.prepare(model, optimizer, dataloader), so the trial's "
                            "settings were not applied; call it once before your training loop")
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got, fix = ((f"a tensor of shape {list(loss.shape)}", "reduce it to the micro-batch's "
                     "mean loss with .mean()") if isinstance(loss, torch.Tensor)
                    else (f"a {type(loss).__name__}", "pass the tensor `loss`, not `loss.item()`"))
        raise WorkloadError(f"infrarsi.step(loss, tokens) got {got}; loss must be the scalar "
                            f"loss tensor of the micro-batch: {fix}")
    part = loss.detach().float() / s.accum
    s.loss_sum = part if s.loss_sum is None else s.loss_sum + part
    s.tokens_sum += int(tokens)
    s.micro += 1
    if s.micro < s.accum:
        return
    index = len(s.losses)
    s.losses.append(s.loss_sum)
    s.tokens.append(s.tokens_sum)
    s.micro, s.loss_sum, s.tokens_sum = 0, None, 0
    s.on_step(index)
    if len(s.losses) >= s.total_steps:
        raise TrialComplete


def _apply_settings(model: nn.Module, optimizer: Any, blocks: nn.Module | None,
                    settings: str | Path | None) -> nn.Module:
    if settings is None or not Path(settings).is_file():
        return model
    import json

    import yaml

    text = Path(settings).read_text()
    body = json.loads(text) if str(settings).endswith(".json") else yaml.safe_load(text)
    cfg = {k: body[k] for k in PROCESS_KNOBS if isinstance(body, dict) and k in body}
    found = blocks if blocks is not None else wlm.find_blocks(model)
    if cfg.get("activation_checkpointing", "none") != "none":
        mech.apply_activation_checkpointing(model, cfg["activation_checkpointing"],
                                            wlm.require_blocks(found, "activation_checkpointing"))
    if cfg.get("compile", "off") != "off":
        mech.apply_compile(model, cfg["compile"], wlm.require_blocks(found, "compile"))
    if cfg.get("precision", "fp32") != "fp32":
        device = next(model.parameters()).device
        forward = model.forward

        @functools.wraps(forward)
        def autocast_forward(*args, **kwargs):
            with mech.autocast_context(cfg["precision"], device):
                return forward(*args, **kwargs)

        model.forward = autocast_forward
    if optimizer is not None and "optimizer_impl" in cfg:
        foreach, fused = _IMPL[cfg["optimizer_impl"]]
        for group in optimizer.param_groups:
            group["foreach"], group["fused"] = foreach, fused
    return model


_IMPL = {"for_loop": (False, False), "foreach": (True, False), "fused": (False, True)}


# ---- the prepared objects --------------------------------------------------------------------
class _AccumulatingOptimizer:
    """The user's optimizer: ``step`` acts on an optimizer step's last micro-batch and zeroes
    the gradients right after; the user's ``zero_grad`` is then a no-op, wherever their loop
    calls it (before the backward or after the step), so accumulated gradients survive it."""

    def __init__(self, optimizer: torch.optim.Optimizer, session: Session) -> None:
        self.optimizer, self._s = optimizer, session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def step(self, *args, **kwargs):
        if not self._s.last_micro:
            return None
        if self._s.accum > 1:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.div_(self._s.accum)
        out = self.optimizer.step(*args, **kwargs)
        self.optimizer.zero_grad(set_to_none=True)
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


class _MicroBatches:
    """This rank's micro-batches of each global batch the user's loader yields, on the device.
    Before each micro-batch's forward, DDP is told whether to sync (only on the last)."""

    def __init__(self, loader: Any, session: Session) -> None:
        self.loader, self._s = loader, session

    def __len__(self) -> int:
        return len(self.loader) * self._s.accum

    def __iter__(self):
        s = self._s
        for batch in self.loader:
            # Checked here (not in ctx.shard) so the message speaks of the user's loader and
            # launch flags, which is what an own-loop user can change.
            rows = wlm.batch_rows(batch)
            if rows != s.ctx.global_batch_size:
                raise WorkloadError(
                    f"the loader given to infrarsi.prepare yielded a batch of {rows} rows, but "
                    f"the task locks workload.global_batch_size {s.ctx.global_batch_size}: give "
                    "prepare() a loader of whole global batches (InfraRSI cuts each into this "
                    "rank's micro-batches), e.g. pass your script's batch-size flag in "
                    "workload.script_args, or change workload.global_batch_size and re-run "
                    "`infrarsi init`")
            for micro in s.ctx.shard(batch):
                if hasattr(s.model, "require_backward_grad_sync"):
                    s.model.require_backward_grad_sync = s.micro == s.accum - 1
                yield wlm.to_device(micro, s.device)


# ---- the harness's side ----------------------------------------------------------------------
def run_script(workspace: str | Path, script: str, args: list[str], session: Session) -> None:
    """Run the user's script as ``__main__`` in this process with ``session`` active, until
    :func:`step` ends the trial. A script that ends before the trial's last step is an error
    that says how many steps it gave."""
    global _SESSION
    path = Path(workspace) / script
    if not path.is_file():
        raise WorkloadError(f"workload.script {script!r} not found in {workspace}")
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))
    _SESSION = session
    try:
        runpy.run_path(str(path), run_name="__main__")
    except TrialComplete:
        return
    finally:
        _SESSION = None
        sys.argv = old_argv
        sys.path[:] = old_path
        for name in [n for n, m in sys.modules.items()
                     if str(getattr(m, "__file__", "") or "").startswith(str(path.parent))]:
            del sys.modules[name]  # a patched copy of the workspace imports fresh
    if session.model is None:
        raise WorkloadError(f"{script} never called infrarsi.prepare(model, optimizer, "
                            "dataloader); call it once before your training loop")
    raise WorkloadError(
        f"{script} ended after {len(session.losses)} optimizer steps; the trial needs "
        f"{session.total_steps}. Call infrarsi.step(loss, tokens) after every optimizer.step() "
        "and train for at least that many steps (the harness ends the loop itself)")


def train_script(spec: Any, config: dict[str, Any], payload: dict[str, Any],
                 device: torch.device) -> dict[str, Any]:
    """One trial of an own-loop script on this rank: the same schedule as the adapter path
    (warm-up steps, the measured steps each closed by a barrier-synchronized clock mark, the
    loss reference's steps, then on CPU one metered step off the clock: the memory meter covers
    the script's model build up to ``prepare`` and that step), driven by the script's calls to
    :func:`step`. No early stop: the script's loop is the user's."""
    from infrarsi.harness.clock import StepClock
    from infrarsi.harness.memory import CpuMemoryMeter, held_state_bytes, raise_if_over_capacity
    from infrarsi.harness.train import METERED_STEPS
    from infrarsi.workloads.knobs import derived

    rank, world = dist_info()
    wl, timing = spec.workload, spec.timing
    meter = CpuMemoryMeter() if device.type == "cpu" else None
    measured_from = timing.warmup_steps
    measured_end = measured_from + timing.measured_steps
    counted = max(measured_end, spec.loss_reference.steps)  # the metered step comes after these
    clock = StepClock(device)
    peak: dict[str, int] = {}
    metered: dict[str, Any] = {}

    def on_step(i: int) -> None:
        if i == measured_from - 1 or measured_from <= i < measured_end:
            clock.mark()
        if meter and i == counted - 1:  # the next step is the metered one
            metered["window"] = meter.step(i + 1, held_state_bytes(session.optimizer))
            metered["window"].__enter__()
        elif meter and i == counted:
            metered.pop("window").__exit__(None, None, None)
            peak["bytes"] = meter.peak_bytes()
            raise_if_over_capacity(peak["bytes"], payload.get("capacity_bytes"))

    def on_prepared() -> None:
        if meter and "built" not in metered:
            metered["built"] = meter.pause()

    session = Session(config=config, device=device,
                      ctx=wlm.DataContext(rank, world, int(config["micro_batch_size"]),
                                          wl.global_batch_size, spec.loss_reference.seed),
                      accum=derived(config, wl.global_batch_size)["gradient_accumulation_steps"],
                      total_steps=counted + (METERED_STEPS if meter else 0), on_step=on_step,
                      on_prepared=on_prepared)
    torch.manual_seed(spec.loss_reference.seed)
    try:
        if meter:
            meter.start()
        run_script(payload["workspace"], wl.script, list(wl.script_args), session)
    finally:
        if meter:
            window = metered.pop("window", None)
            if window is not None:  # a failure inside the metered step
                window.__exit__(None, None, None)
            meter.close()
    if device.type == "cuda":
        peak["bytes"] = torch.cuda.max_memory_allocated(device)
    trace = torch.stack(session.losses).float()
    tokens = torch.tensor([session.tokens[0]], dtype=torch.int64, device=device)
    if world > 1:
        dist.all_reduce(trace)
        trace /= world
        dist.all_reduce(tokens)
    total = int(tokens.item())
    seq_len = total // wl.global_batch_size
    shape = {**session.shape, "seq_len": seq_len}
    return {
        "rank": rank, "world_size": world, "step_times_s": clock.durations(),
        "loss_trace": [float(x) for x in trace.cpu()],
        "peak_memory_bytes": int(peak.get("bytes", 0)), "phase_times_s": {},
        "tokens_per_step": total, "t_first_measured_step": clock.wall_marks[0],
        "num_params": int(shape["num_params"]),
        "flops_per_token": wlm.flops_per_token(shape, seq_len), "shape": shape,
    }


def dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
