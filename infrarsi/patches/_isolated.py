"""The two processes of a verdict: a clean **baseline** process and a sandboxed **candidate**.

Patched code is untrusted: importing it may monkeypatch torch or the harness, start threads or
reseed, and whatever it changes process-wide would also change a baseline computed in the same
interpreter. So the baseline's reference (probe calls, loss trace, parameter and optimizer-state
checksum after the last step) is computed in a fresh process that never imports patched code
(:func:`baseline_checks`), and the candidate runs in another fresh process
(:func:`candidate_checks`) that loads that reference *before* the patched code is imported,
installs the sandbox (:mod:`._sandbox`) and reports what it measured; the verifier compares.

Both run under an initialized ``gloo`` process group (world size 1), as real trials always
have one: code that behaves differently when a process group exists does so here too.

Protocol: ``python -m infrarsi.patches._isolated`` reads one JSON request on stdin and writes
one JSON line, prefixed with ``RESULT_TAG`` and the request's nonce, on stdout.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULT_TAG = "@@infrarsi-verify@@ "


def _init_group(scratch: str) -> None:
    """A one-rank gloo process group (file store in the scratch folder)."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        store = Path(scratch) / "pg-store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


def baseline_checks(req: dict[str, Any]) -> dict[str, Any]:
    """In a clean process: the probe reference (saved to ``req['ref_path']``) and the training
    run's loss trace and state checksum. ``req``: base_ws, task, config, probe_calls, training,
    scratch, ref_path."""
    import torch

    from infrarsi.contract.spec import TaskSpec
    from infrarsi.patches import _dynamic as D

    sys.dont_write_bytecode = True
    spec = D.verification_spec(TaskSpec.from_dict(req["task"]))
    D.prime()
    _init_group(req["scratch"])
    calls = req.get("probe_calls") or D.default_calls(spec)
    ref = D.probe_reference(req["base_ws"], spec, calls=calls)
    torch.save(ref, req["ref_path"])
    out: dict[str, Any] = {"ok": True, "rule": "", "reason": "", "ref_path": req["ref_path"]}
    if req.get("training", True):
        result = D.train_trace(req["base_ws"], spec, req["config"])
        out.update(loss_trace=result["loss_trace"], state_checksum=result["state_checksum"],
                   step_times_s=result["step_times_s"])
    return out


def candidate_checks(req: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process (sandboxed unless ``req['sandbox']`` is False): the probe against the
    reference, then the training run with the integrity guard at every step boundary.

    Returns ``{"ok", "rule", "reason", "evidence", "loss_trace", "state_checksum"}``.
    """
    import torch

    from infrarsi.contract.spec import TaskSpec
    from infrarsi.harness.clock import TIMER_ARGS, ClockTamperError
    from infrarsi.patches import _dynamic as D
    from infrarsi.patches import _sandbox as S

    sys.dont_write_bytecode = True
    spec = D.verification_spec(TaskSpec.from_dict(req["task"]))
    ev: dict[str, Any] = {}
    out: dict[str, Any] = {"ok": True, "rule": "", "reason": "", "evidence": ev}
    before = None
    try:
        D.prime()
        if req.get("sandbox", True):
            _init_group(req["scratch"])
            ev["process_group"] = "gloo, world size 1"
        ref = torch.load(req["ref_path"], weights_only=True)
        if req.get("sandbox", True):
            S.install_audit(req["scratch"], TIMER_ARGS)
        guards = req.get("guards", True)  # False: tests only (is this what rejects a patch?)
        integrity = S.Integrity(check_numerics=guards)
        before = D.snapshot()
        with S.NumericsGuard(1, active=guards) as ng:
            ev.update(D.probe_candidate(req["patched_ws"], spec, ref, rtol=req["grad_rtol"],
                                        after_build=lambda: _check(integrity, ng, None)))
        _check(integrity, ng, None)
        _tamper(D, before)
        if req.get("training", True):
            cfg = req["config"]
            threads = int(cfg["num_threads"])
            with S.NumericsGuard(threads, active=guards) as ng:
                try:
                    result = D.train_trace(req["patched_ws"], spec, cfg,
                                           guard=lambda: _check(integrity, ng, threads))
                except D.CheckFailed:
                    raise
                except ClockTamperError as e:
                    raise D.CheckFailed(str(e), "clock") from None
                except Exception as e:  # noqa: BLE001 - the patched code's own failure
                    _check(integrity, ng, None)  # a refused action is the reason, not its crash
                    raise D.CheckFailed(f"the patched workspace fails in the harness: "
                                        f"{type(e).__name__}: {e}", "crash") from None
            _check(integrity, ng, None)  # train_worker restored this process's thread count
            _tamper(D, before)
            if result.get("tokens_per_step") != spec.workload.tokens_per_step:
                raise D.CheckFailed("changes the tokens per step", "work")
            out.update(loss_trace=result["loss_trace"], state_checksum=result["state_checksum"])
            ev["step_times_s"] = result["step_times_s"]
    except D.CheckFailed as e:
        if before is not None:
            D.restore(before)  # matters only in-process (sandbox off): undo what was detected
        rule, reason = e.rule, str(e)
        if S.violations():  # the refused action is the reason, not the failure it caused
            rule, reason = "sandbox", "sandbox: " + S.violations()[0]
        note = (" (under a gloo process group, as real trials run)"
                if "process_group" in ev and rule in ("loss", "gradient", "work") else "")
        out.update(ok=False, rule=rule, reason=reason + note)
    except S.SandboxViolation as e:
        out.update(ok=False, rule="sandbox", reason=str(e))
    return out


def _check(integrity, guard, threads: int | None) -> None:
    """Raise CheckFailed (rule and reason naming the class) when the process was tampered with."""
    from infrarsi.patches import _dynamic as D

    problem = integrity.problem(threads)
    if problem:
        raise D.CheckFailed(problem[1], problem[0])
    if guard.seen:
        raise D.CheckFailed(guard.seen[0], "numerics" if "numerics" in guard.seen[0] else "threads")


def _tamper(D, before: dict[str, Any]) -> None:
    after = D.snapshot()
    problem = D.compare_snapshot(before, after)
    if problem:
        D.restore(before)
        raise D.CheckFailed(problem, "tamper")


def run_isolated(mode: str, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """:func:`baseline_checks` or :func:`candidate_checks` in a fresh child process; a crash or
    a timeout is a failed result (rule ``crash``)."""
    req = {**req, "mode": mode, "nonce": secrets.token_hex(16)}  # the result line cannot be forged
    try:
        proc = subprocess.run([sys.executable, "-m", "infrarsi.patches._isolated"],
                              input=json.dumps(req), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "rule": "crash", "reason": f"verification exceeded {timeout_s:g} s "
                "(the patched code hangs or is far slower)", "evidence": {}}
    tag = RESULT_TAG + req["nonce"] + " "
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    tail = (proc.stderr or proc.stdout)[-1500:]
    return {"ok": False, "rule": "crash", "reason": f"the {mode} process exited with "
            f"{proc.returncode} without a result: {tail}", "evidence": {}}


def _main() -> None:
    req = json.loads(sys.stdin.read())
    nonce = req.pop("nonce")
    out = baseline_checks(req) if req.pop("mode") == "baseline" else candidate_checks(req)
    sys.stdout.write("\n" + RESULT_TAG + nonce + " " + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
