"""The expert's pattern rules: rewrites found by reading the AST of any model file.

Each rule looks for a shape of code, not a file name, and returns text edits; one patch per
(rule, file) is the unified diff of all its edits. The patches are candidates like any other:
the caller verifies each against the contract (gradients, loss trace, static scan), so a rule
that misjudges a case costs a rejected patch, never a wrong result.

* ``sdpa`` — a hand-written softmax attention (``scores = q @ k^T * scale``, optionally
  ``masked_fill(mask, -inf)``, ``softmax(dim=-1)``, ``@ v``) becomes one
  ``scaled_dot_product_attention`` call (the fused kernel; the score matrix is not kept).
* ``cached_tables`` — a mask or rotary table rebuilt in ``forward`` from shapes only (a
  ``triu``/``tril``/``arange``/``outer``... of sizes, devices and constant attributes) is built
  once per key by an ``lru_cache``'d helper.
* ``batched_dispatch`` — ``for e in range(N): m = idx == e`` (one mask and one gather per
  expert over all tokens) becomes one stable sort of the routing and contiguous row slices
  per expert (the same rows in the same order, so the same numbers).
* ``host_sync`` — ``self.stat = t.item()`` (or ``.tolist()``/``.cpu()``) in ``forward`` whose
  attribute nothing reads stays on the device (``.detach()``): no device-to-host sync per step.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infrarsi.patches import Patch

Edit = tuple[int, int, str]  # (start offset, end offset, replacement) in the file's text

FACTORIES = {"triu", "tril", "arange", "outer", "eye", "linspace", "ones", "full", "polar"}
STATIC_CALLS = {"int", "float", "min", "max", "len", "round", "bool"}


@dataclass(frozen=True)
class Rule:
    name: str
    rationale: str
    log_time: float
    log_mem: float
    find: Callable[[str, ast.Module, dict[str, str]], list[Edit]]


# ---- helpers ------------------------------------------------------------------------------
class _Src:
    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def off(self, line: int, col: int) -> int:
        return self.starts[line - 1] + len(self.text.splitlines(keepends=True)[line - 1]
                                           .encode()[:col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset)

    def seg(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def line_span(self, first: ast.stmt, last: ast.stmt) -> tuple[int, int]:
        return self.starts[first.lineno - 1], self.starts[last.end_lineno]

    def indent(self, node: ast.stmt) -> str:
        line = self.text[self.starts[node.lineno - 1]:self.starts[node.lineno]]
        return line[:len(line) - len(line.lstrip())]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _assign(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)):
        return stmt.targets[0].id, stmt.value
    return None


def _functional_alias(tree: ast.Module) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch.nn.functional" and a.asname:
                    return a.asname
        if isinstance(node, ast.ImportFrom) and node.module == "torch.nn":
            for a in node.names:
                if a.name == "functional":
                    return a.asname or "functional"
    imports_torch = any(isinstance(n, ast.Import) and any(a.name == "torch" and not a.asname
                                                           for a in n.names) for n in tree.body)
    return "torch.nn.functional" if imports_torch else None


def _functions(tree: ast.Module):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _used_after(stmts: list[ast.stmt], names: set[str]) -> bool:
    return any(_names(s) & names for s in stmts)


# ---- sdpa ---------------------------------------------------------------------------------
def _matmul(node: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if (isinstance(node, ast.Call) and _dotted(node.func) in ("torch.matmul", "torch.bmm")
            and len(node.args) == 2 and not node.keywords):
        return node.args[0], node.args[1]
    return None


def _transposed(node: ast.AST) -> ast.expr | None:
    """``k`` of ``k.transpose(-2, -1)`` / ``k.transpose(-1, -2)`` / ``k.mT``."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "transpose" and len(node.args) == 2):
        dims = sorted(ast.literal_eval(a) for a in node.args
                      if isinstance(a, (ast.Constant, ast.UnaryOp)))
        if dims == [-2, -1]:
            return node.func.value
    return None


