"""The search benchmark: every peer runs, tune and inline agree, experience is leave-one-out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infrarsi.backends import TableBackend
from infrarsi.bench import SEARCHERS, register_searcher, run_bench, run_search
from infrarsi.bench._overhead import same_trajectory
from infrarsi.bench._report import metrics, summarize
from infrarsi.bench._runner import BenchRun
from infrarsi.space import config_key

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "configs" / "tables" / "ultrascale.yaml"
PEERS = ["random", "optuna_tpe", "optuna_tpe_constrained", "hyperopt", "deepspeed_autotuner",
         "greedy_one_knob"]

SYN_SPEC = """\
name: syn
csv: {csv}
workload_columns: [w]
knobs:
  - {{name: tensor_parallel_degree, column: tp}}
  - {{name: micro_batch_size, column: mbs}}
  - {{name: zero_stage, column: zero}}
  - {{name: activation_checkpointing, column: ckpt, kind: bool}}
objective: {{column: tps, direction: maximize}}
status: {{column: status, ok: [ok], oom: [oom]}}
baseline: {{tensor_parallel_degree: 1, zero_stage: 0, micro_batch_size: 1}}
signature:
  common: {{model_family: dense, num_params: 1000, num_layers: 2, hidden_size: 8, num_heads: 2,
           seq_len: 16, global_batch_size: 8}}
hardware:
  common: {{device_name: cpu, memory_bytes: 1000000, devices_per_node: 2}}
