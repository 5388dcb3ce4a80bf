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

from infrarsi.stats import verification_advice

__all__ = ["verification_advice"]
