"""Import the user's entry point from a workspace path without polluting ``sys.modules``.

The workspace is loaded as a package under a unique name (so ``entry.py`` may use relative
imports such as ``from .models import dense``); every module it loaded is dropped from
``sys.modules`` when the context exits, so a later call with a patched copy of the workspace
imports fresh code.
"""

from __future__ import annotations

import importlib
import sys
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infrarsi.errors import WorkloadError


@contextmanager
def load_entry(workspace: str | Path, entry: str = "entry.py") -> Iterator[Any]:
    """Yield the imported entry module of ``workspace``; it must define ``build_model``."""
    ws = Path(workspace).resolve()
    entry_path = ws / entry
    if not entry_path.is_file():
        raise WorkloadError(
            f"workload entry {entry_path} not found; workload.entry must name a file in the "
            "workspace that defines build_model(shape, parallel)"
        )
    pkg_name = f"_infrarsi_ws_{uuid.uuid4().hex[:12]}"
    pkg = types.ModuleType(pkg_name)
    pkg.__path__ = [str(ws)]
    pkg.__package__ = pkg_name
    sys.modules[pkg_name] = pkg
    try:
        module_name = f"{pkg_name}.{Path(entry).with_suffix('').as_posix().replace('/', '.')}"
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise WorkloadError(
                f"cannot import the workload entry {entry_path}: {e}. Install the missing "
                "package in the workers' environment, or import your own modules relatively "
                "(`from .model import GPT`): the workspace is loaded as a package") from e
        from infrarsi.harness.workload import check_adapter, is_adapter

        if is_adapter(module):
            check_adapter(module, str(entry_path))
        elif not callable(getattr(module, "build_model", None)):
            raise WorkloadError(
                f"{entry_path} defines neither the adapter interface nor the reference one. For "
                "your own model, data and loss, define build_model(), batches(ctx), "
                "loss(model, batch) and tokens(batch) in it (see infrarsi.harness.workload; "
                "the task YAML then gives no workload.shape); for a model fed by the harness's "
                "synthetic tokens, build_model(shape, parallel) -> torch.nn.Module"
            )
        yield module
    finally:
        for name in [n for n in sys.modules if n == pkg_name or n.startswith(pkg_name + ".")]:
            del sys.modules[name]
