"""Trials run at the driver's own CPU priority, not below it.

Ray starts its worker processes at niceness 15 (``RayConfig::worker_niceness``) so that its own
daemons stay responsive. For a timing harness that is wrong on any shared machine: under the
kernel's fair scheduler a nice-15 process gets about 1/30 of a core against one normal process,
so a single busy core elsewhere turned the 2-worker CPU reference baseline from 0.15-0.31 s
into 2.0-2.9 s per step, and every trial measured the other process's load instead of the config.
Ray Jobs' own drivers opt out the same way (``RAY_worker_niceness=0`` in the job's runtime
environment); workers then keep the niceness of the raylet, i.e. of the driver that started it
(a user's ``nice infrarsi run`` still applies to every trial).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRIAL_PRIORITY_ENV", "with_trial_priority"]

# Ray reads this worker environment variable when it starts a worker process for the job.
TRIAL_PRIORITY_ENV = {"RAY_worker_niceness": "0"}


def with_trial_priority(runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """``runtime_env`` (for ``ray.init``) whose workers, and every task and actor they start
    (Tune trials, Ray Train workers, the warm pool), run at the driver's priority. Works for a
    local Ray and for one joined through ``RAY_ADDRESS``; an explicit value is kept."""
    env = dict(runtime_env or {})
    env["env_vars"] = {**TRIAL_PRIORITY_ENV, **(env.get("env_vars") or {})}
    return env
