"""The task contract: the spec a user writes and the contract ``infrarsi init`` locks."""

from __future__ import annotations

from infrarsi.contract.contract import CONTRACT_FILE, Contract, frozen_paths, lock
from infrarsi.contract.spec import TaskSpec, load_task
from infrarsi.rundir import resolve_run_dir

__all__ = ["CONTRACT_FILE", "Contract", "TaskSpec", "frozen_paths", "load_task", "lock",
           "resolve_run_dir"]
