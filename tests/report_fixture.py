"""A synthetic, finished (or not) run: a git repo with a workspace, a locked contract, a SQLite
bank of hand-made TrialRecords, and the files the run stage and doctor leave. No Ray needed.

``make_run(tmp, kind)``: kind is "promoted" (knobs + one verified patch), "knobs" (promoted,
no patch), "nothing" (the best candidate does not clear the noise floor), "oom" (every
candidate ran out of memory) or "partial" (the driver is still running: no run_outcome.json).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infrarsi.bank import ExperienceBank
from infrarsi.contract import load_task, lock
from infrarsi.search.verify import paired_speedup
from infrarsi.trial import HardwareFingerprint, SoftwareVersions, TrialRecord
from infrarsi.trial import WorkloadSignature as WS
from infrarsi.workloads.knobs import build_torch_space

MiB = 2**20
CAP = 128 * MiB
MODEL_PY = '''"""Editable model code."""
import torch


def rmsnorm(x, w, eps=1e-6):
    var = (x * x).mean(-1, keepdim=True)
    return x / (var + eps).sqrt() * w
'''
ENTRY_PY = '''"""Frozen entry point."""
from model import rmsnorm  # noqa: F401


def build_model(shape, parallel):
    raise NotImplementedError
'''
PATCH_DIFF = '''--- a/model.py
+++ b/model.py
@@ -5,3 +5,3 @@
 def rmsnorm(x, w, eps=1e-6):
     var = (x * x).mean(-1, keepdim=True)
-    return x / (var + eps).sqrt() * w
+    return x * torch.rsqrt(var + eps) * w
'''
TASK_YAML = """name: synth
workload:
  workspace: ws
  family: dense
  seq_len: 256
  global_batch_size: 8
  shape: {vocab_size: 2048, hidden_size: 128, num_layers: 4, num_heads: 4, ffn_hidden_size: 344}
hardware: {device: cpu, max_workers: 2, cpus_per_worker: 1, memory_capacity_gib: 0.125}
loss_reference: {steps: 4, seed: 1234}
timing: {warmup_steps: 2, measured_steps: 5}
search:
  baseline: {num_workers: 2, num_threads: 1, micro_batch_size: 1, activation_checkpointing: none}
