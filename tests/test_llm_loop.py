"""The LLM in the loop, against a scripted OpenAI-compatible server (real HTTP, vLLM's protocol):
its priors are used and logged beside the expert's, a wrong prior is revised once live trials
contradict it (and the revision changes the next suggestion), hostile answers cost the round
and never the run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from conftest import copy_task
from fake_openai_server import Answer, FakeOpenAIServer
from toy_backend import ToyBackend

from infrarsi.bank import ExperienceBank
from infrarsi.contract import load_task
from infrarsi.contract.contract import lock
from infrarsi.proposers import ChatClient, LLMProposer, ProposerContext
from infrarsi.search import SearchEngine
from infrarsi.search._revise import PRIORS_FILE, PriorReviser
from infrarsi.search._session import RunSession

MODEL = "scripted-coder"


def _schema_name(body: dict) -> str:
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("name", "")


def _prior(knob, setting, t, ts=0.1, m=0.0, ms=0.3, reason=None) -> dict:
    d = {"knob": knob, "setting": setting, "log_time_effect": t, "log_time_std": ts,
         "log_mem_effect": m, "log_mem_std": ms}
    if reason is not None:
        d["reason"] = reason
    return d


WRONG = _prior("precision", "bf16", 0.4, 0.2)  # bf16 40% slower: the toy runs it 1.5x faster


class WrongThenCorrected:
    """A model whose first prior on bf16 is confidently wrong; shown the measurements, it says
    bf16 is faster. Records the revision prompts it saw."""

    def __init__(self) -> None:
        self.revision_prompts: list[str] = []

    def __call__(self, body: dict) -> Answer:
        if _schema_name(body) == "revision":
            self.revision_prompts.append(body["messages"][-1]["content"])
            return Answer(json.dumps({"priors": [_prior(
                "precision", "bf16", -0.4, 0.1, -0.2,
                reason="measured posterior -0.4 over 4 bf16 trials contradicts +0.4")]}))
        return Answer(json.dumps({"priors": [WRONG]}))


@pytest.fixture
def server():
    with FakeOpenAIServer(model=MODEL) as srv:
        yield srv


def _proposer(server, **kw) -> LLMProposer:
    return LLMProposer(ChatClient(server.base_url, MODEL, timeout_s=kw.pop("timeout_s", 10.0),
                                  max_retries=0, backoff_s=0.0), **kw)


def _engine(b: ToyBackend, priors) -> SearchEngine:
    return SearchEngine(b.space, b.workload, b.hardware, budget=12, seed=0, priors=priors,
                        n_init=0)


def _contradicting_trials(eng: SearchEngine, b: ToyBackend) -> None:
    for i, (mbs, precision) in enumerate(itertools.product((1, 2), ("fp32", "bf16"))):
        eng.observe(b.execute({"micro_batch_size": mbs, "precision": precision,
                               "activation_checkpointing": "full"}, trial_id=f"p{i}"), "test")


def _context(b: ToyBackend, **kw) -> ProposerContext:
    return ProposerContext(space=b.space, workload=b.workload, hardware=b.hardware, **kw)


def test_a_wrong_llm_prior_is_revised_after_contradicting_trials_and_changes_the_suggestion(server):
    model = WrongThenCorrected()
    server.play(model)
    b, proposer, lines = ToyBackend(), _proposer(server), []
    priors = proposer.priors(_context(b))
    bf16 = next(p for p in priors if p.knob == "precision" and p.setting == "bf16")
    assert bf16.log_time_effect == 0.4 and bf16.source == f"llm:{MODEL}"  # the LLM's, not the rule's
    assert {p.source for p in priors} >= {f"llm:{MODEL}", "expert:micro_batch_size"}

    revised, kept = _engine(b, priors), _engine(b, priors)
    for eng in (revised, kept):
        _contradicting_trials(eng, b)
    reviser = PriorReviser(proposer, lambda **kw: _context(b, **kw), lines.append, every=3)
    assert reviser.after_trial(revised)

    prompt = model.revision_prompts[-1]
    assert '"flagged": true' in prompt and '"knob": "precision"' in prompt  # evidence shown
    now = next(p for p in revised.priors if p.knob == "precision")
    assert now.log_time_effect == -0.4 and now.source == f"llm:{MODEL}:revised"
    (round_,) = revised.prior_rounds
    assert round_["after_trials"] == 4 and ["precision", "bf16", "time"] in round_["flagged"]
    (change,) = round_["changes"]
    assert change["before"]["log_time_effect"] == 0.4 and "contradicts" in change["reason"]
    assert any("revised precision='bf16' after 4 trials: time +0.40 -> -0.40" in x for x in lines)

    # the revision is what the search acts on: the next suggestion differs from the one the
    # unrevised priors give on the same trials
    a, k = revised.suggest("n"), kept.suggest("n")
    assert a.config != k.config, (a, k)
    assert a.config["precision"] == "bf16" and k.config["precision"] == "fp32"

    # and it survives a driver restart with the engine state
    restored = _engine(b, priors)
    restored.load_state_dict(json.loads(json.dumps(revised.state_dict())))
    assert next(p for p in restored.priors if p.knob == "precision").log_time_effect == -0.4
    assert not reviser.due(revised)  # the next round waits for `every` more trials


@pytest.mark.parametrize("answer, kind", [
    (Answer("{not json"), "malformed_json"),
    (Answer(json.dumps({"priors": [_prior("num_threads", 999, -3.0, reason="x")]})),
     "unknown_knob"),
    (Answer(json.dumps({"priors": [_prior("precision", "fp4", -2.0, reason="x")]})),
     "out_of_domain"),
    (Answer(json.dumps({"priors": [_prior("precision", "bf16", -50.0, reason="gamed")]})),
     "out_of_range"),
    (Answer("", delay_s=2.0), "timeout"),
])
def test_a_hostile_revision_is_logged_and_the_search_carries_on(server, answer, kind):
    server.script(Answer(json.dumps({"priors": [WRONG]})), answer)
    b = ToyBackend()
    proposer = _proposer(server, timeout_s=0.5)
    eng, lines = _engine(b, proposer.priors(_context(b))), []
    before = list(eng.priors)
    _contradicting_trials(eng, b)
    reviser = PriorReviser(proposer, lambda **kw: _context(b, **kw), lines.append, every=3)
    assert not reviser.after_trial(eng)
    assert eng.priors == before and proposer.stats[kind] >= 1
    assert eng.prior_rounds[-1]["changes"] == []  # the round is logged, with nothing taken
    assert any("revised none" in x for x in lines)
    assert eng.suggest("next") is not None


def test_the_expert_proposer_revises_nothing_and_no_round_runs_without_contradiction(server):
    from infrarsi.proposers import ExpertProposer

    b, lines = ToyBackend(), []
    eng = _engine(b, ExpertProposer().priors(_context(b)))
    reviser = PriorReviser(ExpertProposer(), lambda **kw: _context(b, **kw), lines.append, every=2)
    eng.observe(b.execute(b.baseline_config(), trial_id="a"), "test")
    assert not reviser.due(eng) and not reviser.after_trial(eng)


def test_the_run_uses_and_logs_llm_priors_beside_the_experts(server, tmp_path):
    server.script(Answer(json.dumps({"priors": [
        _prior("micro_batch_size", 2, -0.3, 0.2, 0.5), _prior("no_such_knob", 1, 0.1)]})))
    task = copy_task(tmp_path, **{"llm.base_url": server.base_url, "llm.model": MODEL})
    spec = load_task(task)
    contract = lock(spec, baseline_config=dict(spec.search.baseline),
                    loss_trace=[7.0] * spec.loss_reference.steps, model_stats={})
    contract.save(tmp_path / "run")
    lines: list[str] = []
    from infrarsi.search._patch_stage import make_proposer

    with RunSession.open(tmp_path / "run", resume=False, bank_url=f"sqlite:///{tmp_path}/b.sqlite",
                         local_mode=True, progress=lines.append) as s:
        s.proposer = make_proposer(s.spec, lines.append)
        priors = s.priors()
        exchanges = s.bank.llm_exchanges(s.run_id)
    used = {(p.knob, p.setting): p for p in priors}
    assert used["micro_batch_size", 2].source == f"llm:{MODEL}"
    assert used["micro_batch_size", 2].log_time_effect == -0.3
    log = json.loads((tmp_path / "run" / PRIORS_FILE).read_text())
    assert log["proposer"] == "llm" and log["sources"] == ["expert", "llm"]
    row = next(r for r in log["rows"] if r["knob"] == "micro_batch_size" and r["setting"] == 2)
    assert row["llm"]["log_time_effect"] == -0.3 and row["expert"]["source"].startswith("expert:")
    assert row["used"]["source"] == f"llm:{MODEL}"
    assert log["stats"]["unknown_knob"] == 1
    assert any("priors:" in x and "llm: 1" in x for x in lines)
    assert len(exchanges) == 1  # the exchange is audited in the bank


def test_report_priors_section_shows_prior_revised_measured(tmp_path):
    from report_fixture import make_run

    from infrarsi.report import build_report

    run = make_run(tmp_path, "promoted")
    state_file = run.run_dir / "searcher_state.json"
    state = json.loads(state_file.read_text())
    llm = {"log_time_effect": 0.4, "log_time_std": 0.2, "log_mem_effect": 0.0,
           "log_mem_std": 0.3, "source": f"llm:{MODEL}"}
    expert = {**llm, "log_time_effect": 0.1, "source": "expert:precision"}
    (run.run_dir / PRIORS_FILE).write_text(json.dumps({
        "proposer": "llm", "sources": ["expert", "llm"], "stats": {}, "rows": [
            {"knob": "precision", "setting": "bf16", "used": llm, "expert": expert, "llm": llm}]}))
    after = {**llm, "log_time_effect": -0.4, "log_time_std": 0.1,
             "source": f"llm:{MODEL}:revised"}
    state["engine"]["prior_rounds"] = [{"after_trials": 3, "proposer": "llm", "flagged": [],
                                        "changes": [{"knob": "precision", "setting": "bf16",
                                                     "before": llm, "after": after,
                                                     "reason": "bf16 measured 33% faster"}]}]
    state["engine"]["prior_judged"] = [{
        "knob": "precision", "setting": "bf16", "target": "time", "prior_mean": -0.4,
        "prior_std": 0.1, "posterior_mean": -0.38, "posterior_std": 0.02, "evidence_n": 4,
        "flagged": False, "source": after["source"]}]
    state_file.write_text(json.dumps(state))
    with ExperienceBank.open(run.bank_url) as bank:  # the report prefers the bank's state
        bank.save_state(run.run_id, "searcher", state["engine"])
    md = build_report(run.run_dir, bank_url=run.bank_url).markdown.read_text()
    section = md.split("Priors: prior → revised → measured")[1].split("\n#")[0]
    assert ("| precision | bf16 | time | +0.400 ± 0.200 | llm:scripted-coder | expert +0.100; "
            "llm +0.400 | -0.400 ± 0.100 (after 3 trials) | -0.380 ± 0.020 | 4 |") in section
    assert "bf16 measured 33% faster" in section


def _plain_run_dir(tmp_path, server) -> Path:
    """A locked contract on a copy of the plain (non-reference) workspace, small shapes."""
    import shutil

    from test_patterns import PLAIN

    task = copy_task(tmp_path, **{"llm.base_url": server.base_url, "llm.model": MODEL,
                                  "workload.seq_len": 32, "workload.shape.hidden_size": 32,
                                  "workload.shape.num_layers": 2, "workload.shape.num_heads": 2,
                                  "workload.shape.ffn_hidden_size": 64,
                                  "workload.shape.vocab_size": 256,
                                  "timing.measured_steps": 3})
    shutil.rmtree(tmp_path / "ws")
    shutil.copytree(PLAIN, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    spec = load_task(task)
    contract = lock(spec, baseline_config=dict(spec.search.baseline),
                    loss_trace=[7.0] * spec.loss_reference.steps, model_stats={})
    contract.save(tmp_path / "run")
    return tmp_path / "run"


def test_llm_patches_for_a_plain_workspace_are_verified_fed_back_once_and_searched(
        server, tmp_path):
    from test_patterns import PLAIN

    from infrarsi.proposers import ExpertProposer
    from infrarsi.proposers._patterns import pattern_patches
    from infrarsi.search._patch_stage import PATCHES_FILE, prepare_patches

    net = (PLAIN / "net.py").read_text()
    rewrites = {p.id.split("-")[1]: p.diff for p in pattern_patches({"net.py": net})}
    gaming = rewrites["host_sync"].replace(
        "+        self.busiest = load.max().detach()",
        "+        self.busiest = load.max().detach()\n+        torch.manual_seed(0)")
    answer = {"patches": [
        {"id": "fused-attention", "diff": rewrites["sdpa"], "rationale": "fused SDPA",
         "expected_log_time_effect": -0.1, "expected_log_mem_effect": -0.1},
        {"id": "no-sync", "diff": gaming, "rationale": "drop the host sync",
         "expected_log_time_effect": -0.01, "expected_log_mem_effect": 0.0}]}
    repaired = {"patches": [
        {"id": "no-sync", "diff": rewrites["host_sync"], "rationale": "without the reseed",
         "expected_log_time_effect": -0.01, "expected_log_mem_effect": 0.0}]}
    server.script(Answer(json.dumps(answer)), Answer(json.dumps(repaired)))
    run_dir, lines = _plain_run_dir(tmp_path, server), []
    proposer = LLMProposer(ChatClient(server.base_url, MODEL, max_retries=0),
                           fallback=ExpertProposer(catalog=False, patterns=False))
    with RunSession.open(run_dir, resume=False, bank_url=f"sqlite:///{tmp_path}/b.sqlite",
                         local_mode=True, progress=lines.append) as s:
        setup = prepare_patches(s, proposer=proposer)
        s.use_patches(setup.verified, setup.conflicts)
        names = s.backend.space.names
    assert [p.id for p in setup.verified] == ["llm-fused-attention", "llm-no-sync-r1"], lines
    assert {"patch:llm-fused-attention", "patch:llm-no-sync-r1"} <= set(names)  # searched
    # the first prompt told the model the contract's rules; the repair prompt the reason
    first, repair = (r["messages"] for r in server.requests)
    assert "Frozen files" in first[-1]["content"] and "entry.py" in first[-1]["content"]
    assert "- static: Reseed the generator" in first[-1]["content"]  # rejected examples, with the check that caught them
    assert "REJECTED" in repair[-1]["content"] and "static" in repair[-1]["content"]
    rows = {r["id"]: r for r in json.loads((run_dir / PATCHES_FILE).read_text())["candidates"]}
    assert rows["llm-no-sync"]["rule"] == "static" and not rows["llm-no-sync"]["accepted"]
    assert any("fed back with the reasons; 1 corrected" in x for x in lines)
    assert len(server.requests) == 2  # fed back once, never again
