"""The sandbox and integrity checks of the process that runs a patched candidate.

Only ever installed in the candidate's own child process (:mod:`._isolated`), never in the
verifier or the search, because an audit hook cannot be removed:

* :func:`install_audit` — a ``sys.addaudithook`` hook refusing, for the rest of the process,
  file writes outside the candidate's scratch folder, file-system and environment mutations,
  processes (other than the harness's own step timer), ctypes, sockets and tracers. It judges
  the *effect* (the audit event), so how the patched code reached ``open`` does not matter.
* :class:`Integrity` — a fingerprint of the harness's and torch's namespaces (every module
  global and class attribute, by identity), thread counts, numerics flags, the environment,
  tracers and the torch-function mode stack, taken before the patched code is imported and
  compared at every step boundary of the candidate's training run.
* :class:`NumericsGuard` — a ``TorchFunctionMode`` that re-reads the numerics flags and thread
  counts at every matmul-like call *inside* forward, so lowering them there and restoring them
  before the step boundary is seen too.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Audit events refused outright in the candidate's process (the patched model has no business
# doing any of these; the harness does none of them once the candidate runs).
_REFUSED = {
    "os.putenv": "changes the environment", "os.unsetenv": "changes the environment",
    "os.system": "starts a process", "os.exec": "starts a process",
    "os.posix_spawn": "starts a process", "os.spawn": "starts a process",
    "os.fork": "starts a process", "os.forkpty": "starts a process", "os.kill": "sends a signal",
    "os.killpg": "sends a signal", "pty.spawn": "starts a process",
    "sys.settrace": "installs a tracer", "sys.setprofile": "installs a profiler hook",
    "sys.addaudithook": "installs an audit hook", "socket.connect": "opens a connection",
    "socket.bind": "opens a socket", "ctypes.dlopen": "loads native code",
    "ctypes.dlsym": "calls native code", "ctypes.cdata": "reads raw memory",
    "ctypes.addressof": "reads raw memory", "ctypes.string_at": "reads raw memory",
    "ctypes.call_function": "calls native code", "sys._current_frames": "reaches other frames",
    "code.__new__": "builds code objects", "function.__new__": "builds functions",
    "import": "",  # decided in _on_import
}
# File-system mutations: allowed under the scratch folder only.
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree",
                "shutil.move", "shutil.copyfile", "shutil.copytree", "os.chdir"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

_state: dict[str, Any] = {"installed": False}


class SandboxViolation(PermissionError):
    """Raised inside the candidate's process when the patched code did what the sandbox
    refuses; the first violation is also kept (:func:`violations`) in case the code swallows it."""


def violations() -> list[str]:
    return list(_state.get("violations", []))


def install_audit(scratch: str | Path, timer_args: tuple[str, ...]) -> None:
    """Install the sandbox for the rest of this process (idempotent)."""
    if _state["installed"]:
        return
    roots = (str(Path(scratch).resolve()) + os.sep, "/dev/null")
    timer = list(timer_args)
    seen: list[str] = []
    local = threading.local()
    _state.update(installed=True, violations=seen)
    harness = "infrarsi"

    def refuse(what: str) -> None:
        seen.append(what)
        raise SandboxViolation(f"sandbox: {what}")

    def writable(path: Any) -> bool:
        if isinstance(path, int):  # an open file descriptor
            return True
        p = os.path.abspath(os.fsdecode(path))
        return p == roots[1] or (p + os.sep).startswith(roots[0])

    def from_patched(direct: bool = False) -> bool:
        # Is a frame of the patched workspace on the stack (the caller, not the harness)?
        # ``direct``: only the immediate caller (torch and warnings look up frames themselves
        # on behalf of any code, honest patches included).
        f = sys._getframe(2)
        while f is not None:
            name = f.f_globals.get("__name__", "")
            if name.startswith("_infrarsi_ws_"):
                return True
            f = None if direct else f.f_back
        return False

    def hook(event: str, args: tuple) -> None:
        if getattr(local, "busy", False):
            return
        if event == "open":
            path, mode, flags = args
            wants = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
            if wants and path is not None and not writable(path):
                refuse(f"refused a write outside the workspace: {os.fsdecode(path)}")
        elif event in _PATH_EVENTS:
            for p in args:
                if isinstance(p, (str, bytes, os.PathLike)) and not writable(p):
                    refuse(f"refused {event} outside the workspace: {os.fsdecode(p)}")
        elif event == "subprocess.Popen":
            if list(args[1] or []) != timer:
                refuse(f"refused to start a process ({args[1]!r})")
        elif event in ("sys._getframe", "sys._getframemodulename"):
            local.busy = True
            try:
                bad = from_patched(direct=True)
            finally:
                local.busy = False
            if bad:
                refuse("refused a frame lookup by the patched code (reaches into frames)")
        elif event == "import":
            module = str(args[0] or "")
            if module.split(".")[0] == harness:
                local.busy = True
                try:
                    bad = from_patched()
                finally:
                    local.busy = False
                if bad:
                    refuse(f"the patched code imports {module} (looks at the verifier)")
        elif event in _REFUSED:
            refuse(f"refused {event} ({_REFUSED[event]})")

    sys.addaudithook(hook)


# ---- integrity -------------------------------------------------------------------------------
def _watched_modules() -> list[Any]:
    import time

    import torch.distributed as dist
    import torch.nn.functional as F

    mods = [sys.modules[n] for n in sorted(sys.modules)
            if n == "infrarsi" or n.startswith("infrarsi.")]
    mods += [time, torch, F, dist, torch.autograd, torch.optim, torch.nn.init,
             sys.modules.get("torch.distributed.distributed_c10d"), sys.modules["builtins"],
             sys.modules["math"]]
    mods += [m for n, m in sorted(sys.modules.items()) if n.startswith("torch.nn.modules.")
             or n.startswith("torch.optim.")]
    return [m for m in mods if m is not None]


def _entries(obj: Any) -> dict[str, int]:
    """name -> identity of every attribute in ``obj.__dict__`` (and of functions' code)."""
    out: dict[str, int] = {}
    try:
        items = list(vars(obj).items())
    except TypeError:
        return out
    for k, v in items:
        out[k] = id(v)
        code = getattr(v, "__code__", None) if callable(v) else None
        if code is not None:
            out[k + ".__code__"] = id(code)
    return out


def fingerprint() -> dict[str, dict[str, int]]:
    """Identity of every global of the watched modules and every attribute of their classes."""
    fp: dict[str, dict[str, int]] = {}
    classes: dict[int, Any] = {torch.Tensor: torch.Tensor, torch.nn.Module: torch.nn.Module}
    classes = {id(c): c for c in classes}
    for m in _watched_modules():
        fp[m.__name__] = _entries(m)
        for v in list(vars(m).values()):
            if isinstance(v, type) and (getattr(v, "__module__", "") or "").startswith(
                    ("infrarsi", "torch.nn.modules", "torch.optim")):
                classes[id(v)] = v
    for c in classes.values():
        fp[f"{c.__module__}.{c.__qualname__}"] = _entries(c)
    return fp


def numerics() -> dict[str, Any]:
    return {
        "default dtype": torch.get_default_dtype(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda matmul allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn deterministic": torch.backends.cudnn.deterministic,
        "mkldnn enabled": torch.backends.mkldnn.enabled,
        "reduced-precision fp16 reductions":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "reduced-precision bf16 reductions":
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "autocast cpu": torch.is_autocast_cpu_enabled(),
        "grad mode": torch.is_grad_enabled(),
    }


class Integrity:
    """What the candidate's process looked like before the patched code ran; :meth:`problem`
    says (naming the class) how it differs now. ``check_numerics=False`` leaves thread counts and
    numerics flags out (only to show, in tests, that this check is what rejects a patch)."""

    def __init__(self, check_numerics: bool = True) -> None:
        self.check_numerics = check_numerics
        self.fp = fingerprint()
        self.numerics = numerics()
        self.environ = dict(os.environ)
        self.tracers = (sys.gettrace(), sys.getprofile())
        self.interop = torch.get_num_interop_threads()

    def problem(self, threads: int | None = None) -> tuple[str, str] | None:
        """(rule, reason) or None. ``threads``: the intra-op thread count the config grants."""
        if violations():
            return "sandbox", "sandbox: " + violations()[0]
        now = fingerprint()
        changed = []
        for mod, names in self.fp.items():
            cur = now.get(mod, {})
            changed += [f"{mod}.{k}" for k, v in names.items() if cur.get(k, v) != v or k not in cur]
            if mod.startswith("infrarsi"):
                import builtins

                changed += [f"{mod}.{k} (shadows a builtin)" for k in set(cur) - set(names)
                            if hasattr(builtins, k)]
        if changed:
            return "tamper", ("namespace changed (process-wide change to the harness or torch): "
                              + ", ".join(sorted(changed)[:6]))
        if not self.check_numerics:
            threads = None
        if threads is not None and torch.get_num_threads() != threads:
            return "threads", (f"thread count changed: {torch.get_num_threads()} intra-op threads, "
                               f"the config grants {threads}")
        if self.check_numerics and torch.get_num_interop_threads() != self.interop:
            return "threads", "thread count changed: inter-op threads"
        num = numerics()
        if self.check_numerics and num != self.numerics:
            diff = {k: (self.numerics[k], num[k]) for k in num if num[k] != self.numerics[k]}
            return "numerics", f"numerics changed: {diff}"
        if dict(os.environ) != self.environ:
            keys = sorted(set(os.environ) ^ set(self.environ) | {
                k for k in self.environ if os.environ.get(k) != self.environ[k]})
            return "tamper", f"changes the environment ({', '.join(keys[:5])})"
        if (sys.gettrace(), sys.getprofile()) != self.tracers:
            return "tamper", "installs a trace or profile hook"
        return None


class NumericsGuard(TorchFunctionMode):
    """Re-reads the numerics flags and thread counts at every matmul-like torch call (inside the
    patched forward); the first difference is kept in ``seen`` (the code may swallow errors).
    ``active=False`` checks nothing (only to show, in tests, that this guard is what rejects)."""

    _NAMES = {"matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "einsum",
              "scaled_dot_product_attention", "__matmul__", "conv1d", "conv2d"}

    def __init__(self, threads: int, active: bool = True) -> None:
        super().__init__()
        self.threads, self.active = threads, active
        self.numerics = numerics()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.active and getattr(func, "__name__", "") in self._NAMES and not self.seen:
            now = {k: v for k, v in numerics().items() if k != "grad mode"}
            want = {k: v for k, v in self.numerics.items() if k != "grad mode"}
            if now != want:
                diff = {k: (want[k], now[k]) for k in now if now[k] != want[k]}
                self.seen.append(f"numerics lowered inside forward: {diff}")
            elif torch.get_num_threads() != self.threads:
                self.seen.append(f"thread count changed inside forward: "
                                 f"{torch.get_num_threads()} threads, the config grants "
                                 f"{self.threads}")
        return func(*args, **(kwargs or {}))
