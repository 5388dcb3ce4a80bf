"""The bank's fast record serializer equals ``dumps(TrialRecord.to_dict())`` exactly."""

from __future__ import annotations

import math

from bank_conformance import CPU, GPT, H100, ok_trial, oom_trial

from infrarsi.bank import _codec as C
from infrarsi.trial import ErrorKind, TrialRecord, TrialStatus


def test_record_json_matches_to_dict():
    recs = [
        ok_trial("a", 1, 0.1), oom_trial("b", 8, hardware=H100),
        TrialRecord("c", {"x": [1, {"y": None}], "t": (1, 2)}, TrialStatus.ERROR, "ray_train",
                    GPT, CPU, error_kind=ErrorKind.TIMEOUT, loss_trace=(1.0, math.nan, math.inf),
                    extra={"nested": {"k": [1.5]}}, phase_times_s={"fwd": 0.1},
                    startup_seconds=2.0),
    ]
    for r in recs:
        assert C.record_json(r) == C.dumps(r.to_dict())
