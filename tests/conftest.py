"""Shared fixtures: one real local Ray instance per test session, project paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "configs" / "tasks"
SHARED_DATA = Path(os.environ.get("INFRARSI_DATA_DIR", ROOT.parent / "shared" / "data"))

# Faster Ray Train polling and no token-auth prompts for the local test cluster.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_local():
    """A real local Ray instance with 2 CPUs, started once and shut down at the end."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def ultrascale_csv() -> Path:
    path = SHARED_DATA / "ultrascale_playbook_benchmarks.csv"
    if not path.is_file():
        pytest.skip(f"measured data not found at {path} (set INFRARSI_DATA_DIR)")
    return path
