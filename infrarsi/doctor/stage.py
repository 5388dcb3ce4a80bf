"""The doctor stage: run the locked baseline several times, profile it, measure the noise floor.

Every baseline repeat is a separate trial through the search's own trial path
(``RayTrainBackend.execute``), with one extra profiled step after its measured steps. The trials
go to the bank under a run of their own (origin ``doctor:baseline``); the summary (the payload
below) goes to the bank with ``record_baseline`` and to ``doctor.json`` in the run directory.

The later stages read the payload as a :class:`~infrarsi.doctor.record.DoctorRecord`
(``baseline_step_s`` and ``noise["mde"]``: the run stage's verifier threshold; ``profile``,
``mfu`` with its peak, ``matmul`` (CPU: measured fp32 and bf16 matmul FLOP/s), ``findings``:
the report; ``contention``: was the machine busy during the repeats,
:mod:`infrarsi.doctor.contention`); :func:`~infrarsi.doctor.record.proposer_findings` is the proposers' digest.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.contract import Contract
from infrarsi.doctor.contention import ContentionProbe
from infrarsi.doctor.findings import bottleneck_findings, contention_finding
from infrarsi.doctor.mfu import compute_mfu, matmul_speeds
from infrarsi.doctor.profile import summarize_profile
from infrarsi.doctor.record import DoctorRecord, proposer_findings
from infrarsi.doctor.table import format_summary
from infrarsi.errors import BankError, InfraRSIError
from infrarsi.rundir import DOCTOR_FILE, local_bank_url, resolve_run_dir, write_json
from infrarsi.stats import DEFAULT_MDE, DEFAULT_PAIRS, noise_model
from infrarsi.trial import SoftwareVersions, TrialRecord, TrialStatus

__all__ = ["DOCTOR_FILE", "BaselineUnusableError", "DoctorResult", "loss_spread",
           "proposer_findings", "run_doctor"]

ORIGIN = "doctor:baseline"


class BaselineUnusableError(InfraRSIError):
    """The locked baseline cannot serve as a baseline (it OOMs, crashes, or its loss does not
    reproduce); the message says what happened and what to change."""


@dataclass(frozen=True)
class DoctorResult:
    """What ``infrarsi doctor`` ends with: the bank run of the baseline repeats (``run_id``),
    doctor's record (``record``; ``payload`` is its JSON form, as in ``path``: doctor.json) and
    the repeats' trial records."""

    run_id: str
    payload: dict[str, Any]
    path: Path
    records: tuple[TrialRecord, ...]

    @property
    def record(self) -> DoctorRecord:
        return DoctorRecord.from_dict(self.payload)

    @property
    def mde(self) -> float | None:
        """The measured noise floor (a fraction) for doctor's planned pairs."""
        return self.record.mde

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "path": str(self.path), "payload": self.payload,
                "records": [r.to_dict() for r in self.records]}


def run_doctor(run_dir: str | Path | None = None, *, repeats: int = 3, pairs: int = DEFAULT_PAIRS,
               target_mde: float = DEFAULT_MDE, bank_url: str | None = None,
               local_mode: bool = False, out: Callable[[str], None] = print,
               backend=None) -> DoctorResult:
    """Profile the baseline of the run in ``run_dir`` (default: the last ``infrarsi init``).

    Raises :class:`BaselineUnusableError` when a repeat OOMs, crashes or breaks the loss
    reference (after recording it in the bank and in ``doctor.json``).
    """
    if repeats < 1 or pairs < 1:
        raise ValueError(f"--repeats {repeats} and --pairs {pairs} must be at least 1 "
                         "(3 each is a good start)")
    run_dir = resolve_run_dir(run_dir)
    contract = Contract.load(run_dir)
    spec = contract.spec()
    if backend is None:
        from infrarsi.backends.ray_train import RayTrainBackend

        backend = RayTrainBackend(spec, contract=contract, local_mode=local_mode, profile=True)
    bank = _open_bank(bank_url or spec.bank.url, run_dir, out)
    run_id = bank.start_run(spec.name, contract.sha256, backend.workload, backend.hardware,
                            SoftwareVersions.current(),
                            {"run_dir": str(Path(run_dir).resolve()), "stage": "doctor"})
    config = backend.baseline_config()
    records: list[TrialRecord] = []
    probe = ContentionProbe()
    try:
        with probe:  # is other work sharing the machine while the repeats run?
            for i in range(repeats):
                rec = backend.execute(config, trial_id=f"doctor-{i}")
                probe.sample_ours()
                bank.record_trial(run_id, rec, origin=ORIGIN)
                records.append(rec)
                out(f"baseline {i + 1}/{repeats}: {rec.summary()}")
                if not rec.ok:
                    break
        problem = _unusable(records, contract, config)
        if problem:
            _save(run_dir, {"status": "failed", "error": problem, "run_id": run_id,
                            "records": [r.trial_id for r in records]})
            bank.finish_run(run_id, "failed")
            raise BaselineUnusableError(problem)
        payload = _payload(records, contract, backend, config, pairs, target_mde)
        payload["contention"] = probe.result
        if probe.result.get("contended"):
            payload["findings"].insert(0, contention_finding(probe.result))
        payload = _finite(payload)
        payload["run_id"] = run_id
        bank.record_baseline(run_id, payload, origin="doctor")
        bank.finish_run(run_id)
    finally:
        bank.close()
    path = _save(run_dir, payload)
    out(format_summary(payload))
    out(f"doctor record: run {run_id} in the bank; {path}")
    return DoctorResult(run_id, payload, path, tuple(records))


