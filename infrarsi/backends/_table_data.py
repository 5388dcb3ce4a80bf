"""Read a measured table's CSV under its spec, refusing bad input with the row and column."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.backends._table_spec import MEMORY_UNITS, TableSpec
from infrarsi.errors import ConfigError

__all__ = ["Row", "read_rows", "workload_key"]

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


@dataclass(frozen=True)
class Row:
    """One measured run. ``line`` is its line number in the CSV (header = line 1)."""

    line: int
    workload: tuple[Any, ...]
    config: dict[str, Any]
    outcome: str  # ok | oom | error
    status_value: str
    objective: float | None
    memory_bytes: int | None
    raw: dict[str, str]


def workload_key(spec: TableSpec, values: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(values[c] for c in spec.workload_columns)


def _parse(text: str, type_: str) -> Any:
    """Parse one cell as ``type_``; raise ValueError when it does not fit."""
    if type_ == "int":
        f = float(text)
        if not f.is_integer():
            raise ValueError(text)
        return int(f)
    if type_ == "float":
        return float(text)
    if type_ == "bool":
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(text)
    return text


def _infer_type(column: str, cells: list[tuple[int, str]]) -> str:
    for type_ in ("int", "float", "bool"):
        try:
            for _, c in cells:
                _parse(c, type_)
            return type_
        except ValueError:
            continue
    numeric = [(ln, c) for ln, c in cells if _is_number(c)]
    if numeric and len(numeric) < len(cells):
        ln_num, num = numeric[0]
        ln_txt, txt = next((ln, c) for ln, c in cells if not _is_number(c))
        raise ConfigError(
            f"column {column!r} mixes types: line {ln_num} has the number {num!r}, line {ln_txt} "
            f"has the text {txt!r}; fix the CSV or declare the knob's type in the spec"
        )
    return "str"


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _fill(knob) -> str:
    """A blank knob cell: the knob's ``fill`` as text (parsed like the column), else blank."""
    if knob.fill is None:
        return ""
    return str(knob.fill).lower() if isinstance(knob.fill, bool) else str(knob.fill)


def _parse_knob_column(spec: TableSpec, name: str, cells: list[tuple[int, str]]) -> list[Any]:
    k = spec.knob(name)
    aliases = k.values
    plain = [(ln, c) for ln, c in cells if c not in aliases]
    type_ = k.type or (_infer_type(k.column, plain) if plain else "str")
    out = []
    for line, text in cells:
        if text in aliases:
            out.append(aliases[text])
            continue
        try:
            out.append(_parse(text, type_))
        except ValueError:
            raise ConfigError(
                f"{spec.csv}: line {line}, column {k.column!r} (knob {name!r}): {text!r} is not "
                f"a {type_}; the column mixes types. Fix the row or the knob's type in the spec"
            ) from None
    return out


def read_rows(spec: TableSpec, path: Path) -> list[Row]:
    """Every row of the CSV, typed and classified; refuses a spec that does not fit the CSV."""
    if not path.is_file():
        raise ConfigError(
            f"table {spec.name!r}: CSV {path} not found; set INFRARSI_DATA_DIR to the folder "
            f"holding {Path(spec.csv).name} or pass csv_path="
        )
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        raw_rows = [(i + 2, r) for i, r in enumerate(reader)]
    for column, where in spec.required_columns().items():
        if column not in header:
            raise ConfigError(
                f"{spec.source_file or spec.name}: {where} names column {column!r}, which {path.name} "
                f"does not have; its columns are {header}"
            )
    if spec.skip_blank:
        raw_rows = [(ln, r) for ln, r in raw_rows if all(r[c].strip() for c in spec.skip_blank)]
    knob_values = {
        k.name: _parse_knob_column(spec, k.name, [(ln, r[k.column].strip() or _fill(k))
                                                  for ln, r in raw_rows])
        for k in spec.knobs
    }
    wl_types = {c: _infer_type(c, [(ln, r[c].strip()) for ln, r in raw_rows]) for c in spec.workload_columns}
    rows = []
    for i, (line, r) in enumerate(raw_rows):
        rows.append(_make_row(spec, line, r, {n: v[i] for n, v in knob_values.items()}, wl_types))
    return rows


def _make_row(spec: TableSpec, line: int, r: dict[str, str], config: dict[str, Any],
              wl_types: dict[str, str]) -> Row:
    value = r[spec.status.column].strip()
    outcome = spec.status.outcome(value)
    if outcome is None:
        raise ConfigError(
            f"{spec.csv}: line {line}, column {spec.status.column!r}: status value {value!r} is not "
            f"mapped; add it to status.ok, status.oom or status.error in the spec"
        )
    objective = memory = None
    if outcome == "ok":
        text = r[spec.objective.column].strip()
        try:
            objective = float(text)
        except ValueError:
            raise ConfigError(
                f"{spec.csv}: line {line}, column {spec.objective.column!r}: an ok row needs a "
                f"numeric objective, got {text!r}"
            ) from None
        if not math.isfinite(objective) or objective <= 0:
            raise ConfigError(
                f"{spec.csv}: line {line}, column {spec.objective.column!r}: objective {text!r} "
                "must be a positive finite number on an ok row"
            )
        if (spec.memory is not None and "memory" not in spec.hide
                and r[spec.memory.column].strip()):
            memory = int(round(float(r[spec.memory.column]) * MEMORY_UNITS[spec.memory.unit]))
    workload = tuple(_parse(r[c].strip(), wl_types[c]) for c in spec.workload_columns)
    return Row(line, workload, config, outcome, value, objective, memory, dict(r))
