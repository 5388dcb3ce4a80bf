"""Source patches in the run stage: proposed, verified, recorded, searched as knobs, run in a
patched copy of the workspace, and named in the promotion.

Fast tests use a fake inner backend (no Ray) and a contract locked from a made-up loss trace;
the slow one is a real run on cpu_dense (init, patch verification, Tune trials, A/B verify).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from _patch_specs import WORKSPACE
from conftest import copy_task

from infrarsi.backends.base import Backend
from infrarsi.bank import ExperienceBank
from infrarsi.contract import load_task
from infrarsi.contract.contract import lock
from infrarsi.errors import IllegalConfigError
from infrarsi.patches import Patch, PatchVerdict, Scope, honest_patches, load_catalog
from infrarsi.search import _patch_stage
from infrarsi.search._patch_stage import PATCHES_FILE, PatchSetup, prepare_patches
from infrarsi.search._patched import PatchedBackend
from infrarsi.search._session import RunSession
from infrarsi.space import Knob, SearchSpace
from infrarsi.trial import HardwareFingerprint, TrialRecord, TrialStatus, WorkloadSignature

SDPA = next(p for p in honest_patches() if p.id == "sdpa_attention")
MASK = next(p for p in honest_patches() if p.id == "cached_mask_rotary")
FROZEN = next(e.patch for e in load_catalog("gaming") if e.patch.id == "frozen_entry")
WL = WorkloadSignature(model_family="dense", num_params=1, num_layers=1, hidden_size=8,
                       num_heads=1, seq_len=8, global_batch_size=1, vocab_size=8, name="fake")
HW = HardwareFingerprint(device_name="cpu", memory_bytes=2**30, devices_per_node=1)


class FakeBackend(Backend):
    """Records what it was asked to run and where."""

    name = "fake"

    def __init__(self, workspace: Path, calls: list) -> None:
        self.workspace, self.calls = workspace, calls
        self._space = SearchSpace((Knob("mbs", (1, 2), 1, "ordinal"),))

    space = property(lambda self: self._space)
    workload = property(lambda self: WL)
    hardware = property(lambda self: HW)

    def execute(self, config, *, trial_id=None, stop_slower_than_s=None) -> TrialRecord:
        config = self._space.normalize(config)  # a patch knob here would be refused
        self.calls.append((dict(config), self.workspace))
        return TrialRecord(trial_id=trial_id or "t", config=config, status=TrialStatus.OK,
                           backend=self.name, workload=WL, hardware=HW, step_times_s=(0.1,),
                           tokens_per_step=8, extra={"num_params": 1})


def patched(tmp_path: Path, patches, *, conflicts=(), scope: Scope | None = None):
    calls: list = []
    inner = FakeBackend(WORKSPACE, calls)
    backend = PatchedBackend(inner, patches, base_workspace=WORKSPACE, scope=scope or Scope(),
                             factory=lambda ws: FakeBackend(ws, calls), conflicts=conflicts,
                             cache=tmp_path / "cache")
    return backend, calls


# ---- the patched backend ------------------------------------------------------------------
def test_verified_patches_join_the_space_off_by_default_and_conflicts_are_illegal(tmp_path):
    backend, _ = patched(tmp_path, [SDPA, MASK],
                         conflicts=[("cached_mask_rotary", "sdpa_attention", "same lines")])
    assert backend.space.names == ("mbs", "patch:sdpa_attention", "patch:cached_mask_rotary")
    assert backend.space.knob("patch:sdpa_attention").kind == "bool"
    assert backend.baseline_config() == {"mbs": 1, "patch:sdpa_attention": False,
                                         "patch:cached_mask_rotary": False}
    both = {"mbs": 1, "patch:sdpa_attention": True, "patch:cached_mask_rotary": True}
    assert not backend.space.is_legal(both)
    with pytest.raises(IllegalConfigError, match="do not apply together"):
        backend.execute(both)


def test_a_config_with_a_patch_on_runs_in_the_patched_copy_and_says_so(tmp_path):
    backend, calls = patched(tmp_path, [SDPA, MASK])
    off = backend.execute({"mbs": 2}, trial_id="a")
    assert calls[-1] == ({"mbs": 2}, WORKSPACE)  # the inner backend never sees patch knobs
    assert off.config == {"mbs": 2, "patch:sdpa_attention": False, "patch:cached_mask_rotary": False}
    assert off.extra["patches"] == [] and "workspace" not in off.extra
    on = backend.execute({"mbs": 1, "patch:sdpa_attention": True}, trial_id="b")
    cfg, ws = calls[-1]
    assert cfg == {"mbs": 1} and ws != WORKSPACE and str(tmp_path / "cache") in str(ws)
    assert "scaled_dot_product_attention" in (ws / "models" / "layers.py").read_text()
    assert "scaled_dot_product_attention" not in (WORKSPACE / "models" / "layers.py").read_text()
    assert on.config["patch:sdpa_attention"] is True and on.trial_id == "b"
    assert on.extra == {"num_params": 1, "patches": ["sdpa_attention"], "workspace": str(ws)}
    assert backend.execute({"patch:sdpa_attention": True}).extra["workspace"] == str(ws)  # cached


def test_a_patched_copy_whose_frozen_file_differs_from_the_contract_is_rejected(tmp_path):
    scope = Scope(frozen_hashes={"entry.py": "0" * 64})
    backend, calls = patched(tmp_path, [SDPA], scope=scope)
    rec = backend.execute({"patch:sdpa_attention": True}, trial_id="x")
    assert rec.status is TrialStatus.REJECTED and "entry.py" in rec.error_message
    assert calls == []  # never ran


def test_a_patch_that_does_not_apply_is_an_error_record_not_a_crash(tmp_path):
    lines = SDPA.diff.splitlines(keepends=True)
    i = next(i for i, t in enumerate(lines) if t.startswith("-") and not t.startswith("---"))
    lines[i] = "-this line is not in the file\n"
    broken = Patch("broken", "".join(lines), origin="test")
    backend, calls = patched(tmp_path, [broken])
    rec = backend.execute({"patch:broken": True}, trial_id="y")
    assert rec.status is TrialStatus.ERROR and rec.error_kind.value == "patch" and calls == []


# ---- the patch step of a run --------------------------------------------------------------
@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory with a contract locked from a made-up loss trace (no trial run); a
    1-worker baseline, as the sessions below run in local mode (one rank)."""
    spec = load_task(copy_task(tmp_path, **{"search.baseline.num_workers": 1}))
    contract = lock(spec, baseline_config=dict(spec.search.baseline),
                    loss_trace=[7.0] * spec.loss_reference.steps, model_stats={})
    contract.save(tmp_path / "run")
    return tmp_path / "run"


