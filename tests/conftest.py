"""Shared fixtures: one real local Ray instance per test session, project paths.

The tests never write into the user's InfraRSI home: INFRARSI_HOME points at a fresh temporary
folder for the session (default bank, default run folders, the LATEST pointer). The measured
tables come from $INFRARSI_DATA_DIR only; the tests that need them skip when it is unset.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "configs" / "tasks"
DATA_DIR = os.environ.get("INFRARSI_DATA_DIR", "").strip()

_HOME = tempfile.mkdtemp(prefix="infrarsi-test-home-")
os.environ["INFRARSI_HOME"] = _HOME  # Ray workers inherit it
atexit.register(shutil.rmtree, _HOME, True)

# Faster Ray Train polling and no token-auth prompts for the local test cluster.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray workers started by the local test cluster inherit this: test helpers (toy_backend) import.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")) if p)


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
    if not DATA_DIR:
        pytest.skip("INFRARSI_DATA_DIR is not set: set it to the folder holding "
                    "ultrascale_playbook_benchmarks.csv to run the tests on the measured table")
    path = Path(DATA_DIR) / "ultrascale_playbook_benchmarks.csv"
    if not path.is_file():
        pytest.skip(f"measured data not found at {path} (INFRARSI_DATA_DIR)")
    return path


def copy_task(tmp_path: Path, name: str = "cpu_dense.yaml", **overrides) -> Path:
    """A task spec in ``tmp_path`` pointing at a private copy of the reference workspace.

    ``overrides`` use dotted keys, e.g. ``**{"trial.timeout_s": 20}``.
    """
    data = yaml.safe_load((TASKS / name).read_text())
    src = (TASKS / data["workload"]["workspace"]).resolve()
    shutil.copytree(src, tmp_path / "ws", ignore=shutil.ignore_patterns("__pycache__"))
    data["workload"]["workspace"] = "ws"
    data["run_dir"] = str(tmp_path / "run")
    for dotted, value in overrides.items():
        node = data
        *head, last = dotted.split(".")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def inject_into_dense(task_path: Path, code: str) -> None:
    """Append ``code`` to the copied workspace's models/dense.py (a user's code change)."""
    dense = task_path.parent / "ws" / "models" / "dense.py"
    dense.write_text(dense.read_text() + "\n" + code)
