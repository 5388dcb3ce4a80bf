"""The ray_train backend: real torch trials as Ray Train V2 TorchTrainer jobs."""

from __future__ import annotations

from infrarsi.backends.ray_train._priority import with_trial_priority
from infrarsi.backends.ray_train.backend import (
    RayTrainBackend,
    hardware_fingerprint,
    workload_signature,
)

__all__ = ["RayTrainBackend", "hardware_fingerprint", "with_trial_priority", "workload_signature"]
