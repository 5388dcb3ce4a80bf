"""The workload interface for a user's own training code (an adapter module in their workspace).

A task whose YAML gives no ``workload.shape`` names, in ``workload.entry``, a small module of
the user's workspace that defines four functions (the user's own model, data and loss; the
harness keeps the clock, the accumulation loop, the loss check and the work per step)::

    build_model() -> torch.nn.Module             # or build_model(ctx); built on the trial's device
    batches(ctx) -> Iterator[batch]              # this rank's micro-batches, in order, forever
    loss(model, batch) -> scalar torch.Tensor    # the mean loss of one micro-batch
    tokens(batch) -> int                         # tokens (or samples) in one micro-batch

and optionally::

    blocks(model) -> nn.ModuleList | nn.Sequential   # the repeated blocks (checkpointing, compile,
                                                     # FSDP); found automatically when absent
    optimizer(model, impl: dict) -> torch.optim.Optimizer   # pass **impl (foreach/fused) on

A ``batch`` is anything the user's loss reads: a tensor, a tuple/list or a dict of tensors (the
harness moves its tensors to the device). ``ctx`` is a :class:`DataContext`: ``ctx.shard(b)``
cuts a *global* batch into this rank's micro-batches, so a pipeline that draws step ``s``'s
global batch from ``ctx.generator(s)`` gives the same data for every number of workers and
micro-batch size, which is what lets the loss reference hold across configs.

Everything the user's functions do (their data loading included, as its own ``data`` phase)
is inside each measured step.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from infrarsi.errors import WorkloadError

REQUIRED = {"build_model": (0, 1), "batches": (1, 1), "loss": (2, 2), "tokens": (1, 1)}
OPTIONAL = {"blocks": (1, 1), "optimizer": (2, 2)}
_USAGE = {
    "build_model": "def build_model() -> torch.nn.Module (or build_model(ctx))",
    "batches": "def batches(ctx) -> Iterator[batch] (this rank's micro-batches; "
               "`yield from ctx.shard(global_batch)`)",
    "loss": "def loss(model, batch) -> torch.Tensor (a scalar: the micro-batch's mean loss)",
    "tokens": "def tokens(batch) -> int (tokens or samples in the micro-batch)",
    "blocks": "def blocks(model) -> nn.ModuleList (the repeated blocks)",
    "optimizer": "def optimizer(model, impl) -> torch.optim.Optimizer (pass **impl on)",
}


def is_adapter(module: Any) -> bool:
    """True when ``module`` follows the adapter interface (it defines ``batches`` or ``loss``)."""
    return any(callable(getattr(module, n, None)) for n in ("batches", "loss"))


def _positional_range(fn: Any) -> tuple[int, int | None]:
    """(required, maximum) positional parameters of ``fn``; maximum None for ``*args``."""
    params = inspect.signature(fn).parameters.values()
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in pos if p.default is p.empty)
    var = any(p.kind is p.VAR_POSITIONAL for p in params)
    return required, None if var else len(pos)


def check_adapter(module: Any, where: str) -> None:
    """Raise :class:`WorkloadError` naming every missing or mis-signed adapter function."""
    problems = []
    for name, (lo, hi) in {**REQUIRED, **OPTIONAL}.items():
        fn = getattr(module, name, None)
        if fn is None:
            if name in REQUIRED:
                problems.append(f"it does not define {name}: add `{_USAGE[name]}`")
            continue
        if not callable(fn):
            problems.append(f"{name} is a {type(fn).__name__}, not a function: `{_USAGE[name]}`")
            continue
        req, most = _positional_range(fn)
        if req > hi or (most is not None and most < lo):
            got = str(inspect.signature(fn))
            problems.append(f"{name}{got} takes the wrong arguments: it must be `{_USAGE[name]}`")
    if problems:
        raise WorkloadError(f"the workload adapter {where} does not fit the interface: "
                            + "; ".join(problems))


def call_build_model(module: Any, ctx: DataContext) -> nn.Module:
    fn = module.build_model
    model = fn(ctx) if _positional_range(fn)[0] == 1 else fn()
    if not isinstance(model, nn.Module):
        raise WorkloadError(
            f"build_model returned a {type(model).__name__}, not a torch.nn.Module; return your "
            "model instance (`return MyModel(...)`)"
        )
    return model


@dataclass(frozen=True)
class DataContext:
    """What a user's ``batches(ctx)`` (and ``build_model(ctx)``) may read about the trial."""

    rank: int
    world_size: int
    micro_batch_size: int
    global_batch_size: int
    seed: int

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch_size // self.world_size

    def generator(self, step: int) -> torch.Generator:
        """A CPU generator seeded by (seed, step): draw step ``step``'s global batch from it."""
        return torch.Generator().manual_seed(int(self.seed) * 1_000_003 + int(step))

    def shard(self, global_batch: Any) -> Iterator[Any]:
        """This rank's micro-batches of ``global_batch`` (rows on dim 0 of every tensor)."""
        n = batch_rows(global_batch)
        if n != self.global_batch_size:
            raise WorkloadError(
                f"ctx.shard got a global batch of {n} rows, the task locks global_batch_size "
                f"{self.global_batch_size}; draw exactly ctx.global_batch_size rows per step "
                "(or change workload.global_batch_size in the task YAML and re-run init)"
            )
        lo = self.rank * self.per_rank_batch
        for i in range(lo, lo + self.per_rank_batch, self.micro_batch_size):
            yield _slice(global_batch, i, i + self.micro_batch_size)


