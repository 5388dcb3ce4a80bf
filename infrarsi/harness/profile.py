"""The phase profile of one extra, unmeasured training step (doctor asks for it).

``train_worker`` runs this step only when the payload says ``"profile": True``, and only after
the measured steps and the loss reference, so measured steps are never perturbed. The step runs
under ``torch.profiler`` (CPU activities; CUDA too on a GPU) with ``infrarsi::<phase>`` labels
that the harness's step loop puts around data, forward, backward and optimizer work, then a
barrier (``infrarsi::barrier``: time a rank waits for the slowest one).

Every instant of the step window is attributed to exactly one phase, so the phases sum to the
step (:func:`attribute_phases`), in this order of precedence:

``idle`` (the closing barrier) > ``host_sync`` (``aten::item``, ``aten::_local_scalar_dense``,
``aten::nonzero``, ``cudaStreamSynchronize``) > ``communication`` (collective time not hidden
behind compute: a collective in flight while the main thread, or on a GPU every compute
kernel, is idle) > ``data`` / ``forward`` / ``backward`` / ``optimizer`` (the labels) >
``other`` (the rest: Python between labels, the loss bookkeeping).

Collectives that run while compute runs count as *overlapped* communication
(``comm_overlapped_s``), not as a phase.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

__all__ = ["PHASES", "Event", "attribute_phases", "memory_breakdown", "no_phase", "profile_step"]

LABEL = "infrarsi::"
STEP, BARRIER = f"{LABEL}step", f"{LABEL}barrier"
LABELLED = ("data", "forward", "backward", "optimizer")
PHASES = ("forward", "backward", "optimizer", "communication", "data", "host_sync", "idle",
          "other")
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::nonzero", "cudaStreamSynchronize")
_COMM_KEYS = ("gloo:", "nccl", "c10d::", "all_reduce", "allreduce", "all_gather", "allgather",
              "reduce_scatter", "all_to_all", "alltoall", "broadcast", "record_param_comms")

Interval = tuple[int, int]


@dataclass(frozen=True)
class Event:
    """One profiler event: name, thread id, start and end in ns, and whether it ran on a GPU."""

    name: str
    thread: int
    start: int
    end: int
    device: bool = False


def no_phase(name: str):
    """The step loop's label when nothing is profiled: free."""
    return _NULL


_NULL = nullcontext()


def labelled(name: str):
    return record_function(f"{LABEL}{name}")