def _open_bank(url: str | None, run_dir: Path, out: Callable[[str], None]):
    from infrarsi.bank import ExperienceBank

    try:
        return ExperienceBank.open(url, retry_s=10.0)
    except BankError as e:
        fallback = local_bank_url(run_dir)
        out(f"warning: the experience bank is unreachable ({e}); using {fallback}")
        return ExperienceBank.open(fallback, seed=False)


# ---- judging the repeats ---------------------------------------------------------------------
def loss_spread(traces: Sequence[Sequence[float]]) -> list[float]:
    """Per step, (max - min) / |median| of the loss across repeats (0.0: bit-identical)."""
    n = min((len(t) for t in traces), default=0)
    out = []
    for i in range(n):
        vals = [t[i] for t in traces]
        if not all(math.isfinite(v) for v in vals):
            out.append(math.inf)
            continue
        mid = abs(statistics.median(vals)) or 1.0
        out.append((max(vals) - min(vals)) / mid)
    return out


def _unusable(records: Sequence[TrialRecord], contract: Contract, config: dict[str, Any]) -> str | None:
    bad = next((r for r in records if not r.ok), None)
    if bad is None:
        return None
    where = f"the locked baseline ({_cfg(config)})"
    if bad.status is TrialStatus.OOM:
        return (f"{where} ran out of memory in trial {bad.trial_id}: {bad.error_message}. The "
                "contract is unusable: change search.baseline (a smaller micro_batch_size, "
                "activation_checkpointing: full) or hardware.memory_capacity_gib, then re-run "
                "`infrarsi init` and `infrarsi doctor`.")
    if bad.status is TrialStatus.ERROR:
        kind = bad.error_kind.value if bad.error_kind else "error"
        return (f"{where} failed in trial {bad.trial_id} ({kind}): {bad.error_message}. The "
                "contract is unusable: fix the workload or change search.baseline, then re-run "
                "`infrarsi init` and `infrarsi doctor`.")
    traces = [r.loss_trace for r in records if r.loss_trace] + [contract.loss_reference["trace"]]
    spread = max(loss_spread(traces) or [0.0])
    if "loss" in bad.error_message:
        rtol = contract.loss_rtol(config.get("precision", "fp32"))
        suggest = _round_up(max(2 * spread, rtol * 2))
        return (f"{where} does not reproduce its own loss reference (trial {bad.trial_id}: "
                f"{bad.error_message}); across repeats and the reference the loss spreads by up "
                f"to {spread:.2e} (relative), above the tolerance {rtol:g}. The workload is "
                "non-deterministic at a fixed seed, so no candidate can be checked against it. "
                f"Make it deterministic{_seeding_advice(contract)}, or set loss_reference.rtol: "
                f"{suggest:g} in the task spec (accepting that drift) and re-run `infrarsi init`.")
    return f"{where} was rejected in trial {bad.trial_id}: {bad.error_message}"


