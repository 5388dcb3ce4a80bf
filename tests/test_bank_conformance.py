"""Runs the bank conformance suite (tests/bank_conformance.py) on SQLite and PostgreSQL."""

from __future__ import annotations

from bank_conformance import *  # noqa: F403 - the suite's fixtures and tests
