"""Proposers: the expert's rules and bank patches; the LLM client against a real loopback HTTP
server speaking OpenAI chat-completions (scripted answers, realistic bad ones included)."""

from __future__ import annotations

import json
import socket
import time

import pytest
from _patch_specs import WORKSPACE, tiny_spec
from fake_openai_server import Answer, FakeOpenAIServer

from infrarsi.bank import ExperienceBank
from infrarsi.patches import honest_patches, patch_knobs
from infrarsi.proposers import (
    PRIORS_SCHEMA,
    ChatClient,
    ExpertProposer,
    LLMBudgetExceeded,
    LLMProposer,
    LLMTimeout,
    LLMTruncated,
    LLMUnavailable,
    editable_source,
)
from infrarsi.trial import HardwareFingerprint, SoftwareVersions, WorkloadSignature
from infrarsi.workloads import build_torch_space

MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"
SPEC = tiny_spec("moe")
SPACE = build_torch_space(SPEC)
SDPA = next(p for p in honest_patches() if p.id == "sdpa_attention")


def ctx(**kw):
    return {"space": SPACE, "spec": SPEC, "workspace": WORKSPACE,
            "findings": {"phases_s": {"forward": 0.4, "backward": 0.8, "optimizer": 0.05},
                         "bottleneck": "attention score matrix"}, **kw}


@pytest.fixture
def server():
    with FakeOpenAIServer(model=MODEL, api_key="k") as srv:
        yield srv


def client(srv, **kw) -> ChatClient:
    return ChatClient(srv.base_url, MODEL, api_key="k", **{"timeout_s": 2.0, "backoff_s": 0.01, **kw})


def priors_json(*items) -> str:
    return json.dumps({"priors": [
        {"knob": k, "setting": s, "log_time_effect": t, "log_time_std": 0.2, "log_mem_effect": m,
         "log_mem_std": 0.2, "rationale": "x"} for k, s, t, m in items]})


# ---- expert ------------------------------------------------------------------------------
def test_expert_has_a_prior_for_every_non_default_torch_setting():
    priors = ExpertProposer().priors({"space": SPACE, "spec": SPEC})
    covered = {(p.knob, p.setting) for p in priors}
    for k in SPACE.knobs:
        for v in k.values:
            if v != k.default:
                assert (k.name, v) in covered, (k.name, v)
    assert priors == ExpertProposer().priors({"space": SPACE, "spec": SPEC})  # deterministic
    by = {(p.knob, p.setting): p for p in priors}
    assert by[("activation_checkpointing", "full")].log_mem_effect < 0 < by[("activation_checkpointing", "full")].log_time_effect


@pytest.mark.parametrize("bf16_over_fp32, faster", [(2.2, True), (0.4, False)])
def test_expert_bf16_prior_on_a_dense_cpu_task_follows_doctors_measured_matmul_speeds(
        bf16_over_fp32, faster):
    dense = tiny_spec("dense")

    def bf16(findings, spec=dense):
        pri = ExpertProposer().priors({"space": build_torch_space(spec), "spec": spec,
                                       "findings": findings})
        return next(p for p in pri if p.knob == "precision" and p.setting == "bf16")

    fr = {"forward": 0.35, "backward": 0.5, "optimizer": 0.1, "communication": 0.05}
    measured = {"matmul": {"fp32_flops": 1e11, "bf16_flops": bf16_over_fp32 * 1e11},
                "phase_fractions": fr}
    p = bf16(measured)
    assert p.source == "expert:precision:measured"
    assert (p.log_time_effect < -0.2) if faster else (p.log_time_effect > 0.2)
    guess = bf16({})  # no doctor run: the rule of thumb, less sure
    assert guess.source == "expert:precision" and guess.log_time_std > p.log_time_std
    # MoE: a new bf16 kernel per expert-matmul shape at every step; the matmul speed speaks for
    # its step only where the space can keep those shapes few (the shape-buckets patch)
    assert bf16(measured, spec=SPEC).source == "expert:precision"
    buckets = next(p for p in honest_patches("moe") if p.id == "moe_shape_buckets")

    def moe_bf16(findings):
        space = build_torch_space(SPEC).with_knobs(patch_knobs([buckets]))
        pri = ExpertProposer().priors({"space": space, "spec": SPEC, "findings": findings,
                                       "patches": [buckets]})
        return next(p for p in pri if p.knob == "precision" and p.setting == "bf16")

    assert moe_bf16(measured).source == "expert:precision:measured"
    assert moe_bf16({}).source == "expert:precision"  # no doctor run: the rule of thumb


