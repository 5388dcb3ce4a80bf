"""The public ExperienceBank: runs and trials, the ledger, queries, bundles, upgrade."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infrarsi.bank import _bundle
from infrarsi.bank._engine import Store, default_url
from infrarsi.bank._ledger import LedgerMixin
from infrarsi.bank._query import QueryMixin


class ExperienceBank(QueryMixin, LedgerMixin):
    """Every trial, patch, finding and promotion, keyed for reuse across runs and hardware.

    Open with :meth:`ExperienceBank.open` (SQLite file by default, PostgreSQL by URL). Every
    method is one transaction, retried on transient errors and idempotent on natural keys;
    see ``infrarsi/bank/_bank.py`` for the storage contract.
    """

    def export(self, path: str | Path) -> dict[str, Any]:
        """Write a Parquet bundle (directory) of every finished row; returns its manifest."""
        return _bundle.export_bundle(self._store, path)

    def import_bundle(self, path: str | Path) -> dict[str, dict[str, int]]:
        """Verify and merge a bundle in one transaction (idempotent); counts per table."""
        return _bundle.import_bundle(self._store, path)

    @staticmethod
    def upgrade(url: str | None = None) -> tuple[int | None, int]:
        """Create or migrate the bank at ``url`` to the current schema: (old, new) version."""
        store = Store(url or default_url())
        try:
            return store.upgrade()
        finally:
            store.dispose()
