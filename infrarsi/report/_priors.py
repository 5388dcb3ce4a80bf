"""The report's priors section: per knob setting, prior -> revised -> measured.

Sources: ``priors.json`` in the run directory (each proposer source's priors and the one the
search started with), the searcher state's ``prior_rounds`` (each revision from live trials,
with the proposer's reason) and ``prior_judged`` (every prior against a fit of the trials
alone: the measured effect, see ``SearchEngine.judge_priors``). Effects are natural-log
ratios vs the knob's default (-0.10 is about 10% less).
"""

from __future__ import annotations

import json
from typing import Any

from infrarsi.report import _doc as D
from infrarsi.rundir import read_json

PRIORS_FILE = "priors.json"  # written by infrarsi.search._revise.log_priors
_TARGETS = (("time", "log_time_effect", "log_time_std"), ("memory", "log_mem_effect", "log_mem_std"))


def _k(knob: Any, setting: Any) -> tuple[str, str]:
    return str(knob), json.dumps(setting, default=str)


def _fmt(effect: Any, std: Any = None) -> str:
    if effect is None:
        return "–"
    return f"{effect:+.3f}" + (f" ± {std:.3f}" if isinstance(std, (int, float)) else "")


def _started(data: Any) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """(knob setting -> {"used": effects, <source>: effects}, the sources)."""
    log = read_json(data.run_dir / PRIORS_FILE) if getattr(data, "run_dir", None) else None
    if not log:
        return {}, []
    return ({_k(r["knob"], r["setting"]): r for r in log.get("rows") or []},
            list(log.get("sources") or []))


def priors(data: Any) -> list[D.Block]:
    engine = data.engine or {}
    started, sources = _started(data)
    rounds = engine.get("prior_rounds") or []
    judged = {(_k(r["knob"], r["setting"]), r["target"]): r
              for r in engine.get("prior_judged") or engine.get("revisions") or []}
    revised: dict[tuple[str, str], tuple[dict[str, Any], int, str]] = {}
    for rnd in rounds:
        for c in rnd.get("changes") or []:
            revised[_k(c["knob"], c["setting"])] = (c["after"], rnd["after_trials"], c["reason"])
    blocks: list[D.Block] = [D.h("Priors: prior → revised → measured", 3)]
    if not started and not judged:
        return blocks + [D.p("No priors recorded for this run.")]
    keys = list(dict.fromkeys([*started, *revised, *(k for k, _ in judged)]))
    rows = []
    for key in keys:
        row = started.get(key) or {}
        first = row.get("used") or {}
        rev = revised.get(key)
        for target, eff, std in _TARGETS:
            j = judged.get((key, target))
            if first.get(eff) is None and j is None and (rev is None or rev[0].get(eff) is None):
                continue
            by_source = "; ".join(f"{s} {_fmt((row.get(s) or {}).get(eff))}" for s in sources
                                  if s != "used" and (row.get(s) or {}).get(eff) is not None)
            rows.append([key[0], json.loads(key[1]), target,
                         _fmt(first.get(eff), first.get(std)) if first else
                         (_fmt(j["prior_mean"], j["prior_std"]) if j and not rev else "–"),
                         first.get("source", "") if first else "",
                         by_source or "–",
                         (f"{_fmt(rev[0].get(eff), rev[0].get(std))} (after {rev[1]} trials)"
                          if rev else "–"),
                         _fmt(j["posterior_mean"], j["posterior_std"]) if j else "–",
                         j.get("evidence_n", "") if j else "",
                         "yes" if j and j.get("flagged") else ""])
    n_rev = sum(len(r.get("changes") or []) for r in rounds)
    text = (f"{len(keys)} knob setting(s) had a prior; {len(rounds)} revision round(s) from live "
            f"trials changed {n_rev}. 'measured' is the effect fitted on this run's trials "
            "alone; 'off' marks a prior (the revised one, where revised) that the trials "
            "contradict (outside its 95% interval).")
    blocks += [D.p(text), D.table(["knob", "setting", "target", "prior", "source",
                                   "by source", "revised", "measured", "n", "off"], rows)]
    reasons = [f"{c['knob']}={c['setting']!r} after {r['after_trials']} trials: {c['reason']}"
               for r in rounds for c in r.get("changes") or [] if c.get("reason")]
    if reasons:
        blocks.append(D.p("The proposer's reasons: " + " | ".join(reasons)))
    return blocks