def _scores(src: _Src, value: ast.expr) -> tuple[ast.expr, ast.expr, str] | None:
    """(q, k, scale text) of ``q @ k^T``, ``(q @ k^T) * s`` or ``(q @ k^T) / d``."""
    scale = "1.0"
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mult, ast.Div)):
        mm = _matmul(value.left)
        scale = (src.seg(value.right) if isinstance(value.op, ast.Mult)
                 else f"1.0 / ({src.seg(value.right)})")
    else:
        mm = _matmul(value)
    if mm is None or (k := _transposed(mm[1])) is None:
        return None
    return mm[0], k, scale


def _neg_inf(src: _Src, node: ast.expr) -> bool:
    text = src.seg(node).replace(" ", "").replace("'", '"')
    return text in ('float("-inf")', '-float("inf")', "-math.inf", "-torch.inf", "float(\"-inf\")")


def _keep_mask(src: _Src, mask: ast.expr) -> str:
    """SDPA's boolean mask (True: may attend) from masked_fill's (True: masked out)."""
    if isinstance(mask, ast.UnaryOp) and isinstance(mask.op, (ast.Invert, ast.Not)):
        return src.seg(mask.operand)
    if (isinstance(mask, ast.Compare) and len(mask.ops) == 1 and isinstance(mask.ops[0], ast.Eq)
            and isinstance(mask.comparators[0], ast.Constant) and mask.comparators[0].value == 0):
        return f"{src.seg(mask.left)} != 0"
    return f"~({src.seg(mask)})"


def _softmax_of(node: ast.expr, s: str) -> bool:
    if not isinstance(node, ast.Call):
        return False
    dim = [k.value for k in node.keywords if k.arg == "dim"]
    if isinstance(node.func, ast.Attribute) and node.func.attr == "softmax" and \
            _dotted(node.func.value) == s:
        args = node.args or dim
    elif _dotted(node.func).endswith("softmax") and node.args and _dotted(node.args[0]) == s:
        args = node.args[1:] or dim
    else:
        return False
    return len(args) == 1 and isinstance(args[0], (ast.UnaryOp, ast.Constant)) and \
        ast.literal_eval(args[0]) == -1


def _sdpa(text: str, tree: ast.Module, sources: dict[str, str]) -> list[Edit]:
    src, fmod, edits = _Src(text), _functional_alias(tree), []
    if fmod is None:
        return []
    for fn in _functions(tree):
        body = fn.body
        for i, s0 in enumerate(body):
            a0 = _assign(s0)
            sc = _scores(src, a0[1]) if a0 else None
            if sc is None:
                continue
            s, (q, k, scale) = a0[0], sc
            j, mask = i + 1, ""
            a1 = _assign(body[j]) if j < len(body) else None
            if a1 and a1[0] == s and isinstance(a1[1], ast.Call) and isinstance(
                    a1[1].func, ast.Attribute) and a1[1].func.attr == "masked_fill" and \
                    _dotted(a1[1].func.value) == s and len(a1[1].args) == 2 and \
                    _neg_inf(src, a1[1].args[1]):
                mask, j = f", attn_mask={_keep_mask(src, a1[1].args[0])}", j + 1
            a2 = _assign(body[j]) if j < len(body) else None
            if not a2 or not _softmax_of(a2[1], s):
                continue
            p = a2[0]
            a3 = _assign(body[j + 1]) if j + 1 < len(body) else None
            mm = _matmul(a3[1]) if a3 else None
            if not mm or _dotted(mm[0]) != p or _used_after(body[j + 2:], {s, p} - {a3[0]}):
                continue
            line = (f"{src.indent(s0)}{a3[0]} = {fmod}.scaled_dot_product_attention("
                    f"{src.seg(q)}, {src.seg(k)}, {src.seg(mm[1])}{mask}, scale={scale})\n")
            edits.append((*src.line_span(s0, body[j + 1]), line))
    return edits


