"""Stage packages that can be called: ``infrarsi.doctor(...)`` runs the doctor stage while
``infrarsi.doctor`` stays the package (``infrarsi.doctor.noise_model``, ``import
infrarsi.doctor.stage``). A function of the same name at the package top could not stay: Python
sets ``infrarsi.doctor`` to the subpackage as soon as anything imports it."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


def make_callable(package: str, module: str, function: str) -> None:
    """Calling the package ``package`` calls ``module.function`` (imported at the first call,
    so importing the package stays as light as it was)."""

    class _StagePackage(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(importlib.import_module(module), function)(*args, **kwargs)

    _StagePackage.__call__.__doc__ = f"Call {module}.{function} (see its docstring)."
    sys.modules[package].__class__ = _StagePackage
