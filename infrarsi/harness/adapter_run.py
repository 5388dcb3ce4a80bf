"""One rank's optimizer steps for a user's adapter workload (see :mod:`infrarsi.harness.workload`).

The same contract as the reference workload's ``_Run`` in :mod:`infrarsi.harness.train`: the
harness derives the accumulation from the locked global batch, applies every mechanism knob to
the user's model and blocks, and runs ``accumulation`` micro-batches per optimizer step; the
user's data pipeline (``data`` phase) and loss (``forward`` phase) run inside the step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from infrarsi.contract.spec import TaskSpec
from infrarsi.errors import WorkloadError
from infrarsi.harness import mechanisms as mech
from infrarsi.harness import workload as wlm
from infrarsi.harness.profile import no_phase
from infrarsi.workloads.knobs import derived

_IMPL_KWARGS = {"for_loop": {"foreach": False}, "foreach": {"foreach": True},
                "fused": {"fused": True}}
# Exceptions of a first loss call that mean "the model's forward does not fit the loss".
_MISFIT = (TypeError, AttributeError, ValueError, IndexError, KeyError, RuntimeError)


def _dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class AdapterRun:
    """Everything one rank needs for the optimizer steps of an adapter workload."""

    def __init__(self, spec: TaskSpec, config: dict[str, Any], device: torch.device) -> None:
        self.spec, self.config, self.device = spec, config, device
        self.rank, self.world = _dist_info()
        wl = spec.workload
        self.accum = derived(config, wl.global_batch_size)["gradient_accumulation_steps"]
        self.ctx = wlm.DataContext(self.rank, self.world, int(config["micro_batch_size"]),
                                   wl.global_batch_size, spec.loss_reference.seed)
        self.model = self.optimizer = None
        self.entry: Any = None
        self._data = None
        self.tokens_per_step: int | None = None  # this rank's, of step 0
        self.seq_len = 0

    def build(self, entry) -> dict[str, Any]:
        cfg = self.config
        self.entry = entry
        torch.manual_seed(self.spec.loss_reference.seed)
        with self.device:
            model = wlm.call_build_model(entry, self.ctx)
        model.to(self.device)
        blocks = wlm.find_blocks(model, entry)
        shape = wlm.read_shape(model, blocks)
        if cfg["activation_checkpointing"] != "none":
            mech.apply_activation_checkpointing(
                model, cfg["activation_checkpointing"],
                wlm.require_blocks(blocks, "activation_checkpointing"))
        if cfg["compile"] != "off":
            mech.apply_compile(model, cfg["compile"], wlm.require_blocks(blocks, "compile"))
        fsdp_blocks = blocks if cfg["data_parallel"] == "fsdp" else None
        self.model = mech.wrap_data_parallel(model, cfg, self.device, blocks=fsdp_blocks)
        impl = _IMPL_KWARGS[cfg["optimizer_impl"]]
        if callable(getattr(entry, "optimizer", None)):
            self.optimizer = entry.optimizer(self.model, dict(impl))
            if not isinstance(self.optimizer, torch.optim.Optimizer):
                raise WorkloadError(
                    f"optimizer(model, impl) returned a {type(self.optimizer).__name__}; return "
                    "a torch.optim.Optimizer, e.g. `torch.optim.AdamW(model.parameters(), "
                    "lr=3e-4, **impl)`")
        else:
            self.optimizer = mech.build_optimizer(
                self.model, cfg["optimizer_impl"], mech.learning_rate(shape["hidden_size"]))
        self._data = iter(entry.batches(self.ctx))
        self.shape = shape
        return {"num_params": shape["num_params"], "shape": shape}

    def _next_batch(self) -> Any:
        try:
            batch = next(self._data)
        except StopIteration:
            raise WorkloadError(
                "batches(ctx) ran out of data before the trial's last step; make it an endless "
                "generator (loop over your data: `while True: ...` or itertools.cycle)") from None
        rows = wlm.batch_rows(batch)
        if rows != self.ctx.micro_batch_size:
            raise WorkloadError(
                f"batches(ctx) yielded a micro-batch of {rows} rows, but this trial's "
                f"micro_batch_size is {self.ctx.micro_batch_size} (global_batch_size "
                f"{self.ctx.global_batch_size} / ({self.world} workers x {self.accum} "
                "accumulation steps)); size each micro-batch by ctx.micro_batch_size, or draw "
                "the global batch and `yield from ctx.shard(global_batch)`")
        return batch

    def _loss(self, batch: Any, first: bool) -> torch.Tensor:
        try:
            loss = self.entry.loss(self.model, batch)
        except torch.OutOfMemoryError:
            raise
        except _MISFIT as e:
            if not first or mech.is_compile_error(e):
                raise
            raise WorkloadError(
                f"loss(model, batch) failed on the first micro-batch with {type(e).__name__}: "
                f"{str(e)[:500]}. The model's forward does not return what your loss expects, "
                "or the batch is not what the forward takes: call the model in loss() the way "
                "your own training loop does (e.g. `logits = model(x); return "
                "F.cross_entropy(logits.flatten(0, 1), y.flatten())`)") from e
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            got = (f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor)
                   else f"a {type(loss).__name__}")
            raise WorkloadError(
                f"loss(model, batch) returned {got}; it must return a scalar tensor (the "
                "micro-batch's mean loss: reduce it with .mean(), and return the tensor, not "
                ".item())")
        return loss

    def step(self, index: int, phase=no_phase) -> torch.Tensor:
        """One optimizer step: ``accum`` micro-batches of the user's data through their loss."""
        cfg = self.config
        total = torch.zeros((), device=self.device)
        tokens = 0
        for i in range(self.accum):
            with phase("data"):
                batch = self._next_batch()
                if self.tokens_per_step is None:
                    tokens += wlm.entry_tokens(self.entry, batch)
                batch = wlm.to_device(batch, self.device)
            with mech.no_sync_context(self.model, i == self.accum - 1):
                with phase("forward"):
                    with mech.autocast_context(cfg["precision"], self.device):
                        loss = self._loss(batch, first=index == 0 and i == 0)
                    loss = loss.float() / self.accum
                with phase("backward"):
                    loss.backward()
            total += loss.detach()
        if self.tokens_per_step is None:
            self.tokens_per_step = tokens
        with phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return total
