"""``infrarsi init --from-script train.py``: a starting adapter and task YAML for a plain script.

Reads the script (its syntax tree only: nothing is run), finds its ``nn.Module`` classes, its
batch and loss functions, its optimizer and its batch-size flag, and writes beside it
``infrarsi_adapter.py`` (the four functions of :mod:`infrarsi.harness.workload`, filled where
the script made it clear, ``TODO`` where the user must fill in; an unfilled function raises
``NotImplementedError`` naming what to write) and ``infrarsi.yaml``.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi.errors import ConfigError

__all__ = ["ScriptFacts", "read_script", "scaffold"]


@dataclass(frozen=True)
class ScriptFacts:
    """What the script shows: model classes, batch/loss functions, optimizer, batch size."""

    modules: tuple[str, ...] = ()
    batch_functions: tuple[str, ...] = ()
    loss_functions: tuple[str, ...] = ()
    # the optimizer call as ``optimizer(model, impl)`` returns it, e.g.
    # "torch.optim.AdamW(model.parameters(), lr=LR, **impl)"
    optimizer: str | None = None
    batch_size: int | None = None
    imports: tuple[str, ...] = field(default_factory=tuple)  # script names the call reads
    unresolved: tuple[str, ...] = ()  # names it reads that exist only while the script runs


def read_script(path: Path) -> ScriptFacts:
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError) as e:
        raise ConfigError(f"--from-script {path}: cannot read it as Python ({e})") from None
    modules, batches, losses, batch_size, optimizer = [], [], [], None, None
    imports: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(b) for b in node.bases}
            if bases & {"nn.Module", "torch.nn.Module", "Module"}:
                modules.append(node.name)
        elif isinstance(node, ast.FunctionDef) and node in tree.body:
            if "batch" in node.name.lower():
                batches.append(node.name)
            elif "loss" in node.name.lower():
                losses.append(node.name)
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name.startswith(("torch.optim.", "optim.")) and optimizer is None:
                optimizer, imports, unresolved = _optimizer_call(node, _top_level_names(tree))
            if name.endswith("add_argument") and node.args:
                flag = ast.unparse(node.args[0]).strip("'\"")
                if flag.replace("_", "-") in ("--batch-size", "--batch", "--bs"):
                    for kw in node.keywords:
                        if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                            batch_size = int(kw.value.value)
    return ScriptFacts(tuple(modules), tuple(batches), tuple(losses), optimizer, batch_size,
                       imports, unresolved)


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names the script's module defines (assigned or imported): importable by the adapter."""
    names = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _optimizer_call(call: ast.Call, top_level: set[str]) -> tuple[str, tuple, tuple]:
    """The script's optimizer call as the adapter's ``optimizer(model, impl)`` makes it: its
    parameters taken from ``model`` (whatever the script named its model), ``**impl`` added,
    ``optim.`` spelled ``torch.optim.``; with the script's module-level names it reads (to
    import) and the names that exist only while the script runs (e.g. ``args``: to fill in)."""
    call = copy.deepcopy(call)
    first = call.args[0] if call.args else None
    if (isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute)
            and first.func.attr == "parameters"):
        call.args[0] = ast.parse("model.parameters()", mode="eval").body
    call.keywords.append(ast.keyword(arg=None, value=ast.Name("impl")))
    source = ast.unparse(call)
    if source.startswith("optim."):
        source = "torch." + source
    reads = {n.id for n in ast.walk(call) if isinstance(n, ast.Name)} - {"torch", "optim",
                                                                          "model", "impl"}
    return source, tuple(sorted(reads & top_level)), tuple(sorted(reads - top_level))


def scaffold(script: str | Path, *, force: bool = False) -> tuple[Path, Path]:
    """Write ``infrarsi_adapter.py`` and ``infrarsi.yaml`` beside ``script``; returns them."""
    script = Path(script).resolve()
    if not script.is_file():
        raise ConfigError(f"--from-script {script}: no such file")
    facts = read_script(script)
    adapter, task = script.parent / "infrarsi_adapter.py", script.parent / "infrarsi.yaml"
    for p in (adapter, task):
        if p.exists() and not force:
            raise ConfigError(f"{p} exists; remove it (or pass --force) to scaffold again")
    mod = script.stem
    names = sorted({*facts.modules[-1:], *facts.batch_functions[:1], *facts.loss_functions[:1],
                    *(facts.imports if facts.optimizer else ())})
    model = facts.modules[-1] if facts.modules else None
    lines = [f'"""InfraRSI adapter for {script.name} (scaffolded: fill in every TODO)."""',
             "import torch", ""]
    if names:
        lines += [f"from .{mod} import {', '.join(names)}", ""]
    lines += ["", "def build_model():"]
    lines += ([f"    return {model}()  # TODO: the arguments your script builds it with"]
              if model else ['    raise NotImplementedError("TODO: return your nn.Module")'])
    lines += ["", "", "def batches(ctx):",
              "    # Draw step s's global batch (ctx.global_batch_size rows) from ctx.generator(s),"]
    if facts.batch_functions:
        lines += ["    # e.g. with your " + facts.batch_functions[0] + "(...); then:",
                  "    # for s in range(10**9): yield from ctx.shard(global_batch)"]
    lines += ['    raise NotImplementedError("TODO: yield from ctx.shard(global_batch) per step")',
              "", "", "def loss(model, batch):"]
    lines += ([f"    # e.g. return {facts.loss_functions[0]}(model, batch)"]
              if facts.loss_functions else [])
    lines += ['    raise NotImplementedError("TODO: return the scalar mean loss of the batch")',
              "", "", "def tokens(batch):",
              "    return batch[-1].numel()  # TODO: the tokens (or samples) in the batch"]
    if facts.optimizer:
        todo = (f"TODO: {', '.join(facts.unresolved)}: your script's values here"
                if facts.unresolved else "TODO: check its arguments")
        lines += ["", "", "def optimizer(model, impl):  # your script's optimizer",
                  f"    return {facts.optimizer}  # {todo}"]
    adapter.write_text("\n".join(lines) + "\n")
    gbs = facts.batch_size or 8
    task.write_text(
        f"name: {mod}\n"
        "workload:\n"
        "  workspace: .\n"
        "  entry: infrarsi_adapter.py\n"
        f"  global_batch_size: {gbs}  # rows per optimizer step"
        f"{' (from --batch-size)' if facts.batch_size else '  # TODO: your batch size'}\n"
        "hardware: {device: cpu, max_workers: 2}  # TODO: cuda on a GPU cluster\n"
        "scope:\n"
        "  editable: []  # TODO: the model files a patch may change\n"
        f"  frozen: [infrarsi_adapter.py, {script.name}]  # + your data files\n")
    return adapter, task