def test_expert_covers_simulator_knob_names():
    from infrarsi.backends.simulator.space import build_space  # noqa: F401 - names only
    from infrarsi.proposers.expert import RULES

    for name in ("tensor_parallel_degree", "pipeline_parallel_degree", "zero_stage",
                 "data_parallel_degree", "context_parallel_degree", "overlap_communication"):
        assert name in RULES


def test_expert_patch_knob_priors_come_from_the_patch():
    space = SPACE.with_knobs(patch_knobs([SDPA]))
    pri = ExpertProposer().priors({"space": space, "spec": SPEC, "patches": [SDPA]})
    p = next(p for p in pri if p.knob == "patch:sdpa_attention")
    assert p.setting is True and p.log_time_effect == SDPA.expected_log_time_effect


def test_expert_patches_are_the_applicable_catalog_and_the_banks(tmp_path):
    ids = [p.id for p in ExpertProposer().patches(ctx())]
    assert {"sdpa_attention", "moe_batched_dispatch", "cached_mask_rotary", "moe_no_host_sync",
            "moe_shape_buckets"} <= set(ids)
    assert [p.id for p in ExpertProposer().patches({"space": SPACE, "spec": tiny_spec("dense")})
            if p.id.startswith("moe")] == []
    bank = ExperienceBank.open(f"sqlite:///{tmp_path / 'b.sqlite'}")
    wl = WorkloadSignature("moe", 1000, 2, 32, 2, 32, 4, 4, 2, vocab_size=256, name="tiny_moe")
    run = bank.start_run("tiny_moe", "c0", wl, HardwareFingerprint("cpu", 1 << 30, 2),
                         SoftwareVersions(), {})
    diff = ("--- a/models/dense.py\n+++ b/models/dense.py\n@@ -1,1 +1,2 @@\n"
            '-"""A Llama-style dense decoder: RMSNorm, RoPE, causal attention, SwiGLU, untied head."""\n'
            '+"""A Llama-style dense decoder: RMSNorm, RoPE, causal attention, SwiGLU, untied head."""\n'
            "+# from the bank\n")
    stale = diff.replace("Llama-style", "Mistral-style")  # written for other code: skipped
    bank.record_patch(run, "docstring", diff, ["models/dense.py"], {"patch": {"rationale": "r"}}, True)
    bank.record_patch(run, "stale", stale, ["models/dense.py"], {}, True)
    bank.record_patch(run, "rejected", diff + "+x = 1\n", ["models/dense.py"], {}, False)
    got = {p.id: p for p in ExpertProposer().patches(ctx(bank=bank, lineage="tiny_moe"))}
    assert "docstring" in got and got["docstring"].origin == f"bank:{run}"
    assert "stale" not in got and "rejected" not in got


# ---- LLM client protocol -----------------------------------------------------------------
def test_client_sends_vllm_structured_output_and_reads_usage(server):
    server.script(Answer(priors_json(("compile", "default", -0.2, 0.0))))
    c = client(server)
    r = c.complete([{"role": "user", "content": "hi"}], PRIORS_SCHEMA, name="priors")
    body = server.requests[-1]
    assert body["stream"] is False and body["model"] == MODEL
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == PRIORS_SCHEMA
    assert server.headers[-1]["Authorization"] == "Bearer k"
    assert json.loads(r.content)["priors"][0]["knob"] == "compile"
    assert c.tokens_used == r.usage["total_tokens"] > 0


@pytest.mark.parametrize("mode, field", [("structured_outputs", "structured_outputs"),
                                         ("guided_json", "guided_json")])
def test_client_other_structured_output_fields(server, mode, field):
    server.script(Answer(priors_json()))
    client(server, structured_mode=mode).complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA)
    body = server.requests[-1]
    assert field in body and "response_format" not in body


def test_client_retries_5xx_and_429_with_backoff(server):
    server.script(Answer(status=503), Answer(status=429), Answer(priors_json()))
    c = client(server, max_retries=2)
    assert json.loads(c.complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA).content) == {"priors": []}
    assert c.retries == 2 and len(server.requests) == 3