def _slice(batch: Any, lo: int, hi: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[lo:hi]
    if isinstance(batch, dict):
        return {k: _slice(v, lo, hi) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_slice(v, lo, hi) for v in batch)
    return batch


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (tuple, list)):
        return [t for v in batch for t in _tensors(v)]
    return []


def batch_rows(batch: Any) -> int:
    """Rows (dim 0) of the batch's first tensor."""
    ts = _tensors(batch)
    if not ts or ts[0].dim() == 0:
        raise WorkloadError(
            f"a batch must hold at least one tensor with a batch dimension; got "
            f"{type(batch).__name__}. Yield a tensor, a tuple/list or a dict of tensors"
        )
    return int(ts[0].shape[0])


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def fingerprint(batch: Any) -> list[tuple[tuple[int, ...], float]]:
    """Shapes and sums of a batch's tensors: equal for equal data (the determinism check)."""
    return [(tuple(t.shape), float(t.double().sum())) for t in _tensors(batch)]


# ---- the repeated blocks --------------------------------------------------------------------
def find_blocks(model: nn.Module, module: Any = None) -> nn.Module | None:
    """The container of the model's repeated blocks: the adapter's ``blocks(model)`` when it
    has one, else the largest ``ModuleList``/``Sequential`` whose children (two or more) all have
    one type (a transformer's layer list). None when the model has no such container."""
    hook = getattr(module, "blocks", None) if module is not None else None
    if callable(hook):
        found = hook(model)
        if not isinstance(found, (nn.ModuleList, nn.Sequential)):
            raise WorkloadError(
                f"blocks(model) returned a {type(found).__name__}; return the nn.ModuleList (or "
                "nn.Sequential) that holds the repeated blocks, e.g. `return model.h`"
            )
        return found
    best, best_params = None, -1
    for m in model.modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            kinds = {type(c) for c in m}
            size = sum(p.numel() for p in m.parameters())
            if len(kinds) == 1 and size > best_params:
                best, best_params = m, size
    return best


def require_blocks(blocks: nn.Module | None, knob: str) -> nn.Module:
    if blocks is None:
        raise WorkloadError(
            f"{knob} wraps the model's repeated blocks, but none were found (no ModuleList or "
            "Sequential of two or more same-type modules); define `def blocks(model): return "
            "model.<your layer list>` in the adapter, or exclude the knob (search.exclude_knobs)"
        )
    return blocks


# ---- shape read from the model --------------------------------------------------------------
_HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead")


def read_shape(model: nn.Module, blocks: nn.Module | None) -> dict[str, int]:
    """Parameter count (measured), layers (blocks), width, heads and vocabulary where found."""
    out = {"num_params": sum(p.numel() for p in model.parameters()),
           "num_layers": len(blocks) if blocks is not None else 0,
           "hidden_size": 0, "num_heads": 0, "vocab_size": 0}
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    if embeddings:
        # The token embedding: the one an output head projects back to (a language model's
        # head), else the first (position embeddings come after it by convention).
        outs = {m.out_features for m in model.modules() if isinstance(m, nn.Linear)}
        tok = next((e for e in embeddings if e.num_embeddings in outs), embeddings[0])
        out["vocab_size"], out["hidden_size"] = int(tok.num_embeddings), int(tok.embedding_dim)
    if not out["hidden_size"]:
        first = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
        out["hidden_size"] = int(first.in_features) if first is not None else 0
    cfg = getattr(model, "config", None)
    for obj in [model, cfg, *model.modules()]:
        for attr in _HEAD_ATTRS:
            v = getattr(obj, attr, None)
            if isinstance(v, int) and v > 0:
                out["num_heads"] = v
                break
        if out["num_heads"]:
            break
    if not out["num_heads"]:
        mha = next((m for m in model.modules() if isinstance(m, nn.MultiheadAttention)), None)
        out["num_heads"] = int(mha.num_heads) if mha is not None else 0
    return out


