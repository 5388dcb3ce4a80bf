"""The report's sections, built from :class:`ReportData` as document blocks."""

from __future__ import annotations

from typing import Any

from infrarsi.report import _doc as D
from infrarsi.report import _priors
from infrarsi.report._audit import fingerprints, recheck_frozen, trial_command
from infrarsi.report._data import ReportData, Side
from infrarsi.space import is_patch_knob
from infrarsi.trial import TrialStatus

MiB = 2**20


def _ms(s: float | None) -> str:
    return f"{s * 1e3:,.1f} ms" if s else "–"


def _mib(b: float | None) -> str:
    return f"{b / MiB:,.1f} MiB" if b else "–"


def _pct(x: float | None) -> str:
    return f"{x:.2%}" if x is not None else "–"


def _tps(x: float | None) -> str:
    return f"{x:,.0f}" if x else "–"


def _change(a: float | None, b: float | None, lower_better: bool = False) -> str:
    if not a or not b:
        return "–"
    r = b / a
    word = ("faster" if r < 1 else "slower") if lower_better else ("more" if r > 1 else "less")
    return f"{r:.3f}x ({abs(r - 1):.1%} {word})"


def verdict_line(data: ReportData) -> tuple[str, str]:
    """(tone, sentence): the one-line answer a reader wants first."""
    v = data.promoted
    if v and v.get("speedup"):
        conf = v.get("confidence", 0.95)
        ci = (f"{conf:.0%} CI [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
              if v.get("ci_low") is not None else "")
        n = len(v.get("pairs") or [])
        bar = (f"minimum worthwhile effect 1 + {v['min_effect']:.3f}" if "min_effect" in v
               else f"noise floor 1 + {v.get('mde', 0):.3f}")
        return "good", (f"**Promoted: {v['speedup']:.3f}x faster per step** ({ci}, {n} interleaved "
                        f"A/B pairs against the untouched baseline; {bar}).")
    if data.partial:
        return "warn", f"**Partial run**: {data.partial}. Nothing promoted yet."
    return "bad", f"**Nothing promoted**: {data.not_promoted}."


def headline(data: ReportData) -> list[D.Block]:
    tone, line = verdict_line(data)
    blocks = [D.callout(line, tone)]
    if data.partial and data.promoted:
        blocks.append(D.callout(f"Partial run: {data.partial}.", "warn"))
    if not data.records:
        return blocks + [D.p("No trial of this run has finished yet: there is nothing to compare.")]
    b, a = data.before or Side("baseline"), data.after or Side("–")
    mfu_note = f" (against the {data.peak_flops_label})" if data.peak_flops_label else \
        " (no peak FLOP/s known: run `infrarsi doctor`)"
    rows = [
        ["step time (median)", _ms(b.step_s), _ms(a.step_s), _change(b.step_s, a.step_s, True)],
        ["tokens / s", _tps(b.tokens_per_s), _tps(a.tokens_per_s),
         _change(b.tokens_per_s, a.tokens_per_s)],
        ["MFU" + mfu_note, _pct(b.mfu), _pct(a.mfu), _change(b.mfu, a.mfu)],
        ["peak memory per device" + (f" (capacity {_mib(data.capacity_bytes)})"
                                     if data.capacity_bytes else ""),
         _mib(b.peak_bytes), _mib(a.peak_bytes),
         _change(b.peak_bytes, a.peak_bytes)],
        ["trials measured", ", ".join(b.trials[:6]) or "–", ", ".join(a.trials[:6]) or "–", ""],
    ]
    blocks.append(D.table(["", b.label, a.label, "after / before"], rows))
    blocks.append(D.p(cost_line(data)))
    return blocks


def cost_line(data: ReportData) -> str:
    recs = data.records
    n_verify = sum(1 for r in recs if data.origin(r).startswith("verify"))
    failed = [r for r in recs if not r.ok]
    total = sum(r.device_seconds for r in recs)
    return (f"Cost of finding it: {len(recs) - n_verify} search + {n_verify} verification trials, "
            f"{total:,.0f} device-seconds, of which {sum(r.device_seconds for r in failed):,.0f} "
            f"on {len(failed)} failed trial(s) (see the ledger).")


def promoted_change(data: ReportData) -> list[D.Block]:
    blocks = [D.h("Promoted change")]
    cfg = data.winner_config
    if not cfg:
        return blocks + [D.p("Nothing was promoted, so there is nothing to apply.")]
    changed = data.changed(cfg)
    knobs = {k: v for k, v in changed.items() if not is_patch_knob(k)}
    if knobs:
        blocks.append(D.table(["knob", "baseline", "promoted"],
                              [[f"`{k}`", b, a] for k, (b, a) in sorted(knobs.items())]))
    else:
        blocks.append(D.p("No launch knob changed."))
    blocks.append(D.p("Apply it on a new branch of your repository with `infrarsi apply --run-dir "
                      f"{data.run_dir}` (your current branch is not touched)."))
    blocks += patches(data)
    return blocks


