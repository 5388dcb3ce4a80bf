"""InfraRSI: make an existing PyTorch LLM training job faster without changing what it computes.

The stages, as Python (see :mod:`infrarsi.api`)::

    infrarsi.init(task) -> infrarsi.doctor(run_dir) -> infrarsi.run(run_dir, budget=12)
    -> infrarsi.report(run_dir) -> infrarsi.apply(run_dir)

Importing ``infrarsi`` loads none of them (torch and Ray load on first use), so the command
line starts fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that holds it; loaded on first access (PEP 562)
_LAZY = {
    "init": "infrarsi.api", "run": "infrarsi.api",
    "InitResult": "infrarsi.api", "DoctorResult": "infrarsi.api", "RunOutcome": "infrarsi.api",
    "ReportResult": "infrarsi.api", "ApplyResult": "infrarsi.api",
    # stage packages that are callable: infrarsi.doctor(...) runs the stage
    "doctor": None, "report": None, "apply": None,
    # the second way in: the user's own loop (infrarsi.harness.own_loop)
    "prepare": "infrarsi.harness.own_loop", "step": "infrarsi.harness.own_loop",
}

__all__ = ["ApplyResult", "DoctorResult", "InitResult", "ReportResult", "RunOutcome",
           "__version__", "apply", "doctor", "init", "prepare", "report", "run", "step"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'infrarsi' has no attribute {name!r}")
    module = _LAZY[name]
    if module is None:
        return importlib.import_module(f"infrarsi.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
