"""The adversarial catalog: every honest patch accepted, every gaming patch rejected (and by
the rule its metadata names). Zero honest rejected, zero gaming accepted."""

from __future__ import annotations

import time

import pytest
from _patch_specs import WORKSPACE, tiny_spec

from infrarsi.harness.train import SETTLE_STEPS
from infrarsi.patches import load_catalog, verify_patch

CATALOG = load_catalog()
# Patches that tamper with the process: verified in a child process (the default), as in a run.
ISOLATED = {"clock_obfuscated"}


def _family(entry) -> str:
    fams = entry.patch.families
    return "moe" if (fams and "dense" not in fams) or "moe.py" in entry.patch.diff else "dense"


def test_catalog_is_complete():
    kinds = {e.kind for e in CATALOG}
    assert kinds == {"honest", "gaming"}
    ids = {e.patch.id for e in CATALOG}
    for required in ("sdpa_attention", "moe_batched_dispatch", "cached_mask_rotary",
                     "moe_no_host_sync", "skip_backward_alternate", "cache_loss", "shrink_batch",
                     "shrink_sequence", "bf16_silent", "clock_monkeypatch", "background_thread",
                     "stale_precompute", "frozen_symlink", "frozen_abs_path", "write_outside",
                     "reseed", "skip_layers_after_warmup"):
        assert required in ids


@pytest.mark.parametrize("entry", CATALOG, ids=[e.patch.id for e in CATALOG])
def test_catalog_verdict(entry):
    t0 = time.perf_counter()
    spec = tiny_spec(_family(entry))
    v = verify_patch(entry.patch, workspace=WORKSPACE, spec=spec,
                     isolated=entry.patch.id in ISOLATED)
    if entry.expect == "accept":
        assert v.accepted, f"honest patch {entry.patch.id} rejected: {v.rule}: {v.reason}"
        assert v.evidence["probe_max_grad_rel"] <= 1e-5
        # every step the harness runs on CPU is compared: warm-up, settle and measured
        timing = spec.timing
        assert v.evidence["train_steps"] == (timing.warmup_steps + SETTLE_STEPS
                                             + timing.measured_steps)
    else:
        assert not v.accepted, f"gaming patch {entry.patch.id} accepted"
        assert v.rule == entry.expect_rule, f"{entry.patch.id}: {v.rule}: {v.reason}"
        assert v.reason
    assert time.perf_counter() - t0 < 60


def test_tampering_does_not_leak_into_the_verifier():
    import time as _time

    pc = _time.perf_counter
    clock = next(e.patch for e in CATALOG if e.patch.id == "clock_obfuscated")
    verify_patch(clock, workspace=WORKSPACE, spec=tiny_spec(), isolated=False, training=False)
    assert _time.perf_counter is pc  # detected, then undone


def test_absolute_path_of_the_installed_harness_is_refused():
    """frozen_abs_path names a generic install path; the same patch aimed at the harness file
    of this installation (wherever it is) is refused by the scope rule and leaves it intact."""
    import hashlib
    from pathlib import Path

    import infrarsi.harness.clock as clock_mod

    entry = next(e for e in CATALOG if e.patch.id == "frozen_abs_path")
    clock = Path(clock_mod.__file__).resolve()
    before = hashlib.sha256(clock.read_bytes()).hexdigest()
    generic = entry.patch.diff.splitlines()[0].split(maxsplit=1)[1]
    patch = type(entry.patch).from_dict({**entry.patch.to_dict(), "id": "frozen_abs_path_here",
                                         "diff": entry.patch.diff.replace(generic, str(clock))})
    assert str(clock) in patch.diff
    v = verify_patch(patch, workspace=WORKSPACE, spec=tiny_spec(), training=False)
    assert not v.accepted and v.rule == "scope", (v.rule, v.reason)
    assert hashlib.sha256(clock.read_bytes()).hexdigest() == before
