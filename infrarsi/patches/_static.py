"""Static scan of patched source: what a model file has no business doing.

A patch may change how the model computes, never the harness around it. The scan walks the AST
of every file a patch wrote and lists *new* findings (present after the patch, absent before),
so a user's tree that already imports ``os`` does not make every patch fail. Each finding names
the rule it breaks. What the scan cannot see (a string-built attribute name, a clever cache)
the dynamic checks catch by their effect.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

# Modules a model file may not import (prefix match on the dotted name).
FORBIDDEN_IMPORTS: dict[str, str] = {
    "time": "reads or replaces the clock",
    "timeit": "reads the clock",
    "datetime": "reads the clock",
    "os": "environment and file-system access",
    "sys": "interpreter hooks (settrace, modules)",
    "builtins": "rebinds builtins",
    "importlib": "dynamic imports",
    "threading": "moves work out of the timed region (threads)",
    "_thread": "moves work out of the timed region (threads)",
    "multiprocessing": "moves work out of the timed region (processes)",
    "concurrent": "moves work out of the timed region (executors)",
    "asyncio": "moves work out of the timed region (event loop)",
    "subprocess": "starts processes",
    "signal": "signal handlers",
    "ctypes": "raw memory and C calls",
    "random": "reseeds or draws host randomness",
    "numpy.random": "reseeds or draws host randomness",
    "shutil": "writes files",
    "pathlib": "file-system access",
    "tempfile": "writes files",
    "io": "file I/O",
    "pickle": "file I/O",
    "socket": "network access",
    "gc": "interferes with the memory measurement",
    "inspect": "reaches into callers' frames",
    "atexit": "exit hooks",
    "infrarsi": "imports the harness (clock, data, loss are frozen)",
    "torch.multiprocessing": "moves work out of the timed region (processes)",
    "torch.futures": "moves work out of the timed region (async futures)",
    "torch.backends": "changes global numerics (TF32, deterministic modes)",
    "torch.amp": "lowers precision (precision is the harness's knob)",
    "torch.cuda.amp": "lowers precision (precision is the harness's knob)",
    "torch.random": "reseeds the generator",
}

# Dotted call/attribute suffixes (matched on the resolved name, aliases expanded).
FORBIDDEN_NAMES: dict[str, str] = {
    "torch.manual_seed": "reseeds the generator",
    "torch.seed": "reseeds the generator",
    "torch.set_rng_state": "reseeds the generator",
    "torch.cuda.manual_seed": "reseeds the generator",
    "torch.cuda.manual_seed_all": "reseeds the generator",
    "torch.Generator": "draws its own random stream",
    "torch.cuda.synchronize": "tampers with the harness's device sync",
    "torch.distributed.barrier": "tampers with the harness's barrier",
    "torch.distributed.monitored_barrier": "tampers with the harness's barrier",
    "torch.set_num_threads": "changes the thread count (a harness knob)",
    "torch.set_num_interop_threads": "changes the thread count (a harness knob)",
    "torch.set_default_dtype": "lowers precision (precision is the harness's knob)",
    "torch.set_float32_matmul_precision": "lowers precision (precision is the harness's knob)",
    "torch.set_flush_denormal": "changes global numerics",
    "torch.autocast": "lowers precision (precision is the harness's knob)",
    "torch.bfloat16": "lowers precision (precision is the harness's knob)",
    "torch.float16": "lowers precision (precision is the harness's knob)",
    "torch.half": "lowers precision (precision is the harness's knob)",
    "torch.float8_e4m3fn": "lowers precision (precision is the harness's knob)",
    "torch.float8_e5m2": "lowers precision (precision is the harness's knob)",
    "torch.save": "writes files",
    "torch.jit.fork": "moves work out of the timed region (async fork)",
    "torch.cuda.Event": "reads a clock",
    "torch.utils.hooks": "installs global hooks",
    "torch.nn.modules.module.register_module_forward_hook": "installs global hooks",
    "numpy.save": "writes files",
}
FORBIDDEN_METHODS: dict[str, str] = {
    "half": "lowers precision (precision is the harness's knob)",
    "bfloat16": "lowers precision (precision is the harness's knob)",
    "write_text": "writes files",
    "write_bytes": "writes files",
    "tofile": "writes files",
    "settrace": "installs a tracer",
    "setprofile": "installs a profiler hook",
}
FORBIDDEN_BUILTINS: dict[str, str] = {
    "open": "file I/O",
    "exec": "runs generated code",
    "eval": "runs generated code",
    "compile": "compiles generated code",
    "__import__": "dynamic imports",
    "globals": "rewrites module globals",
    "locals": "reaches into frames",
    "vars": "reaches into namespaces",
    "breakpoint": "interactive hooks",
}
# Attribute names that are modules a model file may not reach: ``x.os`` is ``os`` whatever ``x``
# is (``torch.serialization.os``, ``np.sys``), so the chain is judged by where it ends.
MODULE_ATTRS: dict[str, str] = {
    m: f"reaches module {m} through an attribute chain ({why})" for m, why in (
        ("os", "environment and file-system access"), ("sys", "interpreter hooks, sys.modules"),
        ("builtins", "rebinds builtins"), ("importlib", "dynamic imports"),
        ("subprocess", "starts processes"), ("inspect", "reaches into frames"),
        ("ctypes", "raw memory and C calls"), ("gc", "reaches every object"),
        ("shutil", "writes files"), ("threading", "threads"), ("_thread", "threads"),
        ("multiprocessing", "processes"), ("signal", "signal handlers"),
        ("socket", "network access"), ("pickle", "file I/O"), ("time", "the clock"),
        ("tempfile", "writes files"), ("pathlib", "file-system access"), ("atexit", "exit hooks"),
        ("io", "file I/O"),
    )
}
# Attributes that reach frames, code or the interpreter's import machinery.
FRAME_ATTRS: dict[str, str] = {
    **{a: "reaches into frames" for a in (
        "_getframe", "currentframe", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
        "tb_frame", "gi_frame", "cr_frame", "ag_frame", "getouterframes",
        "_current_frames")},
    "import_module": "dynamic imports", "_C": "calls torch's C internals directly (bypasses "
    "the harness's knobs: threads, numerics, seeds)",
}
# A string naming the harness or the verifier: code that looks for them inspects whether it is
# being verified.
VERIFIER_MARKERS = ("infrarsi", "_infrarsi_ws_", "pytest", "PYTEST_")

FORBIDDEN_DUNDERS = {
    "__builtins__", "__globals__", "__dict__", "__class__", "__subclasses__", "__code__",
    "__closure__", "__import__", "__loader__", "__spec__", "__bases__", "__mro__",
    "__getattribute__", "__setattr__", "__delattr__", "__defaults__", "__kwdefaults__",
}


@dataclass(frozen=True, order=True)
class Finding:
    rule: str
    detail: str
    line: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.rule, self.detail)

    def __str__(self) -> str:
        return f"line {self.line}: {self.detail} ({self.rule})"


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module/attr
        self.findings: list[Finding] = []

    def add(self, node: ast.AST, rule: str, detail: str) -> None:
        self.findings.append(Finding(rule, detail, getattr(node, "lineno", 0)))

    def _check_module(self, node: ast.AST, name: str) -> None:
        for mod, why in FORBIDDEN_IMPORTS.items():
            if name == mod or name.startswith(mod + "."):
                self.add(node, why, f"imports {name}")
                return

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(node, a.name)
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._check_module(node, node.module)
            for a in node.names:
                full = f"{node.module}.{a.name}"
                self._check_module(node, full)
                self._check_name(node, full)
                self.aliases[a.asname or a.name] = full
        self.generic_visit(node)

    def _resolve(self, node: ast.AST) -> str | None:
        d = _dotted(node)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        if head in self.aliases:
            return self.aliases[head] + ("." + rest if rest else "")
        return d

    def _check_name(self, node: ast.AST, full: str) -> None:
        why = FORBIDDEN_NAMES.get(full)
        if why:
            self.add(node, why, f"uses {full}")

    def _check_attr_name(self, node: ast.AST, attr: str, chain: str) -> None:
        if attr in MODULE_ATTRS:
            self.add(node, MODULE_ATTRS[attr], f"accesses {chain}")
        elif attr in FRAME_ATTRS:
            self.add(node, FRAME_ATTRS[attr], f"accesses {chain}")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and any(m in node.value for m in VERIFIER_MARKERS):
            self.add(node, "inspects whether it is being verified (looks up the harness or the "
                     "verifier)", f"names {node.value[:40]!r}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._check_attr_name(node, node.attr, _dotted(node) or f"<expr>.{node.attr}")
        if node.attr in FORBIDDEN_DUNDERS:
            self.add(node, "reaches into interpreter internals", f"accesses .{node.attr}")
        full = self._resolve(node)
        if full:
            self._check_name(node, full)
        if isinstance(node.ctx, ast.Load) and node.attr in FORBIDDEN_METHODS:
            self.add(node, FORBIDDEN_METHODS[node.attr], f"calls .{node.attr}()")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_DUNDERS:
            self.add(node, "reaches into interpreter internals", f"uses {node.id}")
        elif node.id in FORBIDDEN_BUILTINS and isinstance(node.ctx, ast.Load) and node.id not in self.aliases:
            self.add(node, FORBIDDEN_BUILTINS[node.id], f"uses {node.id}()")
        self.generic_visit(node)

    def _check_store(self, target: ast.AST) -> None:
        if isinstance(target, ast.Attribute):
            d = _dotted(target)
            head = d.split(".")[0] if d else None
            if head and head in self.aliases:
                self.add(target, "monkeypatches a library or the harness",
                         f"assigns {self._resolve(target)}")
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store(t)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_store(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_store(t)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        fn = self._resolve(node.func) or ""
        if fn in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
            name = node.args[1]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                self.add(node, "builds an attribute name at run time (hides what it reaches)",
                         f"{fn}(..., <computed name>)")
            else:  # getattr(x, "os") is x.os
                base = self._resolve(node.args[0])
                chain = f"{base or '<expr>'}.{name.value}"
                self._check_attr_name(node, name.value, chain)
                if name.value in FORBIDDEN_DUNDERS:
                    self.add(node, "reaches into interpreter internals", f"{fn}(..., {name.value!r})")
                if base:
                    self._check_name(node, chain)
        if fn.split(".")[-1] in ("setattr", "delattr") and node.args:
            tgt = self._resolve(node.args[0])
            if tgt and tgt.split(".")[0] in {v.split(".")[0] for v in self.aliases.values()}:
                self.add(node, "monkeypatches a library or the harness", f"{fn}({tgt}, ...)")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.add(node, "keeps hidden state across steps", f"global {', '.join(node.names)}")
        self.generic_visit(node)


def scan_source(text: str, filename: str = "<patch>") -> list[Finding]:
    """Findings in one file's source (a syntax error is a finding too)."""
    try:
        tree = ast.parse(text, filename=filename)
    except SyntaxError as e:
        return [Finding("does not parse", f"syntax error: {e.msg}", e.lineno or 0)]
    s = _Scanner()
    s.visit(tree)
    return sorted(s.findings)


def new_findings(before: str | None, after: str, filename: str = "<patch>") -> list[Finding]:
    """Findings in ``after`` beyond those already in ``before`` (counted per rule and detail)."""
    old = Counter(f.key for f in scan_source(before, filename)) if before is not None else Counter()
    out = []
    for f in scan_source(after, filename):
        if old[f.key] > 0:
            old[f.key] -= 1
        else:
            out.append(f)
    return out
