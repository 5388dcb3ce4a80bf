from __future__ import annotations

import random

import pytest

from infrarsi.errors import IllegalConfigError
from infrarsi.space import Knob, Rule, SearchSpace, config_key


def _space() -> SearchSpace:
    return SearchSpace(
        (
            Knob("mbs", (1, 2, 4), 1, "ordinal"),
            Knob("dp", ("ddp", "fsdp"), "ddp"),
            Knob("bucket", (5, 25), 25, "ordinal", active_if=lambda c: c["dp"] == "ddp"),
        ),
        (Rule("fit", lambda c: "mbs 4 needs fsdp" if c["mbs"] == 4 and c["dp"] == "ddp" else None),),
    )


def test_normalize_resets_inactive_knobs_to_default():
    s = _space()
    assert s.normalize({"mbs": 2, "dp": "fsdp", "bucket": 5}) == {"mbs": 2, "dp": "fsdp", "bucket": 25}


def test_unknown_knob_and_out_of_domain_value_are_refused_with_the_known_names():
    s = _space()
    with pytest.raises(IllegalConfigError, match="unknown knob.*known knobs: mbs, dp, bucket"):
        s.normalize({"mbz": 2})
    with pytest.raises(IllegalConfigError, match="outside its domain"):
        s.normalize({"mbs": 3})


def test_rules_make_configs_illegal_and_enumeration_skips_them():
    s = _space()
    with pytest.raises(IllegalConfigError, match="mbs 4 needs fsdp"):
        s.normalize({"mbs": 4})
    configs = s.enumerate()
    assert all(s.is_legal(c) for c in configs)
    # 3 mbs x ddp x 2 buckets (minus mbs 4) + 3 mbs x fsdp (bucket inactive) = 4 + 3
    assert len(configs) == 7
    assert len({config_key(c) for c in configs}) == 7


def test_neighbours_change_one_knob_and_are_legal():
    s = _space()
    base = s.defaults()
    for n in s.neighbours(base):
        assert s.is_legal(n)
        assert sum(n[k] != base[k] for k in s.names) == 1


def test_allowed_restricts_the_space_to_measured_configs():
    s = SearchSpace((Knob("a", (1, 2, 3), 1, "ordinal"),), allowed=({"a": 1}, {"a": 3}))
    assert s.enumerate() == [{"a": 1}, {"a": 3}]
    assert not s.is_legal({"a": 2})
    assert len(s.sample(5, random.Random(0))) == 2


def test_knob_default_must_be_in_domain():
    with pytest.raises(IllegalConfigError, match="default"):
        Knob("x", (1, 2), 3)
