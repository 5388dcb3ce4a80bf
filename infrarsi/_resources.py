"""Read-only data shipped inside the installed package, found with ``importlib.resources``.

The patch catalog, the seed experience bundle, the reference task specs and the table specs are
package data (``pyproject.toml`` lists them). A missing one means a broken installation, not a
user mistake: :class:`~infrarsi.errors.PackageDataError` says which file and how to fix it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from infrarsi.errors import ConfigError, PackageDataError

__all__ = ["package_path", "task_specs", "task_spec_path"]

TASKS = ("infrarsi", "configs", "tasks")


def package_path(package: str, *parts: str, kind: str = "any") -> Path:
    """The filesystem path of ``parts`` inside ``package`` (a regular package, e.g. "infrarsi");
    raises when it is not installed.

    ``kind``: "file", "dir" or "any". InfraRSI is installed as files (never zipped): the
    verifier and the Ray workers read these paths directly.
    """
    try:
        root = resources.files(package)
    except ModuleNotFoundError as e:
        raise PackageDataError(f"package {package!r} is not installed ({e}); reinstall infrarsi") from None
    node = root.joinpath(*parts) if parts else root
    where = f"{package.replace('.', '/')}/{'/'.join(parts)}"
    if not isinstance(node, Path):
        raise PackageDataError(
            f"{where}: the installed package is not on a file system ({type(node).__name__}); "
            "install infrarsi as files (pip install, not a zip import)")
    ok = {"file": node.is_file, "dir": node.is_dir, "any": node.exists}[kind]()
    if not ok:
        raise PackageDataError(
            f"{where}: missing from the installed package ({node}); the installation is "
            "incomplete: reinstall infrarsi (pip install --force-reinstall infrarsi, or "
            "pip install -e . in a checkout)")
    return node


def task_specs() -> dict[str, Path]:
    """The reference task specs shipped with the package, by name (``cpu_dense`` ...)."""
    folder = package_path(*TASKS, kind="dir")
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def task_spec_path(name: str) -> Path:
    """The shipped task spec called ``name``; a ConfigError listing the known ones."""
    specs = task_specs()
    if name not in specs:
        raise ConfigError(
            f"no built-in task {name!r}; built-in tasks: {', '.join(specs) or 'none'} "
            "(or pass the path of a task spec YAML)")
    return specs[name]
