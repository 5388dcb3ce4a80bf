"""Peak memory per rank, and an emulated device capacity on CPU.

CUDA: the caching allocator's ``max_memory_allocated`` (reset after setup, so it is the peak of
the training steps with the model state resident) and the real ``torch.OutOfMemoryError``.

CPU: the torch profiler's memory events (``profile_memory=True``), in two short sessions that
keep the profiler away from every step before and inside the measured window:

1. the model build (``start`` .. ``pause``): the bytes the build leaves live (parameters,
   buffers, DDP buckets, FSDP shards), counted from before the build began;
2. one extra *metered step* after every measured step, off the clock (``step``): the running
   sum of its allocations and frees gives its peak above what was live when it began.

What was live when the metered step began is the build's bytes plus what the steps since
allocated and kept: the optimizer's state (created by the first optimizer step), counted from
its tensors' storages (``held_state_bytes``). Every later step frees what it allocates (the
gradients are set to None, activations die with the step), so a steady-state step's peak is
this sum plus the metered step's rise; it is never below the first step's, which allocates the
same state while its gradients are live, without the state resident during forward and
backward. Unlike RSS this does not depend on what ran earlier in the process or on the
allocator's caching. Only memory events and the metered step's window are recorded: operator
events are switched off with ``RecordFunction`` while a session runs.

When the peak exceeds the emulated capacity every rank raises ``torch.OutOfMemoryError`` (the
class a GPU raises) and the trial reports no step time. Like a GPU it does not reveal how much
memory the step would have needed: the observation is right-censored at the capacity.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch._C._autograd import DeviceType, _enable_record_function
from torch.profiler import ProfilerActivity, profile, record_function

_STEP_TAG = "infrarsi_metered_step"


def _profiler() -> profile:
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


def _events(prof: profile) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(time-sorted CPU memory events as (ns, bytes), step windows as (start ns, end ns))."""
    cpu = DeviceType.CPU
    mem, windows = [], []
    for e in prof.profiler.kineto_results.events():  # each name read once: every accessor
        name = e.name()                               # is a call into C++
        if name == "[memory]":
            if e.device_type() == cpu:
                mem.append((e.start_ns(), e.nbytes()))
        elif name.startswith(_STEP_TAG):
            windows.append((e.start_ns(), e.end_ns()))
    mem.sort()
    return mem, windows


def held_state_bytes(optimizer: Any) -> int:
    """Bytes of ``optimizer``'s state tensors on the CPU, one count per storage (a wrapper's
    ``.optimizer`` is followed; a DTensor counts its local shard)."""
    opt = getattr(optimizer, "optimizer", optimizer)
    seen: set[int] = set()
    total = 0
    for state in getattr(opt, "state", {}).values():
        for v in state.values() if isinstance(state, dict) else ():
            if not torch.is_tensor(v):
                continue
            t = getattr(v, "_local_tensor", v)
            if t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


class CpuMemoryMeter:
    """``start()`` before the model build, ``pause()`` after it; later, ``with step(i, held)``
    around one extra step off the clock; then ``peak_bytes()``."""

    def __init__(self) -> None:
        self._prof: profile | None = None
        self._built: int | None = None
        self._peak: int | None = None

    def _enter(self) -> None:
        self._prof = _profiler()
        self._prof.__enter__()
        # Memory events come from the allocator, not from RecordFunction: with it off on this
        # thread (and the autograd threads it starts, which inherit the setting) no operator is
        # recorded and the memory events are the same. The step's window switches it on for its
        # own event.
        _enable_record_function(False)

    def _exit(self) -> profile:
        prof, self._prof = self._prof, None
        _enable_record_function(True)
        prof.__exit__(None, None, None)
        return prof

    def start(self) -> None:
        """The model build begins."""
        self._enter()

    def pause(self) -> int:
        """The build is done: the bytes it left live (the metered step adds to them)."""
        mem, _ = _events(self._exit())
        self._built = sum(n for _, n in mem)
        return self._built

    @contextmanager
    def step(self, index: int, held_bytes: int = 0):
        """Meter the step run inside: its peak plus what was live when it began (the build's
        bytes and ``held_bytes``, allocated since the build and still held: the optimizer's
        state)."""
        if self._built is None:
            raise RuntimeError("memory meter: step() before start() and pause() around the build")
        self._enter()
        _enable_record_function(True)
        try:
            window = record_function(f"{_STEP_TAG}_{index}")
            window.__enter__()
        finally:
            _enable_record_function(False)
        try:
            yield
        finally:
            _enable_record_function(True)
            window.__exit__(None, None, None)
            prof = self._exit()
        mem, windows = _events(prof)
        if not windows:
            raise RuntimeError("memory meter: the metered step's window was not recorded")
        lo, hi = windows[0]
        live = rise = 0
        for t, nbytes in mem:
            if lo <= t <= hi:
                live += nbytes
                rise = max(rise, live)
        self._peak = self._built + int(held_bytes) + rise

    def peak_bytes(self) -> int:
        if self._peak is None:
            raise RuntimeError("memory meter: no metered step yet")
        return self._peak

    def close(self) -> None:
        """Stop a session left open by a failure (idempotent)."""
        if self._prof is not None:
            self._exit()


def raise_if_over_capacity(peak_bytes: int, capacity_bytes: int | None) -> None:
    """Emulate a device OOM on every rank when any rank's peak exceeds the capacity."""
    if capacity_bytes is None:
        return
    over = torch.tensor([1 if peak_bytes > capacity_bytes else 0], dtype=torch.int64)
    ranks = [0] if over.item() else []
    if dist.is_available() and dist.is_initialized():
        flags = [torch.zeros_like(over) for _ in range(dist.get_world_size())]
        dist.all_gather(flags, over)
        ranks = [r for r, f in enumerate(flags) if f.item()]
    if ranks:
        raise torch.OutOfMemoryError(
            f"emulated device out of memory: the training step on rank(s) {ranks} needs more "
            f"than the emulated capacity of {capacity_bytes} bytes "
            f"({capacity_bytes / 2**30:.3f} GiB) per worker (CPU emulation of a GPU's memory; "
            "the true peak is not reported)"
        )