def _seeding_advice(contract: Contract) -> str:
    """How to seed a user's own data, the usual source of run-to-run drift in their job."""
    wl = contract.spec().workload
    if wl.script:
        return (" (seed every random draw of your data at the top of your script: "
                "`torch.manual_seed(0)`, `random.seed(0)`, `numpy.random.seed(0)`, and give a "
                "shuffling DataLoader `generator=torch.Generator().manual_seed(0)` and, with "
                "workers, a `worker_init_fn` that seeds each worker)")
    if wl.adapter:
        return (" (draw every random choice of batches(ctx) from `ctx.generator(step)`, e.g. "
                "`torch.randint(..., generator=ctx.generator(step))`, and shuffle a DataLoader "
                "with `generator=ctx.generator(epoch)`; not the global torch/numpy/random state)")
    return ""


def _round_up(x: float) -> float:
    if x <= 0:
        return 0.0
    e = math.floor(math.log10(x))
    return math.ceil(x / 10**e) * 10**e


def _cfg(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


# ---- the payload -------------------------------------------------------------------------------
def _best_cpu_peak(matmul: dict[str, Any] | None) -> dict[str, Any]:
    """compute_mfu's CPU peak: the faster of the measured fp32 and bf16 matmul speeds."""
    if not matmul:
        return {}
    dtype = max(("fp32", "bf16"), key=lambda d: matmul.get(f"{d}_flops") or 0.0)
    return {"cpu_peak_flops": matmul[f"{dtype}_flops"], "cpu_peak_dtype": dtype}


def _payload(records: Sequence[TrialRecord], contract: Contract, backend, config: dict[str, Any],
             pairs: int, target_mde: float) -> dict[str, Any]:
    spec = contract.spec()
    noise = noise_model([r.step_times_s for r in records], pairs=pairs, target_mde=target_mde)
    step = statistics.median(r.step_time_s for r in records)
    profile = summarize_profile(records)
    extra = records[0].extra or {}
    # CPU: measured, since whether bf16 pays depends on the processor (datasheets cover GPUs)
    matmul = (matmul_speeds(int(config.get("num_threads", 1)))
              if spec.hardware.device == "cpu" else None)
    mfu = compute_mfu(step_s=step, tokens_per_step=contract.work.tokens_per_step,
                      flops_per_token=float(extra.get("flops_per_token")
                                            or contract.work.flops_per_token),
                      num_workers=int(config.get("num_workers", 1)), device=spec.hardware.device,
                      num_threads=int(config.get("num_threads", 1)),
                      device_peak_flops=backend.hardware.peak_flops,
                      device_name=backend.hardware.device_name,
                      **_best_cpu_peak(matmul))
    capacity = backend.hardware.memory_bytes or None
    findings = bottleneck_findings(profile, config, mfu, capacity, matmul)
    if noise["too_noisy"]:
        findings.insert(0, {"kind": "noise", "fraction": noise["mde"], "severity": "warn",
                            "message": "too noisy: " + noise["advice"], "text": noise["advice"],
                            "knobs": []})
    spread = loss_spread([r.loss_trace for r in records] + [contract.loss_reference["trace"]])
    rtol = contract.loss_rtol(config.get("precision", "fp32"))
    return {
        "baseline_step_s": step,
        "noise": noise,
        "profile": profile,
        "mfu": mfu,
        "matmul": matmul,
        "findings": findings,
        "loss": {"max_rel_spread": max(spread, default=0.0), "per_step_rel_spread": spread,
                 "tolerance": rtol, "bitwise_identical": max(spread, default=0.0) == 0.0,
                 "steps_compared": len(spread)},
        "records": [r.trial_id for r in records],
        "config": dict(config),
        "contract_sha256": contract.sha256,
        "task": spec.name,
        "device": spec.hardware.device,
        "memory_capacity_bytes": capacity,
        "tokens_per_step": contract.work.tokens_per_step,
        "device_seconds": sum(r.device_seconds for r in records),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _save(run_dir: Path, payload: dict[str, Any]) -> Path:
    return write_json(Path(run_dir) / DOCTOR_FILE, payload, sort_keys=True)


def _finite(v: Any) -> Any:
    """The payload as strict JSON: NaN and infinity (unmeasured, unbounded) become None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v
