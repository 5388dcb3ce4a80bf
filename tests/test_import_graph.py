"""The package's imports point one way: no cycle between ``infrarsi``'s subpackages.

The graph is read from the source (``ast`` over every file of the package), not from what a
Python process happens to import, so a function-level import counts as much as a top-level one
(it runs sooner or later, and a cycle through it is still a tangle of responsibilities).
``from x import y`` resolves to the module ``x.y`` when that is a module, else to ``x``;
relative imports resolve against the importing module's package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import infrarsi

PKG = "infrarsi"
ROOT = Path(infrarsi.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(mod: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix
                     for a in node.names]
        else:
            continue
        for name in names:
            if name == PKG or name.startswith(PKG + "."):
                target = _resolve(name, modules)
                if target and target != mod:
                    found.add(target)
    return found


def _unit(mod: str) -> str:
    """The subpackage a module belongs to (``infrarsi.search.engine`` -> ``infrarsi.search``);
    a top-level module is a unit of its own."""
    parts = mod.split(".")
    return ".".join(parts[:2])


def import_graph() -> dict[str, set[str]]:
    """Subpackage -> the subpackages it imports (itself excluded)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        src = _unit(mod)
        for target in _imports(mod, path, modules):
            dst = _unit(target)
            if dst != src and src != PKG:
                graph.setdefault(src, set()).add(dst)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node, as a cycle path through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [_cycle_path(c, graph) for c in comps]


def _cycle_path(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle inside a strongly connected component, from its first node back to it."""
    members, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w in members and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def _edges_between(a: str, b: str) -> list[str]:
    modules = _modules()
    return sorted(f"{m} -> {t}" for m, p in modules.items() if _unit(m) == a
                  for t in _imports(m, p, modules) if _unit(t) == b)


def test_no_cycle_between_subpackages():
    cycles = find_cycles(import_graph())
    lines = []
    for cyc in cycles:
        lines.append(" -> ".join(cyc))
        for a, b in zip(cyc, cyc[1:], strict=False):
            lines += [f"    {e}" for e in _edges_between(a, b)]
    assert not cycles, "import cycles between subpackages:\n" + "\n".join(lines)


def test_the_walker_sees_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_the_walker_reads_function_level_and_relative_imports(tmp_path):
    # the CLI imports the API inside its functions only: still an edge
    modules = _modules()
    assert "infrarsi.api" in _imports("infrarsi.cli", modules["infrarsi.cli"], modules)
    # relative and from-imports resolve to modules (a name that is not a module: its module)
    src = tmp_path / "engine.py"
    src.write_text("from . import verify\nfrom ..doctor.noise import mde_for\n"
                   "def f():\n    from infrarsi.stats import paired_speedup\n")
    fake = {**modules, "infrarsi.search.engine": src}
    assert _imports("infrarsi.search.engine", src, fake) == {
        "infrarsi.search.verify", "infrarsi.doctor.noise", "infrarsi.stats"}
