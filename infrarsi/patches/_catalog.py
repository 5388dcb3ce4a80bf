"""The patch catalog shipped with InfraRSI (``infrarsi/patches/catalog/``).

``honest/`` holds real optimizations of the reference workloads (each must be accepted);
``gaming/`` holds patches that try to game the benchmark (each must be rejected, by the rule
named in its ``expect_rule``). Each entry is ``<id>.diff`` plus ``<id>.yaml`` metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infrarsi.patches._patch import Patch, load_patch

CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


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
        for y in sorted((CATALOG_DIR / k).glob("*.yaml")):
            patch, extra = load_patch(y)
            if family and patch.families and family not in patch.families:
                continue
            out.append(CatalogEntry(patch, k, extra.get("expect", "accept" if k == "honest" else "reject"),
                                    extra.get("expect_rule", ""),
                                    extra.get("expect_dynamic_rule", "")))
    return out


def honest_patches(family: str | None = None) -> list[Patch]:
    return [e.patch for e in load_catalog("honest", family)]