class Stub:
    name = "stub"

    def __init__(self, patches=None, error: Exception | None = None) -> None:
        self._patches, self.error = patches or [], error

    def patches(self, context):
        assert context["contract"] is not None and context["bank"] is not None
        if self.error:
            raise self.error
        return list(self._patches)


def _open(run_dir: Path, bank_url: str, lines: list, resume: bool = False) -> RunSession:
    return RunSession.open(run_dir, resume=resume, bank_url=bank_url, local_mode=True,
                           progress=lines.append)


def test_every_verdict_is_recorded_and_a_known_one_is_reused(run_dir, tmp_path, monkeypatch):
    real = _patch_stage.verify_patch
    verified_ids = []

    def verify(p, **kw):  # the dynamic checks of an honest patch are test_patches' business
        verified_ids.append(p.id)
        if p.id == "sdpa_attention":
            return PatchVerdict(p.id, True, "accepted", "", {"files": ["models/layers.py"],
                                                             "verify_seconds": 0.5})
        if p.id == "boom":
            raise RuntimeError("verifier exploded")
        return real(p, **kw)  # frozen_entry: rejected by the real scope check, no trial

    monkeypatch.setattr(_patch_stage, "verify_patch", verify)
    boom = Patch("boom", MASK.diff, origin="test")
    url, lines = f"sqlite:///{tmp_path / 'bank.sqlite'}", []
    with _open(run_dir, url, lines) as s:
        setup = prepare_patches(s, proposer=Stub([SDPA, FROZEN, boom, SDPA]))
        run1 = s.run_id
        rows = {e.patch_id: e for e in s.bank.patches(run_id=run1)}
    assert [p.id for p in setup.verified] == ["sdpa_attention"]
    assert verified_ids == ["sdpa_attention", "frozen_entry", "boom"]  # the duplicate dropped
    assert rows["sdpa_attention"].verified and not rows["frozen_entry"].verified
    assert rows["frozen_entry"].evidence["rule"] == "scope"
    assert rows["boom"].evidence["rule"] == "crash" and "exploded" in rows["boom"].evidence["reason"]
    data = json.loads((run_dir / PATCHES_FILE).read_text())
    assert {c["id"]: c["accepted"] for c in data["candidates"]} == {
        "sdpa_attention": True, "frozen_entry": False, "boom": False}
    assert [p["id"] for p in data["verified"]] == ["sdpa_attention"]
    text = "\n".join(lines)
    assert "patch sdpa_attention (catalog): accepted" in text
    assert "patch frozen_entry (catalog:gaming): REJECTED by the scope check" in text
    assert "patch boom (test): REJECTED by the crash check: the verifier crashed" in text

    # A second run of the same code: known verdicts are reused; a crash is verified again.
    verified_ids.clear()
    lines.clear()
    with _open(run_dir, url, lines) as s:
        setup = prepare_patches(s, proposer=Stub([SDPA, FROZEN, boom]))
        rows = {e.patch_id: e for e in s.bank.patches(run_id=s.run_id)}
    assert verified_ids == ["boom"]
    assert [p.id for p in setup.verified] == ["sdpa_attention"]
    assert rows["sdpa_attention"].evidence["reused_from"] == run1
    assert f"patch sdpa_attention (catalog): accepted (verdict reused from run {run1})" in lines


