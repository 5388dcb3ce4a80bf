"""The documented cluster path: ``ray job submit`` against a head started from this project's
install (the ``cluster`` extra, part of ``dev``: ``ray[default]`` brings the dashboard and its
job server). A local head on 127.0.0.1 with its own ports and temp dir, stopped by the pid of
its ``ray start`` process (tests/cluster_fixture.py); the job runs one short stage, a local-mode
trial of cpu_dense, and its exit code comes back through ``ray job submit``."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_fixture import RAY, LocalRayCluster
from conftest import copy_task

pytestmark = pytest.mark.slow


def _wait_for_job_server(url: str, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"no job server at {url} after {timeout:.0f}s")


def test_ray_job_submit_runs_a_stage_on_a_local_head(tmp_path):
    try:
        import aiohttp  # noqa: F401
        import ray.dashboard.modules.job.sdk  # noqa: F401
    except ImportError as e:  # a failure, not a skip: the install is what is tested
        pytest.fail(f"the job server needs ray[default]: pip install -e '.[cluster]' ({e})")
    task = copy_task(tmp_path, "cpu_dense.yaml", **{
        "timing.measured_steps": 2, "timing.warmup_steps": 1, "hardware.max_workers": 1,
        "search.baseline.num_workers": 1})
    cluster = LocalRayCluster()
    try:
        cluster.start_head(num_cpus=2, dashboard=True)
        _wait_for_job_server(cluster.dashboard_url)
        env = cluster.env(RAY_ADDRESS=cluster.dashboard_url)
        ok = subprocess.run(
            [RAY, "job", "submit", "--address", cluster.dashboard_url, "--",
             sys.executable, "-m", "infrarsi.cli", "trial", str(task), "--local-mode"],
            env=env, capture_output=True, text=True, timeout=300, cwd=Path(tmp_path))
        out = ok.stdout + ok.stderr
        assert ok.returncode == 0, out[-4000:]
        assert "succeeded" in out and "trial" in out and "ok" in out, out[-4000:]
        # the stage's exit code reaches the submitter: bad input fails the job
        bad = subprocess.run(
            [RAY, "job", "submit", "--address", cluster.dashboard_url, "--",
             sys.executable, "-m", "infrarsi.cli", "trial", str(tmp_path / "missing.yaml")],
            env=env, capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "no such file" in bad.stdout + bad.stderr
    finally:
        cluster.shutdown()
