"""The short summary doctor prints: step, phases, memory, MFU, noise floor, findings."""

from __future__ import annotations

from typing import Any

from infrarsi.harness.profile import PHASES

__all__ = ["format_summary"]


def _ms(s: float | None) -> str:
    return "–" if s is None else f"{s * 1e3:.1f} ms"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _mib(b: float | None) -> str:
    return "–" if b is None else f"{b / 2**20:,.1f} MiB"


def format_summary(p: dict[str, Any]) -> str:
    """A few readable blocks of ``label  value`` lines."""
    lines = [f"doctor: {p.get('task')} baseline, {len(p.get('records', []))} repeat(s)",
             f"  step (median of trial medians)  {_ms(p.get('baseline_step_s'))}"]
    prof = p.get("profile") or {}
    fr = prof.get("fractions") or {}
    if fr:
        lines.append(f"  phase profile (profiled step {_ms(prof.get('step_s'))}, "
                     f"{prof.get('timeline', '')}):")
        per_rank = prof.get("per_rank") or []
        head = "    phase            all ranks" + "".join(f"   rank {r['rank']}" for r in per_rank)
        lines.append(head)
        for ph in PHASES:
            row = f"    {ph:<16} {fr.get(ph, 0.0):>9.1%}"
            row += "".join(f" {r['fractions'].get(ph, 0.0):>8.1%}" for r in per_rank)
            lines.append(row)
        comm = prof.get("communication") or {}
        if comm.get("total_s"):
            lines.append(f"    communication in flight {_ms(comm['total_s'])}, "
                         f"overlapped {_pct(comm.get('overlapped_fraction'))}")
    for m in prof.get("missing") or []:
        lines.append(f"  profile: {m} missing" + (f" ({'; '.join(prof.get('errors', [])[:2])})"
                                                  if prof.get("errors") else ""))
    mem = prof.get("memory_bytes") or {}
    if mem:
        keys = ("params", "grads", "optimizer_state", "ddp_buckets", "activations_and_other")
        parts = ", ".join(f"{k} {_mib(mem[k])}" for k in keys if mem.get(k) is not None)
        lines.append(f"  memory rank 0: peak {_mib(mem.get('peak'))} = {parts}")
    mfu = p.get("mfu") or {}
    lines.append(f"  MFU  {_pct(mfu.get('mfu'))}  ({mfu.get('achieved_flops', 0) / 1e9:,.2f} "
                 f"GFLOP/s of {(mfu.get('job_peak_flops') or 0) / 1e9:,.1f}; "
                 f"{mfu.get('peak_label') or mfu.get('note', '')})")
    n = p.get("noise") or {}
    lines += [
        f"  noise: within-run CV {_pct(n.get('within_cv'))}, between-run CV "
        f"{_pct(n.get('between_cv'))} ({n.get('repeats')} trials x {n.get('measured_steps')} steps)",
        f"  minimum detectable effect {_pct(n.get('mde'))} with {n.get('pairs')} interleaved "
        f"pairs (t-interval on log ratios); target {_pct(n.get('target_mde'))}",
        f"  {'WARNING: ' if n.get('too_noisy') else ''}{n.get('advice', '')}",
    ]
    need, alone = n.get("required_measured_steps"), n.get("required_measured_steps_within_only")
    if need:
        lines.append(f"  trial length for the target: measured_steps >= {need}")
    elif alone:
        lines.append(f"  trial length for the target if runs did not shift: measured_steps >= {alone}"
                     " (step jitter alone)")
    loss = p.get("loss") or {}
    if loss:
        lines.append(f"  loss across repeats: max relative spread {loss.get('max_rel_spread', 0):.1e}"
                     f" (tolerance {loss.get('tolerance')})")
    finds = p.get("findings") or []
    if finds:
        lines.append("  findings:")
        lines += [f"    - [{f['kind']}] {f['message']}" for f in finds]
    return "\n".join(lines)