def test_a_crashing_proposer_costs_the_patches_not_the_run(run_dir, tmp_path, monkeypatch):
    from infrarsi.proposers import ExpertProposer

    def broken(self, context):
        raise RuntimeError("no catalog")

    monkeypatch.setattr(ExpertProposer, "patches", broken)  # the fallback fails as well
    lines: list = []
    with _open(run_dir, f"sqlite:///{tmp_path / 'b.sqlite'}", lines) as s:
        setup = prepare_patches(s, proposer=Stub(error=ValueError("bad prompt")))
        s.use_patches(setup.verified, setup.conflicts)
        assert not any(n.startswith("patch:") for n in s.backend.space.names)
    assert setup.verified == [] and any("stub proposer failed (bad prompt)" in x for x in lines)
    assert any("expert proposer failed too (no catalog)" in x for x in lines)


def test_no_patches_writes_an_empty_patch_file_and_resume_reads_it_back(run_dir, tmp_path):
    url, lines = f"sqlite:///{tmp_path / 'b.sqlite'}", []
    with _open(run_dir, url, lines) as s:
        setup = prepare_patches(s, enabled=False, proposer=Stub([SDPA]))
    assert setup == PatchSetup(enabled=False)
    assert json.loads((run_dir / PATCHES_FILE).read_text())["enabled"] is False
    (run_dir / PATCHES_FILE).write_text(json.dumps({
        "enabled": True, "verified": [SDPA.to_dict(), MASK.to_dict()],
        "conflicts": [["cached_mask_rotary", "sdpa_attention", "same lines"]]}))
    with _open(run_dir, url, lines, resume=True) as s:
        setup = prepare_patches(s, resume=True, proposer=Stub(error=AssertionError("not asked")))
        s.use_patches(setup.verified, setup.conflicts)
        space = s.backend.space
        priors = {p.knob for p in s.priors()}
    assert [p.id for p in setup.verified] == ["sdpa_attention", "cached_mask_rotary"]
    assert {"patch:sdpa_attention", "patch:cached_mask_rotary"} <= set(space.names)
    assert {"patch:sdpa_attention", "patch:cached_mask_rotary"} <= priors
    assert not space.is_legal({**space.defaults(), "patch:sdpa_attention": True,
                               "patch:cached_mask_rotary": True})


