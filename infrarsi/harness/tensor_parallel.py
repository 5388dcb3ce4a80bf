"""Tensor (and sequence) parallelism of any decoder, its plan derived from its linear layers.

``tensor_parallel_plan(model, sequence_parallel)`` reads roles off an ``nn.Module`` (a user's
model as well as the reference one), the way Megatron-LM and torchtitan lay a decoder out:

- a *projection group* is a module with two or more ``nn.Linear`` children where the last one
  registered (the output projection, e.g. ``wo``, ``w2``, ``down_proj``) maps back to the width
  the others read: the others are column-parallel (``ColwiseParallel``), the output projection
  row-parallel (``RowwiseParallel``), so each group costs one all-reduce forward and backward;
- a fused input projection (``wqkv``: out = 3 x the output projection's input) is column-sharded
  per chunk: its rows are permuted so that every rank's shard holds its heads of q, k and v;
- head counts (``num_heads``, ``n_heads``, ``num_kv_heads``, ...) of a group module are divided
  by the degree, as torchtitan does, so the attention reshapes its local heads;
- outside the blocks (``model.layers``), the token embedding is row-parallel (vocab-sharded) and
  the output head column-parallel with its logits gathered (the loss sees full logits);
- with ``sequence_parallel``: every norm is ``SequenceParallel`` (activations sharded on the
  sequence between blocks' mixers), each mixer (attention, MLP) gathers its input and the
  output projections reduce-scatter back to sequence shards.

A module outside any group (an MoE router, a norm without sequence parallelism) keeps its
parameters whole on every rank; its inputs are identical there, so are its gradients.

Model contract (the one torchtitan asks of its models): a projection group's ``forward`` splits
fused outputs with ``chunk`` and reshapes heads from the local tensor (``view(B, T, heads, hd)``
with the module's head count, ``reshape(B, T, -1)``), never from the full hidden width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from infrarsi.errors import IllegalConfigError

__all__ = ["ProjectionGroup", "apply_tensor_parallel", "projection_groups", "tensor_parallel_plan"]

HEAD_ATTRS = ("num_heads", "n_heads", "n_local_heads", "num_kv_heads", "n_kv_heads",
              "num_key_value_heads", "n_local_kv_heads")


@dataclass
class ProjectionGroup:
    """Column-parallel inputs and a row-parallel output inside one module (by dotted path)."""

    path: str
    inputs: list[str]
    output: str
    fused: dict[str, int] = field(default_factory=dict)  # input name -> chunks it fuses

    def fqn(self, child: str) -> str:
        return f"{self.path}.{child}" if self.path else child


def _is_norm(m: nn.Module) -> bool:
    return isinstance(m, (nn.LayerNorm, nn.RMSNorm)) or type(m).__name__.endswith("Norm")


def _linears(m: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, c) for n, c in m.named_children() if isinstance(c, nn.Linear)]


def projection_groups(model: nn.Module) -> list[ProjectionGroup]:
    """Every projection group inside ``model.layers`` (see the module docstring)."""
    groups = []
    for path, mod in model.layers.named_modules(prefix="layers"):
        lins = _linears(mod)
        if len(lins) < 2:
            continue
        out_name, out = lins[-1]
        ins = [(n, c) for n, c in lins[:-1] if c.in_features == out.out_features]
        if len(ins) != len(lins) - 1:
            continue  # not an in -> out pair (e.g. two unrelated projections)
        fused = {}
        for n, c in ins:
            if c.out_features != out.in_features:
                if c.out_features % out.in_features:
                    raise IllegalConfigError(
                        f"{path}.{n}: {c.out_features} outputs are neither the {out.in_features} "
                        f"inputs of {path}.{out_name} nor a multiple of them, so its tensor-parallel "
                        "split cannot be derived; give the model separate projections or set "
                        "tensor_parallel_degree=1")
                fused[n] = c.out_features // out.in_features
        groups.append(ProjectionGroup(path, [n for n, _ in ins], out_name, fused))
    return groups


def _mixers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The non-norm children of each block that hold linear layers (attention, MLP, MoE)."""
    out = []
    for i, block in enumerate(model.layers):
        for n, c in block.named_children():
            if not _is_norm(c) and any(isinstance(m, nn.Linear) for m in c.modules()):
                out.append((f"layers.{i}.{n}", c))
    return out