# ---- interval arithmetic ------------------------------------------------------------------
def _union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[list[int]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _minus(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    out = []
    for lo, hi in a:
        cur = lo
        for blo, bhi in b:
            if bhi <= cur or blo >= hi:
                continue
            if blo > cur:
                out.append((cur, blo))
            cur = max(cur, bhi)
        if cur < hi:
            out.append((cur, hi))
    return out


def _clip(a: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    return _union((max(x, lo), min(y, hi)) for x, y in a)


def _length(a: Iterable[Interval]) -> int:
    return sum(y - x for x, y in a)


def is_comm(name: str) -> bool:
    n = name.lower()
    return "barrier" not in n and any(k in n for k in _COMM_KEYS)


# ---- attribution --------------------------------------------------------------------------
def attribute_phases(events: Sequence[Event]) -> dict[str, Any]:
    """Seconds per phase of the profiled step (summing to ``step_s``) and communication figures.

    ``events`` must hold one ``infrarsi::step`` label; its thread is the main thread.
    """
    steps = [e for e in events if e.name == STEP]
    if not steps:
        raise ValueError("no infrarsi::step label among the profiler events")
    main = steps[0]
    lo, hi = main.start, main.end
    on_main = [e for e in events if e.thread == main.thread and not e.device]
    barrier = _clip(((e.start, e.end) for e in on_main if e.name == BARRIER), lo, hi)
    sync = _minus(_clip(((e.start, e.end) for e in on_main if e.name in SYNC_OPS), lo, hi), barrier)
    comm_all = _minus(_clip(((e.start, e.end) for e in events if is_comm(e.name)), lo, hi), barrier)
    device = any(e.device for e in events)
    compute = [(e.start, e.end) for e in events
               if not e.name.startswith(LABEL) and not is_comm(e.name) and e.name not in SYNC_OPS
               and (e.device if device else e.thread == main.thread)]
    busy = _clip(compute, lo, hi)
    exposed = _minus(_minus(comm_all, busy), sync)
    taken = _union([*barrier, *sync, *exposed])
    out = {"idle": _length(barrier), "host_sync": _length(sync), "communication": _length(exposed)}
    for phase in LABELLED:
        spans = _clip(((e.start, e.end) for e in on_main if e.name == f"{LABEL}{phase}"), lo, hi)
        own = _minus(spans, taken)
        out[phase] = _length(own)
        taken = _union([*taken, *own])
    out["other"] = (hi - lo) - _length(taken)
    total_comm = _length(comm_all)
    return {
        "step_s": (hi - lo) / 1e9,
        "phases_s": {p: out[p] / 1e9 for p in PHASES},
        "comm_total_s": total_comm / 1e9,
        "comm_overlapped_s": (total_comm - out["communication"]) / 1e9,
        "timeline": "device kernels" if device else "host (CPU) threads",
        "sync_ops": {n: sum(1 for e in on_main if e.name == n and lo <= e.start <= hi)
                     for n in SYNC_OPS},
    }


def _events(prof) -> list[Event]:
    out = []
    for e in prof.profiler.kineto_results.events():
        dev = str(e.device_type()).upper().endswith("CUDA")
        out.append(Event(e.name(), -1 if dev else e.start_thread_id(), e.start_ns(), e.end_ns(), dev))
    return out


# ---- memory -------------------------------------------------------------------------------
def _bytes(t: torch.Tensor) -> int:
    t = getattr(t, "_local_tensor", t)  # an FSDP2 DTensor: this rank's shard
    return t.numel() * t.element_size()


def memory_breakdown(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any],
                     peak_bytes: int | None) -> dict[str, int | None]:
    """Bytes of parameters, gradients, optimizer state and DDP buckets on this rank; activations
    (and the rest) as the peak minus those, when the peak is known."""
    params = sum(_bytes(p) for p in model.parameters())
    grads = sum(_bytes(p) for p in model.parameters() if p.requires_grad)
    state = sum(_bytes(v) for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    ddp = type(model).__name__ == "DistributedDataParallel"
    buckets = grads if ddp and not config.get("gradient_as_bucket_view") else 0
    rest = None if peak_bytes is None else max(int(peak_bytes) - params - grads - state - buckets, 0)
    return {"params": params, "grads": grads, "optimizer_state": state, "ddp_buckets": buckets,
            "activations_and_other": rest, "peak": None if peak_bytes is None else int(peak_bytes)}


# ---- the profiled step ---------------------------------------------------------------------
def profile_step(step: Callable[[Callable], Any], device: torch.device) -> dict[str, Any]:
    """Run ``step(phase)`` once under the profiler and attribute its time.

    On a GPU each phase label ends with a device synchronize (this step is not measured), so the
    host-side labels cover the device work they launched.
    """
    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def phase(name: str):
        return _SyncedLabel(name) if cuda else labelled(name)

    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        dist.barrier()
    with profile(activities=acts) as prof:
        with record_function(STEP):
            step(phase)
            if cuda:
                torch.cuda.synchronize(device)
            with record_function(BARRIER):
                if distributed:
                    dist.barrier()
    return attribute_phases(_events(prof))


class _SyncedLabel:
    def __init__(self, name: str) -> None:
        self._rf = labelled(name)

    def __enter__(self):
        return self._rf.__enter__()

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        return self._rf.__exit__(*exc)