# ---- cached tables ------------------------------------------------------------------------
def _static_attrs(cls: ast.ClassDef) -> set[str]:
    good, bad = set(), set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and _dotted(t.value) == "self":
                    calls = [_dotted(c.func) for c in ast.walk(node.value) if isinstance(c, ast.Call)]
                    ok = all(c in STATIC_CALLS or c.startswith("math.") for c in calls)
                    (good if ok else bad).add(t.attr)
    return good - bad


def _shape_names(stmt: ast.stmt, static: set[str], attrs: set[str]) -> set[str]:
    """Names ``stmt`` binds to sizes: ``B, T, C = x.shape``, ``T = x.size(1)``, ``n = T * 2``."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return set()
    t, v = stmt.targets[0], stmt.value
    is_shape = (isinstance(v, ast.Attribute) and v.attr == "shape") or (
        isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "size")
    if isinstance(t, ast.Tuple) and is_shape:
        return {e.id for e in t.elts if isinstance(e, ast.Name)}
    if isinstance(t, ast.Name) and (is_shape or (isinstance(v, ast.Subscript) and isinstance(
            v.value, ast.Attribute) and v.value.attr == "shape")):
        return {t.id}
    if isinstance(t, ast.Name) and _leaves(v, static, attrs, set(), set()) is not None and \
            not any(isinstance(n, ast.Call) for n in ast.walk(v)):
        return {t.id}
    return set()


def _leaves(node: ast.AST, static: set[str], attrs: set[str], globals_: set[str],
            out: set[str] | None = None) -> list[ast.expr] | None:
    """The static leaves of ``node`` (sizes, devices, dtypes, constant attributes), or None
    when it reads anything else (a tensor's values, a parameter, a mutable attribute)."""
    found: list[ast.expr] = []

    def visit(n: ast.AST) -> bool:
        if isinstance(n, ast.Attribute) and n.attr in ("device", "dtype"):
            found.append(n)
            return True
        if isinstance(n, ast.Attribute) and _dotted(n.value) == "self":
            if n.attr in attrs:
                found.append(n)
                return True
            return False
        if isinstance(n, ast.Name):
            if n.id in static:
                found.append(n)
                return True
            return n.id in globals_ or n.id in STATIC_CALLS
        if isinstance(n, ast.Attribute):
            return visit(n.value)
        if isinstance(n, ast.Call):
            return visit(n.func) and all(visit(a) for a in n.args) and \
                all(visit(k.value) for k in n.keywords)
        if isinstance(n, (ast.Constant, ast.operator, ast.unaryop, ast.cmpop, ast.expr_context)):
            return True
        if isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.Tuple, ast.List,
                          ast.Subscript, ast.Slice, ast.keyword)):
            return all(visit(c) for c in ast.iter_child_nodes(n))
        return False

    return found if visit(node) else None


def _has_factory(node: ast.AST, tree: ast.Module) -> bool:
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for c in ast.walk(node):
        if isinstance(c, ast.Call):
            name = _dotted(c.func)
            if name.split(".")[-1] in FACTORIES and name.startswith("torch."):
                return True
            if name in funcs and _has_factory(funcs[name], ast.Module([], [])):
                return True
    return False


def _mutated(stmts: list[ast.stmt], names: set[str]) -> bool:
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.AugAssign) and _names(n.target) & names:
                return True
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                    n.func.attr.endswith("_") and _dotted(n.func.value) in names:
                return True
            if isinstance(n, (ast.Assign)) and any(isinstance(t, ast.Subscript) and
                                                   _names(t.value) & names for t in n.targets):
                return True
    return False


