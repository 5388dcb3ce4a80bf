"""A backend that searches verified source patches as bool knobs, jointly with launch knobs.

:class:`PatchedBackend` wraps the run's backend: its space is the launch space plus one bool
knob ``patch:<id>`` per verified patch (default off: the baseline is the unpatched code) and a
rule per pair of patches that do not apply together. A config with patches on runs in the
cached, isolated copy of the workspace with those patches applied (:func:`workspace_for`,
built where the trial runs: the Tune trial process, or the driver for verification), after its
frozen files are re-hashed against the contract. The record keeps the full config (patch knobs
included) and says in ``extra`` which patches it ran and in which workspace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from infrarsi.backends.base import Backend
from infrarsi.patches import (
    DiffError,
    Patch,
    Scope,
    enabled_patches,
    patch_knobs,
    workspace_for,
)
from infrarsi.patches._workspace import check_frozen
from infrarsi.patches.knobs import conflict_rules
from infrarsi.space import Config, SearchSpace, launch_knobs
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

Conflict = tuple[str, str, str]  # (patch id, patch id, why they do not apply together)


def launch_part(config: Mapping[str, Any]) -> Config:
    """The config without its patch knobs (what the wrapped backend understands)."""
    return launch_knobs(config)


class PatchedBackend(Backend):
    """``inner``'s space plus patch knobs; ``factory(workspace)`` builds the backend that runs a
    config in a patched workspace (one per distinct patch set, kept)."""

    def __init__(self, inner: Backend, patches: Sequence[Patch], *, base_workspace: Path,
                 scope: Scope, factory: Callable[[Path], Backend],
                 conflicts: Sequence[Conflict] = (), cache: Path | None = None) -> None:
        self.inner = inner
        self.patches = list(patches)
        self.name = inner.name
        self.base_workspace = Path(base_workspace)
        self.scope = scope
        self.factory = factory
        self.conflicts = [tuple(c) for c in conflicts]
        self.cache = cache
        self._space = inner.space.with_knobs(patch_knobs(self.patches), conflict_rules(self.conflicts))
        self._backends: dict[str, Backend] = {}

    @classmethod
    def ray_train(cls, inner: Any, patches: Sequence[Patch], *, conflicts: Sequence[Conflict] = (),
                  cache: Path | None = None) -> PatchedBackend:
        """Around a :class:`RayTrainBackend`: patched configs run with ``workspace=`` the copy."""
        from infrarsi.backends.ray_train import RayTrainBackend

        contract = inner.contract
        scope = Scope.from_contract(contract) if contract is not None else Scope.from_spec(inner.spec)

        def factory(ws: Path) -> Backend:
            return RayTrainBackend(inner.spec, contract=contract, workspace=ws,
                                   local_mode=inner.local_mode, storage_path=inner.storage_path,
                                   profile=inner.profile,
                                   fresh_processes=getattr(inner, "fresh_processes", False),
                                   pool_name=getattr(inner, "pool_name", None),
                                   untrusted_code=True)  # proposed patches: never reused

        return cls(inner, patches, base_workspace=inner.workspace, scope=scope, factory=factory,
                   conflicts=conflicts, cache=cache)

    # ---- the Backend seam -------------------------------------------------------------
    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def workload(self) -> WorkloadSignature:
        return self.inner.workload

    @property
    def hardware(self) -> HardwareFingerprint:
        return self.inner.hardware

    def baseline_config(self) -> Config:
        return self._space.normalize(self.inner.baseline_config())

    def objective(self, record: TrialRecord) -> float | None:
        return self.inner.objective(record)

    def close(self) -> None:
        for b in self._backends.values():
            b.close()
        self._backends.clear()
        self.inner.close()

    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                stop_slower_than_s: float | None = None) -> TrialRecord:
        config = self._space.normalize(config)  # IllegalConfigError: conflicting patches never run
        on = enabled_patches(config, self.patches)
        launch = launch_part(config)
        if not on:
            rec = self.inner.execute(launch, trial_id=trial_id, stop_slower_than_s=stop_slower_than_s)
            return replace(rec, config=config, extra={**rec.extra, "patches": []})
        ids = [p.id for p in on]
        t0 = time.time()
        try:
            ws = workspace_for(config, self.base_workspace, self.patches, self.scope, cache=self.cache)
        except (DiffError, OSError) as e:
            return self._failed(config, trial_id, t0, TrialStatus.ERROR,
                                f"patch(es) {', '.join(ids)} could not be materialized: {e}", ids)
        problem = check_frozen(ws, self.scope, self.base_workspace)
        if problem:
            return self._failed(config, trial_id, t0, TrialStatus.REJECTED,
                                f"patched workspace {ws} breaks the contract: {problem}", ids)
        backend = self._backends.get(str(ws))
        if backend is None:
            backend = self._backends[str(ws)] = self.factory(ws)
        rec = backend.execute(launch, trial_id=trial_id, stop_slower_than_s=stop_slower_than_s)
        return replace(rec, config=config, extra={**rec.extra, "patches": ids, "workspace": str(ws)})

    def _failed(self, config: Config, trial_id: str | None, t0: float, status: TrialStatus,
                message: str, ids: list[str]) -> TrialRecord:
        return TrialRecord(
            trial_id=trial_id or f"patch-{int(t0)}", config=config, status=status,
            backend=self.name, workload=self.workload, hardware=self.hardware,
            error_kind=ErrorKind.PATCH if status is TrialStatus.ERROR else None,
            error_message=message, wall_seconds=time.time() - t0, extra={"patches": ids})
