"""A real multi-node Ray cluster on this machine, for tests that need nodes to come and go.

Each node is one ``ray start --block`` process (head: ``--head``; workers: ``--address``) with
its own temp dir, explicit CPUs and memory (so resources are not double-counted on one host),
node IP 127.0.0.1 and token auth off (Ray 2.60's CLI refuses to join otherwise). ``--block``
keeps the ``ray start`` process as the parent of its node's raylet and services, so a node is
exactly that process tree: :meth:`Node.kill` (SIGKILL of the whole tree) is a machine lost;
:meth:`Node.stop` is an orderly shutdown. Nothing here ever runs ``ray stop`` or touches a Ray
process it did not start.

A driver joins with ``RAY_ADDRESS=cluster.address`` (see :meth:`LocalRayCluster.env`), exactly as
``ray job submit`` runs an entrypoint on the head.

Node death is detected by the GCS health check; the cluster sets it to ~3 s (period 1 s,
3 failures) instead of Ray's default ~30 s, so node-loss tests stay short.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).with_name("ray"))
DRIVER = Path(__file__).with_name("cluster_driver.py")
MIB = 2**20
# The run stage's custom resource for Tune trial processes (they hold no CPU); only the head has
# it, so trial drivers live on the head, as on a real cluster (cluster/cluster.yaml).
TRIAL_DRIVER_RESOURCE = "infrarsi_trial_driver"

# Environment shared by every node and every driver of the test cluster.
CLUSTER_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    "RAY_DEDUP_LOGS": "0",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    """One Ray node: the ``ray start --block`` process and everything under it."""

    name: str
    proc: subprocess.Popen
    temp_dir: Path
    log: Path
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def processes(self) -> list[psutil.Process]:
        """The node's live processes: ``ray start`` and all its descendants."""
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def find(self, needle: str) -> list[psutil.Process]:
        """Processes of this node whose command line (its Ray process title) contains needle."""
        out = []
        for p in self.processes():
            try:
                if needle in " ".join(p.cmdline()):
                    out.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    def kill(self) -> float:
        """SIGKILL the whole node at once (a machine lost). Returns the time it was killed."""
        procs = self.processes()
        t = time.time()
        for p in procs:
            _signal(p, signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        self.proc.wait(timeout=10)
        return t

    def stop(self, timeout: float = 20.0) -> None:
        """Orderly shutdown: SIGTERM ``ray start --block`` (it stops its node), then SIGKILL
        whatever of this node is left."""
        procs = self.processes()
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        _, left = psutil.wait_procs([p for p in procs if p.is_running()], timeout=5)
        for p in left:
            _signal(p, signal.SIGKILL)
        psutil.wait_procs(left, timeout=5)
        if self.alive:
            self.proc.kill()
            self.proc.wait(timeout=5)


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


class LocalRayCluster:
    """A head and worker nodes started as separate Ray nodes on loopback.

    ``cluster = LocalRayCluster(); cluster.start_head(num_cpus=1); cluster.add_node("w1")``;
    ``cluster.wait_for_nodes(2)``; ``cluster.shutdown()`` stops only these nodes.
    """

    def __init__(self, root: Path | None = None, *, object_store_mib: int = 100) -> None:
        # Short root: Ray's unix socket paths (root/session_.../sockets/plasma_store) must fit
        # in 107 bytes.
        self.root = Path(root or tempfile.mkdtemp(prefix="irc-", dir="/tmp"))
        self.object_store_mib = object_store_mib
        self.port: int | None = None
        self.dashboard_port: int | None = None
        self.nodes: dict[str, Node] = {}

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def address(self) -> str:
        assert self.port is not None, "start_head() first"
        return f"127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a driver (or a CLI call) that joins this cluster."""
        env = {**os.environ, **CLUSTER_ENV, **extra}
        if self.port is not None:
            env["RAY_ADDRESS"] = self.address
        return env

    def start_head(self, num_cpus: int = 1, memory_mib: int = 2048,
                   resources: dict[str, float] | None = None, timeout: float = 90.0,
                   dashboard: bool = False) -> Node:
        """``dashboard=True``: with the dashboard and its job server (``ray job submit``) on
        127.0.0.1 at :attr:`dashboard_url`; needs ``ray[default]`` (the ``cluster`` extra)."""
        self.port = free_port()
        args = ["--head", f"--port={self.port}", "--disable-usage-stats"]
        if dashboard:
            self.dashboard_port = free_port()
            args += ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                     f"--dashboard-port={self.dashboard_port}",
                     f"--dashboard-agent-listen-port={free_port()}",
                     f"--dashboard-agent-grpc-port={free_port()}",
                     f"--runtime-env-agent-port={free_port()}",
                     f"--metrics-export-port={free_port()}"]
        else:
            args.append("--include-dashboard=false")
        return self._start("head", args, num_cpus, memory_mib, resources, timeout)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def add_node(self, name: str, num_cpus: int = 1, memory_mib: int = 2048,
                 resources: dict[str, float] | None = None, timeout: float = 90.0) -> Node:
        """Start a worker node and wait until the GCS lists it alive."""
        n = len(self.alive_nodes())
        node = self._start(name, [f"--address={self.address}"], num_cpus, memory_mib,
                           resources, timeout)
        self.wait_for_nodes(n + 1, timeout=timeout)
        return node

    def _start(self, name: str, args: list[str], num_cpus: int, memory_mib: int,
               resources: dict[str, float] | None, timeout: float) -> Node:
        assert name not in self.nodes or not self.nodes[name].alive, f"node {name} is running"
        temp = self.root / name
        temp.mkdir(parents=True, exist_ok=True)
        res = {f"node_{name}": 1.0, **(resources or {})}
        cmd = [RAY, "start", "--block", *args, "--node-ip-address=127.0.0.1",
               f"--num-cpus={num_cpus}", "--num-gpus=0", f"--memory={memory_mib * MIB}",
               f"--object-store-memory={self.object_store_mib * MIB}",
               f"--resources={json.dumps(res)}", f"--temp-dir={temp}"]
        log = self.root / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env(), start_new_session=True)
        node = Node(name, proc, temp, log, res)
        self.nodes[name] = node
        deadline = time.time() + timeout
        while time.time() < deadline:  # the raylet is up once ray start says so
            if not node.alive:
                raise RuntimeError(f"ray start for node {name} exited:\n{log.read_text()[-3000:]}")
            if "Ray runtime started" in log.read_text(errors="replace"):
                return node
            time.sleep(0.5)
        node.stop()
        raise TimeoutError(f"node {name} did not start in {timeout:.0f}s:\n{log.read_text()[-3000:]}")

    def shutdown(self) -> None:
        """Stop every node this cluster started (workers first), then remove its temp dir."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            self.nodes[name].stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # ---- state from the GCS (no driver needed) --------------------------------------------
    def node_table(self) -> list[dict]:
        """Every node the GCS knows: ``{"node_id", "alive", "resources"}`` per node."""
        from ray._raylet import GcsClient

        infos = GcsClient(address=self.address).get_all_node_info(timeout=10)
        out = []
        for node_id, info in infos.items():
            out.append({
                "node_id": node_id.hex() if hasattr(node_id, "hex") else str(node_id),
                "alive": info.state == 0,  # GcsNodeInfo.ALIVE
                "resources": dict(info.resources_total),
            })
        return out

    def alive_nodes(self) -> list[dict]:
        if self.port is None:
            return []
        return [n for n in self.node_table() if n["alive"]]

    def wait_for_nodes(self, n: int, timeout: float = 60.0) -> float:
        """Wait until exactly ``n`` nodes are alive; returns the seconds it took."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            if len(self.alive_nodes()) == n:
                return time.time() - t0
            time.sleep(0.25)
        raise TimeoutError(f"expected {n} alive nodes, GCS has {self.alive_nodes()}")

    def node_of(self, pid: int) -> str | None:
        """Which of this cluster's nodes a process belongs to (None: not ours)."""
        for name, node in self.nodes.items():
            if any(p.pid == pid for p in node.processes()):
                return name
        return None

    def find(self, needle: str) -> list[tuple[str, psutil.Process]]:
        """(node name, process) of every live cluster process whose title contains needle."""
        return [(name, p) for name, node in self.nodes.items() for p in node.find(needle)]

    def wait_for(self, needle: str, count: int = 1, timeout: float = 180.0,
                 poll_s: float = 0.5) -> list[tuple[str, psutil.Process]]:
        """Wait until at least ``count`` processes titled ``needle`` run on the cluster."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = self.find(needle)
            if len(found) >= count:
                return found
            time.sleep(poll_s)
        raise TimeoutError(f"{count} x {needle!r} never appeared on the cluster in {timeout:.0f}s")


@contextmanager
def local_cluster(workers: dict[str, int] | None = None, head_cpus: int = 1,
                  memory_mib: int = 2048) -> Iterator[LocalRayCluster]:
    """A started cluster (head + ``workers`` name -> CPUs), always shut down afterwards."""
    cluster = LocalRayCluster()
    try:
        cluster.start_head(num_cpus=head_cpus, memory_mib=memory_mib,
                           resources={TRIAL_DRIVER_RESOURCE: 4})
        cluster.wait_for_nodes(1)
        for name, cpus in (workers or {}).items():
            cluster.add_node(name, num_cpus=cpus, memory_mib=memory_mib)
        yield cluster
    finally:
        cluster.shutdown()


class SearchDriver:
    """``tests/cluster_driver.py`` as its own process on the cluster (as ``ray job submit``
    runs an entrypoint on the head), with its events and summary readable from the test."""

    def __init__(self, cluster: LocalRayCluster, workdir: Path, task: Path, budget: int,
                 bank_url: str | None = None, startup_allowance: float | None = None,
                 inline: bool = False) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.workdir / "events.jsonl"
        self.out_path = self.workdir / "summary.json"
        self.log = self.workdir / "driver.log"
        self.bank_url = bank_url or f"sqlite:///{self.workdir / 'bank.sqlite'}"
        cmd = [sys.executable, str(DRIVER), "--task", str(task), "--budget", str(budget),
               "--bank", self.bank_url, "--events", str(self.events_path),
               "--out", str(self.out_path)]
        if startup_allowance is not None:
            cmd += ["--startup-allowance", str(startup_allowance)]
        if inline:
            cmd.append("--inline")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env=cluster.env(), cwd=self.workdir)
        self.t_start = time.time()

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.events_path.is_file():
            return []
        rows = [json.loads(line) for line in self.events_path.read_text().splitlines() if line]
        return [r for r in rows if kind is None or r["event"] == kind]

    def wait_event(self, kind: str, n: int, timeout: float = 300.0) -> dict:
        """The ``n``-th event of ``kind`` (1-based), waiting for it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = self.events(kind)
            if len(got) >= n:
                return got[n - 1]
            if self.proc.poll() is not None:
                break
            time.sleep(0.25)
        raise AssertionError(f"no {kind} event #{n} (driver rc={self.proc.poll()}):\n{self.tail()}")

    def wait(self, timeout: float = 300.0) -> dict:
        """Wait for a clean exit; the driver's summary."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"driver still running after {timeout:.0f}s:\n{self.tail()}") from None
        assert rc == 0, f"driver exited {rc}:\n{self.tail()}"
        return json.loads(self.out_path.read_text())

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.is_file() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
