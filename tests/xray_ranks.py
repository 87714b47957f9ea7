"""Real gloo ranks whose collectives the X-ray reads (tests/kernel/test_xray_ranks.py, bench/xray_cost.py).

``python tests/xray_ranks.py OUT_DIR SCENARIO [WORLD] [N]`` runs WORLD (4) ranks with
torch.multiprocessing; each drains torch's flight recorder with ``ranks._xray.Drainer`` (unless the
scenario ends in ``-bare``) and writes its record to ``OUT_DIR/<rank>/xray.json``, and its
wall time to ``OUT_DIR/<rank>/seconds``.  Scenarios:

* ``story``: every kind of collective, a straggler (rank 3 sleeps before each of 10 all_reduces), a
  send and recv 0 -> 1, then a mismatch (rank 1 calls all_gather where the others call all_reduce)
  that fails at the group's short timeout;
* ``hang``: ranks 0-2 enter a barrier rank 3 never enters;
* ``many`` / ``many-bare``: N small all_reduces, timed.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nbspawn.ranks._xray import XRAY_FR_ENTRIES, Drainer, record_path

STRAGGLER_SLEEP = 0.5  # more than a loaded machine's other ranks ever lag (0.1 s was not, ci: another came last)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, world: int, port: int, out_dir: str, scenario: str, n: int) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(XRAY_FR_ENTRIES)
    # the group's short timeout ends the hang and the mismatch; its rendezvous waits as long for the last
    # rank to arrive, so every rank first waits for all to be started (spawned ranks import torch: on 2
    # loaded cores their arrivals once spread past 4 s)
    _all_started(rank, world, out_dir)
    timeout = datetime.timedelta(seconds=4)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timeout)
    rank_dir = os.path.join(out_dir, str(rank))
    os.makedirs(rank_dir, exist_ok=True)
    drainer = None if scenario.endswith("-bare") else Drainer(rank, record_path(rank_dir))
    if drainer is not None:
        drainer.start()
    began = time.perf_counter()
    try:
        if scenario == "story":
            _story(rank, world)
        elif scenario == "hang":
            dist.all_reduce(torch.ones(2))
            if rank != 3:
                dist.barrier()
        else:
            tensor = torch.ones(16)
            for _ in range(n):
                dist.all_reduce(tensor)
    except RuntimeError as err:  # the mismatch, the hang: the group's timeout ends them
        print(f"rank {rank}: {type(err).__name__}: {str(err)[:120]}", file=sys.stderr)
    seconds = time.perf_counter() - began
    if drainer is not None:
        drainer.stop()
    with open(os.path.join(rank_dir, "seconds"), "w") as fh:
        fh.write(repr(seconds))
    os._exit(0)  # a group left mid-collective must not hold the process at exit


def _all_started(rank: int, world: int, out_dir: str, within: float = 120) -> None:
    """Say this rank is started (``OUT_DIR/started-<rank>``), and wait for the others to say so too."""
    open(os.path.join(out_dir, f"started-{rank}"), "w").close()
    deadline = time.monotonic() + within
    while not all(os.path.exists(os.path.join(out_dir, f"started-{r}")) for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: not all {world} ranks started within {within} s")
        time.sleep(0.01)


def _story(rank: int, world: int) -> None:
    tensor = torch.ones(4, 8)
    for _ in range(3):
        dist.all_reduce(tensor)
    for _ in range(10):
        if rank == 3:
            time.sleep(STRAGGLER_SLEEP)
        dist.all_reduce(tensor)
    dist.broadcast(tensor, 0)
    gathered = [torch.zeros(4, 8) for _ in range(world)]
    dist.all_gather(gathered, tensor)
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * world))
    if rank == 0:
        dist.send(torch.ones(3), 1)
    elif rank == 1:
        dist.recv(torch.zeros(3), 0)
    dist.barrier()
    if rank == 1:
        dist.all_gather([torch.zeros(4, 8) for _ in range(world)], tensor)
    else:
        dist.all_reduce(tensor)
    dist.barrier()


def run(out_dir: str, scenario: str, world: int = 4, n: int = 0) -> None:
    mp.start_processes(_rank, args=(world, _free_port(), out_dir, scenario, n), nprocs=world, join=True, start_method="spawn")


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 4, int(sys.argv[4]) if len(sys.argv) > 4 else 0)