def patches(data: ReportData) -> list[D.Block]:
    if not data.patch_ids():
        return [D.h("Patches", 3), D.p("No source patches: the promoted change is launch knobs only.")]
    blocks = [D.h("Patches", 3)]
    for e in data.patches:
        ev = e.evidence or {}
        blocks.append(D.p(f"**{e.patch_id}** — {'verified' if e.verified else 'NOT VERIFIED'}; "
                          f"touches {', '.join(f'`{f}`' for f in e.files) or 'no files'} (paths relative "
                          f"to the workspace `{data.spec.workload.workspace}`)"))
        rows = [(k, _evidence(v)) for k, v in ev.items()]
        if rows:
            blocks.append(D.kv(rows))
        blocks.append(D.code(e.diff, "diff"))
    return blocks


def _evidence(v: Any) -> str:
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_evidence(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def ledger(data: ReportData) -> list[D.Block]:
    recs = data.records
    base = data.baseline_step_s()
    total = sum(r.device_seconds for r in recs)
    failed = [r for r in recs if not r.ok]
    oom = [r for r in recs if r.status is TrialStatus.OOM]
    f_cost = sum(r.device_seconds for r in failed)
    o_cost = sum(r.device_seconds for r in oom)
    n_verify = sum(1 for r in recs if data.origin(r).startswith("verify"))
    text = (f"{len(recs)} trials ({len(recs) - n_verify} search, {n_verify} verification), "
            f"**{total:,.0f} device-seconds** in all. Failed trials: {len(failed)} costing "
            f"**{f_cost:,.0f} device-s** ({f_cost / total:.0%} of the total)" if total else
            f"{len(recs)} trials, no cost recorded")
    if failed and f_cost:
        text += f"; OOM: {len(oom)} trial(s), {o_cost / f_cost:.0%} of the failed cost."
    elif recs:
        text += "."
    rows, marked = [], set()
    for i, r in enumerate(recs):
        status = r.status.value + (f" ({r.error_kind.value})" if r.error_kind else "")
        if not r.ok:
            marked.add(i)
        changes = ", ".join(f"{k}={a}" for k, (_, a) in sorted(data.changed(r.config).items())) or "baseline"
        sp = f"{base / r.step_time_s:.3f}x" if base and r.ok and r.step_time_s else "–"
        if r.peak_memory_max_bytes:
            mem = _mib(r.peak_memory_max_bytes)
        elif r.status is TrialStatus.OOM and r.memory_censor_bytes:
            mem = f"> {r.memory_censor_bytes / MiB:,.0f} MiB (censored)"
        else:
            mem = "–"
        rows.append([i + 1, f"`{r.trial_id}`", data.origin(r) or "?", status, changes,
                     _ms(r.step_time_s), sp, mem, f"{r.device_seconds:,.1f}"])
    return [D.h("Trial ledger"), D.p(text),
            D.table(["#", "trial", "origin", "status", "config (vs baseline)", "step", "speedup",
                     "peak memory", "device-s"], rows, marked)]


def verification(data: ReportData) -> list[D.Block]:
    blocks = [D.h("Verification")]
    if not data.verdicts:
        return blocks + [D.p("No candidate was re-measured against the baseline"
                             + (" yet (partial run)." if data.partial else "."))]
    rows = []
    for v in data.verdicts:
        changes = ", ".join(f"{k}={a}" for k, (_, a) in sorted(data.changed(v["config"]).items()))
        ci = (f"[{v['ci_low']:.3f}, {v['ci_high']:.3f}]" if v.get("ci_low") is not None else "–")
        sp = f"{v['speedup']:.3f}x" if v.get("speedup") else "–"
        rows.append([changes or "baseline", "yes" if v.get("promoted") else "no", sp, ci,
                     len(v.get("pairs") or []), v.get("reason", "")])
    effect = next((v["min_effect"] for v in data.verdicts if "min_effect" in v), None)
    rule = (f"Promoted only when the one-sided lower bound from these pairs clears 1 + "
            f"verify.min_effect = {1 + effect:.3f} (false-promotion rate at most 5% over all "
            "looks: alpha spending); doctor's MDE only planned how many pairs to run."
            if effect is not None else "Promoted only when the lower bound clears 1 + MDE.")
    steps = next((v["measured_steps"] for v in data.verdicts if v.get("measured_steps")), None)
    if steps:
        rule += (f" Each verification trial timed {steps} steps (the length fitted to doctor's "
                 "noise model; both sides of every pair alike).")
    blocks.append(D.p("Each candidate ran interleaved with the untouched baseline (A B A B …); "
                      "speedup = baseline / candidate step time per pair, Student-t bound on "
                      "the mean log ratio. " + rule))
    blocks.append(D.table(["candidate", "promoted", "speedup", "interval", "pairs", "reason"],
                          rows))
    return blocks


def models(data: ReportData) -> list[D.Block]:
    revs = data.engine.get("revisions") or []
    flagged = [r for r in revs if r.get("flagged")]
    blocks = [D.h("Priors the run corrected", 3)]
    if not revs:
        return blocks + [D.p("No prior revisions recorded.")]
    if not flagged:
        return blocks + [D.p(f"All {len(revs)} priors agreed with the measurements.")]
    rows = [[r.get("knob"), r.get("setting"), r.get("target"),
             f"{r.get('prior_mean', 0):+.3f} ± {r.get('prior_std', 0):.3f}",
             f"{r.get('posterior_mean', 0):+.3f} ± {r.get('posterior_std', 0):.3f}",
             r.get("evidence_n", ""), r.get("source", "")] for r in flagged]
    return blocks + [D.p(f"{len(flagged)} of {len(revs)} priors were miscalibrated (the measured "
                         "effect fell outside the prior's interval; log-scale effects vs the "
                         "knob's default):"),
                     D.table(["knob", "setting", "target", "prior", "measured", "n", "source"], rows)]


def doctor(data: ReportData) -> list[D.Block]:
    doc = data.doctor
    blocks = [D.h("Doctor's baseline", 3)]
    if not doc:
        return blocks + [D.p("No doctor record for this workload and hardware: run `infrarsi doctor` "
                             "for a phase profile, a measured noise floor and MFU.")]
    rows = [("baseline step", _ms(doc.baseline_step_s))]
    rows += [(f"noise: {k}", f"{v:.4g}" if isinstance(v, float) else str(v))
             for k, v in doc.noise.items() if not isinstance(v, dict | list)]
    if doc.mfu_fraction is not None:
        rows.append(("MFU (doctor)", f"{_pct(doc.mfu_fraction)} of the {doc.peak_label or 'peak'}"))
    blocks.append(D.kv(rows))
    finds = doc.findings
    if finds:
        blocks.append(D.p("Findings: " + "; ".join(
            f.get("text") or f.get("summary") or str(f) if isinstance(f, dict) else str(f)
            for f in finds[:8])))
    return blocks


def audit(data: ReportData) -> list[D.Block]:
    checks = recheck_frozen(data)
    bad = [c for c in checks if c.status != "unchanged"]
    c = data.contract
    blocks = [D.h("Audit"),
              D.kv([("contract sha256", f"`{c.sha256}`"), ("locked at", c.created_at),
                    ("editable scope", ", ".join(f"`{g}`" for g in c.editable)),
                    ("work per step", f"{data.tokens_per_step:,} tokens"),
                    ("loss reference", f"{c.loss_reference.get('steps')} steps at seed "
                                       f"{c.loss_reference.get('seed')}"),
                    *fingerprints(data)])]
    tone = "good" if not bad else "bad"
    msg = (f"All {len(checks)} frozen files re-hashed now match the contract." if not bad else
           f"{len(bad)} frozen file(s) differ from the contract: "
           + ", ".join(f"`{x.key}` {x.status}" for x in bad)
           + ". The measurements above were made on the locked files; re-run `infrarsi init` "
             "before trusting a re-run.")
    blocks.append(D.callout(msg, tone))
    blocks.append(D.table(["frozen file", "sha256 at lock", "sha256 now", "status"],
                          [[f"`{x.key}`", x.locked[:16], x.current[:16], x.status] for x in checks],
                          {i for i, x in enumerate(checks) if x.status != "unchanged"}))
    cmds = "# the baseline\n" + trial_command(data, None)
    if data.winner_config:
        cmds += "\n# the promoted config\n" + trial_command(data, data.winner_config)
    elif data.after and data.after.trials:
        cmds += "\n# the best candidate (not promoted)\n" + trial_command(
            data, next((r.config for r in data.records if r.trial_id == data.after.trials[0]), None))
    blocks += [D.p("Reproduce:"), D.code(cmds, "sh")]
    return blocks


def build(data: ReportData, plots: dict[str, tuple[str, bytes | None, str]]) -> list[D.Block]:
    blocks = [D.p(f"Task `{data.task_name}` · run `{data.run_id}` · run directory "
                  f"`{data.run_dir}`")]
    blocks += headline(data)
    blocks += promoted_change(data)
    blocks.append(D.h("Plots"))
    blocks += [D.img(name, title, png, why) for name, (title, png, why) in plots.items()]
    blocks += verification(data)
    blocks += ledger(data)
    blocks += [D.h("Models and baseline")] + _priors.priors(data) + models(data) + doctor(data)
    blocks += audit(data)
    if data.notes:
        blocks += [D.h("Notes")] + [D.p(n) for n in data.notes]
    return blocks
