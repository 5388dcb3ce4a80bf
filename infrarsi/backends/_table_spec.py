"""The YAML spec that maps a CSV of measured training runs onto knobs, outcomes and workloads.

A spec is data, not code: a table with other knobs (activation checkpointing, attention
kernel, sequence parallelism, ZeRO stage) needs only a new spec. See
``infrarsi/configs/tables/ultrascale.yaml`` (shipped with the package) for a commented example.
The CSV itself is not shipped: see :func:`resolve_csv_path`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi._home import ENV_DATA_DIR, data_dir
from infrarsi._strict import from_dict, load_yaml
from infrarsi.errors import ConfigError

__all__ = ["TableSpec", "load_table_spec", "resolve_csv_path"]

_KINDS = ("ordinal", "categorical", "bool")
_TYPES = ("int", "float", "str", "bool")
_DIRECTIONS = ("maximize", "minimize")
MEMORY_UNITS = {"bytes": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10,
                "MiB": 2**20, "GiB": 2**30}
ERROR_KINDS = ("timeout", "compile", "communication", "worker_lost", "patch", "crash")
# Measured columns a spec may hide from the records (``hide: [memory]``): to replay a table as
# the logs of a cluster that recorded ok/OOM but no peak memory.
HIDEABLE = ("memory",)


@dataclass(frozen=True)
class KnobSpec:
    """One knob column. ``searched: false`` marks a knob that follows from the others and the
    workload (e.g. data-parallel degree = devices / (tp * pp)); per-knob samplers do not draw it
    and the table resolves it from the measured rows. ``type`` is inferred when omitted; a
    column whose values do not share one type is refused. ``fill``: what a blank cell means
    (e.g. a setting the source states once for a whole table), for a column with gaps.
    ``values`` maps a cell's text to the knob value it means, in the vocabulary the physics and
    the priors read (e.g. ``{every_layer: full, disabled: none}`` for activation checkpointing,
    ``{1: full, 0: none}``); cells not named there are parsed as ``type``."""

    name: str
    column: str
    kind: str = "ordinal"
    type: str | None = None
    searched: bool = True
    fill: Any = None  # the value a blank cell reads as (None: a blank cell is refused)
    description: str = ""
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError(f"knob {self.name!r}: kind {self.kind!r} is not one of {_KINDS}")
        if self.type is not None and self.type not in _TYPES:
            raise ConfigError(f"knob {self.name!r}: type {self.type!r} is not one of {_TYPES}")


@dataclass(frozen=True)
class ObjectiveSpec:
    """The measured figure the search optimizes. ``per_device``: it is per device (tokens/s per
    GPU), so a record's tokens/s is this value times the workload's device count."""

    column: str
    direction: str = "maximize"
    unit: str = ""
    per_device: bool = False

    def __post_init__(self) -> None:
        if self.direction not in _DIRECTIONS:
            raise ConfigError(f"objective.direction {self.direction!r} is not one of {_DIRECTIONS}")


@dataclass(frozen=True)
class StatusSpec:
    """Which values of the status column mean ok, out-of-memory, or another error (value ->
    error kind)."""

    column: str
    ok: tuple[str, ...]
    oom: tuple[str, ...] = ()
    error: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for value, kind in self.error.items():
            if kind not in ERROR_KINDS:
                raise ConfigError(f"status.error.{value}: kind {kind!r} is not one of {ERROR_KINDS}")
        seen: dict[str, str] = {}
        for group, values in (("ok", self.ok), ("oom", self.oom), ("error", tuple(self.error))):
            for v in values:
                if v in seen:
                    raise ConfigError(f"status value {v!r} is mapped twice ({seen[v]} and {group})")
                seen[v] = group

    def outcome(self, value: str) -> str | None:
        if value in self.ok:
            return "ok"
        if value in self.oom:
            return "oom"
        return "error" if value in self.error else None


@dataclass(frozen=True)
class MemorySpec:
    column: str
    unit: str = "GB"

    def __post_init__(self) -> None:
        if self.unit not in MEMORY_UNITS:
            raise ConfigError(f"memory.unit {self.unit!r} is not one of {list(MEMORY_UNITS)}")


@dataclass(frozen=True)
class MappingSpec:
    """How one dataclass (WorkloadSignature or HardwareFingerprint) is built per workload:
    ``common`` fields, ``columns`` (field -> column read from the workload's rows) and
    ``lookup`` (column -> {column value -> fields})."""

    common: dict[str, Any] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    lookup: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialCostSpec:
    """The cost of one short trial. ``device_seconds = devices * (startup_s + (warmup_steps +
    measured_steps) * step_time_s)`` for a trial that ran; ``devices * startup_s`` for one that
    crashed or ran out of memory (it dies at its first step)."""

    startup_s: float = 60.0
    warmup_steps: int = 3
    measured_steps: int = 10


@dataclass(frozen=True)
class TableSpec:
    """A measured table: where the CSV is and what its columns mean. See module docstring.

    ``hide``: measured columns the records leave out (``[memory]``: ok/OOM labels only);
    ``skip_blank``: columns whose blank cell leaves the row out (a run the source lists
    without, e.g., its micro-batch or depth cannot be placed in the space)."""

    name: str
    csv: str
    knobs: tuple[KnobSpec, ...]
    objective: ObjectiveSpec
    status: StatusSpec
    workload_columns: tuple[str, ...]
    signature: MappingSpec
    hardware: MappingSpec
    memory: MemorySpec | None = None
    baseline: dict[str, Any] = field(default_factory=dict)
    trial_cost: TrialCostSpec = field(default_factory=TrialCostSpec)
    data_dir: str = ""  # relative to the spec file; "" : $INFRARSI_DATA_DIR (see resolve_csv_path)
    hide: tuple[str, ...] = ()
    skip_blank: tuple[str, ...] = ()
    description: str = ""
    source_file: str = ""

    def __post_init__(self) -> None:
        names = [k.name for k in self.knobs]
        if not names:
            raise ConfigError("knobs: a table needs at least one knob column")
        if len(set(names)) != len(names):
            raise ConfigError(f"knobs: duplicate knob names in {names}")
        if not self.workload_columns:
            raise ConfigError("workload_columns: name at least one column that identifies a workload")
        bad = set(self.hide) - set(HIDEABLE)
        if bad:
            raise ConfigError(f"hide: {sorted(bad)} cannot be hidden; hideable: {list(HIDEABLE)}")
        unknown = set(self.baseline) - set(names)
        if unknown:
            raise ConfigError(f"baseline: unknown knob(s) {sorted(unknown)}; knobs: {names}")

    def knob(self, name: str) -> KnobSpec:
        return next(k for k in self.knobs if k.name == name)

    def required_columns(self) -> dict[str, str]:
        """column -> the spec field that names it (for error messages)."""
        cols = {k.column: f"knobs[{i}].column ({k.name})" for i, k in enumerate(self.knobs)}
        cols[self.objective.column] = "objective.column"
        cols[self.status.column] = "status.column"
        if self.memory is not None:
            cols[self.memory.column] = "memory.column"
        for i, c in enumerate(self.workload_columns):
            cols[c] = f"workload_columns[{i}]"
        for i, c in enumerate(self.skip_blank):
            cols.setdefault(c, f"skip_blank[{i}]")
        for part, m in (("signature", self.signature), ("hardware", self.hardware)):
            for f_name, c in m.columns.items():
                cols.setdefault(c, f"{part}.columns.{f_name}")
            for c in m.lookup:
                cols.setdefault(c, f"{part}.lookup.{c}")
        return cols


def load_table_spec(path: str | Path) -> TableSpec:
    path = Path(path)
    spec = from_dict(TableSpec, load_yaml(path), source=str(path))
    object.__setattr__(spec, "source_file", str(path.resolve()))
    return spec


def resolve_csv_path(spec: TableSpec, override: str | Path | None = None) -> Path:
    """Where the CSV is: ``override`` (e.g. ``--csv``), else ``spec.csv`` if absolute or found
    relative to the spec file's folder, else under ``$INFRARSI_DATA_DIR`` when set, else under
    ``spec.data_dir`` relative to the spec file. Neither set: a ConfigError naming the variable
    (the tables are never looked for in a folder beside the checkout)."""
    if override is not None:
        return Path(override)
    csv = Path(spec.csv)
    if csv.is_absolute():
        return csv
    beside = Path(spec.source_file).parent / csv if spec.source_file else None
    if beside is not None and beside.is_file():  # a relative path reads from the spec's folder
        return beside.resolve()
    if os.environ.get(ENV_DATA_DIR, "").strip() or not spec.data_dir:
        base = data_dir(f"table {spec.name!r} ({csv.name})")
    else:
        here = Path(spec.source_file).parent if spec.source_file else Path.cwd()
        base = here / Path(spec.data_dir).expanduser()
    return (base / csv).resolve()