def tensor_parallel_plan(model: nn.Module, sequence_parallel: bool = False) -> dict:
    """The ``parallelize_module`` plan (dotted name -> ParallelStyle) of ``model``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    seq = Shard(1)
    plan: dict = {}
    groups = {g.path: g for g in projection_groups(model)}
    for g in groups.values():
        for n in g.inputs:
            plan[g.fqn(n)] = ColwiseParallel()
        plan[g.fqn(g.output)] = RowwiseParallel()
    for name, m in model.named_children():
        if name == "layers":
            continue
        for sub, c in m.named_modules(prefix=name):
            if isinstance(c, nn.Embedding):
                plan[sub] = RowwiseParallel(input_layouts=Replicate(),
                                            output_layouts=seq if sequence_parallel else Replicate())
            elif isinstance(c, nn.Linear):
                plan[sub] = ColwiseParallel(input_layouts=seq if sequence_parallel else Replicate(),
                                            output_layouts=Replicate())
            elif sequence_parallel and _is_norm(c):
                plan[sub] = SequenceParallel()
    if not sequence_parallel:
        return plan
    for path, m in model.layers.named_modules(prefix="layers"):
        if _is_norm(m):
            plan[path] = SequenceParallel()
    for path, _ in _mixers(model):
        if path in groups:  # its own output projection reduce-scatters to sequence shards
            plan[path] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                            use_local_output=True)
            plan[groups[path].fqn(groups[path].output)] = RowwiseParallel(output_layouts=seq)
        else:  # e.g. MoE: the output is whole on every rank, keep this rank's sequence shard
            plan[path] = PrepareModuleInputOutput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_input=True,
                output_layouts=(Replicate(), None), desired_output_layouts=(seq, None))
    return plan


def _permute_fused(linear: nn.Linear, chunks: int, tp: int) -> None:
    """Reorder a fused projection's rows [c0 | c1 | ...] so rank r's contiguous shard is
    [c0_r | c1_r | ...]: column sharding then gives each rank its own heads of every chunk."""
    with torch.no_grad():
        for name in ("weight", "bias"):
            p = getattr(linear, name)
            if p is None:
                continue
            rows = p.shape[0]
            p.copy_(p.reshape(chunks, tp, rows // (chunks * tp), *p.shape[1:])
                    .transpose(0, 1).reshape(p.shape))


def unpermute_fused(t: torch.Tensor, chunks: int, tp: int) -> torch.Tensor:
    """The inverse of the fused-row permutation (for checksums against an unsharded run)."""
    rows = t.shape[0]
    return t.reshape(tp, chunks, rows // (chunks * tp), *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def apply_tensor_parallel(model: nn.Module, tp_mesh, sequence_parallel: bool = False
                          ) -> dict[str, int]:
    """Parallelize ``model`` in place over ``tp_mesh``; returns the fused parameters
    (name -> chunks) whose rows were permuted. Raises ``IllegalConfigError`` when a head count
    or a width does not divide by the degree."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    fused_params: dict[str, int] = {}
    for g in projection_groups(model):
        group_mod = model.get_submodule(g.path)
        for n in g.inputs + [g.output]:
            lin = group_mod.get_submodule(n)
            width = lin.in_features if n == g.output else lin.out_features // g.fused.get(n, 1)
            if width % tp:
                raise IllegalConfigError(
                    f"{g.fqn(n)}: width {width} does not divide by tensor_parallel_degree {tp}; "
                    "pick a degree that divides the model's hidden and MLP widths")
        for attr in HEAD_ATTRS:
            heads = getattr(group_mod, attr, None)
            if isinstance(heads, int):
                if heads % tp:
                    raise IllegalConfigError(
                        f"{g.path}.{attr} = {heads} does not divide by tensor_parallel_degree {tp}; "
                        "pick a degree that divides the number of attention heads")
                setattr(group_mod, attr, heads // tp)
        for n, chunks in g.fused.items():
            _permute_fused(group_mod.get_submodule(n), chunks, tp)
            fused_params[f"{g.fqn(n)}.weight"] = chunks
    parallelize_module(model, tp_mesh, tensor_parallel_plan(model, sequence_parallel))
    return fused_params
