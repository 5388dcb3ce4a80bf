"""Run ``train_worker`` on N local gloo ranks without Ray (tests and benchmark scripts).

Each rank is a spawned process joined over loopback; results (or the exception a rank raised)
come back in rank order.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, payload: dict, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from infrarsi.harness.train import train_worker

        queue.put((rank, train_worker(payload)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, e))
    finally:
        dist.destroy_process_group()


def run_local(payload: dict[str, Any], world_size: int) -> list[Any]:
    """Results of ``train_worker(payload)`` per rank; a rank that raised gives its exception."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world_size, port, payload, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    for _ in procs:
        rank, value = queue.get()
        results[rank] = value
    for p in procs:
        p.join()
    return [results[r] for r in range(world_size)]
