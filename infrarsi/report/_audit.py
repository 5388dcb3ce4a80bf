"""Audit facts: frozen files re-hashed now, fingerprints, and the commands that reproduce."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.contract.contract import frozen_paths, sha256_file
from infrarsi.report._data import ReportData
from infrarsi.space import is_patch_knob


@dataclass(frozen=True)
class FrozenCheck:
    key: str
    locked: str
    current: str  # "" when missing or not checkable
    status: str  # unchanged | CHANGED | MISSING | NEW | unchecked


def recheck_frozen(data: ReportData) -> list[FrozenCheck]:
    """Every frozen file's hash at lock time next to its hash now."""
    try:
        current = frozen_paths(data.spec)
    except Exception as e:  # noqa: BLE001 - a moved workspace: say so per file
        return [FrozenCheck(k, v, "", f"unchecked ({e})") for k, v in sorted(data.contract.frozen_files.items())]
    out = []
    for key, digest in sorted(data.contract.frozen_files.items()):
        path = current.get(key)
        if path is None or not path.is_file():
            out.append(FrozenCheck(key, digest, "", "MISSING"))
            continue
        now = sha256_file(path)
        out.append(FrozenCheck(key, digest, now, "unchanged" if now == digest else "CHANGED"))
    for key in sorted(set(current) - set(data.contract.frozen_files)):
        out.append(FrozenCheck(key, "", sha256_file(current[key]), "NEW"))
    return out


def task_path(data: ReportData, relative_to: Path | None = None) -> str:
    """The task spec file this contract came from, when it can be found; else ``TASK.yaml``."""
    base = data.contract.task.get("base_dir") or ""
    name = data.task_name
    for cand in (Path(base) / f"{name}.yaml", Path(base) / f"{name}.yml"):
        if cand.is_file():
            try:
                return str(cand.resolve().relative_to((relative_to or Path.cwd()).resolve()))
            except ValueError:
                return str(cand)
    return "TASK.yaml"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def trial_command(data: ReportData, config: dict[str, Any] | None, *,
                  relative_to: Path | None = None, run_dir: bool = True,
                  patches: bool = True) -> str:
    """``infrarsi trial`` for the baseline (``config`` None) or a config's changed knobs.

    ``patches=False`` leaves out ``patch:<id>`` knobs (for a tree where they are applied)."""
    head = ["infrarsi", "trial", task_path(data, relative_to)]
    head += ["--run-dir", str(data.run_dir)] if run_dir else []
    head = " ".join(shlex.quote(x) for x in head)
    sets = [f"--set {shlex.quote(f'{k}={_value(a)}')}" for k, (_, a) in sorted(data.changed(config).items())
            if patches or not is_patch_knob(k)]
    return " \\\n    ".join([head, *sets])


def fingerprints(data: ReportData) -> list[tuple[str, str]]:
    info = data.run_info
    rows: list[tuple[str, str]] = [("run", data.run_id), ("bank", data.bank_url)]
    if info is None:
        return rows
    hw, sw, wl = info.hardware, info.software, info.workload
    rows += [
        ("hardware", f"{hw.device_name}, {hw.num_nodes} node(s) x {hw.devices_per_node} device(s), "
                     f"{hw.memory_bytes / 2**30:.3g} GiB per device, interconnect {hw.interconnect}"
                     + (f", peak {hw.peak_flops / 1e12:.3g} TFLOP/s" if hw.peak_flops else "")),
        ("software", ", ".join(f"{k} {v}" for k, v in sw.to_dict().items() if v)),
        ("workload", f"{wl.name or data.task_name}: {wl.model_family}, {wl.num_params:,} params, "
                     f"{wl.num_layers} layers, hidden {wl.hidden_size}, seq {wl.seq_len}, "
                     f"global batch {wl.global_batch_size}"),
        ("host / user", f"{info.host} / {info.user}"),
        ("status", info.status),
    ]
    return rows
