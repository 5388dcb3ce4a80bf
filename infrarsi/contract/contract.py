"""The locked task contract: what may change, what may not, and how a trial is judged.

``infrarsi init`` writes ``contract.json`` into the run directory. Every later stage loads it,
re-hashes the frozen files and refuses to run when one changed. The harness (clock, loss, data
pipeline) and the workload's entry-point interface are frozen; patches may touch only the
editable globs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract.spec import TaskSpec
from infrarsi.errors import ContractError, FrozenFileChangedError
from infrarsi.rundir import CONTRACT_FILE

SCHEMA = 1
# Relative loss tolerance per compute precision, used when the task spec does not set one.
# fp32 differs between configs only by summation order; bf16 autocast rounds every matmul.
DEFAULT_LOSS_RTOL = {"fp32": 2e-3, "bf16": 3e-2}
_PKG_ROOT = Path(__file__).resolve().parents[1]  # .../infrarsi
HARNESS_DIR = _PKG_ROOT / "harness"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Work:
    """The work per step the contract locks: what every trial must compute, whatever its knobs.

    ``tokens_per_step`` is checked on every trial (a trial that trains on fewer tokens is
    rejected, never rewarded); the rest describes the model for MFU and the report:
    ``num_params`` and ``flops_per_token`` are measured on the built model at ``init``."""

    tokens_per_step: int
    global_batch_size: int
    seq_len: int
    shape: dict[str, Any] = field(default_factory=dict)
    num_params: int = 0
    flops_per_token: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_per_step": self.tokens_per_step,
                "global_batch_size": self.global_batch_size, "seq_len": self.seq_len,
                "shape": dict(self.shape), "num_params": self.num_params,
                "flops_per_token": self.flops_per_token}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Work:
        return cls(tokens_per_step=int(data["tokens_per_step"]),
                   global_batch_size=int(data["global_batch_size"]), seq_len=int(data["seq_len"]),
                   shape=dict(data.get("shape") or {}), num_params=int(data.get("num_params") or 0),
                   flops_per_token=float(data.get("flops_per_token") or 0.0))


def frozen_paths(spec: TaskSpec) -> dict[str, Path]:
    """Frozen files by contract key: ``harness/<file>`` and ``workspace/<file>``."""
    out: dict[str, Path] = {}
    for p in sorted(HARNESS_DIR.rglob("*.py")):
        out[f"harness/{p.relative_to(HARNESS_DIR)}"] = p
    ws = spec.workspace_path()
    for pattern in spec.scope.frozen:
        matches = sorted(q for q in ws.glob(pattern) if q.is_file())
        if not matches:
            raise ContractError(
                f"scope.frozen pattern {pattern!r} matches no file in {ws}; fix the glob or "
                "remove it"
            )
        for q in matches:
            out[f"workspace/{q.relative_to(ws)}"] = q
    return out


@dataclass(frozen=True)
class Contract:
    """The parsed contract.json. Build with :func:`lock`, read with :meth:`load`."""

    task: dict[str, Any]
    frozen_files: dict[str, str]
    editable: tuple[str, ...]
    work: Work
    loss_reference: dict[str, Any]
    timing: dict[str, Any]
    baseline_config: dict[str, Any]
    created_at: str = ""
    sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    # ---- persistence ------------------------------------------------------------------
    def body(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "task": self.task,
            "frozen_files": self.frozen_files,
            "editable": list(self.editable),
            "work": self.work.to_dict(),
            "loss_reference": self.loss_reference,
            "timing": self.timing,
            "baseline_config": self.baseline_config,
            "created_at": self.created_at,
            "extra": self.extra,
        }

    @staticmethod
    def digest(body: Mapping[str, Any]) -> str:
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    def save(self, run_dir: Path) -> Path:
        run_dir.mkdir(parents=True, exist_ok=True)
        body = self.body()
        path = run_dir / CONTRACT_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**body, "sha256": self.digest(body)}, indent=2, sort_keys=True))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, run_dir: Path) -> Contract:
        path = Path(run_dir) / CONTRACT_FILE
        if not path.is_file():
            raise ContractError(
                f"no contract at {path}; run `infrarsi init TASK.yaml` first (or pass --run-dir)"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ContractError(f"{path} is not valid JSON ({e}); re-run `infrarsi init`") from None
        sha = data.pop("sha256", "")
        if data.get("schema") != SCHEMA:
            raise ContractError(f"{path}: contract schema {data.get('schema')} is not {SCHEMA}; re-run `infrarsi init`")
        if cls.digest(data) != sha:
            raise FrozenFileChangedError(
                f"{path} was edited after `infrarsi init` (its checksum does not match); "
                "re-run `infrarsi init` to lock a new contract"
            )
        data.pop("schema")
        data["editable"] = tuple(data["editable"])
        data["work"] = Work.from_dict(data["work"])
        return cls(**data, sha256=sha)

    # ---- checks -----------------------------------------------------------------------
    def spec(self) -> TaskSpec:
        return TaskSpec.from_dict(self.task, source=CONTRACT_FILE)

    def verify_frozen(self) -> None:
        """Raise FrozenFileChangedError naming every frozen file that changed or vanished."""
        current = frozen_paths(self.spec())
        problems = []
        for key, digest in sorted(self.frozen_files.items()):
            path = current.get(key)
            if path is None or not path.is_file():
                problems.append(f"{key} is missing")
            elif sha256_file(path) != digest:
                problems.append(f"{key} ({path}) changed")
        added = sorted(set(current) - set(self.frozen_files))
        problems += [f"{k} is new in a frozen location" for k in added]
        if problems:
            raise FrozenFileChangedError(
                "frozen files changed since `infrarsi init`: " + "; ".join(problems)
                + ". Restore them (git checkout), or re-run `infrarsi init` to lock a new contract."
            )

    def loss_rtol(self, precision: str) -> float:
        rtol = self.loss_reference.get("rtol") or {}
        return float(rtol.get(precision, max(DEFAULT_LOSS_RTOL.values())))

    def check_loss(self, trace: Sequence[float], precision: str) -> str | None:
        """None when ``trace`` reproduces the baseline's losses, else what drifted.

        A trial must run at least the reference's first K steps; every step it ran that the
        baseline ran too is compared (``every_step``: the baseline's whole trace, warm-up and
        measured steps; contracts locked before it existed compare the first K), so work
        skipped after the first K steps drifts the loss too."""
        ref = self.loss_reference["trace"]
        if len(trace) < len(ref):
            return f"loss trace has {len(trace)} steps, the reference needs {len(ref)}"
        ref = self.loss_reference.get("every_step") or ref
        rtol = self.loss_rtol(precision)
        for i, (a, b) in enumerate(zip(trace, ref, strict=False)):
            if not math.isfinite(a) or abs(a - b) > rtol * abs(b):
                return (
                    f"loss drifted at step {i}: {a:.6f} vs reference {b:.6f} "
                    f"(relative tolerance {rtol:g} for {precision})"
                )
        return None

    def check_work(self, tokens_per_step: int | None) -> str | None:
        want = self.work.tokens_per_step
        if tokens_per_step != want:
            return f"work per step changed: {tokens_per_step} tokens, the contract locks {want}"
        return None


def lock(spec: TaskSpec, *, baseline_config: dict[str, Any], loss_trace: Sequence[float],
         model_stats: Mapping[str, Any]) -> Contract:
    """Build the contract from a spec and the baseline's measured loss trace."""
    k = spec.loss_reference.steps
    if len(loss_trace) < k:
        raise ContractError(f"the baseline ran {len(loss_trace)} steps; the loss reference needs {k}")
    rtol = (
        {p: spec.loss_reference.rtol for p in DEFAULT_LOSS_RTOL}
        if spec.loss_reference.rtol is not None else dict(DEFAULT_LOSS_RTOL)
    )
    wl = spec.workload
    work_shape = spec.to_dict()["workload"]["shape"]
    tokens, seq_len = wl.tokens_per_step, wl.seq_len
    if wl.adapter:  # read from the user's model and data, not the YAML
        work_shape = dict(model_stats.get("shape") or {})
        tokens = int(model_stats.get("tokens_per_step") or 0)
        seq_len = int(work_shape.get("seq_len") or model_stats.get("seq_len") or 0)
        if not tokens:
            raise ContractError("the baseline of an adapter workload counted no tokens; "
                                "tokens(batch) must return a positive int")
    return Contract(
        task=spec.to_dict(),
        frozen_files={k_: sha256_file(p) for k_, p in frozen_paths(spec).items()},
        editable=tuple(spec.scope.editable),
        work=Work(
            tokens_per_step=tokens,
            global_batch_size=wl.global_batch_size,
            seq_len=seq_len,
            shape=work_shape or {},
            num_params=int(model_stats.get("num_params", 0)),
            flops_per_token=float(model_stats.get("flops_per_token", 0.0)),
        ),
        loss_reference={
            "steps": k,
            "seed": spec.loss_reference.seed,
            "trace": [float(v) for v in loss_trace[:k]],
            "every_step": [float(v) for v in loss_trace],  # checked at every step trials run
            "rtol": rtol,
        },
        timing={
            "warmup_steps": spec.timing.warmup_steps,
            "measured_steps": spec.timing.measured_steps,
            "clock": "infrarsi.harness: rank 0 time.perf_counter after dist.barrier "
                     "(+ torch.cuda.synchronize on GPU); warm-up and compile excluded",
        },
        baseline_config=dict(baseline_config),
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
