"""The training harness (outside the editable scope, frozen by the contract).

It owns the clock, the synthetic data, the loss, the memory measurement (and its emulation on
CPU) and the mechanism behind each launch knob. ``train_worker(payload)`` runs one trial on one
rank; ``model_stats(task)`` counts a workload's parameters and FLOPs per token.
"""

from __future__ import annotations

from infrarsi.harness.mechanisms import CompileFailure
from infrarsi.harness.stats import model_stats
from infrarsi.harness.train import train_worker

__all__ = ["CompileFailure", "model_stats", "train_worker"]
