"""The real torch mechanism behind each launch knob (see ``infrarsi.workloads.knobs``).

Order of application, as torchtitan does it: activation checkpointing on the blocks, then
``torch.compile`` per block, then the data-parallel wrapper (DDP or FSDP2) around the model.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "CompileFailure",
    "apply_activation_checkpointing",
    "apply_compile",
    "autocast_context",
    "build_optimizer",
    "learning_rate",
    "set_compile_cache",
    "wrap_data_parallel",
]

LEARNING_RATE = 1e-3  # AdamW's rate at the base width; wider models scale it down
BASE_WIDTH = 128
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


class CompileFailure(RuntimeError):
    """``torch.compile`` failed (tracing, lowering or the C++/Triton build); a compile error."""


def apply_activation_checkpointing(model: nn.Module, mode: str,
                                   blocks: nn.Module | None = None) -> None:
    """Wrap every block ("full") or every second block ("selective") with non-reentrant
    ``checkpoint_wrapper``; "none" leaves the blocks alone. ``blocks``: the container of the
    repeated blocks (default ``model.layers``)."""
    if mode == "none":
        return
    if mode not in ("selective", "full"):
        raise ValueError(f"activation_checkpointing {mode!r} must be none, selective or full")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    layers = model.layers if blocks is None else blocks
    for i, block in enumerate(layers):
        if mode == "full" or i % 2 == 0:
            layers[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def set_compile_cache() -> str:
    """Share one inductor cache between trials (cold CPU compile ~70 s, warm ~5 s)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "infrarsi" / "inductor"
    return os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default))


def apply_compile(model: nn.Module, mode: str, blocks: nn.Module | None = None) -> None:
    """``torch.compile(block, mode=mode)`` on every block; "off" runs eagerly."""
    if mode == "off":
        return
    set_compile_cache()
    layers = model.layers if blocks is None else blocks
    for i, block in enumerate(layers):
        layers[i] = torch.compile(block, mode=mode)
        # Runs eagerly, before dynamo sees the inputs (hooks of the OptimizedModule itself).
        layers[i].register_forward_pre_hook(_wait_async_inputs, with_kwargs=True)


def _wait_async_inputs(module: nn.Module, args: tuple, kwargs: dict):
    """Resolve ``AsyncCollectiveTensor`` inputs of a compiled block with a differentiable wait.

    Tensor parallelism hands a block the ``to_local()`` of an async redistribute (the vocab-
    sharded embedding's all-reduce or reduce-scatter): an ``AsyncCollectiveTensor`` whose
    autograd edge is ``to_local``'s backward, which turns the incoming gradient back into a
    DTensor. AOTAutograd (torch 2.13, ``_aot_autograd/frontend_utils.py`` and the runtime
    wrapper in ``subclass_codegen.py``) replaces such an input by ``trigger_wait()``, i.e. the
    wrapper's inner tensor, so the compiled block's input gradient skips that edge and reaches
    DTensor's ``Redistribute.backward`` as a plain tensor: ``AttributeError: 'Tensor' object has
    no attribute '_local_tensor'`` in the first backward of every compiled TP trial.
    ``wait_tensor`` has an identity autograd formula, so calling it here gives the block a plain
    tensor whose gradient flows through ``to_local``'s backward as in eager mode.
    """
    from torch.distributed._functional_collectives import AsyncCollectiveTensor, wait_tensor
    from torch.utils._pytree import tree_any, tree_map_only

    if not tree_any(lambda x: isinstance(x, AsyncCollectiveTensor), (args, kwargs)):
        return None
    return tree_map_only(AsyncCollectiveTensor, wait_tensor, (args, kwargs))


