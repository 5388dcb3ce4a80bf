"""Priors in the run: where they came from (side by side), and their revision from live trials.

At the start the proposer's priors are logged per source (``priors.json`` in the run
directory: for each knob setting the expert rule's and the LLM's effects beside the one the
search uses). Then, after every ``every`` trials, :class:`PriorReviser` asks the engine's
models how each prior fares against the trials so far (:meth:`SearchEngine.judge_priors`: a
fit of the trials without the priors, so that a confident prior cannot vouch for itself);
when any is contradicted (``flagged``), the proposer is shown the evidence and returns revised
priors with its reasons, which the engine searches on (:meth:`SearchEngine.set_priors`). Each
round is kept in the engine's state (``prior_rounds``) for the report's prior -> revised ->
measured table. A proposer that fails or changes nothing costs the round, never the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from infrarsi.models.priors import KnobPrior
from infrarsi.rundir import write_json

PRIORS_FILE = "priors.json"
REVISE_EVERY = 3  # trials between two revision rounds: enough new evidence to judge a prior


def _key(p: KnobPrior) -> tuple[str, str]:
    return p.knob, json.dumps(p.setting, default=str)


def _effects(p: KnobPrior) -> dict[str, Any]:
    return {"log_time_effect": p.log_time_effect, "log_time_std": p.log_time_std,
            "log_mem_effect": p.log_mem_effect, "log_mem_std": p.log_mem_std,
            "source": p.source}


def prior_table(by_source: Mapping[str, Sequence[KnobPrior]],
                used: Sequence[KnobPrior]) -> list[dict[str, Any]]:
    """One row per knob setting: each source's prior (None: no opinion) and the one used."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for p in used:
        rows[_key(p)] = {"knob": p.knob, "setting": p.setting, "used": _effects(p),
                         **{name: None for name in by_source}}
    for name, priors in by_source.items():
        for p in priors:
            row = rows.setdefault(_key(p), {"knob": p.knob, "setting": p.setting, "used": None,
                                            **{n: None for n in by_source}})
            row[name] = _effects(p)
    return list(rows.values())


def log_priors(run_dir: Path, proposer: Any, used: Sequence[KnobPrior],
               progress: Callable[[str], None]) -> None:
    """Write ``priors.json`` and one progress line on how many priors each source gave."""
    name = getattr(proposer, "name", type(proposer).__name__)
    by_source = dict(getattr(proposer, "last_sources", None) or {name: list(used)})
    stats = dict(getattr(proposer, "stats", {}) or {})
    write_json(Path(run_dir) / PRIORS_FILE, {
        "proposer": name, "sources": sorted(by_source), "stats": stats,
        "rows": prior_table(by_source, used)})
    counts = ", ".join(f"{n}: {len(v)}" for n, v in sorted(by_source.items()))
    progress(f"priors: {len(used)} knob setting(s) from the {name} proposer ({counts}); "
             f"side by side in {PRIORS_FILE}")


class PriorReviser:
    """Asks ``proposer.revise`` for new priors every ``every`` trials when the trials
    contradict any; ``context(**fields)`` builds the proposer context (the session's)."""

    def __init__(self, proposer: Any, context: Callable[..., Any],
                 progress: Callable[[str], None] = print, every: int = REVISE_EVERY) -> None:
        self.proposer = proposer
        self.context = context
        self.progress = progress
        self.every = max(1, every)

    def due(self, engine: Any) -> bool:
        n = len(engine.observations)
        last = engine.prior_rounds[-1]["after_trials"] if engine.prior_rounds else 0
        return bool(engine.priors) and n - last >= self.every

    def after_trial(self, engine: Any) -> bool:
        """One revision round when due and contradicted; True when the priors changed."""
        if not self.due(engine):
            return False
        try:
            judged = engine.judge_priors()
        except Exception as e:  # noqa: BLE001 - a failed fit costs the round, not the run
            self.progress(f"warning: could not judge the priors ({e}); no revision this round")
            return False
        flagged = [r for r in judged if r.get("flagged")]
        if not flagged:
            return False
        try:
            answer = list(self.proposer.revise(
                self.context(trials=tuple(engine.records), revisions=tuple(judged)),
                list(engine.priors)))
        except Exception as e:  # noqa: BLE001 - advice; the search goes on with what it has
            self.progress(f"warning: the {getattr(self.proposer, 'name', '')} proposer's "
                          f"revision failed ({e}); keeping the priors")
            answer = []
        n = len(engine.observations)
        old = {_key(p): p for p in engine.priors}
        changes = [{"knob": p.knob, "setting": p.setting, "reason": reason,
                    "before": _effects(old[_key(p)]) if _key(p) in old else None,
                    "after": _effects(p)} for p, reason in answer]
        merged = {**old, **{_key(p): p for p, _ in answer}}
        round_ = {"after_trials": n, "flagged": [[r["knob"], r["setting"], r["target"]]
                                                 for r in flagged],
                  "proposer": getattr(self.proposer, "name", ""), "changes": changes}
        engine.set_priors(list(merged.values()), round_)
        if not changes:
            self.progress(f"priors: {len(flagged)} contradicted after {n} trials; the "
                          f"{round_['proposer']} proposer revised none")
        for c in changes:
            b, a = c["before"] or {}, c["after"]
            self.progress(f"priors: revised {c['knob']}={c['setting']!r} after {n} trials: time "
                          f"{_fmt(b.get('log_time_effect'))} -> {_fmt(a['log_time_effect'])}, "
                          f"memory {_fmt(b.get('log_mem_effect'))} -> "
                          f"{_fmt(a['log_mem_effect'])} ({c['reason']})")
        return bool(changes)


def _fmt(x: Any) -> str:
    return "none" if x is None else f"{x:+.2f}"
