"""Is the machine busy while doctor measures? Load, CPU steal, other processes, other GPU users.

Doctor's noise model is only as good as the machine it was measured on: repeats taken while
other jobs share the CPUs read slow and scattered (a user's doctor read 514, 551 and 360 ms for
a baseline init had measured at 243 ms). :class:`ContentionProbe` wraps the repeats and reports,
with figures:

* ``other_cores``: CPU seconds that processes *outside this process tree* (our own Ray head and
  trial workers are descendants of the driver) used during the repeats, per wall second, i.e.
  how many cores other work kept busy on average (``psutil``);
* ``steal``: the share of CPU time the hypervisor gave to other guests (``/proc/stat`` steal,
  via ``psutil.cpu_times``);
* ``load_per_core``: the 1-minute load average at the end over the logical cores;
* ``gpu_other_processes`` (GPU only, when ``pynvml`` is importable): compute processes on the
  GPUs that are not ours, with the device utilization.

``contended`` is true when other work kept at least ``BUSY_CORES`` of a core busy on average,
or steal reached ``BUSY_STEAL``, or another process used a GPU.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

__all__ = ["BUSY_CORES", "BUSY_STEAL", "ContentionProbe"]

BUSY_CORES = 0.5  # other processes' average CPU use, in cores, that makes a repeat unreliable
BUSY_STEAL = 0.05


def _ours() -> set[int]:
    me = psutil.Process()
    try:
        return {me.pid, *(p.pid for p in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def _cpu_by_pid() -> dict[int, float]:
    out = {}
    for p in psutil.process_iter(["cpu_times"]):
        t = p.info.get("cpu_times")
        if t is not None:
            out[p.pid] = t.user + t.system
    return out


class ContentionProbe:
    """``with ContentionProbe() as probe: ...`` then ``probe.summary()`` (the payload's
    ``contention``). Sample the process tree with :meth:`sample_ours` while the work runs:
    short-lived trial workers must be seen to be counted as ours."""

    def __init__(self) -> None:
        self._ours: set[int] = set()
        self._t0 = 0.0
        self._cpu0: dict[int, float] = {}
        self._sys0 = None
        self.result: dict[str, Any] = {}

    def __enter__(self) -> ContentionProbe:
        self._ours = _ours()
        self._t0 = time.monotonic()
        self._cpu0 = _cpu_by_pid()
        self._sys0 = psutil.cpu_times()
        return self

    def sample_ours(self) -> None:
        self._ours |= _ours()

    def __exit__(self, *exc: Any) -> None:
        self.sample_ours()
        wall = max(time.monotonic() - self._t0, 1e-9)
        cpu1 = _cpu_by_pid()
        other = sum(t - self._cpu0.get(pid, 0.0) for pid, t in cpu1.items()
                    if pid not in self._ours and t >= self._cpu0.get(pid, 0.0))
        sys1 = psutil.cpu_times()
        total = sum(sys1) - sum(self._sys0)
        steal = ((getattr(sys1, "steal", 0.0) - getattr(self._sys0, "steal", 0.0)) / total
                 if total > 0 else 0.0)
        cores = psutil.cpu_count() or 1
        load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self.result = contention_summary(other_cores=other / wall, steal=steal,
                                         load_per_core=None if load1 is None else load1 / cores,
                                         cores=cores, gpu=_gpu_others(self._ours))


def contention_summary(*, other_cores: float, steal: float, load_per_core: float | None,
                       cores: int, gpu: dict[str, Any] | None = None) -> dict[str, Any]:
    """The payload's ``contention`` from the measured figures (see the module docstring)."""
    busy_gpu = bool(gpu and gpu.get("other_processes"))
    contended = other_cores >= BUSY_CORES or steal >= BUSY_STEAL or busy_gpu
    parts = [f"other processes kept {other_cores:.2f} of {cores} cores busy",
             f"CPU steal {steal:.1%}"]
    if load_per_core is not None:
        parts.append(f"load average {load_per_core:.2f} per core")
    if busy_gpu:
        parts.append(f"{len(gpu['other_processes'])} other process(es) on the GPU "
                     f"(utilization {gpu.get('utilization', 0):.0%})")
    return {"contended": contended, "other_cores": other_cores, "steal": steal,
            "load_per_core": load_per_core, "cores": cores, "gpu": gpu,
            "summary": ", ".join(parts)}


def _gpu_others(ours: set[int]) -> dict[str, Any] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVIDIA driver: nothing to report
        return None
    try:
        others, util = [], []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            others += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                       if p.pid not in ours]
        return {"other_processes": others, "utilization": max(util, default=0.0)}
    finally:
        pynvml.nvmlShutdown()