def _cached_tables(text: str, tree: ast.Module, sources: dict[str, str]) -> list[Edit]:
    src, edits, helpers = _Src(text), [], []
    globals_ = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for n in tree.body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            globals_ |= {(a.asname or a.name).split(".")[0] for a in n.names}
    taken = set(globals_)
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        attrs, made = _static_attrs(cls), []
        for fn in [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"]:
            static: set[str] = set()
            for i, stmt in enumerate(fn.body):
                bound = _shape_names(stmt, static, attrs)
                if bound:
                    static |= bound
                    continue
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], (ast.Name, ast.Tuple))
                        and _has_factory(stmt.value, tree)):
                    continue
                leaves = _leaves(stmt.value, static, attrs, globals_)
                targets = _names(stmt.targets[0])
                if not leaves or _mutated(fn.body[i + 1:], targets):
                    continue
                name = "_cached_" + "_".join(sorted(targets))
                while name in taken:
                    name += "_"
                taken.add(name)
                params: dict[str, str] = {}
                for leaf in leaves:
                    params.setdefault(src.seg(leaf), f"a{len(params)}")
                body = _substitute(src, stmt.value, leaves, params)
                helpers.append((cls, f"@functools.lru_cache(maxsize=16)\ndef {name}("
                                     f"{', '.join(params.values())}):\n    return {body}\n\n\n"))
                a, b = src.span(stmt.value)
                edits.append((a, b, f"{name}({', '.join(params)})"))
                made.append(name)
    if not edits:
        return []
    for cls, h in helpers:
        first = min([cls.lineno] + [d.lineno for d in cls.decorator_list])
        at = src.starts[first - 1]
        edits.append((at, at, h))
    if not any(isinstance(n, ast.Import) and any(a.name == "functools" and not a.asname
                                                 for a in n.names) for n in tree.body):
        last = max(n.end_lineno for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)))
        edits.append((src.starts[last], src.starts[last], "import functools\n"))
    return edits


def _substitute(src: _Src, expr: ast.expr, leaves: list[ast.expr], params: dict[str, str]) -> str:
    a0, _ = src.span(expr)
    out = src.seg(expr)
    for leaf in sorted(leaves, key=lambda n: src.span(n)[0], reverse=True):
        a, b = src.span(leaf)
        out = out[:a - a0] + params[src.seg(leaf)] + out[b - a0:]
    return " ".join(out.split()) if "\n" in out else out


# ---- batched dispatch ---------------------------------------------------------------------
def _batched_dispatch(text: str, tree: ast.Module, sources: dict[str, str]) -> list[Edit]:
    src, edits = _Src(text), []
    for loop in [n for n in ast.walk(tree) if isinstance(n, ast.For)]:
        if not (isinstance(loop.target, ast.Name) and isinstance(loop.iter, ast.Call)
                and _dotted(loop.iter.func) == "range" and len(loop.iter.args) == 1
                and loop.body and not loop.orelse):
            continue
        e, n_experts = loop.target.id, src.seg(loop.iter.args[0])
        first = _assign(loop.body[0])
        if not first or not isinstance(first[1], ast.Compare) or len(first[1].ops) != 1 or \
                not isinstance(first[1].ops[0], ast.Eq):
            continue
        cmp = first[1]
        sides = [cmp.left, cmp.comparators[0]]
        if _dotted(sides[1]) == e:
            idx = sides[0]
        elif _dotted(sides[0]) == e:
            idx = sides[1]
        else:
            continue
        m, ok, any_calls = first[0], True, []
        if _names(idx) & {e, m} or "torch" not in {n.split(".")[0] for n in
                                                   [_dotted(x) for x in ast.walk(tree)
                                                    if isinstance(x, ast.Name)]}:
            continue
        for stmt in loop.body[1:]:
            parents = {c: p for p in ast.walk(stmt) for c in ast.iter_child_nodes(p)}
            for node in ast.walk(stmt):
                if not (isinstance(node, ast.Name) and node.id == m):
                    continue
                par = parents.get(node)
                if isinstance(par, ast.Subscript) and par.slice is node:
                    continue
                if isinstance(par, ast.Tuple) and isinstance(parents.get(par), ast.Subscript) \
                        and par.elts[0] is node:
                    continue
                if isinstance(par, ast.Attribute) and par.attr == "any" and isinstance(
                        parents.get(par), ast.Call):
                    any_calls.append(parents[par])
                    continue
                ok = False
        if not ok:
            continue
        ind, inner = src.indent(loop), src.indent(loop.body[0])
        order, bounds = f"_{m}_order", f"_{m}_bounds"
        head = (f"{ind}{order} = torch.argsort({src.seg(idx)}, stable=True)\n"
                f"{ind}{bounds} = torch.bincount({src.seg(idx)}, minlength={n_experts})"
                f".cumsum(0).tolist()  # one host sync for every expert\n")
        at = src.starts[loop.lineno - 1]
        edits.append((at, at, head))
        a, b = src.line_span(loop.body[0], loop.body[0])
        edits.append((a, b, f"{inner}{m} = {order}[({bounds}[{e} - 1] if {e} else 0):"
                            f"{bounds}[{e}]]\n"))
        for call in any_calls:
            edits.append((*src.span(call), f"{m}.numel() > 0"))
    return edits


