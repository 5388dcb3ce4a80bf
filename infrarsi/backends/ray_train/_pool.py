"""A warm pool of trial worker groups: processes and a torch process group kept across trials.

Why not Ray Train for warm trials: a Ray Train V2 worker group belongs to the controller of one
``TorchTrainer.fit()`` and is torn down when it returns; there is no public API to run a second
train function in a live group. So the pool is a set of Ray actors managed here, doing what
``TorchConfig``'s backend setup does for a Train worker group: one actor per rank in a placement
group of the trial's bundles (``num_threads`` CPUs, one GPU on CUDA), rank 0's address and a
free port as the rendezvous, ``torch.distributed.init_process_group`` (gloo on CPU, nccl on GPU,
the same collective timeout), ``CUDA_VISIBLE_DEVICES`` shared by the ranks of one node and
``LOCAL_RANK`` set, so NCCL sees its peers. Each trial then runs the same per-rank function
(``_runner.run_rank``) as a fresh ``TorchTrainer`` job would. Fresh trials
(``fresh_processes=True``, ``infrarsi run --fresh-processes``) still run as TorchTrainer jobs.

Which trials share a group: those with the same :func:`group_key` (world size, threads per
worker, device, collective backend and timeout, placement strategy): what is fixed when the
processes start, and the **code** they run (a digest of the shipped workspace). Everything else
(model, optimizer, compiled graph) is built afresh per trial inside the live workers
(:class:`PoolWorker.run` says how it is isolated).

Why the code is part of the key, and why a patched trial's group serves that trial only
(``single_use``): a proposed patch is untrusted code, and it runs inside the worker's
interpreter, where it can change process-wide state no purge can enumerate (rebind a torch
function, wrap a class's method, start a thread, keep a cache on a torch module). Such a change
outlives the trial. In a later trial of other code it could slow an untouched baseline (in an
A B A B verification, the candidate would look faster); in a later trial of the same patch it
could replay what it cached (the data of a seeded trial repeats exactly: the same losses, less
work). So the untouched code's groups never run a patch, and a patched trial's processes run
no later trial: it costs a group start (not a Ray Train job's), and it measures what a fresh
process measures.

A trial that fails in any way (crash, OOM, compile error, hang, lost worker) retires its group:
the actors are killed and the next trial gets a fresh group. A worker whose loaded ``infrarsi``
sources changed on disk since it started is stale: its group is retired before the next trial.

Resources: an idle CPU group holds none, so a warm group per code version fits on a small
machine (on 2 CPUs, the untouched code's group stays warm while patched trials come and go).
Its actors are placed with ``num_cpus=0``, each pinned to the node where its rank was first
placed; a trial on the group first takes a **lease**: a placement group of the trial's bundles
(``num_threads`` CPUs per rank) pinned to those nodes (``bundle_label_selector`` on the node-id
label), so Ray accounts the CPUs while the trial runs and other Ray work, and other trials of
this pool, wait for them as they would for a group's own placement group. The lease is removed
when the trial ends, whatever the outcome (after the group's tidy-up on success: that is work
on those CPUs too); a trial whose lease is not placed before its deadline fails as a group that
cannot start does. When a warm group's nodes stay busy while the cluster has room elsewhere, the
group is retired and the trial starts a new one there. GPU groups keep their resources while
idle (``CUDA_VISIBLE_DEVICES`` is fixed when a rank starts: a rank cannot move to another GPU);
they are retired when a new group needs the room. Idle groups are bounded: at most
``MAX_IDLE_GROUPS`` (the oldest retired first), none idle longer than ``IDLE_KEEP_S`` (a CPU
group) or ``IDLE_RETIRE_S`` (a GPU group).

One :class:`TrialPool` actor per driver process (:func:`process_pool`), pinned to the driver's
node and owned by the driver, so it and its groups end with the driver. Tune's trial processes
reach it by name (:func:`connect`).
"""

from __future__ import annotations

