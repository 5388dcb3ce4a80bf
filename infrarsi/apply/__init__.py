"""The apply stage (``infrarsi apply``): the promoted config and verified patches as one
commit on a new branch of the user's repository; the current branch is never touched.
The package is callable: ``infrarsi.apply(run_dir, ...)`` is ``apply_run``."""

from __future__ import annotations

from infrarsi._stage_package import make_callable
from infrarsi.apply._git import ApplyRefusedError
from infrarsi.apply.stage import CONFIG_DIR, ApplyResult, apply_run, commit_message

__all__ = ["CONFIG_DIR", "ApplyRefusedError", "ApplyResult", "apply_run", "commit_message"]

make_callable(__name__, "infrarsi.apply.stage", "apply_run")