"""
WL = WS("dense", 1_200_000, 4, 128, 4, 256, 8, vocab_size=2048, name="synth")
HW = HardwareFingerprint("cpu", CAP, 2, 1, "loopback", 0.0)


@dataclass
class SynthRun:
    repo: Path
    run_dir: Path
    bank_url: str
    run_id: str
    baseline: dict
    winner: dict | None


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout


def make_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    (repo / "ws").mkdir(parents=True)
    (repo / "ws" / "entry.py").write_text(ENTRY_PY)
    (repo / "ws" / "model.py").write_text(MODEL_PY)
    (repo / "synth.yaml").write_text(TASK_YAML)
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "Dev")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return repo


def rec(tid: str, config: dict, status: str = "ok", step_ms: float | None = None,
        peak_mib: float | None = None, cost: float = 20.0, error_kind: str | None = None,
        phases: dict | None = None, msg: str = "") -> TrialRecord:
    steps = [step_ms / 1e3 * f for f in (0.99, 1.0, 1.01, 1.0, 1.02)] if step_ms else []
    return TrialRecord(
        trial_id=tid, config=config, status=status, backend="ray_train", workload=WL, hardware=HW,
        error_kind=error_kind, error_message=msg, step_times_s=steps,
        peak_memory_bytes=[int(peak_mib * MiB)] * 2 if peak_mib and status == "ok" else None,
        memory_capacity_bytes=CAP, memory_censor_bytes=CAP if status == "oom" else None,
        loss_trace=[7.6, 7.5, 7.4, 7.3] if status == "ok" else [], phase_times_s=phases or {},
        tokens_per_step=2048, device_seconds=cost, wall_seconds=cost / 2,
        extra={"num_params": WL.num_params, "flops_per_token": 7.2e6})


def _phases(step_ms: float, fwd: float = 0.3) -> dict:
    s = step_ms / 1e3
    return {"forward": fwd * s, "backward": 0.45 * s, "optimizer": 0.1 * s,
            "communication": (0.15 - (fwd - 0.3)) * s}


def make_run(tmp: Path, kind: str = "promoted") -> SynthRun:
    repo = make_repo(tmp)
    spec = load_task(repo / "synth.yaml")
    space = build_torch_space(spec)
    base = space.normalize(dict(spec.search.baseline))
    run_dir = tmp / "runs" / "synth"
    contract = lock(spec, baseline_config=base, loss_trace=[7.6, 7.5, 7.4, 7.3],
                    model_stats={"num_params": WL.num_params, "flops_per_token": 7.2e6})
    contract.save(run_dir)

    def cfg(**kw):
        return {**base, **kw}

    patch = kind == "promoted"
    win = cfg(micro_batch_size=4, activation_checkpointing="full",
              **({"patch:fused_rmsnorm": True} if patch else {}))
    if kind == "oom":
        search = [(rec("t0", base, step_ms=180, peak_mib=60, phases=_phases(180)), "seed:baseline")]
        search += [(rec(f"t{i}", cfg(micro_batch_size=m), "oom", cost=8.0), o) for i, (m, o) in
                   enumerate([(8, "seed:maximin"), (4, "model"), (2, "pairing")], 1)]
    else:
        search = [
            (rec("t0", base, step_ms=180, peak_mib=60, phases=_phases(180)), "seed:baseline"),
            (rec("t1", cfg(micro_batch_size=2), step_ms=150, peak_mib=82), "seed:maximin"),
            (rec("t2", cfg(micro_batch_size=8), "oom", cost=6.0), "seed:maximin"),
            (rec("t3", cfg(micro_batch_size=4, activation_checkpointing="full"), step_ms=140,
                 peak_mib=95), "model"),
            (rec("t4", cfg(compile="default"), "error", cost=30.0, error_kind="compile",
                 msg="torch._dynamo: backend failed"), "model"),
            (rec("t5", cfg(micro_batch_size=8, activation_checkpointing="full"), step_ms=138,
                 peak_mib=118), "pairing"),
            (rec("t6", cfg(micro_batch_size=8, activation_checkpointing="selective"), "oom",
                 cost=7.0), "pairing"),
        ]
        if patch:
            search.append((rec("t7", win, step_ms=126, peak_mib=93), "proposer:patch"))
    verify = []
    cand = 178 if kind == "nothing" else (126 if patch else 140)
    cand_cfg = win if kind != "nothing" else cfg(micro_batch_size=2)
    pairs = []
    if kind in ("promoted", "knobs", "nothing"):
        for i, (b, c) in enumerate([(181, cand * 1.0), (178, cand * 1.02), (183, cand * 0.99)]):
            verify.append((rec(f"verify0-A{i}", base, step_ms=b, peak_mib=60,
                               phases=_phases(b)), "verify:baseline"))
            verify.append((rec(f"verify0-B{i}", cand_cfg, step_ms=c, peak_mib=93,
                               phases=_phases(c, 0.25)), "verify:candidate"))
            pairs.append((b / 1e3, c / 1e3))

    bank_url = f"sqlite:///{tmp / 'bank.sqlite'}"
    bank = ExperienceBank.open(bank_url, seed=False)
    run_id = bank.start_run("synth", contract.sha256, WL, HW,
                            SoftwareVersions("2.5.0", "", "", "2.40.0", "3.11.9"),
                            {"run_dir": str(run_dir)})
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id}))
    for r, origin in search + verify:
        bank.record_trial(run_id, r, origin)
    verdicts, promoted = [], None
    if pairs:
        s, lo, hi = paired_speedup([p[0] for p in pairs], [p[1] for p in pairs])
        ok = lo > 1.03
        v = {"config": cand_cfg, "promoted": ok,
             "reason": f"speedup {s:.3f}x, 95% CI [{lo:.3f}, {hi:.3f}] over 3 interleaved pairs",
             "speedup": s, "ci_low": lo, "ci_high": hi, "mde": 0.03, "pairs": pairs,
             "baseline_trials": [f"verify0-A{i}" for i in range(3)],
             "candidate_trials": [f"verify0-B{i}" for i in range(3)],
             "invariants": "loss and work per step checked on every candidate trial"}
        verdicts.append(v)
        if ok:
            promoted = v
            bank.record_promotion(run_id, cand_cfg, ["fused_rmsnorm"] if patch else [], v)
    if patch:
        bank.record_patch(run_id, "fused_rmsnorm", PATCH_DIFF, ["model.py"],
                          {"loss_check": "max relative drift 3.1e-07 over 4 steps (tolerance 2e-3)",
                           "work_check": "2048 tokens per step, as locked",
                           "static_check": "no timing or data-pipeline access"}, True)
    bank.record_baseline(run_id, {"baseline_step_s": 0.181, "noise": {"mde": 0.03}})
    if kind != "partial":
        bank.finish_run(run_id, "finished")
    bank.close()

    state = {"engine": {"observations": [{"record": r.to_dict(), "origin": o} for r, o in search],
                        "seed_plan": [], "pairings": [],
                        "revisions": _revisions(), "stop_reason": None}}
    (run_dir / "searcher_state.json").write_text(json.dumps(state))
    (run_dir / "doctor.json").write_text(json.dumps({
        "baseline_step_s": 0.181, "noise": {"mde": 0.03, "within_run_cv": 0.008, "between_run_cv": 0.012},
        "profile": {"forward": 0.3, "backward": 0.45, "optimizer": 0.1, "communication": 0.15},
        "mfu": {"mfu": 0.2, "peak_flops": 2.0e11, "peak_label": "measured CPU matmul peak (doctor)"},
        "findings": [{"text": "communication 15% of step, not overlapped"}]}))
    if kind != "partial":
        best = min((r for r, _ in search if r.ok), key=lambda r: r.step_time_s)
        (run_dir / "run_outcome.json").write_text(json.dumps({
            "run_id": run_id, "trials": len(search), "best": best.to_dict(), "verdicts": verdicts,
            "promoted": promoted, "stop_reason": None}, default=str))
    return SynthRun(repo, run_dir, bank_url, run_id, base, cand_cfg if promoted else None)


def _revisions() -> list[dict]:
    def r(knob, setting, target, pm, ps, qm, qs, n, flagged):
        return {"knob": knob, "setting": setting, "target": target, "prior_mean": pm,
                "prior_std": ps, "posterior_mean": qm, "posterior_std": qs, "evidence_n": n,
                "flagged": flagged, "source": "expert"}
    return [r("micro_batch_size", 4, "time", -0.15, 0.1, -0.25, 0.05, 3, False),
            r("activation_checkpointing", "full", "time", 0.25, 0.08, 0.05, 0.04, 3, True),
            r("compile", "default", "time", -0.2, 0.15, -0.1, 0.3, 0, False),
            r("micro_batch_size", 8, "memory", 0.9, 0.2, 1.1, 0.1, 3, False)]
