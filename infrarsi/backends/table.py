"""Table backend: replays a CSV of measured training runs; a query returns only what was measured.

The spec (``configs/tables/*.yaml``) maps columns to knobs, the objective, the status and the
workload. One table holds many workloads; a backend serves one of them. Its search space is
exactly the workload's distinct measured configs (``SearchSpace(allowed=...)``): a config the
table never measured is illegal. A query of a config measured several times returns one of its
rows at random (the run-to-run noise is real), drawn from the backend's seeded generator.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from infrarsi._strict import from_dict
from infrarsi.backends._table_data import Row, read_rows, workload_key
from infrarsi.backends._table_spec import TableSpec, load_table_spec, resolve_csv_path
from infrarsi.backends.base import Backend
from infrarsi.errors import ConfigError
from infrarsi.space import Config, Knob, SearchSpace, config_key
from infrarsi.trial import (
    ErrorKind,
    HardwareFingerprint,
    TrialRecord,
    TrialStatus,
    WorkloadSignature,
)

__all__ = ["TableBackend", "TableSpec", "load_table_spec"]

SpecLike = TableSpec | str | Path


def _spec(spec: SpecLike) -> TableSpec:
    return spec if isinstance(spec, TableSpec) else load_table_spec(spec)


_ROWS_CACHE: dict[tuple[str, float, str], tuple[Row, ...]] = {}


def _rows(spec: TableSpec, csv_path: str | Path | None) -> tuple[Row, ...]:
    """The parsed rows, cached per (file, mtime, spec) so 27 workloads parse the CSV once."""
    path = resolve_csv_path(spec, csv_path)
    key = (str(path), path.stat().st_mtime if path.is_file() else 0.0, repr(spec))
    if key not in _ROWS_CACHE:
        _ROWS_CACHE[key] = tuple(read_rows(spec, path))
    return _ROWS_CACHE[key]


class TableBackend(Backend):
    """Replay of one workload of a measured table. Build it with :meth:`from_spec`.

    Records: an ok row gives ``step_times_s`` = ``measured_steps`` copies of
    ``tokens_per_step / tokens_per_s`` (tokens/s = objective x devices when the objective is per
    device), ``peak_memory_bytes`` = the measured memory (when the table has it), and the exact
    measured objective in ``extra["objective"]`` (what :meth:`objective` returns). An OOM row gives
    status OOM, no peak, ``memory_censor_bytes`` = the device capacity. An error row gives status
    ERROR with the kind the spec maps. Cost: see ``TrialCostSpec`` (startup + warm-up + measured
    steps at the measured step time, times the devices; startup only for a failed trial).
    """

    name = "table"

    def __init__(self, spec: TableSpec, workload: Mapping[str, Any], rows: list[Row], *,
                 seed: int | None = 0) -> None:
        if not rows:
            raise ConfigError(f"table {spec.name!r}: workload {dict(workload)} has no rows")
        self.spec = spec
        self.workload_values = dict(workload)
        self._rows = rows
        self._by_key: dict[str, list[Row]] = {}
        for r in rows:
            self._by_key.setdefault(config_key(r.config), []).append(r)
        self._signature = _build(WorkloadSignature, spec.signature, rows[0], spec, "signature")
        self._hardware = _build(HardwareFingerprint, spec.hardware, rows[0], spec, "hardware")
        if not spec.signature.common.get("name") and "name" not in spec.signature.columns:
            self._signature = replace(self._signature, name=self.workload_name)
        self._space = self._build_space()
        self._rng = random.Random(seed)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: SpecLike, workload: Mapping[str, Any], *, seed: int | None = 0,
                  csv_path: str | Path | None = None) -> TableBackend:
        """The backend for one workload, e.g. ``workload={"model": "1B", "nodes": 1}``."""
        spec = _spec(spec)
        missing = set(spec.workload_columns) - set(workload)
        extra = set(workload) - set(spec.workload_columns)
        if missing or extra:
            raise ConfigError(
                f"table {spec.name!r}: a workload is given by exactly the columns "
                f"{list(spec.workload_columns)}; got {dict(workload)}"
            )
        rows_all = _rows(spec, csv_path)
        want = workload_key(spec, workload)
        rows = [r for r in rows_all if r.workload == want]
        if not rows:
            known = ", ".join(str(w) for w in cls.workloads(spec, csv_path=csv_path))
            raise ConfigError(
                f"table {spec.name!r}: workload {dict(workload)} has no rows in the CSV; "
                f"known workloads: {known}"
            )
        return cls(spec, workload, rows, seed=seed)

    @staticmethod
    def workloads(spec: SpecLike, *, csv_path: str | Path | None = None) -> list[dict[str, Any]]:
        """Every workload of the table, in first-appearance order."""
        spec = _spec(spec)
        seen: dict[tuple, dict[str, Any]] = {}
        for r in _rows(spec, csv_path):
            seen.setdefault(r.workload, dict(zip(spec.workload_columns, r.workload, strict=True)))
        return list(seen.values())

    def _build_space(self) -> SearchSpace:
        configs = [self._by_key[k][0].config for k in self._by_key]
        baseline = self._pick_baseline(configs)
        knobs = []
        for k in self.spec.knobs:
            values = tuple(sorted({c[k.name] for c in configs}, key=_sort_key))
            knobs.append(Knob(k.name, values, baseline[k.name], kind=k.kind,
                              description=k.description))
        _warn_unread(self.spec, knobs)
        return SearchSpace(tuple(knobs), allowed=tuple(configs))

    def _pick_baseline(self, configs: list[Config]) -> Config:
        """The measured config closest to the spec's ``baseline`` preferences (earlier keys
        weigh more), among configs that ran ok when any did: the user's baseline runs today."""
        ok_keys = {config_key(r.config) for r in self._rows if r.outcome == "ok"}
        pool = [c for c in configs if config_key(c) in ok_keys] or configs
        prefs = list(self.spec.baseline.items())
        return min(pool, key=lambda c: tuple(_distance(c[n], v) for n, v in prefs))

    # ---- the Backend seam --------------------------------------------------------------
    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def workload(self) -> WorkloadSignature:
        return self._signature

    @property
    def hardware(self) -> HardwareFingerprint:
        return self._hardware

    @property
    def workload_name(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.workload_values.items())

    @property
    def searched_knobs(self) -> tuple[str, ...]:
        """Knobs a per-knob sampler draws; the others follow from them (see :meth:`resolve`)."""
        return tuple(k.name for k in self.spec.knobs if k.searched)

    def reseed(self, seed: int | None) -> None:
        """Reset the generator that picks among duplicate rows."""
        self._rng = random.Random(seed)

    def execute(self, config: Mapping[str, Any], *, trial_id: str | None = None,
                stop_slower_than_s: float | None = None) -> TrialRecord:
        """Replay a measured row (``stop_slower_than_s`` is ignored: the row ran to its end)."""
        config = self.space.normalize(config)  # raises IllegalConfigError if never measured
        rows = self._by_key[config_key(config)]
        row = rows[self._rng.randrange(len(rows))] if len(rows) > 1 else rows[0]
        return self.record(row, trial_id or f"table-{self._rng.getrandbits(32):08x}")

    def objective(self, record: TrialRecord) -> float | None:
        if not record.ok:
            return None
        if "objective" in record.extra:
            return float(record.extra["objective"])
        return super().objective(record)

    def maximize(self) -> bool:
        return self.spec.objective.direction == "maximize"

    # ---- table-specific ----------------------------------------------------------------
    def resolve(self, partial: Mapping[str, Any], rng: random.Random | None = None) -> Config | None:
        """The measured config that agrees with ``partial`` on every knob it names, or None.
        When several do (e.g. a derived knob differs in a few rows), one is drawn with ``rng``
        (first in table order without one)."""
        matches = [c for c in self.space.allowed
                   if all(c.get(k) == v for k, v in partial.items())]
        if not matches:
            return None
        if len(matches) == 1 or rng is None:
            return dict(matches[0])
        return dict(matches[rng.randrange(len(matches))])

    def best_objective(self) -> float | None:
        """The best measured objective of an ok row (the reference for 'fraction of best')."""
        vals = [r.objective for r in self._rows if r.outcome == "ok"]
        if not vals:
            return None
        return max(vals) if self.maximize() else min(vals)

    def records(self) -> list[TrialRecord]:
        """Every measured row as a record (e.g. experience for other workloads' searches)."""
        return [self.record(r, f"{self.spec.name}:{self.workload_name}:line{r.line}")
                for r in self._rows]

    def record(self, row: Row, trial_id: str) -> TrialRecord:
        hw, cost = self._hardware, self.spec.trial_cost
        devices = hw.num_devices
        tokens = self._signature.tokens_per_step
        common = dict(trial_id=trial_id, config=dict(row.config), backend=self.name,
                      workload=self._signature, hardware=hw,
                      memory_capacity_bytes=hw.memory_bytes or None, tokens_per_step=tokens,
                      startup_seconds=cost.startup_s,
                      extra={"table": self.spec.name, "csv_line": row.line,
                             "status_value": row.status_value})
        if row.outcome != "ok":
            status = TrialStatus.OOM if row.outcome == "oom" else TrialStatus.ERROR
            kind = ErrorKind(self.spec.status.error[row.status_value]) if status is TrialStatus.ERROR else None
            return TrialRecord(status=status, error_kind=kind,
                               error_message=f"measured status {row.status_value!r}",
                               memory_censor_bytes=(hw.memory_bytes or None) if status is TrialStatus.OOM else None,
                               device_seconds=devices * cost.startup_s,
                               wall_seconds=cost.startup_s, **common)
        tok_s = row.objective * devices if self.spec.objective.per_device else row.objective
        if self.spec.objective.direction == "minimize":  # objective is a time per step
            step = row.objective
        else:
            step = tokens / tok_s if tokens else 1.0 / tok_s
        wall = cost.startup_s + (cost.warmup_steps + cost.measured_steps) * step
        common["extra"]["objective"] = row.objective
        return TrialRecord(status=TrialStatus.OK, step_times_s=(step,) * cost.measured_steps,
                           peak_memory_bytes=(row.memory_bytes,) if row.memory_bytes else None,
                           device_seconds=devices * wall, wall_seconds=wall, **common)


