"""An analytical model of LLM training on GPU clusters (dense and MoE), calibrated on
measured runs, behind the Backend seam."""

from __future__ import annotations

from infrarsi.backends.simulator.backend import COMPILE_FAILURES, SimOutcome, SimulatorBackend
from infrarsi.backends.simulator.hardware import GPU, GPUS, Cluster
from infrarsi.backends.simulator.models import MODELS, ModelShape
from infrarsi.backends.simulator.params import SimParams, load_params
from infrarsi.backends.simulator.space import SimulatorSpace, build_space
from infrarsi.backends.simulator.workloads import BUILTIN_WORKLOADS, SimWorkload

__all__ = [
    "BUILTIN_WORKLOADS",
    "COMPILE_FAILURES",
    "GPU",
    "GPUS",
    "MODELS",
    "Cluster",
    "ModelShape",
    "SimOutcome",
    "SimParams",
    "SimWorkload",
    "SimulatorBackend",
    "SimulatorSpace",
    "build_space",
    "load_params",
]
