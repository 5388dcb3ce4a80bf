"""The harness-owned step clock: a cross-rank barrier, a device sync, then ``perf_counter``.

Patches cannot touch this file (it is outside the editable scope and frozen by the contract).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class StepClock:
    """Marks step boundaries; every mark waits for all ranks and for the device to finish."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.marks: list[float] = []
        self.wall_marks: list[float] = []
        self._gaps: set[int] = set()  # indices of marks that start a new interval

    def mark(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        self.marks.append(t)
        self.wall_marks.append(time.time())
        return t

    def restart(self) -> float:
        """Mark a new start: the time since the last mark belongs to no step (harness work
        between steps, such as the early-stop decision, is kept off every step's clock)."""
        self._gaps.add(len(self.marks))
        return self.mark()

    def durations(self) -> list[float]:
        return [b - a for i, (a, b) in enumerate(zip(self.marks, self.marks[1:], strict=False))
                if i + 1 not in self._gaps]
