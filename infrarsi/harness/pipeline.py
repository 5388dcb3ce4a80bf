"""Pipeline parallelism with ``torch.distributed.pipelining``: stages split by blocks.

The model is cut into ``pp x v`` stages of consecutive blocks (``v`` virtual stages per rank
for the interleaved schedule; one otherwise); rank ``r`` of the pipeline group runs stages
``r, r + pp, ...``. A stage is the model's children before ``layers`` (first stage only), its
share of the blocks, and the children after ``layers`` (last stage only). This asks of the model
what the entry contract states: ``forward`` is those children applied in order, each block
returning ``(x, aux_loss)`` and the aux losses summed; ``split_stages`` checks it on a short
input before cutting.

One optimizer step is one ``schedule.step`` over this data-parallel rank's share of the locked
global batch, in ``per_rank_batch / micro_batch_size`` micro-batches: the same work as the
accumulation loop, with gradients scaled by the micro-batch count (``scale_grads``), exactly
what dividing each micro-batch's loss by the accumulation steps does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from infrarsi.errors import IllegalConfigError

__all__ = ["Stage", "build_schedule", "split_stages", "stage_bounds"]


class Stage(nn.Module):
    """Consecutive blocks of a decoder, with its head or tail children on the first/last stage.

    ``forward(x, aux)``: ``x`` is tokens on the first stage (``aux`` absent), hidden states
    otherwise; returns ``(x, aux)`` (logits and the summed aux loss on the last stage).
    ``names`` maps this stage's parameter names to the full model's.
    """

    def __init__(self, pre: list[tuple[str, nn.Module]], blocks: list[tuple[int, nn.Module]],
                 post: list[tuple[str, nn.Module]]) -> None:
        super().__init__()
        self.pre = nn.ModuleList(m for _, m in pre)
        self.layers = nn.ModuleList(m for _, m in blocks)
        self.post = nn.ModuleList(m for _, m in post)
        self.is_first, self.is_last = bool(pre), bool(post)
        self.names: dict[str, str] = {}
        for attr, named in (("pre", [(n, m) for n, m in pre]),
                            ("layers", [(f"layers.{i}", m) for i, m in blocks]),
                            ("post", [(n, m) for n, m in post])):
            for j, (orig, m) in enumerate(named):
                for pn, _ in m.named_parameters():
                    self.names[f"{attr}.{j}.{pn}"] = f"{orig}.{pn}"

    def forward(self, x: torch.Tensor, aux: torch.Tensor | None = None):
        for m in self.pre:
            x = m(x)
        if aux is None:
            aux = torch.zeros((), device=x.device, dtype=torch.float32)
        for block in self.layers:
            x, a = block(x)
            aux = aux + a
        for m in self.post:
            x = m(x)
        return x, aux


def stage_bounds(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """Blocks ``[start, end)`` of each stage: as even as possible, earlier stages the larger."""
    if num_stages > num_layers:
        raise IllegalConfigError(
            f"{num_stages} pipeline stages exceed the model's {num_layers} blocks; lower "
            "pipeline_parallel_degree (or num_virtual_pipeline_stages)")
    base, extra = divmod(num_layers, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        end = start + base + (1 if s < extra else 0)
        out.append((start, end))
        start = end
    return out


def _children(model: nn.Module) -> tuple[list, list]:
    names = [n for n, _ in model.named_children()]
    if "layers" not in names:
        raise IllegalConfigError("pipeline parallelism needs the model's blocks in `model.layers` "
                                 "(the entry contract); set pipeline_parallel_degree=1")
    cut = names.index("layers")
    kids = list(model.named_children())
    return kids[:cut], kids[cut + 1:]


def _check_sequential(model: nn.Module, vocab: int, device: torch.device) -> None:
    pre, post = _children(model)
    whole = Stage(pre, list(enumerate(model.layers)), post)
    tokens = torch.randint(0, vocab, (1, 8), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.no_grad():
        want, got = model(tokens), whole(tokens)
    same = all(torch.allclose(a.float(), b.float(), atol=1e-5, rtol=1e-4)
               for a, b in zip(want, got, strict=True))
    if not same:
        raise IllegalConfigError(
            "the model's forward is not its children before `layers`, the blocks and the children "
            "after, applied in order, so it cannot be cut into pipeline stages; set "
            "pipeline_parallel_degree=1")


def split_stages(model: nn.Module, pp: int, virtual: int, pp_rank: int, vocab: int,
                 device: torch.device) -> list[tuple[int, Stage]]:
    """This pipeline rank's ``(stage_index, Stage)`` pairs, in schedule order."""
    _check_sequential(model, vocab, device)
    pre, post = _children(model)
    n = pp * virtual
    bounds = stage_bounds(len(model.layers), n)
    stages = []
    for s in range(pp_rank, n, pp):
        start, end = bounds[s]
        blocks = [(i, model.layers[i]) for i in range(start, end)]
        stages.append((s, Stage(pre if s == 0 else [], blocks, post if s == n - 1 else [])))
    return stages


def build_schedule(stages: list[tuple[int, Stage]], num_stages: int, schedule: str,
                   n_microbatches: int, loss_fn: Callable, device: torch.device, group):
    """The ``torch.distributed.pipelining`` schedule for this rank's stages."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    pipe = [PipelineStage(m, i, num_stages, device, group=group) for i, m in stages]
    if schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(pipe, n_microbatches, loss_fn=loss_fn)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    return cls(pipe[0], n_microbatches, loss_fn=loss_fn)