"""


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    """Two workloads over tp x mbs x zero x ckpt; big micro-batches without checkpointing OOM."""
    d = tmp_path_factory.mktemp("syn")
    lines = ["w,tp,mbs,zero,ckpt,status,tps"]
    for w, scale in (("a", 1.0), ("b", 1.5)):
        for tp in (1, 2):
            for mbs in (1, 2, 4, 8):
                for zero in (0, 1, 2):
                    for ckpt in ("false", "true"):
                        if tp == 2 and mbs == 8:
                            continue  # never measured
                        oom = mbs * (2 if ckpt == "false" else 1) / tp > 6 - zero
                        tps = scale * (100 + 10 * mbs + 5 * zero - 3 * tp - (8 if ckpt == "true" else 0))
                        lines.append(f"{w},{tp},{mbs},{zero},{ckpt},{'oom' if oom else 'ok'},"
                                     f"{'' if oom else tps}")
    (d / "t.csv").write_text("\n".join(lines) + "\n")
    spec = d / "t.yaml"
    spec.write_text(SYN_SPEC.format(csv=d / "t.csv"))
    return spec


def _legal(b, traj) -> bool:
    keys = {config_key(c) for c in b.space.allowed}
    return all(config_key(r.config) in keys for r in traj.records)


@pytest.mark.parametrize("name", PEERS)
def test_each_peer_runs_on_a_synthetic_table(synthetic, name):
    b = TableBackend.from_spec(synthetic, {"w": "a"}, seed=0)
    traj = run_search(name, b, budget=8, seed=1)
    assert 1 <= len(traj.records) <= 8 and _legal(b, traj)
    assert any(r.ok for r in traj.records)
    assert traj.fallbacks == 0


@pytest.mark.parametrize("name", PEERS)
def test_each_peer_runs_on_the_ultrascale_table(ultrascale_csv, name):
    b = TableBackend.from_spec(SPEC, {"model": "8B", "nodes": 4}, csv_path=ultrascale_csv)
    traj = run_search(name, b, budget=10, seed=0)
    assert 1 <= len(traj.records) <= 10 and _legal(b, traj)
    m = metrics(BenchRun("8B", name, False, 10, 0, b.best_objective(), True, traj))
    assert 0 < m.fraction <= 1 and 0 <= m.fail_share <= 1


def test_deepspeed_probes_zero_stages_in_order_and_mbs(synthetic):
    b = TableBackend.from_spec(synthetic, {"w": "a"})
    traj = run_search("deepspeed_autotuner", b, budget=30, seed=0)
    stages = [r.config["zero_stage"] for r in traj.records]
    assert stages == sorted(stages) and stages[0] == 0
    first = traj.records[0].config
    assert first["micro_batch_size"] == 1 and first["tensor_parallel_degree"] == 1
    assert {r.config["tensor_parallel_degree"] for r in traj.records} == {1}  # no model parallelism
    assert traj.records[1].config["micro_batch_size"] == 8  # then the largest micro-batch
    assert len({config_key(r.config) for r in traj.records}) == len(traj.records)


def test_greedy_changes_one_searched_knob_at_a_time(synthetic):
    b = TableBackend.from_spec(synthetic, {"w": "a"})
    traj = run_search("greedy_one_knob", b, budget=30, seed=2)
    assert traj.records[0].config == b.baseline_config()
    inc, best = traj.records[0].config, b.objective(traj.records[0])
    for r in traj.records[1:]:
        assert sum(r.config[k] != inc[k] for k in inc) == 1
        v = b.objective(r)
        if v is not None and (best is None or v > best):
            inc, best = r.config, v
    assert len(traj.records) < 30  # stopped at a local optimum


def test_budget_prefix_equals_a_smaller_budget(synthetic):
    b = TableBackend.from_spec(synthetic, {"w": "a"})
    for name in ("optuna_tpe", "hyperopt", "random"):
        assert same_trajectory(run_search(name, b, budget=12, seed=4).prefix(6),
                               run_search(name, b, budget=6, seed=4))


def test_tune_and_inline_give_identical_trajectories(ray_local, synthetic):
    b = TableBackend.from_spec(synthetic, {"w": "a"})
    for name in ("random", "optuna_tpe", "optuna_tpe_constrained"):  # raise-on-OOM and report
        tuned = run_search(name, b, budget=5, seed=3, engine="tune")
        inline = run_search(name, b, budget=5, seed=3, engine="inline")
        assert len(tuned.records) == 5
        assert same_trajectory(tuned, inline), name


def test_leave_one_workload_out_experience(synthetic):
    seen: list[tuple[str, object]] = []

    @register_searcher("probe_exp", uses_experience=True)
    def make_probe(space, backend, budget, seed, experience):
        seen.append((backend.workload_name, experience))
        return SEARCHERS["random"](space, backend, budget, seed, experience)

    try:
        backends = [TableBackend.from_spec(synthetic, {"w": w}) for w in ("a", "b")]
        runs = run_bench(backends, searchers=["probe_exp", "random"], budgets=[3], seeds=[0])
    finally:
        del SEARCHERS["probe_exp"]
    assert sorted((r.searcher, r.experience) for r in runs) == sorted(
        [("probe_exp", False), ("probe_exp", True), ("random", False)] * 2)
    for wl, exp in seen:
        if exp is None:
            continue
        other = "w=b" if wl == "w=a" else "w=a"
        assert {r.workload.name for r in exp} == {other}
        assert len(exp) == len(backends[0].records())
    assert sum(exp is None for _, exp in seen) == 2


def test_report_figures(synthetic, tmp_path):
    b = TableBackend.from_spec(synthetic, {"w": "b"})
    runs = run_bench([b], searchers=["random", "deepspeed_autotuner"], budgets=[4, 8], seeds=[0, 1])
    ms = [metrics(r) for r in runs]
    for m, r in zip(ms, runs, strict=True):
        objs = [b.objective(x) for x in r.trajectory.records]
        assert m.fail_share == sum(o is None for o in objs) / len(objs)
        ok = [o for o in objs if o is not None]
        assert m.fraction == (max(ok) / b.best_objective() if ok else 0.0)
    s = summarize(ms)
    assert set(s["overall"]) == {"4", "8"} and "random" in s["overall"]["8"]

    import importlib.util

    loader = importlib.util.spec_from_file_location("bench_search", ROOT / "scripts" / "bench_search.py")
    cli = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(cli)
    out = tmp_path / "b.json"
    assert cli.main(["--spec", str(synthetic), "--workloads", '[{"w": "a"}]', "--budgets", "4",
                 "--seeds", "2", "--tune-check", "0", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    # a searcher that uses experience runs twice (cold, and with leave-one-out experience)
    rows = sum(2 if getattr(f, "uses_experience", False) else 1 for f in SEARCHERS.values())
    assert len(data["runs"]) == 2 * rows and data["summary"]["overall"]["4"]
