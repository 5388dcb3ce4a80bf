"""Model FLOPs utilization of the baseline, against a peak that says where it came from.

GPU: the device's peak FLOP/s from the hardware fingerprint (``hardware.peak_flops``, per device)
times the workers. CPU: there is no datasheet figure for a shared box, so the peak is *measured*:
the best of several timed large fp32 matmuls with the trial's torch thread count, times the
workers, labelled "CPU measured matmul peak". On CPU the same probe in bf16
(:func:`matmul_speeds`) tells the search whether bf16 autocast can pay on this processor (it
does with AMX or AVX512-BF16, and is slower without).
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["PEAK_LABEL_CPU", "compute_mfu", "matmul_speeds", "measure_matmul_peak"]

PEAK_LABEL_CPU = "CPU measured matmul peak"


def measure_matmul_peak(num_threads: int, n: int = 1024, repeats: int = 10,
                        dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of the best of ``repeats`` timed ``n x n`` matmuls in ``dtype`` on ``num_threads``
    threads.

    Timed in this process's CPU seconds per thread, not wall seconds: on a shared machine a
    wall-clock probe counts the time other jobs held the core as slowness, the peak reads low
    and the MFU above 100% (seen: 141.6% from a doctor run on a busy 2-core box). CPU time is
    what the matmul itself took; the best of the repeats is kept."""
    threads = max(int(num_threads), 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)  # warm-up: BLAS init, page-in
        best = float("inf")
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            torch.mm(a, b)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            best = min(best, cpu / threads if cpu > 0 else wall)
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / best


def matmul_speeds(num_threads: int, n: int = 1024) -> dict[str, Any]:
    """Measured CPU matmul FLOP/s per worker in fp32 and bf16 (doctor's payload ``matmul``)."""
    return {"fp32_flops": measure_matmul_peak(num_threads, n),
            "bf16_flops": measure_matmul_peak(num_threads, n, dtype=torch.bfloat16),
            "num_threads": int(num_threads), "n": n}


def compute_mfu(*, step_s: float, tokens_per_step: int, flops_per_token: float,
                num_workers: int, device: str, num_threads: int = 1,
                device_peak_flops: float | None = None, device_name: str = "",
                cpu_peak_flops: float | None = None,
                cpu_peak_dtype: str = "fp32") -> dict[str, Any]:
    """The payload's ``mfu``: ``mfu`` (a fraction or None), ``achieved_flops`` (FLOP/s of the
    whole job), ``peak_flops`` (per worker/device, like ``hardware.peak_flops``),
    ``job_peak_flops`` (times the workers), ``peak_label``, ``flops_per_token``,
    ``tokens_per_s``; ``note`` when no peak is known. On CPU the peak is measured here unless
    ``cpu_peak_flops`` passes a probe already taken (``cpu_peak_dtype`` names its precision: doctor
    passes the faster of its fp32 and bf16 probes, so every config is divided by the processor's
    best matmul speed, as GPU MFU divides by one datasheet peak, and a bf16 config cannot read near
    100% against the slower fp32 peak)."""
    tokens_per_s = tokens_per_step / step_s
    achieved = flops_per_token * tokens_per_s
    out: dict[str, Any] = {"flops_per_token": flops_per_token, "tokens_per_s": tokens_per_s,
                           "achieved_flops": achieved, "num_workers": num_workers}
    if device == "cpu":
        # a probe already taken (doctor's matmul_speeds) is not timed again
        per = cpu_peak_flops or measure_matmul_peak(num_threads)
        dtype = cpu_peak_dtype if cpu_peak_flops else "fp32"
        label = f"{PEAK_LABEL_CPU} ({num_threads} thread(s) per worker, {dtype}, 1024^3)"
    elif device_peak_flops:
        per, label = float(device_peak_flops), f"{device_name or device} peak (hardware.peak_flops)"
    else:
        return {**out, "mfu": None, "peak_flops": None, "job_peak_flops": None, "peak_label": None,
                "note": "no device peak known: set hardware.peak_flops in the task spec"}
    peak = per * num_workers
    return {**out, "mfu": achieved / peak, "peak_flops": per, "job_peak_flops": peak,
            "peak_label": label}