def test_client_does_not_retry_a_4xx(server):
    from infrarsi.proposers import LLMHTTPError

    server.script(Answer(status=400), Answer(priors_json()))
    with pytest.raises(LLMHTTPError, match="400"):
        client(server).complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA)
    assert len(server.requests) == 1


def test_client_timeout_on_a_slow_answer(server):
    server.script(Answer(priors_json(), delay_s=1.5), Answer(priors_json(), delay_s=1.5))
    t0 = time.monotonic()
    with pytest.raises(LLMTimeout):
        client(server, timeout_s=0.3, max_retries=1).complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA)
    assert time.monotonic() - t0 < 3


def test_client_endpoint_down():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = ChatClient(f"http://127.0.0.1:{port}/v1", MODEL, timeout_s=1, backoff_s=0.01)
    with pytest.raises(LLMUnavailable, match="vllm serve"):
        c.complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA)
    assert c.retries == 2


def test_client_truncated_answer_and_budget(server):
    server.script(Answer('{"priors": [{"knob": "comp', finish_reason="length"))
    with pytest.raises(LLMTruncated) as e:
        client(server).complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA)
    assert e.value.answer.startswith('{"priors"')
    with pytest.raises(LLMBudgetExceeded):
        client(server, token_budget=100).complete([{"role": "user", "content": "x" * 600}], PRIORS_SCHEMA)
    assert len(server.requests) == 1  # the over-budget request was never sent


def test_wrong_model_name_is_a_clear_error(server):
    from infrarsi.proposers import LLMHTTPError

    with pytest.raises(LLMHTTPError, match="does not exist"):
        ChatClient(server.base_url, "other", api_key="k").complete([{"role": "user", "content": "x"}], PRIORS_SCHEMA)


# ---- LLM proposer: good answers, bad answers, fallback, audit --------------------------------
def test_llm_priors_override_the_expert_and_prompt_carries_the_context(server):
    server.script(Answer(priors_json(("compile", "default", -0.3, -0.1), ("micro_batch_size", 2, -0.05, 0.3))))
    prop = LLMProposer(client(server))
    revision = {"knob": "precision", "setting": "bf16", "target": "time", "prior_mean": -0.4,
                "prior_std": 0.2, "posterior_mean": 0.15, "posterior_std": 0.05, "evidence_n": 3,
                "flagged": True, "source": "expert:precision"}
    trial = {"config": {**SPACE.defaults(), "precision": "bf16"}, "status": "ok",
             "step_times_s": [0.5, 0.6, 0.55], "peak_memory_bytes": [1000]}
    pri = prop.priors(ctx(trials=[trial], revisions=[revision]))
    by = {(p.knob, p.setting): p for p in pri}
    assert by[("compile", "default")].source == f"llm:{MODEL}" and by[("compile", "default")].log_time_effect == -0.3
    assert by[("micro_batch_size", 2)].source.startswith("llm")
    assert by[("activation_checkpointing", "full")].source.startswith("expert")  # filled in
    prompt = server.requests[-1]["messages"][1]["content"]
    for needle in ("attention score matrix", "MISCALIBRATED", "posterior_mean", "micro_batch_size",
                   '"precision": "bf16"'):
        assert needle in prompt, needle
    assert prop.stats["priors_accepted"] == 2 and prop.stats["fallbacks"] == 0


BAD_ANSWERS = [
    (Answer("Sure! Here are my priors: compile is great."), "malformed_json"),
    (Answer('{"priors": [{"knob": "compile"}]}'), "schema_invalid"),
    (Answer('```json\n{"priors": [}\n```'), "malformed_json"),
    (Answer(priors_json(("warp_speed", True, -2.0, 0.0))), "unknown_knob"),
    (Answer(priors_json(("micro_batch_size", 3, -0.1, 0.0))), "out_of_domain"),
    (Answer(priors_json(("compile", "default", -40.0, 0.0))), "out_of_range"),
    (Answer('{"priors": [{"knob": "compi', finish_reason="length"), "truncated"),
    (Answer(status=500), "http_error"),
    (Answer(raw=b"<html>502 Bad Gateway</html>"), "bad_response"),
]


