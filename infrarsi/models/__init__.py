"""Learned cost models: one feature encoding, a step-time model, a censored peak-memory model.

``FeatureEncoder`` turns (config, workload, hardware) into features, the napkin physics of
the config's parallel layout among them (``physics``: per-device memory estimate, pipeline
bubble); ``StepTimeModel``
predicts log step time with a calibrated std; ``PeakMemoryModel`` fits peak memory with OOM
trials right-censored at capacity and gives quantiles, P(OOM) and memory prices; ``CrashModel``
gives P(a config crashes) from the crashes seen, conjunctions of settings included; ``KnobPrior``
and ``revise_priors`` carry proposer/bank priors in and miscalibration records out.
"""

from __future__ import annotations

from infrarsi.models.crash import CrashModel
from infrarsi.models.encoding import Column, FeatureEncoder
from infrarsi.models.peak_memory import PeakMemoryModel
from infrarsi.models.physics import memory_estimate_bytes, pipeline_bubble
from infrarsi.models.priors import (
    MEMORY_MONOTONE,
    KnobPrior,
    PriorRevision,
    coef_prior,
    monotone_signs,
    revise_priors,
)
from infrarsi.models.step_time import StepTimeModel

__all__ = [
    "MEMORY_MONOTONE",
    "Column",
    "CrashModel",
    "FeatureEncoder",
    "KnobPrior",
    "PeakMemoryModel",
    "PriorRevision",
    "StepTimeModel",
    "coef_prior",
    "memory_estimate_bytes",
    "monotone_signs",
    "pipeline_bubble",
    "revise_priors",
]
