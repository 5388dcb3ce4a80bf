"""Run the dynamic checks of one patch, by default in a fresh Python process.

Patched code is untrusted: importing it may monkeypatch the clock, start threads or reseed.
In a child process none of that can reach the verifier (or the search that runs after it);
the child still detects it (the tamper sentinels) and reports it as the reason.

Protocol: ``python -m infrarsi.patches._isolated`` reads one JSON request on stdin and writes
one JSON line, prefixed with ``RESULT_TAG``, on stdout.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from typing import Any

RESULT_TAG = "@@infrarsi-verify@@ "


def run_checks(req: dict[str, Any]) -> dict[str, Any]:
    """``req``: base_ws, patched_ws, task (TaskSpec dict), config (one-rank config or None),
    probe_calls, training, loss_rtol, grad_rtol, baseline_trace (None: measure it).

    Returns ``{"ok", "rule", "reason", "evidence", "baseline_trace"}``.
    """
    from infrarsi.contract.spec import TaskSpec
    from infrarsi.patches import _dynamic as D

    spec = D.verification_spec(TaskSpec.from_dict(req["task"]))
    ev: dict[str, Any] = {}
    base_trace = req.get("baseline_trace")
    try:
        D.prime()
        before = D.snapshot()
        ev.update(D.probe(req["base_ws"], req["patched_ws"], spec,
                          calls=req.get("probe_calls") or D.default_calls(spec),
                          rtol=req["grad_rtol"]))
        _tamper(D, before)
        if req.get("training", True):
            cfg = req["config"]
            if base_trace is None:
                base_trace = D.train_trace(req["base_ws"], spec, cfg)["loss_trace"]
            before = D.snapshot()
            try:
                result = D.train_trace(req["patched_ws"], spec, cfg)
            except Exception as e:  # noqa: BLE001 - the patched code's own failure
                raise D.CheckFailed(f"the patched workspace fails in the harness: "
                                    f"{type(e).__name__}: {e}", "crash") from None
            _tamper(D, before)
            if result.get("tokens_per_step") != spec.workload.tokens_per_step:
                raise D.CheckFailed("changes the tokens per step", "work")
            problem, worst = D.compare_traces(base_trace, result["loss_trace"], req["loss_rtol"])
            ev.update(train_steps=len(base_trace), train_max_loss_rel=worst,
                      loss_rtol=req["loss_rtol"], patched_trace=result["loss_trace"])
            if problem:
                raise D.CheckFailed(problem, "loss")
    except D.CheckFailed as e:
        return {"ok": False, "rule": e.rule, "reason": str(e), "evidence": ev,
                "baseline_trace": base_trace}
    return {"ok": True, "rule": "", "reason": "", "evidence": ev, "baseline_trace": base_trace}


def _tamper(D, before: dict[str, Any]) -> None:
    after = D.snapshot()
    problem = D.compare_snapshot(before, after)
    if problem:
        D.restore(before)
        raise D.CheckFailed(problem, "tamper")


def run_isolated(req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """:func:`run_checks` in a child process; a crash or timeout is a rejection."""
    req = {**req, "nonce": secrets.token_hex(16)}  # patched code cannot forge the result line
    try:
        proc = subprocess.run([sys.executable, "-m", "infrarsi.patches._isolated"],
                              input=json.dumps(req), capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "rule": "crash", "reason": f"verification exceeded {timeout_s:g} s "
                "(the patched code hangs or is far slower)", "evidence": {}, "baseline_trace": None}
    tag = RESULT_TAG + req["nonce"] + " "
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    tail = (proc.stderr or proc.stdout)[-1500:]
    return {"ok": False, "rule": "crash", "reason": f"the verification process exited with "
            f"{proc.returncode} without a result: {tail}", "evidence": {}, "baseline_trace": None}


def _main() -> None:
    req = json.loads(sys.stdin.read())
    nonce = req.pop("nonce")
    out = run_checks(req)
    sys.stdout.write("\n" + RESULT_TAG + nonce + " " + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
