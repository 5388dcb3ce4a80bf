"""The bank's tables (SQLAlchemy Core) and its schema version.

Every ledger row carries a ``uid``: a natural, deterministic key (``run_id/trial_id``,
``run_id/patch_id``, a content hash, ...). Writes are insert-if-absent on ``uid``, which makes
a retried write after a lost connection and a re-imported bundle change nothing. Rows also keep
``origin`` (who produced them: "search", "doctor", "seed:ultrascale-playbook", ...) and
``bank_id`` (the bank they were first written to), which survive export and import.

Workloads and hardware are stored once each, keyed by a hash of their full dict, with their
feature vectors precomputed (``vector``), so similarity queries never parse trial JSON.
JSON columns are TEXT holding canonical JSON; nothing is ever pickled.
"""

from __future__ import annotations

import sqlalchemy as sa

SCHEMA_VERSION = 1

metadata = sa.MetaData()

_KEY = sa.String(64)
_JSON = sa.Text


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.Float, nullable=nullable)  # epoch seconds, UTC


def _id() -> sa.Column:
    """Local insertion order; never exported (bundles merge on ``uid``)."""
    return sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
        autoincrement=True,
    )


def _uid() -> sa.Column:
    return sa.Column("uid", sa.String(300), nullable=False, unique=True)