@pytest.mark.parametrize("answer, kind", BAD_ANSWERS, ids=[k for _, k in BAD_ANSWERS])
def test_bad_prior_answers_are_counted_and_fall_back_to_the_expert(server, answer, kind):
    server.script(answer, answer, answer)  # retries see the same failure
    prop = LLMProposer(client(server, max_retries=1))
    got = prop.priors(ctx())
    assert got == ExpertProposer().priors(ctx())
    assert prop.stats[kind] >= 1 and prop.stats["fallbacks"] == 1


def test_slow_and_down_endpoints_fall_back():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prop = LLMProposer(ChatClient(f"http://127.0.0.1:{port}/v1", MODEL, timeout_s=0.5, backoff_s=0.01))
    assert prop.priors(ctx()) == ExpertProposer().priors(ctx())
    assert prop.stats["unavailable"] == 1
    with FakeOpenAIServer(model=MODEL) as srv:
        srv.script(*[Answer(priors_json(), delay_s=1.0)] * 3)
        prop = LLMProposer(ChatClient(srv.base_url, MODEL, timeout_s=0.2, max_retries=1, backoff_s=0.01))
        assert prop.priors(ctx()) == ExpertProposer().priors(ctx())
        assert prop.stats["timeout"] == 1


def _patch_answer(*items) -> str:
    return json.dumps({"patches": [
        {"id": pid, "diff": diff, "rationale": "faster", "expected_log_time_effect": t,
         "expected_log_mem_effect": 0.0} for pid, diff, t in items]})


def test_llm_patches_validated_and_merged_with_the_expert(server):
    missing = SDPA.diff.replace("models/layers.py", "models/attention.py")
    outside = SDPA.diff.replace("a/models/layers.py", "a/../harness/clock.py").replace(
        "b/models/layers.py", "b/../harness/clock.py")
    garbage = "this is not a diff"
    server.script(Answer(_patch_answer(("sdpa", SDPA.diff, -0.3), ("ghost", missing, -0.3),
                                       ("escape", outside, -0.3), ("junk", garbage, -0.1),
                                       ("huge", SDPA.diff, -50.0))))
    prop = LLMProposer(client(server))
    got = prop.patches(ctx())
    ids = [p.id for p in got]
    assert ids[0] == "llm-sdpa" and got[0].origin == f"llm:{MODEL}"
    assert "sdpa_attention" not in ids  # same diff as the LLM's: kept once
    assert "moe_batched_dispatch" in ids  # the expert's others still come
    assert prop.stats["missing_file"] == 1 and prop.stats["out_of_scope"] == 1
    assert prop.stats["bad_diff"] == 1 and prop.stats["out_of_range"] == 1
    prompt = server.requests[-1]["messages"][1]["content"]
    assert "=== models/moe.py ===" in prompt and "entry.py ===" not in prompt


def test_llm_patches_all_bad_falls_back(server):
    server.script(Answer(_patch_answer(("ghost", "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n", -0.1))))
    prop = LLMProposer(client(server))
    assert [p.id for p in prop.patches(ctx())] == [p.id for p in ExpertProposer().patches(ctx())]
    assert prop.stats["fallbacks"] == 1


def test_every_exchange_is_audited_in_the_bank(server, tmp_path):
    bank = ExperienceBank.open(f"sqlite:///{tmp_path / 'b.sqlite'}")
    wl = WorkloadSignature("moe", 1000, 2, 32, 2, 32, 4, 4, 2, vocab_size=256, name="tiny_moe")
    run = bank.start_run("tiny_moe", "c0", wl, HardwareFingerprint("cpu", 1 << 30, 2), SoftwareVersions(), {})
    server.script(Answer(priors_json(("compile", "default", -0.2, 0.0))), Answer("not json"))
    prop = LLMProposer(client(server))
    prop.priors(ctx(bank=bank, run_id=run))
    prop.priors(ctx(bank=bank, run_id=run))
    log = bank.llm_exchanges(run)
    assert len(log) == 2
    assert json.loads(log[0]["prompt"])[0]["role"] == "system"
    assert log[0]["meta"]["usage"]["total_tokens"] > 0 and "error" not in log[0]["meta"]
    assert log[1]["answer"] == "not json" and log[1]["meta"]["error_kind"] == "malformed_json"


def test_editable_source_excludes_frozen_files():
    src = editable_source({"spec": SPEC})
    assert "models/layers.py" in src and "entry.py" not in src
