"""The experience bank: every trial kept, shared across runs, GPU types and clusters.

``ExperienceBank.open(url)`` gives a SQLite file (default ``$INFRARSI_HOME/bank.sqlite``, see :mod:`infrarsi._home`) or a
PostgreSQL bank. Bundles (``export``/``import_bundle``) share experience between banks that
cannot share a database; :mod:`infrarsi.bank.transfer` turns experience from one device into
seeds and priors for another.
"""

from __future__ import annotations

from infrarsi.bank._codec import HARDWARE_WEIGHTS, WORKLOAD_WEIGHTS
from infrarsi.bank._engine import ENV_URL, default_url
from infrarsi.bank._experience import ExperienceBank
from infrarsi.bank._heartbeat import TrialHeartbeat
from infrarsi.bank._schema import SCHEMA_VERSION
from infrarsi.bank._types import (
    BaselineEntry,
    Finding,
    Neighbour,
    PatchEntry,
    Promotion,
    RunInfo,
    SignatureMatch,
)

__all__ = [
    "ENV_URL",
    "HARDWARE_WEIGHTS",
    "SCHEMA_VERSION",
    "WORKLOAD_WEIGHTS",
    "BaselineEntry",
    "ExperienceBank",
    "Finding",
    "Neighbour",
    "PatchEntry",
    "Promotion",
    "RunInfo",
    "SignatureMatch",
    "TrialHeartbeat",
    "default_url",
]
