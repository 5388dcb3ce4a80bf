"""Seed experience shipped as package data in infrarsi/bank/seed/ (a bank bundle, rebuilt by
experience_db/make_seed.py), imported into a bank the first time it is opened."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from infrarsi._resources import package_path
from infrarsi.bank import _bundle
from infrarsi.bank import _schema as S
from infrarsi.bank._engine import insert_ignore

log = logging.getLogger(__name__)


def seed_dir() -> Path:
    """The shipped seed bundle; a PackageDataError when the installation lacks it."""
    path = package_path("infrarsi", "bank", "seed", kind="dir")
    package_path("infrarsi", "bank", "seed", _bundle.MANIFEST, kind="file")
    return path


def ensure_seed(bank: Any, path: Path | None = None, *, announce: bool = False) -> bool:
    """Import the seed bundle once per bank (marked in bank_meta); True if imported now.

    ``path`` None: the shipped bundle, which must be there (PackageDataError otherwise); a
    ``path`` given without a manifest imports nothing. ``announce``: say so on stderr, naming
    the bank and the trials imported (a bank chosen through ``$INFRARSI_BANK_URL`` receives the
    seed too, which its owner must be told)."""
    path = path or seed_dir()
    if not (path / _bundle.MANIFEST).is_file():
        return False
    manifest = _bundle.read_bundle(path)[0]
    marker = f"seed:{manifest['checksum'][:32]}"
    store = bank._store
    done = store.tx(lambda c: c.execute(
        sa.select(S.bank_meta.c.value).where(S.bank_meta.c.key == marker)).scalar(), write=False)
    if done is not None:
        return False
    summary = bank.import_bundle(path)
    store.tx(lambda c: c.execute(insert_ignore(store.engine, S.bank_meta),
                                 {"key": marker, "value": repr(time.time())}))
    log.info("bank: imported seed experience from %s: %s", path,
             {k: v["inserted"] for k, v in summary.items() if v["inserted"]})
    if announce:
        from infrarsi.bank._engine import redact

        trials = summary.get("trials", {}).get("inserted", 0)
        print(f"bank: imported the built-in seed experience ({trials} trials from {path}) into "
              f"{redact(str(bank.url))}; this happens once per bank opened without an explicit "
              "URL", file=sys.stderr)
    return True
