"""Backends execute one trial and return a TrialRecord: real torch jobs, table replay, simulator."""

from __future__ import annotations

from infrarsi.backends.base import Backend
from infrarsi.backends.simulator import SimulatorBackend
from infrarsi.backends.table import TableBackend

__all__ = ["Backend", "SimulatorBackend", "TableBackend"]