_WARNED: set[tuple[str, str, str]] = set()


def _warn_unread(spec: TableSpec, knobs: list[Knob]) -> None:
    """Warn (once per spec and knob) about knob values the physics reads as the default."""
    from infrarsi.models.physics import unread_values

    for k in knobs:
        bad = unread_values(k.name, k.values)
        key = (spec.source_file or spec.name, k.name, repr(bad))
        if bad and key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"{spec.source_file or spec.name}: knob {k.name!r} has value(s) {bad} that the "
                "physics and the priors do not understand (read as the knob's default); map them "
                f"with an alias, e.g. values: {{{bad[0]}: full}} for checkpointing every layer",
                UserWarning, stacklevel=3)


def _sort_key(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def _distance(a: Any, b: Any) -> float:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if a > 0 and b > 0:
            return abs(math.log2(a) - math.log2(b))
        return abs(a - b)
    return 0.0 if a == b else 1.0


def _build(cls, m, row: Row, spec: TableSpec, part: str):
    data = dict(m.common)
    for f_name, column in m.columns.items():
        data[f_name] = _coerce(row.raw[column])
    for column, table in m.lookup.items():
        value = row.raw[column].strip()
        if value not in table:
            raise ConfigError(
                f"{spec.source_file or spec.name}: {part}.lookup.{column} has no entry for "
                f"{value!r} (line {row.line}); add one"
            )
        data.update(table[value])
    try:
        return from_dict(cls, data, source=spec.source_file or spec.name, path=part)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a spec author's typo, reported with the part
        raise ConfigError(f"{spec.source_file or spec.name}: {part}: {e}") from None


def _coerce(text: str) -> Any:
    t = text.strip()
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            continue
    return t