def flops_per_token(shape: dict[str, int], seq_len: int) -> float:
    """MFU FLOPs per token (PaLM appendix B): 6 x (parameters less the embedding) + 12 L H T."""
    active = shape["num_params"] - shape["vocab_size"] * shape["hidden_size"]
    return float(6 * max(active, 0) + 12 * shape["num_layers"] * shape["hidden_size"] * seq_len)


# ---- the entry contract, checked in the driver before any trial -----------------------------
def _to_meta(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to("meta")
    if isinstance(batch, dict):
        return {k: _to_meta(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_meta(v) for v in batch)
    return batch


def probe(module: Any, *, global_batch_size: int, micro_batch_size: int, seed: int,
          world_size: int = 1) -> dict[str, Any]:
    """Check an adapter against its contract without training, and read its shape.

    The model is built on the meta device (no memory, no compute); the first micro-batches of
    rank 0 are drawn twice from fresh ``batches(ctx)`` iterators (the data must not depend on
    anything but ``ctx``); the loss runs once on meta copies (shapes only). Raises
    :class:`WorkloadError` naming the problem and its fix.
    """
    ctx = DataContext(0, world_size, micro_batch_size, global_batch_size, seed)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = call_build_model(module, ctx)
    blocks = find_blocks(model, module)
    shape = read_shape(model, blocks)
    first, again = iter(module.batches(ctx)), iter(module.batches(ctx))
    draws = []
    for _ in range(2):
        try:
            draws.append((next(first), next(again)))
        except StopIteration:
            raise WorkloadError("batches(ctx) yielded fewer than two micro-batches; make it an "
                                "endless generator over your data") from None
    batch = draws[0][0]
    rows = batch_rows(batch)
    if rows != micro_batch_size:
        raise WorkloadError(
            f"batches(ctx) yielded a micro-batch of {rows} rows, but the baseline's "
            f"micro_batch_size is {micro_batch_size} (global_batch_size {global_batch_size}); "
            "size each micro-batch by ctx.micro_batch_size, or draw the global batch of "
            "ctx.global_batch_size rows and `yield from ctx.shard(global_batch)`")
    for a, b in draws:
        if fingerprint(a) != fingerprint(b):
            raise WorkloadError(
                "batches(ctx) yields different data each time it is called with the same ctx: "
                "the loss reference cannot be reproduced. Draw every random choice from a "
                "generator seeded by the context, e.g. `g = ctx.generator(step)` and "
                "`torch.randint(..., generator=g)` (not the global torch/numpy/random state), "
                "and shuffle a DataLoader with `generator=ctx.generator(0)`")
    n = entry_tokens(module, batch)
    try:
        loss = module.loss(model, _to_meta(batch))
    except NotImplementedError:
        loss = None  # an op without a meta kernel: the first trial step checks the loss
    except Exception as e:  # noqa: BLE001 - any failure here is the forward/loss misfit
        raise WorkloadError(
            f"loss(model, batch) failed on the first micro-batch with {type(e).__name__}: "
            f"{str(e)[:500]}. The model's forward does not return what your loss expects, or "
            "the batch is not what the forward takes: call the model in loss() the way your "
            "own training loop does (e.g. `logits = model(x); return "
            "F.cross_entropy(logits.flatten(0, 1), y.flatten())`)") from e
    if loss is not None and (not isinstance(loss, torch.Tensor) or loss.dim() != 0):
        got = (f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor)
               else f"a {type(loss).__name__}")
        raise WorkloadError(
            f"loss(model, batch) returned {got}; it must return a scalar tensor (the "
            "micro-batch's mean loss: reduce it with .mean(), and return the tensor, not .item())")
    seq_len = n // rows
    tokens_per_step = n * (global_batch_size // micro_batch_size)
    return {**shape, "seq_len": seq_len, "tokens_per_step": tokens_per_step,
            "flops_per_token": flops_per_token(shape, seq_len),
            "blocks": type(blocks[0]).__name__ if blocks is not None else None}


def entry_tokens(module: Any, batch: Any) -> int:
    n = module.tokens(batch)
    if isinstance(n, torch.Tensor) and n.numel() == 1:
        n = int(n.item())
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise WorkloadError(
            f"tokens(batch) returned {n!r}; it must return a positive int (the tokens, or "
            "samples, in the micro-batch, e.g. `return batch[1].numel()`)")
    return n