import gc
import hashlib
import os
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import ray
from ray.util.placement_group import (
    NODE_ID_LABEL_KEY,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from infrarsi.backends.ray_train._classify import classify

# Before a placement group (a new group's or a trial's lease) is made, idle groups that hold
# resources (GPU groups) are retired when the free resources are short; if it is still not
# ready after this long, every idle group holding resources is retired.
_PLACE_PATIENCE_S = 5.0
# An idle group that holds resources (a GPU group) is retired after this long: a driver that
# never closes its pool must not keep GPUs from other Ray work; between a run's trials of one
# group the gap is seconds.
IDLE_RETIRE_S = 60.0
# An idle group that holds none (a CPU group: only its processes' memory) is retired after this
# long. Longer, because patched trials (a group each) can run for minutes between two trials of
# the untouched code: in the README demo 4-5 of them in a row (~25 s each on 2 cores) outlived
# a 60 s limit, and the untouched code's next trial started a group again.
IDLE_KEEP_S = 600.0
# At most this many idle groups stay alive (each keeps its ranks' processes, with torch loaded,
# in memory); the longest idle is retired first. A run alternates few code versions at a time.
MAX_IDLE_GROUPS = 4
# A lease outlives its trial until the group's tidy-up is done, at most this long.
_TIDY_WAIT_S = 60.0


def group_key(config: dict[str, Any], *, device: str, backend: str, collective_timeout_s: int,
              placement_strategy: str, code: str, single_use: bool = False) -> dict[str, Any]:
    """What a trial's processes are started with, and the code they run (``code``:
    :func:`code_digest` of the workspace); trials with equal keys share a warm group, except
    ``single_use`` ones (untrusted code), whose group is retired after its one trial."""
    return {"num_workers": int(config["num_workers"]), "num_threads": int(config["num_threads"]),
            "device": device, "backend": backend, "collective_timeout_s": int(collective_timeout_s),
            "placement_strategy": placement_strategy, "code": code, "single_use": bool(single_use)}


def code_digest(files: dict[str, bytes | str]) -> str:
    """sha256 over a workspace's files (relative path and content, in path order): which
    version of the user's code a trial runs; a patched workspace has its own."""
    h = hashlib.sha256()
    for rel in sorted(files):
        content = files[rel]
        data = content.encode() if isinstance(content, str) else content
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


# ---- the worker: one rank ---------------------------------------------------------------------
def _loaded_sources() -> dict[str, str]:
    """sha256 of the source file of every loaded ``infrarsi`` module (the harness among them)."""
    out = {}
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if (name == "infrarsi" or name.startswith("infrarsi.")) and path and os.path.isfile(path):
            with open(path, "rb") as f:
                out[path] = hashlib.sha256(f.read()).hexdigest()
    return out


def _torch_globals() -> dict[str, Any]:
    """Process-wide torch settings a trial's code may change (a patch setting TF32, say)."""
    import torch

    flags: dict[str, Any] = {
        "default_dtype": torch.get_default_dtype(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda_bf16_reduced": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cuda_fp16_reduced": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cudnn": (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark,
                  torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32),
    }
    try:
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config

        flags["dynamo_config"] = dynamo_config.get_config_copy()
        flags["inductor_config"] = inductor_config.get_config_copy()
    except Exception:  # noqa: BLE001 - an older torch without config copies: flags above only
        pass
    return flags


def _restore_torch_globals(flags: dict[str, Any]) -> None:
    import torch

    torch.set_default_dtype(flags["default_dtype"])
    torch.set_float32_matmul_precision(flags["matmul_precision"])
    torch.use_deterministic_algorithms(flags["deterministic"])
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda_matmul_tf32"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flags["cuda_bf16_reduced"]
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = flags["cuda_fp16_reduced"]
    (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32) = flags["cudnn"]
    torch.set_grad_enabled(True)
    if "dynamo_config" in flags:
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config

        for config, saved in ((dynamo_config, flags["dynamo_config"]),
                              (inductor_config, flags["inductor_config"])):
            now = config.get_config_copy()
            # only what the trial changed (setting deprecated keys back would warn)
            config.load_config({k: v for k, v in saved.items() if now.get(k) != v})


def _collect_and_freeze() -> None:
    """Collect the garbage, then move every surviving object to the collector's permanent
    generation (``gc.freeze``).

    Why: a warm worker holds ~300k long-lived objects (torch, Ray, the harness); a full
    collection walks all of them (0.25-0.45 s on a loaded 2-core box), which the next trial
    waited for. Survivors of a collection between trials are reachable (imported modules, torch's
    caches): frozen they are skipped by every later collection, so the next one walks only what
    later trials created."""
    gc.collect()
    gc.freeze()


def _reset_between_trials(flags: dict[str, Any]) -> None:
    """Nothing of the last trial's compiled graphs, memory or global settings stays."""
    import torch

    torch._dynamo.reset()  # compiled graphs and guards of the earlier trial's model  # noqa: SLF001
    _collect_and_freeze()
    _restore_torch_globals(flags)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _seed(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every CUDA device too


def _purge_workspace(workspace: str, path_before: list[str]) -> list[str]:
    """Drop every module loaded from ``workspace`` (under any name) and the ``sys.path`` entries
    the trial added. Returns the purged module names."""
    root = os.path.realpath(workspace) + os.sep
    gone = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None) or ""
        if name.startswith("_infrarsi_ws_") or (path and os.path.realpath(path).startswith(root)):
            del sys.modules[name]
            gone.append(name)
    sys.path[:] = path_before
    return gone


@ray.remote(max_restarts=0)
class PoolWorker:
    """One rank of a warm group: holds its process and its torch process group across trials.

    Per trial (:meth:`run`): RNGs seeded from the task's loss-reference seed, the workspace
    materialized in a new folder and imported under a fresh package name (``load_entry``), and
    afterwards every module loaded from that folder dropped from ``sys.modules`` (whatever name
    it was imported under) and ``sys.path`` restored: nothing of a trial's code is reachable from
    the next one. Between trials (:meth:`tidy`, before the next :meth:`run` in any case): torch's
    compile caches and global settings reset, memory statistics reset, garbage collected.
    """

    def __init__(self, num_threads: int) -> None:
        # A CPU group's rank is placed with num_cpus=0 (its trial's lease holds the CPUs), for
        # which Ray sets OMP_NUM_THREADS=1; a Train worker (and a rank holding its CPUs) sees
        # the CPUs it was given. Set before the harness's first OpenMP use.
        os.environ["OMP_NUM_THREADS"] = str(max(1, int(num_threads)))
        from infrarsi.backends.ray_train import _runner  # noqa: F401 - loads the harness now

        self._sources = _loaded_sources()
        self._flags = _torch_globals()
        self._untidy = False
        _collect_and_freeze()  # the imports' objects: walked by no collection from now on
        self.trials = 0
        self.purged: list[str] = []

    def node(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"ip": ray.util.get_node_ip_address(), "node_id": ctx.get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}

    def free_port(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def init_group(self, backend: str, addr: str, port: int, rank: int, world: int,
                   local_rank: int, cuda_visible: str | None, timeout_s: int) -> None:
        import torch.distributed as dist

        if cuda_visible is not None:  # before CUDA initializes: the node's ranks see each other
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank))
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout_s))

    def stale(self) -> str | None:
        """Why this process must not run another trial (its loaded sources changed), or None."""
        for path, digest in self._sources.items():
            try:
                with open(path, "rb") as f:
                    now = hashlib.sha256(f.read()).hexdigest()
            except OSError:
                now = None
            if now != digest:
                return f"{path} changed on disk since this worker process started"
        return None

    def run(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        from infrarsi.backends.ray_train._runner import run_rank

        if self._untidy:  # the pool's tidy() call after the last trial did not arrive
            self.tidy()
        self._untidy = True
        _seed(int(payload["task"].get("loss_reference", {}).get("seed", 0)))
        path_before = list(sys.path)
        holder: dict[str, str] = {}
        try:
            return run_rank(payload, on_workspace=lambda ws: holder.setdefault("ws", ws))
        finally:
            self.trials += 1
            if "ws" in holder:
                self.purged = _purge_workspace(holder["ws"], path_before)

    def tidy(self) -> None:
        """After a trial, off its clock (the pool calls it once the trial's reply is in; an
        actor runs its calls in order, so it is done before the next trial starts): compile
        caches, memory statistics and torch's global settings reset, the old model's reference
        cycles collected, and the sources of modules the trial imported first recorded."""
        _reset_between_trials(self._flags)
        self._sources = {**_loaded_sources(), **self._sources}
        self._untidy = False

    def leaked_workspace_modules(self) -> list[str]:
        """Modules of any trial's workspace still loaded (tests: must be empty between trials)."""
        return [n for n, m in sys.modules.items() if n.startswith("_infrarsi_ws_")
                or "infrarsi-ws-" in (getattr(m, "__file__", None) or "")]


# ---- the pool: groups by key --------------------------------------------------------------------
@dataclass
class _Group:
    """A live group. ``pg``: the placement group it holds while idle (GPU groups; None for a
    CPU group, whose trials take a lease); ``nodes``: each rank's node id (where leases go);
    ``lease``: its last trial's lease while the group tidies up (the next trial on the group
    takes it over instead of placing a new one)."""

    key: dict[str, Any]
    workers: list[Any]
    pg: Any = None
    nodes: list[str] = field(default_factory=list)
    lease: Any = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    trials: int = 0
    idle_since: float = 0.0


def _bundles(key: dict[str, Any]) -> list[dict[str, float]]:
    """One bundle per rank: its threads' CPUs, and one GPU on CUDA."""
    bundle = {"CPU": float(key["num_threads"]), **({"GPU": 1.0} if key["device"] == "cuda" else {})}
    return [dict(bundle) for _ in range(int(key["num_workers"]))]


def _fits(bundles: list[dict[str, float]], free: dict[str, float]) -> bool:
    return all(free.get(r, 0.0) >= sum(b.get(r, 0.0) for b in bundles)
               for r in {r for b in bundles for r in b})


class GroupStartError(RuntimeError):
    """A warm group could not be placed or its process group not formed before the deadline."""


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=64)
class TrialPool:
    """Hands out warm groups by :func:`group_key` and runs one trial on a group per call."""

    def __init__(self) -> None:
        self._idle: list[_Group] = []
        self._busy: dict[str, _Group] = {}
        self._lock = threading.Lock()
        self.stats = {"groups_started": 0, "groups_retired": 0, "warm_trials": 0, "trials": 0}
        threading.Thread(target=self._expire_idle, daemon=True).start()

    def _expire_idle(self) -> None:
        while True:
            time.sleep(IDLE_RETIRE_S / 6)
            now = time.time()
            with self._lock:
                old = [g for g in self._idle if now - g.idle_since
                       > (IDLE_RETIRE_S if g.pg is not None else IDLE_KEEP_S)]
                self._idle = [g for g in self._idle if g not in old]
            for g in old:
                self._kill(g)

    # -- public --
    def run(self, key: dict[str, Any], payload: dict[str, Any], deadline: float,
            timeout_message: str) -> dict[str, Any]:
        """One trial on a warm group (or a new one), under a lease of its CPUs: the same outcome
        dict as ``run_trainer`` (``ok``/``value`` or ``status``/``error_kind``/``message``), plus
        ``group``, ``warm`` (whether the group had run a trial before) and ``t_end``."""
        try:
            group, warm, lease = self._take(key, deadline)
        except Exception as e:  # noqa: BLE001 - a group that cannot start is a failed trial
            if isinstance(e, GroupStartError):
                return self._failed("error", "timeout", f"{e}. {timeout_message}")
            status, kind, message = classify(e)
            return self._failed(status.value, kind.value if kind else None, message)
        try:
            with self._lock:
                self.stats["trials"] += 1
                self.stats["warm_trials"] += int(warm)
            reply = {**self._run_on(group, payload, deadline, timeout_message),
                     "group": group.id, "warm": warm}
            if reply["ok"]:
                group.trials += 1
                if key.get("single_use"):  # untrusted code ran in these processes: no later trial
                    self._retire(group)
                else:
                    tidy = [w.tidy.remote() for w in group.workers]  # after the reply, off its clock
                    self._hold_lease(group, lease, until=tidy)
                    lease = None  # the group holds it now
                    self._release(group)
            return reply
        except BaseException:
            self._retire(group)
            raise
        finally:
            _remove_quietly(lease)

    def retire_idle(self, holding_only: bool = False) -> int:
        """Retire every idle group (``holding_only``: those holding their resources while idle,
        i.e. GPU groups). Returns how many."""
        with self._lock:
            gone = [g for g in self._idle if g.pg is not None or not holding_only]
            self._idle = [g for g in self._idle if g not in gone]
        for g in gone:
            self._kill(g)
        return len(gone)

    def retire_all(self) -> int:
        with self._lock:
            groups = self._idle + list(self._busy.values())
            self._idle, self._busy = [], {}
        for g in groups:
            self._kill(g)
        return len(groups)

    def workers(self) -> dict[str, list[Any]]:
        """Live groups' worker handles by group id (tests and diagnostics)."""
        with self._lock:
            return {g.id: list(g.workers) for g in [*self._idle, *self._busy.values()]}

    def get_stats(self) -> dict[str, int]:
        return dict(self.stats)

    # -- one trial --
    def _run_on(self, group: _Group, payload: dict[str, Any], deadline: float,
                timeout_message: str) -> dict[str, Any]:
        """Every rank's :meth:`PoolWorker.run`; a failed or late rank retires the group."""
        refs = [w.run.remote(payload) for w in group.workers]
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.time()))
            if not ready:
                self._retire(group)
                return self._failed("error", "timeout", timeout_message)
            try:
                ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - the first rank to fail names the cause
                self._retire(group)
                status, kind, message = classify(e)
                return self._failed(status.value, kind.value if kind else None, message)
        return {"ok": True, "value": ray.get(refs[0]), "t_end": time.time()}

    def _hold_lease(self, group: _Group, lease: Any, until: list[Any]) -> None:
        """``group`` keeps its trial's ``lease`` until its tidy-up calls (``until``) are done,
        then it is removed in the background (the trial's reply does not wait), unless a next
        trial on the group took it over first (a new placement group right after one is
        removed waits up to ~1 s for Ray to see the CPUs free)."""
        if lease is None:
            return
        with self._lock:
            group.lease = lease

        def end() -> None:
            try:
                ray.wait(until, num_returns=len(until), timeout=_TIDY_WAIT_S)
            except Exception:  # noqa: BLE001 - a killed worker's call: its group is gone anyway
                pass
            with self._lock:
                mine = group.lease is lease
                if mine:
                    group.lease = None
            if mine:
                _remove_quietly(lease)

        threading.Thread(target=end, daemon=True).start()

    # -- groups --
    def _take(self, key: dict[str, Any], deadline: float) -> tuple[_Group, bool, Any]:
        """(group, warm, lease): an idle group of ``key`` that is not stale, with a lease on its
        nodes (None for a group holding its own resources), else a new group."""
        while True:
            with self._lock:
                match = next((g for g in self._idle if g.key == key), None)
                if match is not None:
                    self._idle.remove(match)
                    self._busy[match.id] = match
            if match is None:
                break
            try:
                why = next((s for s in ray.get([w.stale.remote() for w in match.workers],
                                               timeout=max(1.0, deadline - time.time())) if s), None)
            except Exception:  # noqa: BLE001 - a worker gone while idle: start another group
                why = "a worker of the group is gone"
            if why is not None:
                self._retire(match)
                continue
            with self._lock:
                lease, match.lease = match.lease, None
            if match.pg is not None or lease is not None:
                return match, match.trials > 0, lease
            try:
                lease = self._place(_bundles(key), key["placement_strategy"], deadline,
                                    nodes=match.nodes)
            except BaseException:
                self._release(match)  # no room before the deadline: not the group's fault
                raise
            if lease is not None:
                return match, match.trials > 0, lease
            self._retire(match)  # its nodes are busy and the cluster has room elsewhere
        group, lease = self._start(key, deadline)
        with self._lock:
            self._busy[group.id] = group
        return group, False, lease

    def _place(self, bundles: list[dict[str, float]], strategy: str, deadline: float,
               nodes: list[str] | None = None) -> Any:
        """A ready placement group of ``bundles`` (bundle i on node ``nodes[i]`` when given).
        None when pinned bundles are not placed within the patience while the cluster has the
        room elsewhere; :class:`GroupStartError` when not placed before the deadline."""
        self._make_room(bundles)
        selector = [{NODE_ID_LABEL_KEY: n} for n in nodes] if nodes else None
        pg = placement_group(bundles, strategy=strategy, bundle_label_selector=selector)
        try:
            if pg.wait(min(_PLACE_PATIENCE_S, max(0.0, deadline - time.time()))):
                return pg
            self.retire_idle(holding_only=True)  # an idle GPU group may hold what it waits for
            if nodes and _fits(bundles, ray.available_resources()):
                _remove_quietly(pg)
                return None
            if pg.wait(max(0.0, deadline - time.time())):
                return pg
        except BaseException:
            _remove_quietly(pg)
            raise
        _remove_quietly(pg)
        where = " on the group's node(s)" if nodes else ""
        raise GroupStartError(f"no room for {len(bundles)} worker(s) of {bundles[0]}{where} "
                              "before the deadline")

    def _start(self, key: dict[str, Any], deadline: float) -> tuple[_Group, Any]:
        """A new group of ``key`` and the lease its first trial runs under (None on GPU: the
        group holds its placement group while it lives)."""
        n, gpu = key["num_workers"], key["device"] == "cuda"
        bundles = _bundles(key)
        pg = self._place(bundles, key["placement_strategy"], deadline)
        group = _Group(key=key, workers=[], pg=pg if gpu else None)
        lease = None if gpu else pg
        try:
            if gpu:
                strategies = [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
                              for i in range(n)]
            else:  # pinned where the lease placed each rank; the lease holds the CPUs
                on = placement_group_table(pg)["bundles_to_node_id"]
                group.nodes = [on[i] for i in range(n)]
                strategies = [NodeAffinitySchedulingStrategy(node, soft=False) for node in group.nodes]
            group.workers = [
                PoolWorker.options(num_cpus=bundles[i]["CPU"] if gpu else 0, num_gpus=1 if gpu else 0,
                                   scheduling_strategy=strategies[i]).remote(key["num_threads"])
                for i in range(n)]
            left = lambda: max(1.0, deadline - time.time())  # noqa: E731
            nodes = ray.get([w.node.remote() for w in group.workers], timeout=left())
            port = ray.get(group.workers[0].free_port.remote(), timeout=left())
            local, visible = _local_ranks(nodes, gpu)
            ray.get([w.init_group.remote(key["backend"], nodes[0]["ip"], port, r, n, local[r],
                                         visible[r], key["collective_timeout_s"])
                     for r, w in enumerate(group.workers)], timeout=left())
        except ray.exceptions.GetTimeoutError:
            self._kill(group)
            _remove_quietly(lease)
            raise GroupStartError(f"the {n} worker(s) did not form a process group before the "
                                  "deadline") from None
        except BaseException:
            self._kill(group)
            _remove_quietly(lease)
            raise
        with self._lock:
            self.stats["groups_started"] += 1
        return group, lease

    def _make_room(self, bundles: list[dict[str, float]]) -> None:
        if not _fits(bundles, ray.available_resources()):
            self.retire_idle(holding_only=True)

    def _release(self, group: _Group) -> None:
        """Back to idle; past ``MAX_IDLE_GROUPS`` idle, the longest idle are retired."""
        with self._lock:
            self._busy.pop(group.id, None)
            group.idle_since = time.time()
            self._idle.append(group)
            self._idle.sort(key=lambda g: g.idle_since)
            extra = self._idle[:max(0, len(self._idle) - MAX_IDLE_GROUPS)]
            self._idle = self._idle[len(extra):]
        for g in extra:
            self._kill(g)

    def _retire(self, group: _Group) -> None:
        with self._lock:
            self._busy.pop(group.id, None)
            if group in self._idle:
                self._idle.remove(group)
        self._kill(group)

    def _kill(self, group: _Group) -> None:
        for w in group.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        with self._lock:
            lease, group.lease = group.lease, None
            self.stats["groups_retired"] += 1
        _remove_quietly(lease)
        _remove_quietly(group.pg)

    @staticmethod
    def _failed(status: str, kind: str | None, message: str) -> dict[str, Any]:
        return {"ok": False, "status": status, "error_kind": kind, "message": message,
                "t_end": time.time()}


