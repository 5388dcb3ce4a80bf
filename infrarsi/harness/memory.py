"""Peak memory per rank, and an emulated device capacity on CPU.

CUDA: the caching allocator's ``max_memory_allocated`` (reset after setup, so it is the peak of
the training steps with the model state resident) and the real ``torch.OutOfMemoryError``.

CPU: the torch profiler's memory events (``profile_memory=True``) from before the model is built
to the end of the warm-up steps. Their running sum is the bytes live since setup began (params,
grads, optimizer state and DDP buckets included); the peak is its maximum during the warm-up
steps. Measured steps are never profiled. Unlike RSS this does not depend on what ran earlier in
the process or on the allocator's caching. Only memory events and the warm-up steps' windows are
recorded: the operators' events (~75k of a cpu_dense warm-up's ~80k, which the profiler then
collected and the meter walked) are switched off with ``RecordFunction`` while it runs.

When the peak exceeds the emulated capacity every rank raises ``torch.OutOfMemoryError`` (the
class a GPU raises). Like a GPU it does not reveal how much memory the step would have needed:
the observation is right-censored at the capacity.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch._C._autograd import DeviceType, _enable_record_function
from torch.profiler import ProfilerActivity, profile, record_function

_STEP_TAG = "infrarsi_warmup_step"


class CpuMemoryMeter:
    """Profiles setup and warm-up steps; ``peak_bytes()`` after ``stop()``."""

    def __init__(self) -> None:
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._peak: int | None = None

    def start(self) -> None:
        self._prof.__enter__()
        # Memory events come from the allocator, not from RecordFunction: with it off on this
        # thread (and the autograd threads it starts, which inherit the setting) no operator is
        # recorded and the memory events are the same. Windows switch it on for their own event.
        _enable_record_function(False)
        self._windows: list[record_function] = []

    def open_window(self, index: int) -> None:
        """Warm-up step ``index`` begins (its window bounds the peak)."""
        _enable_record_function(True)
        try:
            rf = record_function(f"{_STEP_TAG}_{index}")
            rf.__enter__()
            self._windows.append(rf)
        finally:
            _enable_record_function(False)

    def close_window(self) -> None:
        _enable_record_function(True)
        try:
            self._windows.pop().__exit__(None, None, None)
        finally:
            _enable_record_function(False)

    @contextmanager
    def step(self, index: int):
        self.open_window(index)
        try:
            yield
        finally:
            self.close_window()

    def close(self) -> None:
        """Stop profiling without reading the events (after a failed warm-up step)."""
        if self._prof is not None:
            _enable_record_function(True)
            self._prof.__exit__(None, None, None)
            self._prof = None

    def stop(self) -> int:
        prof, self._prof = self._prof, None
        _enable_record_function(True)
        prof.__exit__(None, None, None)
        # One pass, each event's name read once (every accessor is a call into C++).
        cpu = DeviceType.CPU
        mem, windows = [], []
        for e in prof.profiler.kineto_results.events():
            name = e.name()
            if name == "[memory]":
                if e.device_type() == cpu:
                    mem.append((e.start_ns(), e.nbytes()))
            elif name.startswith(_STEP_TAG):
                windows.append((e.start_ns(), e.end_ns()))
        mem.sort()
        if not windows:
            raise RuntimeError("memory meter: no profiled warm-up step found")
        live, peak = 0, None
        lo, hi = min(w[0] for w in windows), max(w[1] for w in windows)
        for t, nbytes in mem:
            if t >= lo and peak is None:
                peak = live
            live += nbytes
            if lo <= t <= hi:
                peak = max(peak, live)
        self._peak = int(peak if peak is not None else live)
        return self._peak


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
