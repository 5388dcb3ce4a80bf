"""Map whatever a failed Ray Train job raised to one outcome of the trial vocabulary."""

from __future__ import annotations

from infrarsi.trial import ErrorKind, TrialStatus

# Substrings of exception types/messages, checked in order; the first match wins. Ordered so
# the most specific cause is found first (an OOM inside a compiled graph is still an OOM).
_PATTERNS: tuple[tuple[tuple[str, ...], TrialStatus, ErrorKind | None], ...] = (
    # The harness's clock disagreed with the outside timer: the trial ran, but its timing was
    # tampered with (an invariant broken, not a failure of the code), so it is rejected.
    (("ClockTamperError",), TrialStatus.REJECTED, None),
    (("OutOfMemoryError", "CUDA out of memory", "out of memory"), TrialStatus.OOM, None),
    (("CompileFailure", "BackendCompilerFailed", "InductorError", "torch._dynamo.exc"),
     TrialStatus.ERROR, ErrorKind.COMPILE),
    (("ActorDiedError", "WorkerHealthCheck", "RayActorError", "NodeDiedError",
      "died unexpectedly", "OwnerDiedError", "WorkerCrashedError"),
     TrialStatus.ERROR, ErrorKind.WORKER_LOST),
    (("DistBackendError", "Gloo", "gloo", "NCCL", "nccl", "Connection closed by peer",
      "Connection reset by peer", "CollectiveTimeoutError", "ProcessGroup"),
     TrialStatus.ERROR, ErrorKind.COMMUNICATION),
    (("WorkspaceImportError",), TrialStatus.ERROR, ErrorKind.PATCH),
)


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, its Ray wrappers' payloads and its causes, outermost first."""
    seen: list[BaseException] = []
    stack = [exc]
    while stack:
        e = stack.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        stack.extend(
            getattr(e, attr, None)
            for attr in ("_base_exc", "cause", "health_check_failure", "controller_failure",
                         "__cause__", "__context__")
        )
        failures = getattr(e, "worker_failures", None)
        if isinstance(failures, dict):
            stack.extend(failures[r] for r in sorted(failures))
    return seen


def classify(exc: BaseException) -> tuple[TrialStatus, ErrorKind | None, str]:
    """(status, error kind, one readable message) for an exception from ``trainer.fit()``."""
    chain = _chain(exc)
    text = "\n".join(f"{type(e).__module__}.{type(e).__name__}: {e}" for e in chain)
    for needles, status, kind in _PATTERNS:
        if any(n in text for n in needles):
            return status, kind, _message(chain, needles)
    return TrialStatus.ERROR, ErrorKind.CRASH, _message(chain, ())


def _message(chain: list[BaseException], needles: tuple[str, ...]) -> str:
    for e in reversed(chain):  # innermost matching cause reads best
        line = f"{type(e).__name__}: {e}"
        if not needles or any(n in line for n in needles):
            return line.strip()[:2000]
    e = chain[-1]
    return f"{type(e).__name__}: {e}".strip()[:2000]