def _remove_quietly(pg: Any) -> None:
    if pg is None:
        return
    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001 - already removed
        pass


def _local_ranks(nodes: list[dict[str, Any]], gpu: bool) -> tuple[list[int], list[str | None]]:
    """Each rank's index among the ranks of its node, and (on GPU) the node's shared
    ``CUDA_VISIBLE_DEVICES`` (as Ray Train sets it: every GPU the node's ranks hold)."""
    local, visible, seen = [], [], {}
    gpus: dict[str, list[str]] = {}
    for info in nodes:
        gpus.setdefault(info["node_id"], []).extend(info["gpu_ids"])
    for info in nodes:
        local.append(seen.get(info["node_id"], 0))
        seen[info["node_id"]] = local[-1] + 1
        ids = sorted(set(gpus[info["node_id"]]), key=lambda s: (len(s), s))
        visible.append(",".join(ids) if gpu else None)
    return local, visible


# ---- the driver side -----------------------------------------------------------------------------
_PROCESS_POOL: dict[str, Any] = {}  # {"job": job id, "name": actor name, "handle": actor}


def process_pool() -> tuple[str, Any]:
    """(name, handle) of this driver process's pool, started on first use (on this node)."""
    job = ray.get_runtime_context().get_job_id()
    if _PROCESS_POOL.get("job") != job:
        name = f"infrarsi-pool-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        node = ray.get_runtime_context().get_node_id()
        handle = TrialPool.options(
            name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote()
        _PROCESS_POOL.update(job=job, name=name, handle=handle)
    return _PROCESS_POOL["name"], _PROCESS_POOL["handle"]


def existing_process_pool() -> Any | None:
    """This process's pool if it has started one in the current Ray session, else None."""
    if not ray.is_initialized() or _PROCESS_POOL.get("job") != ray.get_runtime_context().get_job_id():
        return None
    return _PROCESS_POOL["handle"]


def connect(name: str) -> Any | None:
    """The pool another process (the run's driver) started, by name; None when it is gone."""
    try:
        return ray.get_actor(name)
    except ValueError:
        return None


def shutdown_process_pool(timeout_s: float = 60.0) -> None:
    """Retire every group of this process's pool and end the pool actor."""
    handle = existing_process_pool()
    if handle is None:
        return
    try:
        ray.get(handle.retire_all.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - a pool already gone has nothing left to retire
        pass
    ray.kill(handle, no_restart=True)
    _PROCESS_POOL.clear()