def test_cli_run_has_no_patches(monkeypatch, run_dir):
    from infrarsi import cli
    from infrarsi.search import run_stage

    seen: dict[str, Any] = {}

    def fake_run_search(run_dir, **kw):
        seen.update(kw)
        return run_stage.RunOutcome("r", 0, None)

    # the CLI calls infrarsi.api.run, which calls run_stage.run_search through the module
    monkeypatch.setattr(run_stage, "run_search", fake_run_search)
    cli.main(["run", "--budget", "1", "--run-dir", str(run_dir), "--no-patches"])
    assert seen["patches"] is False
    cli.main(["run", "--budget", "1", "--run-dir", str(run_dir)])
    assert seen["patches"] is True


# ---- a real run -------------------------------------------------------------------------
@pytest.mark.slow
def test_a_run_verifies_searches_and_records_patches_on_cpu_dense(tmp_path, ray_local, monkeypatch):
    from infrarsi.init_stage import init_task
    from infrarsi.search.run_stage import OUTCOME_FILE, run_search

    # One rank, trials in the Tune trial process (Train local mode): the run stage end to end
    # in about two minutes on a shared 2-core box.
    path = copy_task(tmp_path, "cpu_dense.yaml", **{
        "timing.measured_steps": 3, "timing.warmup_steps": 1, "hardware.max_workers": 1,
        "search.baseline.num_workers": 1})
    _, cpath, _ = init_task(path, local_mode=True)
    run_dir, url, lines = cpath.parent, f"sqlite:///{tmp_path / 'bank.sqlite'}", []
    outcome = run_search(run_dir, budget=4, verify_top=1, pairs=3, local_mode=True,
                         bank_url=url, progress=lines.append, use_experience=False)
    text = "\n".join(lines)
    assert "patch sdpa_attention (catalog): accepted" in text, text
    assert "patch cached_mask_rotary (catalog): accepted" in text, text
    data = json.loads((run_dir / PATCHES_FILE).read_text())
    assert {p["id"] for p in data["verified"]} == {"sdpa_attention", "cached_mask_rotary"}
    assert data["conflicts"] and outcome.verified_patches
    bank = ExperienceBank.open(url, seed=False)
    try:
        rows = bank.patches(run_id=outcome.run_id)
        records = bank.trials(outcome.run_id)
        promo = bank.promotion(outcome.run_id)
    finally:
        bank.close()
    assert {e.patch_id for e in rows if e.verified} == {"sdpa_attention", "cached_mask_rotary"}
    assert len(records) >= 4
    spec, patched_trials = load_task(path), 0
    for r in records:  # every trial's config carries the patch knobs; patched ones say where
        assert {"patch:sdpa_attention", "patch:cached_mask_rotary"} <= set(r.config)
        on = sorted(k[len("patch:"):] for k, v in r.config.items() if k.startswith("patch:") and v)
        assert sorted(r.extra.get("patches", ["?"])) == on, r.extra
        if on:  # materialized by the trial process: a complete, patched copy, not the user's tree
            ws = Path(r.extra["workspace"])
            assert ws != spec.workspace_path()
            assert sorted((ws / ".infrarsi-complete").read_text().strip().split(",")) == on
            assert r.status is not TrialStatus.ERROR, r.error_message
            patched_trials += 1
    out = json.loads((run_dir / OUTCOME_FILE).read_text())
    if outcome.promoted is not None:
        on = [k[len("patch:"):] for k, v in outcome.promoted.config.items()
              if k.startswith("patch:") and v]
        assert list(promo.patches) == on
        assert [p["id"] for p in out["promoted_patches"]] == on
        assert all(p["diff"] for p in out["promoted_patches"])
    print(text, f"\n{patched_trials} of {len(records)} trials ran with a patch on")


