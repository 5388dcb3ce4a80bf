"""Canonical JSON, keys and signature vectors. JSON only: nothing is ever pickled."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from typing import Any

from infrarsi.trial import HardwareFingerprint, TrialRecord, WorkloadSignature

# Weights of the signature distance (applied to WorkloadSignature.vector() and
# HardwareFingerprint.vector() component by component). A unit of distance is roughly "one
# doubling of a size that matters": a dense/MoE mismatch costs as much as ~8x the parameters.
WORKLOAD_WEIGHTS: tuple[float, ...] = (
    3.0,  # moe vs dense
    3.0,  # log10 parameters (10x parameters = 3)
    0.05,  # layers (raw count: 20 extra layers = 1)
    1.0,  # log2 hidden size
    0.5,  # log2 heads
    1.0,  # log2 sequence length
    1.0,  # log2 global batch (sequences)
    1.0,  # log2 (experts + 1)
    0.5,  # top-k
)
HARDWARE_WEIGHTS: tuple[float, ...] = (
    1.0,  # log2 memory per device
    1.0,  # log2 total devices
    0.5,  # log2 nodes
    2.0,  # log10 peak FLOP/s per device (10x = 2)
)
DEVICE_NAME_MISMATCH = 1.0  # added when device names differ (same numbers, other chip)


def dumps(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces); floats round-trip exactly."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def digest(*parts: Any) -> str:
    return hashlib.sha256(dumps(list(parts)).encode()).hexdigest()[:40]


@functools.lru_cache(maxsize=4096)
def workload_key(w: WorkloadSignature) -> str:
    return digest("workload", w.to_dict())[:32]


@functools.lru_cache(maxsize=4096)
def hardware_key(h: HardwareFingerprint) -> str:
    return digest("hardware", h.to_dict())[:32]


def weighted(vector: list[float], weights: tuple[float, ...]) -> list[float]:
    return [v * w for v, w in zip(vector, weights, strict=True)]


def workload_row(w: WorkloadSignature) -> dict[str, Any]:
    return {
        "key": workload_key(w),
        "name": w.name or "",
        "model_family": w.model_family,
        "signature": dumps(w.to_dict()),
        "vector": dumps(weighted(w.vector(), WORKLOAD_WEIGHTS)),
    }


def hardware_row(h: HardwareFingerprint) -> dict[str, Any]:
    return {
        "key": hardware_key(h),
        "device_name": h.device_name,
        "fingerprint": dumps(h.to_dict()),
        "vector": dumps(weighted(h.vector(), HARDWARE_WEIGHTS)),
    }


@functools.lru_cache(maxsize=4096)
def _context_dict(obj: WorkloadSignature | HardwareFingerprint) -> dict[str, Any]:
    return obj.to_dict()


_RECORD_FIELDS: tuple[str, ...] = ()


def record_json(rec: TrialRecord) -> str:
    """``dumps(rec.to_dict())``, computed without ``asdict``'s deep copies (the bank's hot
    path). tests/test_bank_codec.py checks it equals the reference on every field kind."""
    global _RECORD_FIELDS
    if not _RECORD_FIELDS:
        _RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(TrialRecord))
    d = {name: getattr(rec, name) for name in _RECORD_FIELDS}
    d["workload"] = _context_dict(rec.workload)
    d["hardware"] = _context_dict(rec.hardware)
    d["status"] = rec.status.value
    d["error_kind"] = rec.error_kind.value if rec.error_kind else None
    d["step_times_s"] = list(rec.step_times_s)
    d["loss_trace"] = [v if math.isfinite(v) else None for v in rec.loss_trace]
    d["peak_memory_bytes"] = list(rec.peak_memory_bytes) if rec.peak_memory_bytes else None
    return dumps(d)


def final_loss(loss_trace: tuple[float, ...]) -> float | None:
    finite = [v for v in loss_trace if math.isfinite(v)]
    return finite[-1] if finite else None
