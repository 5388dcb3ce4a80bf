"""The task contract: the spec a user writes and the contract ``infrarsi init`` locks."""

from __future__ import annotations

from infrarsi.contract.contract import CONTRACT_FILE, Contract, frozen_paths, lock
from infrarsi.contract.init import init_task, resolve_run_dir
from infrarsi.contract.spec import TaskSpec, load_task

__all__ = ["CONTRACT_FILE", "Contract", "TaskSpec", "frozen_paths", "init_task", "load_task", "lock",
           "resolve_run_dir"]
