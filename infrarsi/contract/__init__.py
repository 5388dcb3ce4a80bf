"""The task contract: the spec a user writes and the contract ``infrarsi init`` locks."""

from __future__ import annotations

from infrarsi.contract.spec import TaskSpec, load_task

__all__ = ["TaskSpec", "load_task"]
