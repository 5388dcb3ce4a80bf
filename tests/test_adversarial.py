"""The adversarial catalog: every honest patch accepted, every gaming patch rejected (and by
the rule its metadata names). Zero honest rejected, zero gaming accepted.

Every verdict goes through the path ``infrarsi run`` uses (``verify_patch`` with its defaults:
a clean baseline process, a sandboxed candidate process under a process group)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from _patch_specs import WORKSPACE, tiny_spec

from infrarsi.harness.train import METERED_STEPS
from infrarsi.patches import load_catalog, verify_patch

CATALOG = load_catalog()
# One case per class of issue 34 (a hostile patch the earlier verifier accepted).
ISSUE_34 = {"process_wide_linear": "process-wide change", "clock_private_reference": "infrarsi",
            "attr_chain_env": "attribute chain", "sys_modules_frames": "frames",
            "raw_write_outside": "attribute chain", "process_group_skip": "process group",
            "skip_last_step": "work skipped at the last step", "threads_indirect": "thread count",
            "numerics_in_forward": "numerics lowered inside forward"}


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
    v = verify_patch(entry.patch, workspace=WORKSPACE, spec=spec)
    if entry.expect == "accept":
        assert v.accepted, f"honest patch {entry.patch.id} rejected: {v.rule}: {v.reason}"
        assert v.evidence["probe_max_grad_rel"] <= 1e-5
        # every step the harness runs on CPU is compared: warm-up, measured and metered
        timing = spec.timing
        assert v.evidence["train_steps"] == (timing.warmup_steps + METERED_STEPS
                                             + timing.measured_steps)
    else:
        assert not v.accepted, f"gaming patch {entry.patch.id} accepted"
        assert v.rule == entry.expect_rule, f"{entry.patch.id}: {v.rule}: {v.reason}"
        assert v.reason
        if entry.patch.id in ISSUE_34:  # the reason names the class
            assert ISSUE_34[entry.patch.id] in v.reason, v.reason
    assert time.perf_counter() - t0 < 90


def test_issue_34_catalog_has_a_case_per_class():
    ids = {e.patch.id for e in CATALOG}
    assert set(ISSUE_34) <= ids


DYNAMIC = [e for e in CATALOG if e.expect_dynamic_rule]


@pytest.mark.parametrize("entry", DYNAMIC, ids=[e.patch.id for e in DYNAMIC])
def test_what_the_static_scan_refuses_the_dynamic_checks_refuse_too(entry):
    """With the static scan off, the structural defence behind it rejects the patch: the sandbox
    (a write outside the workspace, os.putenv, a frame lookup) or the namespace hash (the
    clock's private reference); no file appears outside the workspace."""
    marker = Path("/tmp/gaming_outside_marker.txt")  # where raw_write_outside writes
    v = verify_patch(entry.patch, workspace=WORKSPACE, spec=tiny_spec(), static=False)
    assert not v.accepted and v.rule == entry.expect_dynamic_rule, f"{v.rule}: {v.reason}"
    assert not marker.exists()


def _entry(pid):
    return next(e for e in CATALOG if e.patch.id == pid)


def test_process_group_dependent_patch_passes_without_a_group_and_fails_with_one():
    """The candidate runs under a gloo process group as real trials do; the in-process debug
    path has none, and there the patch looks honest (so the group is what rejects it)."""
    entry, spec = _entry("process_group_skip"), tiny_spec()
    without = verify_patch(entry.patch, workspace=WORKSPACE, spec=spec, isolated=False)
    assert without.accepted, without.reason
    with_group = verify_patch(entry.patch, workspace=WORKSPACE, spec=spec)
    assert with_group.rule == "loss" and "process group" in with_group.reason


def _medium_precision_changes_matmul() -> bool:
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    prec = torch.get_float32_matmul_precision()
    try:
        exact = a @ b
        torch.set_float32_matmul_precision("medium")
        return not torch.equal(a @ b, exact)
    finally:
        torch.set_float32_matmul_precision(prec)


@pytest.mark.parametrize("pid", ["numerics_in_forward", "threads_indirect"])
def test_the_thread_and_numerics_guards_are_what_rejects(pid):
    """Same patch, same path, guards off then on. Off: nothing else sees it (a thread count or
    a matmul precision that changes no result here: losses, gradients and the final state agree
    within tolerance), so it is accepted. On: rejected by the guard, the reason naming the class.
    Where lowered matmul precision does change results on this CPU, the gradient/loss checks
    reject it too (defence in depth) and that is what is asserted instead."""
    entry, spec = _entry(pid), tiny_spec()
    off = verify_patch(entry.patch, workspace=WORKSPACE, spec=spec, guards=False)
    if pid == "numerics_in_forward" and _medium_precision_changes_matmul():
        assert off.rule in ("gradient", "loss", "checksum"), f"{off.rule}: {off.reason}"
    else:
        assert off.accepted, f"{off.rule}: {off.reason}"
    on = verify_patch(entry.patch, workspace=WORKSPACE, spec=spec)
    assert not on.accepted and on.rule == entry.expect_rule, f"{on.rule}: {on.reason}"
    assert ISSUE_34[pid] in on.reason, on.reason


def test_last_step_skip_passes_the_loss_trace_and_fails_the_checksum():
    from infrarsi.patches._dynamic import CHECKSUM_RTOL
    from infrarsi.patches.verify import LOSS_RTOL

    v = verify_patch(_entry("skip_last_step").patch, workspace=WORKSPACE, spec=tiny_spec())
    assert v.rule == "checksum", f"{v.rule}: {v.reason}"
    # every recorded loss agreed (over every step): without the checksum it would be accepted
    assert v.evidence["train_steps"] == len(v.evidence["patched_trace"])
    assert v.evidence["train_max_loss_rel"] <= LOSS_RTOL
    assert v.evidence["checksum_max_rel"] > CHECKSUM_RTOL


def test_honest_patches_are_accepted_in_any_order_among_gaming_ones():
    """A shuffled sequence of honest and gaming patches in one verifier process (one baseline
    cache): a gaming patch verified first cannot poison the baseline the honest ones meet."""
    gaming = [_entry(p) for p in ("process_wide_linear", "threads_indirect", "skip_last_step")]
    honest = [e for e in CATALOG if e.kind == "honest" and _family(e) == "dense"]
    order = gaming + honest
    random.Random(34).shuffle(order)
    order = gaming[:1] + [e for e in order if e is not gaming[0]]  # a gaming patch goes first
    for e in order:
        v = verify_patch(e.patch, workspace=WORKSPACE, spec=tiny_spec())
        assert v.accepted == (e.kind == "honest"), f"{e.patch.id}: {v.rule}: {v.reason}"


def test_tampering_does_not_leak_into_the_verifier():
    import time as _time

    pc = _time.perf_counter
    clock = next(e.patch for e in CATALOG if e.patch.id == "clock_obfuscated")
    v = verify_patch(clock, workspace=WORKSPACE, spec=tiny_spec(), isolated=False, training=False,
                     static=False)
    assert v.rule == "tamper"
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
