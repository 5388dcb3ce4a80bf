"""Bottleneck findings: what the profile says, as structured rows for the report and proposers.

Each finding is a dict: ``kind`` (communication, host_sync, optimizer, data, idle, compute,
memory_headroom, memory_pressure, mfu, precision, noise, contention, loss), ``fraction`` (of the step, of memory or
None), ``message`` (one sentence; ``text`` is the same for readers that look there),
``severity`` (info, warn) and ``knobs`` (launch knobs that act on it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["THRESHOLDS", "bottleneck_findings", "contention_finding"]

THRESHOLDS = {"communication": 0.10, "host_sync": 0.05, "optimizer": 0.15, "data": 0.05,
              "idle": 0.10, "compute": 0.60, "headroom": 0.40, "pressure": 0.85}


def _f(kind: str, fraction: float | None, message: str, knobs: list[str],
       severity: str = "warn") -> dict[str, Any]:
    return {"kind": kind, "fraction": fraction, "message": message, "text": message,
            "severity": severity, "knobs": knobs}


def bottleneck_findings(profile: dict[str, Any], config: dict[str, Any],
                        mfu: dict[str, Any] | None = None,
                        capacity_bytes: int | None = None,
                        matmul: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Findings from the summarized profile (``infrarsi.doctor.profile.summarize_profile``),
    the baseline config, the MFU figures, the device capacity and (CPU) the measured fp32 and
    bf16 matmul speeds (``infrarsi.doctor.mfu.matmul_speeds``); largest first."""
    fr = profile.get("fractions") or {}
    out: list[dict[str, Any]] = []
    comm = profile.get("communication") or {}
    if fr.get("communication", 0) >= THRESHOLDS["communication"]:
        over = comm.get("overlapped_fraction")
        tail = f", {over:.0%} of it overlapped with compute" if over is not None else ""
        out.append(_f("communication", fr["communication"],
                      f"communication {fr['communication']:.0%} of step exposed{tail}",
                      ["bucket_cap_mb", "gradient_as_bucket_view", "micro_batch_size",
                       "data_parallel", "num_workers"]))
    if fr.get("host_sync", 0) >= THRESHOLDS["host_sync"]:
        n = (profile.get("host_syncs") or {}).get("aten::item", 0)
        nz = (profile.get("host_syncs") or {}).get("aten::nonzero", 0)
        out.append(_f("host_sync", fr["host_sync"],
                      f"host sync (aten::item x{n:.0f}, aten::nonzero x{nz:.0f}) "
                      f"{fr['host_sync']:.0%} of step", ["compile"]))
    if fr.get("optimizer", 0) >= THRESHOLDS["optimizer"]:
        impl = config.get("optimizer_impl", "?")
        out.append(_f("optimizer", fr["optimizer"],
                      f"optimizer {fr['optimizer']:.0%} of step (optimizer_impl={impl})",
                      ["optimizer_impl"]))
    if fr.get("data", 0) >= THRESHOLDS["data"]:
        out.append(_f("data", fr["data"], f"data loading {fr['data']:.0%} of step", []))
    if fr.get("idle", 0) >= THRESHOLDS["idle"]:
        out.append(_f("idle", fr["idle"],
                      f"ranks wait {fr['idle']:.0%} of step at the step-end barrier "
                      "(load imbalance or a slow rank)", ["num_workers", "expert_parallel_degree"]))
    compute = fr.get("forward", 0) + fr.get("backward", 0)
    if compute >= THRESHOLDS["compute"]:
        out.append(_f("compute", compute,
                      f"forward+backward {compute:.0%} of step: compute-bound",
                      ["compile", "precision", "micro_batch_size", "num_threads"], "info"))
    out += _memory(profile, config, capacity_bytes)
    if mfu and mfu.get("mfu") is not None:
        out.append(_f("mfu", mfu["mfu"], f"MFU {mfu['mfu']:.1%} of the {mfu['peak_label']}",
                      [], "info"))
    out += _precision(config, matmul)
    out.sort(key=lambda f: -(f["fraction"] or 0) if f["severity"] == "warn" else 1)
    return out


def _precision(config: dict[str, Any], matmul: dict[str, Any] | None) -> list[dict[str, Any]]:
    """On CPU, whether bf16 GEMMs are faster than fp32 here (AMX / AVX512-BF16) or slower."""
    if not matmul or not matmul.get("fp32_flops") or not matmul.get("bf16_flops"):
        return []
    ratio = matmul["bf16_flops"] / matmul["fp32_flops"]
    verdict = ("bf16 autocast can pay here" if ratio >= 1.2 else
               "bf16 autocast is unlikely to pay here" if ratio <= 1.0 else "bf16 gains little")
    return [_f("precision", None,
               f"bf16 matmul {ratio:.2f}x the fp32 speed on this CPU "
               f"(precision={config.get('precision', 'fp32')}): {verdict}", ["precision"], "info")]


def _memory(profile: dict[str, Any], config: dict[str, Any],
            capacity: int | None) -> list[dict[str, Any]]:
    peaks = profile.get("peak_memory_bytes") or []
    if not capacity or not peaks:
        return []
    used = max(peaks) / capacity
    if used >= THRESHOLDS["pressure"]:
        return [_f("memory_pressure", used,
                   f"peak memory {used:.0%} of capacity: little room for larger micro-batches",
                   ["activation_checkpointing", "data_parallel", "reshard_after_forward"])]
    if used <= THRESHOLDS["headroom"]:
        return [_f("memory_headroom", used,
                   f"peak memory {used:.0%} of capacity (micro_batch_size="
                   f"{config.get('micro_batch_size')}): room for a larger micro-batch",
                   ["micro_batch_size"], "info")]
    return []


def contention_finding(contention: dict[str, Any]) -> dict[str, Any]:
    """The machine was busy while the baseline repeats ran (``infrarsi.doctor.contention``)."""
    return _f("contention", contention.get("other_cores"),
              f"the machine was busy during the baseline repeats ({contention['summary']}): the "
              "baseline step time and noise floor read high; the run re-measures the baseline "
              "before searching. Quiet the machine or re-run `infrarsi doctor` when it is", [])