@pytest.mark.slow
def test_a_frozen_file_changed_mid_run_stops_the_search_at_the_next_trial(tmp_path, ray_local):
    from infrarsi.errors import FrozenFileChangedError
    from infrarsi.init_stage import init_task
    from infrarsi.search.run_stage import STATE_FILE, run_search

    path = copy_task(tmp_path, "cpu_dense.yaml", **{
        "timing.measured_steps": 2, "timing.warmup_steps": 1, "hardware.max_workers": 1,
        "search.baseline.num_workers": 1})
    _, cpath, _ = init_task(path, local_mode=True)
    entry = tmp_path / "ws" / "entry.py"
    lines: list[str] = []

    def progress(line: str) -> None:  # the user edits a frozen file while trial 1 reports
        lines.append(line)
        if re.search(r"\d\.\dms", line) and "entry.py" not in entry.read_text():
            entry.write_text(entry.read_text() + "\n# edited mid-run: entry.py\n")

    with pytest.raises(FrozenFileChangedError, match="workspace/entry.py"):
        run_search(cpath.parent, budget=4, pairs=3, local_mode=True, patches=False,
                   bank_url=f"sqlite:///{tmp_path / 'bank.sqlite'}", progress=progress,
                   use_experience=False)
    state = json.loads((cpath.parent / STATE_FILE).read_text())
    # one trial ran; none of the 3 left was spent on a harness nobody can trust any more
    assert len(state["engine"]["observations"]) == 1, "\n".join(lines)


def test_cli_trial_refuses_a_patch_the_run_did_not_verify(run_dir, capsys):
    from infrarsi import cli

    task = run_dir.parent / "cpu_dense.yaml"
    rc = cli.main(["trial", str(task), "--run-dir", str(run_dir), "--local-mode",
                   "--set", "patch:sdpa_attention=true"])
    assert rc == cli.EXIT_USAGE
    assert "not among the verified patches" in capsys.readouterr().err


def test_a_promotion_names_its_patches_for_apply(run_dir, tmp_path):
    from infrarsi.search._patch_stage import promoted_patches
    from infrarsi.search.verify import Verdict

    with _open(run_dir, f"sqlite:///{tmp_path / 'b.sqlite'}", []) as s:
        s.use_patches([SDPA, MASK], [("cached_mask_rotary", "sdpa_attention", "same lines")])
        config = {**s.backend.baseline_config(), "micro_batch_size": 2, "patch:sdpa_attention": True}
        s.promote(Verdict(config, True, "clears the floor", 1.3, 1.1, 1.5))
        promo = s.bank.promotion(s.run_id)
    assert promo.patches == ("sdpa_attention",) and promo.config["patch:sdpa_attention"] is True
    [p] = promoted_patches(config, [SDPA, MASK])
    assert p["id"] == "sdpa_attention" and p["diff"] == SDPA.diff and p["files"] == ["models/layers.py"]


def test_the_llm_proposer_is_used_when_the_spec_configures_one(tmp_path, monkeypatch):
    from infrarsi.proposers import ExpertProposer, LLMProposer
    from infrarsi.search._patch_stage import make_proposer

    monkeypatch.delenv("INFRARSI_LLM_MODEL", raising=False)
    plain = load_task(copy_task(tmp_path / "a"))
    assert isinstance(make_proposer(plain), ExpertProposer)
    llm = load_task(copy_task(tmp_path / "b", **{"llm.model": "Qwen/Qwen2.5-Coder-7B-Instruct"}))
    chosen = make_proposer(llm)
    assert isinstance(chosen, LLMProposer) and isinstance(chosen.fallback, ExpertProposer)
    lines: list = []
    empty = load_task(copy_task(tmp_path / "c", **{"llm.model": ""}))
    assert isinstance(make_proposer(empty, lines.append), ExpertProposer)
    assert "LLM proposer could not start" in lines[0]
