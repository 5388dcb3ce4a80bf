"""The search engine's policy constants, each with the reason for its value.

The benchmark figures behind these values (and the alternatives tried and not kept) are in
``docs/benchmarks.md``, with the commands that measured them.
"""

from __future__ import annotations

from infrarsi.trial import ErrorKind

# ---- the candidate pool and experience ---------------------------------------------------
# Size of the candidate sample of a space too large to enumerate: large enough that the
# sample's best is near the space's best, small enough that a suggestion scores it quickly.
POOL_SIZE = 5_000
# Experience rows a search fits at most (whole workloads, nearest first): the nearest transfer
# best, and the fit time grows with rows, so a search must not slow down as the bank grows.
MAX_EXPERIENCE = 400
# Experience fits an ExperienceCache keeps: a benchmark's searches share a few experience sets.
EXPERIENCE_CACHE_SIZE = 8

# Once LOCAL_FROM of the budget is spent, the neighbours of the LOCAL_INCUMBENTS best measured
# configs join the pool. Not sooner: early incumbents are poor and the residual model favours
# their neighbourhoods.
LOCAL_INCUMBENTS = 3
LOCAL_FROM = 0.7

# ---- seeds ------------------------------------------------------------------------------------
# Seed trials with experience or priors (they already point somewhere) and cold (a space-filling
# design needs one more to cover the space); never more than a third of the budget.
N_INIT_INFORMED = 3
N_INIT_COLD = 4

# ---- transfer from experience to own trials -------------------------------------------------
# Own trials fit the difference from experience: a step-time residual whose slopes have this
# prior std (log units: about a 35% effect per feature unit).
TRANSFER_TIME_STD = 0.3
# ... scaled by whichever of these the own trials' evidence favours (empirical Bayes): where
# experience predicts this workload's trials well it gains weight, where it does not it gives way.
TRANSFER_TIME_SCALES = (0.5, 1.0, 2.0)
# Memory slopes may move a few posterior std from experience's, plus a floor for slopes
# experience pinned too tightly.
TRANSFER_MEMORY_STD_SCALE = 2.0
TRANSFER_MEMORY_STD_FLOOR = 0.1
# ... that width is the widest the own trials may keep: they choose a multiple of it by their
# evidence (empirical Bayes, as TRANSFER_TIME_SCALES). Kept at full width, the slopes' prior
# uncertainty flattened every P(OOM) away from the own trials (Ultra-Scale labels with
# experience, 10 seeds: predicted 0.15 ran out of memory 3% of the time, predicted 0.65, 83%).
TRANSFER_MEMORY_SCALES = (0.1, 0.3, 1.0)
# Own trials bound the P(OOM) of configs the model places above an own OOM (from below) or
# below an own ok trial (from above), see PeakMemoryModel.p_oom_near: memory is nearly
# deterministic, so the fitted spread's independent misfits overstate how two neighbours can
# differ. This is the run-to-run variation (log units, ~5%) the bounds still allow.
OWN_MEMORY_NOISE = 0.05
# A crash of this search's own workload says more about its configs than one of another
# workload from the bank: it weighs this many experience rows in the crash model.
OWN_CRASH_WEIGHT = 3.0

# ---- acquisition ------------------------------------------------------------------------------
# Expected-improvement margin (log units) at the start of the budget, shrinking to 0 at its end:
# explore early, exploit late.
EXPLORATION_MARGIN = 0.02
# The largest predicted P(fail) a model-driven trial may carry, at first and at the end of the
# budget: early a risky trial also teaches the memory model; late only what it finds counts.
MAX_OOM_RISK = 0.3
FINAL_OOM_RISK = 0.1
# P(fit) multiplier for candidates with a setting every crash so far shared: not zero, the
# setting may be innocent.
SUSPECT_FIT = 0.02
# With no safe candidate left, stop (after this many trials) when even the best P(fit) is below
# NO_FIT_P: every remaining trial would be spent on an expected OOM.
NO_FIT_MIN_TRIALS = 4
NO_FIT_P = 0.05

# Late in the budget (from RISK_FROM of it), a candidate riskier than the cap may still be run
# when its expected gain times P(it measures anything) is at least RISK_MIN_GAIN (log units:
# about 2%) and RISK_GAIN_RATIO times the best safe candidate's, and the failures so far leave
# room within FAIL_ALLOWANCE of the budget for it to fail too. Why: the fastest configs often
# sit at 95-100% of the device's memory, where an honest memory model says P(OOM) ~0.3-0.6;
# late, the safe candidates promise nothing while one such trial is a one-in-two chance of the
# best. Earlier, or without the minimum gain, too many trials fail.
RISK_FROM = 0.7
RISK_MIN_GAIN = 0.02
RISK_GAIN_RATIO = 2.0
FAIL_ALLOWANCE = 0.15

# ---- trials and stop rules --------------------------------------------------------------------
# A trial whose measured steps are all this much slower than the fastest ok trial's median is
# stopped early: far beyond any noise floor doctor measures, its outcome is certain.
SLOW_STOP_FACTOR = 1.5
# After two OOMs and nothing that fit, the lightest configs are run before anything else; when
# this many of them run out of memory too, the search stops (one could be a fluke of a noisy
# measurement, two agreeing are not).
LIGHTEST_PROBES = 2
OOMS_BEFORE_PROBES = 2
# The search stops as "broken, not slow" when its first trials (at least this many) all crashed
# and no setting they share explains it; with a shared setting, after BROKEN_AFTER_SUSPECTS.
BROKEN_AFTER = 3
BROKEN_AFTER_SUSPECTS = 6
# Failures that are the cluster's, not the config's: its trial measured nothing, and the config
# stays a candidate until it has been lost this many times (a config that always loses its
# worker may be killing it). A surprising OOM is not retried: the table's flaky failures made
# retries cost more failed trials than they found.
CLUSTER_FAULTS = frozenset({ErrorKind.WORKER_LOST, ErrorKind.COMMUNICATION})
CLUSTER_FAULT_TRIES = 2
CLUSTER_FAULT_VALUES = frozenset(k.value for k in CLUSTER_FAULTS)
