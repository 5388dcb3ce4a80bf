"""The Backend seam: execute one trial of one config, return a TrialRecord.

Three backends share this interface: ``ray_train`` (real torch jobs), ``table`` (replays
measured runs) and ``simulator`` (an analytical GPU-cluster model). The searcher never knows
which one it talks to.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from infrarsi.space import Config, SearchSpace
from infrarsi.trial import HardwareFingerprint, TrialRecord, WorkloadSignature


class Backend(abc.ABC):
    """Executes trials for one workload on one kind of hardware.

    Contract for implementers:

    * ``space`` holds every knob this backend understands and its legality rules;
      :meth:`execute` refuses (``IllegalConfigError``) a config the space calls illegal.
    * :meth:`execute` never raises for a trial that ran and failed: OOM, crash, timeout and
      broken invariants come back as a record with that status and the cost spent.
    * ``objective`` is what the search maximizes, read from a record (default: tokens/s).
    * Records are self-describing: they carry ``workload`` and ``hardware``.
    """

    name: str = "backend"

    @property
    @abc.abstractmethod
    def space(self) -> SearchSpace: ...

    @property
    @abc.abstractmethod
    def workload(self) -> WorkloadSignature: ...

    @property
    @abc.abstractmethod
    def hardware(self) -> HardwareFingerprint: ...

    @abc.abstractmethod
    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                stop_slower_than_s: float | None = None) -> TrialRecord:
        """Run (or replay, or simulate) one trial of ``config``.

        ``stop_slower_than_s`` is the searcher's hint that a trial whose measured steps are all
        slower than this has a certain outcome: a backend that can end it sooner does (its
        record says so in ``extra["stopped_early"]``), one that cannot ignores the hint. A
        stopped trial is still a valid, loss-checked measurement of its config.
        """

    def with_measured_steps(self, steps: int) -> Backend | None:
        """This backend with trials that time ``steps`` measured steps (the verifier lengthens
        trials when the step-to-step jitter dominates the noise), or None when it cannot. Only
        the number of timed steps changes: warm-up, clock, loss check and per-step work stay."""
        return None

    def baseline_config(self) -> Config:
        """The config the user runs today; speedups are measured against it."""
        return self.space.defaults()

    def objective(self, record: TrialRecord) -> float | None:
        """Higher is better; None when the trial produced no measurement."""
        return record.tokens_per_s if record.ok else None

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release what the backend holds (processes, files). Idempotent."""
