"""One answer to "what would resolve an effect of this size on this machine?", for every stage.

Doctor (planning: can a ``target_mde`` speedup be told from the noise?) and the report
(nothing promoted: would more pairs or longer trials have let the best candidate's measured
speedup clear the bar?) both call :func:`verification_advice` on doctor's noise model, so they
cannot contradict each other (a user saw the report advise more pairs where doctor had said no
number of pairs would reach the target). The remedy is one of:

* ``none``: ``pairs`` pairs of ``steps``-step trials already resolve ``target``;
* ``pairs``, ``steps``, ``pairs_or_steps``: the fewest pairs (up to ``MAX_PAIRS``) and/or
  measured steps per trial (up to ``MAX_STEPS``) that would;
* ``quiet``: neither does: the trial-to-trial shifts alone exceed it (quiet the machine);
* ``unknown``: no noise model with its components (older doctor payloads, no doctor run).
"""

from __future__ import annotations

import math
from typing import Any

from infrarsi.stats import MAX_PAIRS, mde_for, required_pairs, required_steps

__all__ = ["verification_advice"]


def verification_advice(noise: dict[str, Any] | None, *, target: float, pairs: int,
                        steps: int | None = None, confidence: float | None = None
                        ) -> dict[str, Any]:
    """``{"remedy", "mde", "required_pairs", "required_steps", "text"}`` for resolving an effect
    of ``target`` (a fraction) with ``pairs`` interleaved pairs of ``steps`` measured steps
    (default: doctor's trial length) under ``noise`` (doctor's :func:`noise_model` payload)."""
    if not noise or noise.get("within_cv") is None or not noise.get("measured_steps"):
        return {"remedy": "unknown", "mde": None, "required_pairs": None, "required_steps": None,
                "text": "no doctor noise model with its components: run `infrarsi doctor` to "
                        "learn whether more pairs or longer trials would resolve it"}
    sb = noise.get("sigma_between")
    sb = 0.0 if sb is None or math.isnan(sb) else float(sb)
    sw = float(noise["within_cv"])
    steps = int(steps or noise["measured_steps"])
    conf = float(confidence or noise.get("confidence") or 0.95)
    mde = mde_for(sb, sw, steps, pairs, conf)
    need_pairs = required_pairs(sb, sw, steps, target, conf)
    need_steps = required_steps(sb, sw, pairs, target, conf)
    text = (f"with {pairs} verification pairs of {steps}-step trials the smallest trustworthy "
            f"speedup is {mde:.1%}")
    if (noise.get("repeats") or 2) < 2:
        text += " (between-run noise unmeasured: one repeat; run doctor with --repeats 3)"
    if mde <= target:
        return {"remedy": "none", "mde": mde, "required_pairs": need_pairs,
                "required_steps": need_steps, "text": text + f", within {target:.1%}."}
    fix = []
    if need_steps is not None:
        fix.append(f"set timing.measured_steps to {need_steps} in the task spec (and re-run init)")
    if need_pairs is not None:
        fix.append(f"verify with --pairs {need_pairs}")
    if not fix:
        return {"remedy": "quiet", "mde": mde, "required_pairs": None, "required_steps": None,
                "text": text + f": too noisy for {target:.1%}; neither longer trials nor up to "
                               f"{MAX_PAIRS} pairs reach it: the trial-to-trial shifts "
                               "(between-run noise) dominate. Quiet the machine (other jobs "
                               "share it) or accept a larger effect."}
    remedy = "pairs_or_steps" if len(fix) == 2 else ("steps" if need_steps else "pairs")
    return {"remedy": remedy, "mde": mde, "required_pairs": need_pairs,
            "required_steps": need_steps,
            "text": text + f": too noisy for {target:.1%}. To reach it: " + ", or ".join(fix) + "."}
