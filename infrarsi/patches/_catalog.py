"""The patch catalog shipped with InfraRSI (``infrarsi/patches/catalog/``).

``honest/`` holds real optimizations of the reference workloads (each must be accepted);
``gaming/`` holds patches that try to game the benchmark (each must be rejected, by the rule
named in its ``expect_rule``). Each entry is ``<id>.diff`` plus ``<id>.yaml`` metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

from infrarsi._resources import package_path
from infrarsi.errors import ConfigError, PackageDataError
from infrarsi.patches._patch import Patch, load_patch

# package data (importlib.resources); a missing folder or diff is a PackageDataError
CATALOG_DIR = package_path("infrarsi", "patches", "catalog", kind="dir")


@dataclass(frozen=True)
class CatalogEntry:
    patch: Patch
    kind: str  # "honest" | "gaming"
    expect: str  # "accept" | "reject"
    expect_rule: str = ""
    expect_dynamic_rule: str = ""  # the rule when the static scan is off ("": the same)


def load_catalog(kind: str | None = None, family: str | None = None) -> list[CatalogEntry]:
    """Catalog entries (sorted by id), optionally one kind, optionally those for a family."""
    out = []
    for k in ("honest", "gaming"):
        if kind not in (None, k):
            continue
        folder = package_path("infrarsi", "patches", "catalog", k, kind="dir")
        for y in sorted(folder.glob("*.yaml")):
            if not y.with_suffix(".diff").is_file():
                raise PackageDataError(
                    f"patch catalog entry {k}/{y.stem}: {y.name} is installed without its "
                    f"{y.stem}.diff; the installation is incomplete: reinstall infrarsi")
            try:
                patch, extra = load_patch(y)
            except ConfigError as e:  # a shipped entry that does not parse is a broken package
                raise PackageDataError(f"patch catalog entry {k}/{y.stem}: {e}") from None
            if family and patch.families and family not in patch.families:
                continue
            out.append(CatalogEntry(patch, k, extra.get("expect", "accept" if k == "honest" else "reject"),
                                    extra.get("expect_rule", ""),
                                    extra.get("expect_dynamic_rule", "")))
    return out


def honest_patches(family: str | None = None) -> list[Patch]:
    return [e.patch for e in load_catalog("honest", family)]