bank_meta = sa.Table(
    "bank_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

workloads = sa.Table(
    "workloads",
    metadata,
    sa.Column("key", _KEY, primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("model_family", sa.String(32), nullable=False),
    sa.Column("signature", _JSON, nullable=False),
    sa.Column("vector", _JSON, nullable=False),
)

hardware = sa.Table(
    "hardware",
    metadata,
    sa.Column("key", _KEY, primary_key=True),
    sa.Column("device_name", sa.String(200), nullable=False),
    sa.Column("fingerprint", _JSON, nullable=False),
    sa.Column("vector", _JSON, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("run_id", sa.String(128), primary_key=True),
    sa.Column("task_name", sa.String(200), nullable=False),
    sa.Column("lineage", sa.String(400), nullable=False),
    sa.Column("contract_hash", sa.String(128), nullable=False),
    sa.Column("workload_key", _KEY, sa.ForeignKey("workloads.key"), nullable=False),
    sa.Column("hardware_key", _KEY, sa.ForeignKey("hardware.key"), nullable=False),
    sa.Column("software", _JSON, nullable=False),
    sa.Column("meta", _JSON, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    _ts("started_at"),
    _ts("finished_at", nullable=True),
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("username", sa.String(200), nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)

trials = sa.Table(
    "trials",
    metadata,
    _id(),
    _uid(),  # run_id/trial_id
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("trial_id", sa.String(160), nullable=False),
    sa.Column("workload_key", _KEY, nullable=False),
    sa.Column("hardware_key", _KEY, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # "open" or "finished"
    sa.Column("status", sa.String(16), nullable=True),  # TrialStatus value once finished
    sa.Column("error_kind", sa.String(32), nullable=True),
    sa.Column("backend", sa.String(64), nullable=True),
    sa.Column("config", _JSON, nullable=False),
    sa.Column("config_key", sa.Text, nullable=False),
    sa.Column("knob_encoding", _JSON, nullable=True),
    sa.Column("step_time_s", sa.Float, nullable=True),
    sa.Column("tokens_per_s", sa.Float, nullable=True),
    sa.Column("peak_memory_bytes", sa.BigInteger, nullable=True),
    sa.Column("memory_censor_bytes", sa.BigInteger, nullable=True),
    sa.Column("memory_capacity_bytes", sa.BigInteger, nullable=True),
    sa.Column("final_loss", sa.Float, nullable=True),
    sa.Column("device_seconds", sa.Float, nullable=True),
    sa.Column("record", _JSON, nullable=True),  # TrialRecord.to_dict(), canonical JSON
    _ts("opened_at"),
    _ts("heartbeat_at"),
    _ts("finished_at", nullable=True),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
    sa.UniqueConstraint("run_id", "trial_id", name="uq_trials_run_trial"),
)
sa.Index("ix_trials_sig", trials.c.workload_key, trials.c.hardware_key, trials.c.state,
         trials.c.status)
sa.Index("ix_trials_run", trials.c.run_id, trials.c.status)
sa.Index("ix_trials_state", trials.c.state, trials.c.heartbeat_at)

# Derived, never exported: every (workload, hardware) pair with a finished trial, written in the
# same transaction as the trial, so similarity queries never scan the trial table.
signature_pairs = sa.Table(
    "signature_pairs",
    metadata,
    sa.Column("workload_key", _KEY, primary_key=True),
    sa.Column("hardware_key", _KEY, primary_key=True),
)

baselines = sa.Table(
    "baselines",
    metadata,
    _id(),
    _uid(),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("workload_key", _KEY, nullable=False),
    sa.Column("hardware_key", _KEY, nullable=False),
    sa.Column("payload", _JSON, nullable=False),
    _ts("created_at"),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)
sa.Index("ix_baselines_sig", baselines.c.workload_key, baselines.c.hardware_key)

patches = sa.Table(
    "patches",
    metadata,
    _id(),
    _uid(),  # run_id/patch_id
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("patch_id", sa.String(160), nullable=False),
    sa.Column("lineage", sa.String(400), nullable=False),
    sa.Column("workload_key", _KEY, nullable=False),
    sa.Column("diff", sa.Text, nullable=False),
    sa.Column("files", _JSON, nullable=False),
    sa.Column("evidence", _JSON, nullable=False),
    sa.Column("verified", sa.Boolean, nullable=False),
    _ts("created_at"),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)
sa.Index("ix_patches_lineage", patches.c.lineage)

findings = sa.Table(
    "findings",
    metadata,
    _id(),
    _uid(),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("knob", sa.String(120), nullable=False),
    sa.Column("setting", _JSON, nullable=False),
    sa.Column("workload_key", _KEY, nullable=False),
    sa.Column("hardware_key", _KEY, nullable=False),
    sa.Column("prior", _JSON, nullable=False),
    sa.Column("measured", _JSON, nullable=False),
    sa.Column("flagged", sa.Boolean, nullable=False),
    _ts("created_at"),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)
sa.Index("ix_findings_knob", findings.c.knob)

promotions = sa.Table(
    "promotions",
    metadata,
    _id(),
    _uid(),  # run_id: one promotion per run
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("config", _JSON, nullable=False),
    sa.Column("patches", _JSON, nullable=False),
    sa.Column("evidence", _JSON, nullable=False),
    _ts("created_at"),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)

llm_exchanges = sa.Table(
    "llm_exchanges",
    metadata,
    _id(),
    _uid(),
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("answer", sa.Text, nullable=False),
    sa.Column("meta", _JSON, nullable=False),
    _ts("created_at"),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)
sa.Index("ix_llm_run", llm_exchanges.c.run_id)

searcher_state = sa.Table(
    "searcher_state",
    metadata,
    _id(),
    _uid(),  # run_id/key; the one mutable table
    sa.Column("run_id", sa.String(128), sa.ForeignKey("runs.run_id"), nullable=False),
    sa.Column("key", sa.String(160), nullable=False),
    sa.Column("state", _JSON, nullable=False),
    _ts("updated_at"),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("bank_id", sa.String(64), nullable=False),
)

# Export order respects foreign keys: parents first.
LEDGER_TABLES: tuple[sa.Table, ...] = (
    workloads,
    hardware,
    runs,
    trials,
    baselines,
    patches,
    findings,
    promotions,
    llm_exchanges,
    searcher_state,
)


def merge_key(table: sa.Table) -> str:
    """The column a bundle import merges on (the row's identity across banks)."""
    return {"workloads": "key", "hardware": "key", "runs": "run_id"}.get(table.name, "uid")


def exported_columns(table: sa.Table) -> list[str]:
    return [c.name for c in table.columns if c.name != "id"]
