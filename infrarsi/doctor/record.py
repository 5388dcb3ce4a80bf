"""Doctor's record of the baseline: the typed form of ``doctor.json`` and the bank's baseline
payload, read by the run stage (noise floor, baseline repeats, proposer findings) and the report
(profile, MFU and its peak, findings).

On disk and in the bank the record stays a JSON object (``to_dict``); every reader goes through
:meth:`DoctorRecord.from_dict`, so a key is named in one place. ``from_dict`` accepts payloads of
older banks: a bare noise model (the fields of ``noise`` at the top level) and missing sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DoctorRecord", "proposer_findings"]


@dataclass(frozen=True)
class DoctorRecord:
    """What doctor measured of the locked baseline.

    ``noise`` is :func:`infrarsi.stats.noise_model`'s dict (``mde`` is the verifier's floor for
    ``noise["pairs"]`` pairs); ``profile`` is :func:`~infrarsi.doctor.profile.summarize_profile`'s
    (``fractions`` by phase, ``peak_memory_bytes``); ``mfu`` is
    :func:`~infrarsi.doctor.mfu.compute_mfu`'s (``mfu``, ``peak_flops`` per worker,
    ``peak_label``); ``matmul`` the CPU's measured fp32/bf16 matmul FLOP/s (None on GPU);
    ``findings`` the bottleneck findings (dicts with ``kind``, ``message``, ``knobs``);
    ``records`` the trial ids of the baseline repeats in the bank run ``run_id``.
    """

    baseline_step_s: float | None = None
    noise: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    mfu: dict[str, Any] = field(default_factory=dict)
    matmul: dict[str, Any] | None = None
    findings: tuple[dict[str, Any], ...] = ()
    loss: dict[str, Any] = field(default_factory=dict)
    records: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    contract_sha256: str = ""
    task: str = ""
    device: str = ""
    memory_capacity_bytes: int | None = None
    tokens_per_step: int | None = None
    device_seconds: float = 0.0
    created_at: str = ""
    run_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know

    # ---- reading --------------------------------------------------------------------------
    @property
    def mde(self) -> float | None:
        """The noise floor doctor measured (for its own planned pairs), None when unmeasured."""
        v = self.noise.get("mde")
        return None if v is None else float(v)

    @property
    def has_noise_model(self) -> bool:
        return self.mde is not None

    @property
    def peak_flops(self) -> float | None:
        """The per-worker peak FLOP/s doctor's MFU is against (CPU: measured fp32 matmul)."""
        v = self.mfu.get("peak_flops")
        return float(v) if v else None

    @property
    def peak_label(self) -> str:
        return self.mfu.get("peak_label") or ""

    @property
    def mfu_fraction(self) -> float | None:
        v = self.mfu.get("mfu")
        return None if v is None else float(v)

    @property
    def phase_fractions(self) -> dict[str, float]:
        return dict(self.profile.get("fractions") or {})

    @property
    def peak_memory_bytes(self) -> Any:
        return self.profile.get("peak_memory_bytes")

    # ---- conversion -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, payload: dict[str, Any] | None) -> DoctorRecord | None:
        """The record of a payload (None for None). Older payloads: see the module doc."""
        if payload is None:
            return None
        p = dict(payload)
        if "noise" not in p and "mde" in p:  # an old bank's baseline: the noise model alone
            noise_keys = [k for k in p if k != "baseline_step_s"]
            p = {"baseline_step_s": p.get("baseline_step_s"),
                 "noise": {k: p[k] for k in noise_keys}}
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        kw = {k: p[k] for k in known if k in p and p[k] is not None}
        if "findings" in kw:
            kw["findings"] = tuple(kw["findings"])
        if "records" in kw:
            kw["records"] = tuple(kw["records"])
        mfu = p.get("mfu")
        if isinstance(mfu, int | float):  # a bare figure (hand-written payloads)
            kw["mfu"] = {"mfu": float(mfu)}
        for k in ("noise", "profile", "mfu", "loss", "config"):
            if not isinstance(kw.get(k, {}), dict):
                kw.pop(k)
        return cls(**kw, extra={k: v for k, v in p.items() if k not in known})

    def to_dict(self) -> dict[str, Any]:
        """The payload as doctor writes it (``doctor.json``, the bank's baseline entry)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        out["findings"] = [dict(f) for f in self.findings]
        out["records"] = list(self.records)
        return {**self.extra, **out}

    def proposer_findings(self) -> dict[str, Any]:
        """The proposers' context ``findings``: a compact digest (the LLM prompt carries it
        whole): baseline step, phase fractions, MFU, measured matmul speeds (CPU), peak memory
        against capacity, and the findings' sentences."""
        return {"baseline_step_s": self.baseline_step_s,
                "phase_fractions": self.phase_fractions,
                "mfu": self.mfu_fraction,
                "matmul": self.matmul,
                "peak_memory_bytes": self.peak_memory_bytes,
                "memory_capacity_bytes": self.memory_capacity_bytes,
                "bottlenecks": [f.get("message") for f in self.findings]}


def proposer_findings(payload: dict[str, Any] | DoctorRecord | None) -> dict[str, Any]:
    """:meth:`DoctorRecord.proposer_findings` of a payload; empty without a doctor run."""
    if not payload:
        return {}
    record = payload if isinstance(payload, DoctorRecord) else DoctorRecord.from_dict(payload)
    return record.proposer_findings()