def is_compile_error(exc: BaseException) -> bool:
    """True when ``exc`` is a dynamo/inductor compile-time failure.

    Judged by type, not by traceback: every error raised inside a compiled module (a real OOM,
    a failed collective) passes through dynamo's frames at run time.
    """
    from torch._dynamo import exc as dynamo_exc
    from torch._inductor import exc as inductor_exc

    names = ("OperatorIssue", "SubgraphLoweringException", "InvalidCxxCompiler",
             "CppWrapperCodegenError", "CppCompileError")
    kinds = (dynamo_exc.TorchDynamoException,) + tuple(
        getattr(inductor_exc, n) for n in names if hasattr(inductor_exc, n))
    return isinstance(exc, kinds) and not isinstance(exc, torch.OutOfMemoryError)


def wrap_data_parallel(model: nn.Module, config: Mapping[str, Any], device: torch.device,
                       ignore: Iterable[nn.Parameter] = (), *,
                       blocks: nn.Module | None = None) -> nn.Module:
    """DDP (more than one rank) or FSDP2 ``fully_shard`` per block + root (when distributed).
    ``blocks``: the repeated blocks FSDP shards one by one (default ``model.layers``; an
    adapter workload without blocks shards the root only)."""
    if not (dist.is_available() and dist.is_initialized()):
        return model
    world = dist.get_world_size()
    if config["data_parallel"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        raf = bool(config["reshard_after_forward"])
        for block in (getattr(model, "layers", ()) if blocks is None else blocks):
            fully_shard(block, mesh=mesh, reshard_after_forward=raf)
        fully_shard(model, mesh=mesh, reshard_after_forward=raf)
        return model
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ignore_ids = {id(p) for p in ignore}
    names = [n for n, p in model.named_parameters() if id(p) in ignore_ids]
    if names:
        # Expert-parallel parameters are owned by one rank: DDP must not average them.
        DDP._set_params_and_buffers_to_ignore_for_model(model, names)
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=config["bucket_cap_mb"],
        gradient_as_bucket_view=bool(config["gradient_as_bucket_view"]),
    )


def fully_shard_on(model: nn.Module, mesh, reshard_after_forward: bool) -> None:
    """FSDP2 ``fully_shard`` per block and at the root over ``mesh`` (the data-parallel
    dimension of a tensor/pipeline layout: FSDP2 composes with the DTensor parameters TP made)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def no_sync_context(model: nn.Module, last_micro_batch: bool):
    """Skip DDP's all-reduce on all but the last micro-batch of an accumulation."""
    if last_micro_batch or not hasattr(model, "no_sync"):
        return nullcontext()
    return model.no_sync()


def autocast_context(precision: str, device: torch.device):
    if precision == "fp32":
        return nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision {precision!r} must be fp32 or bf16")


def learning_rate(hidden_size: int) -> float:
    """AdamW's learning rate for a model of this width: ``LEARNING_RATE`` up to ``BASE_WIDTH``,
    then ``1 / width`` (muP's rule for Adam on hidden weights).

    Adam's first update moves every weight by about the learning rate, in a direction that
    lines up with the layer's input, so a layer's output moves by ~``lr * width``. At a fixed
    1e-3 a 2,048-wide model's loss jumped from 10.8 to 15.7 at the first step (H200,
    gpu_dense); on such a trajectory any numerics change (bf16) breaks the loss reference.
    """
    return LEARNING_RATE * min(1.0, BASE_WIDTH / max(int(hidden_size), 1))


def build_optimizer(model: nn.Module, impl: str, lr: float = LEARNING_RATE) -> torch.optim.Optimizer:
    """AdamW with fp32 master weights; for_loop / foreach / fused implementation."""
    kwargs = {"for_loop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}.get(impl)
    if kwargs is None:
        raise ValueError(f"optimizer_impl {impl!r} must be for_loop, foreach or fused")
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0}]
    if any(_is_dtensor(p) for p in decay + no_decay):
        # Tensor parallelism leaves some parameters whole (norms, a router): foreach and fused
        # kernels refuse a list mixing them with DTensors, so each kind gets its own group.
        groups = [{**g, "params": [p for p in g["params"] if _is_dtensor(p) == dt]}
                  for g in groups for dt in (True, False)]
        groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, **kwargs)


def _is_dtensor(p: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(p, DTensor)