# ---- host syncs ---------------------------------------------------------------------------
def _read_attrs(sources: dict[str, str]) -> set[str]:
    out: set[str] = set()
    for text in sources.values():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        out |= {n.attr for n in ast.walk(tree)
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    return out


def _host_sync(text: str, tree: ast.Module, sources: dict[str, str]) -> list[Edit]:
    src, edits, read = _Src(text), [], _read_attrs(sources)
    for fn in [f for f in _functions(tree) if f.name == "forward"]:
        for stmt in ast.walk(fn):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                continue
            t, v = stmt.targets[0], stmt.value
            if (isinstance(t, ast.Attribute) and _dotted(t.value) == "self" and t.attr not in read
                    and isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute)
                    and v.func.attr in ("item", "tolist", "cpu") and not v.args):
                edits.append((*src.span(v), f"{src.seg(v.func.value)}.detach()"))
    return edits


RULES: tuple[Rule, ...] = (
    Rule("sdpa", "Hand-written softmax attention (scores, mask, softmax, weighted sum) replaced "
         "by one scaled_dot_product_attention call: a fused kernel that never stores the "
         "[B, H, T, T] score matrix.", -0.1, -0.1, _sdpa),
    Rule("cached_tables", "Masks and rotary tables that depend only on sizes and devices were "
         "rebuilt on every forward; an lru_cache'd helper builds each once per key.",
         -0.02, 0.0, _cached_tables),
    Rule("batched_dispatch", "A Python loop built one boolean mask over all tokens per expert; "
         "one stable sort of the routing gives each expert a contiguous slice of the same rows "
         "in the same order (one host sync instead of one per expert).", -0.03, 0.0,
         _batched_dispatch),
    Rule("host_sync", "A statistic read back to the host with .item()/.tolist() on every "
         "forward (a device sync per call) that nothing reads stays on the device.",
         -0.01, 0.0, _host_sync),
)


def _apply(text: str, edits: list[Edit]) -> str:
    for a, b, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        text = text[:a] + new + text[b:]
    return text


def pattern_patches(files: dict[str, str]) -> list[Patch]:
    """One candidate patch per (rule, file) of ``files`` (relative path -> text, the editable
    Python source) where a rule finds its pattern; unverified."""
    out = []
    for rel, text in sorted(files.items()):
        if not rel.endswith(".py") or not text.endswith("\n"):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for rule in RULES:
            try:
                edits = rule.find(text, tree, files)
                new = _apply(text, edits) if edits else text
                ast.parse(new)
            except (SyntaxError, ValueError, IndexError):
                continue  # a rule that cannot rewrite this file cleanly proposes nothing
            if new == text:
                continue
            diff = "".join(difflib.unified_diff(text.splitlines(keepends=True),
                                                new.splitlines(keepends=True),
                                                f"a/{rel}", f"b/{rel}", n=3))
            out.append(Patch(f"pattern-{rule.name}-{Path(rel).stem}"[:64], diff,
                             origin="expert:pattern", rationale=rule.rationale,
                             expected_log_time_effect=rule.log_time,
                             expected_log_mem_effect=rule.log_mem))
    return out
