"""What the collectives X-ray costs in the ranks: a 5,000-collective gloo cell on 4 ranks, with and
without the thread that drains torch's flight recorder (``nbspawn.ranks._xray.Drainer``).

    python bench/xray_cost.py                     # 4 ranks, 5,000 all_reduces, 3 rounds
    python bench/xray_cost.py --world 4 --n 5000 --rounds 5 --numel 16

Rows, run alternately in each round so that the machine's load falls on all alike:

* ``ring 256``: nbspawn's recorder size today, no drain (the baseline);
* ``ring 4096``: the ring the X-ray asks for, no drain (what the bigger ring costs alone);
* ``ring 4096 + drain``: the X-ray.

Columns: the cell's wall time (the slowest rank's, median of the rounds), its ratio to the baseline,
the drain thread's own time (summed over the ranks, its share of the cell's wall time × ranks), drains
per rank, and entries lost off the ring (must be 0).  The issue's target: ≤ 3 % slower.

Then the same cell through nbspawn (``launch()``, the text view), ``--xray off`` against ``on``: the
run's wall time, and the kernel's CPU time (every thread of this process) over the run's wall time.
The issue's target: the kernel's CPU for the X-ray ≤ 5 % of the cell's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nbspawn.ranks._xray import XRAY_FR_ENTRIES, Drainer, record_path

ROWS = (
    ("ring 256", 256, False),
    (f"ring {XRAY_FR_ENTRIES}", XRAY_FR_ENTRIES, False),
    (f"ring {XRAY_FR_ENTRIES} + drain", XRAY_FR_ENTRIES, True),
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, world: int, port: int, out_dir: str, ring: int, drain: bool, n: int, numel: int) -> None:
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(ring)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rank_dir = os.path.join(out_dir, str(rank))
    os.makedirs(rank_dir, exist_ok=True)
    tensor = torch.ones(numel)
    dist.barrier()
    drainer = Drainer(rank, record_path(rank_dir)) if drain else None
    began = time.perf_counter()
    if drainer is not None:
        drainer.start()
    for _ in range(n):
        dist.all_reduce(tensor)
    if drainer is not None:
        drainer.stop()
    seconds = time.perf_counter() - began
    result = {"seconds": seconds}
    if drainer is not None:
        result.update(drains=drainer.drains, drain_seconds=drainer.drain_seconds, lost=drainer.log.lost, count=drainer.log.count)
    with open(os.path.join(rank_dir, "result.json"), "w") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


def one_cell(world: int, ring: int, drain: bool, n: int, numel: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _rank, args=(world, _free_port(), out_dir, ring, drain, n, numel), nprocs=world, join=True, start_method="spawn"
        )
        results = []
        for rank in range(world):
            with open(os.path.join(out_dir, str(rank), "result.json")) as fh:
                results.append(json.load(fh))
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--numel", type=int, default=16)
    args = parser.parse_args()
    runs: dict[str, list[list[dict]]] = {name: [] for name, _ring, _drain in ROWS}
    for _round in range(args.rounds):
        for name, ring, drain in ROWS:
            runs[name].append(one_cell(args.world, ring, drain, args.n, args.numel))
    wall = {name: statistics.median(max(r["seconds"] for r in cell) for cell in cells) for name, cells in runs.items()}
    base = wall[ROWS[0][0]]
    print(
        f"{args.world} gloo ranks, {args.n} all_reduces of {args.numel} floats, median of {args.rounds} rounds (torch {torch.__version__})"
    )
    print(f"{'row':<22} {'cell s':>8} {'vs 256':>8} {'drain s':>8} {'drain %':>8} {'drains':>7} {'lost':>5}")
    for name, cells in runs.items():
        drained = [r for cell in cells for r in cell if "drains" in r]
        drain_s = statistics.median(sum(r["drain_seconds"] for r in cell) for cell in cells) if drained else 0.0
        share = 100 * drain_s / (wall[name] * args.world) if drained else 0.0
        drains = statistics.median(r["drains"] for r in drained) if drained else 0
        lost = sum(r["lost"] for r in drained)
        print(f"{name:<22} {wall[name]:>8.3f} {wall[name] / base:>8.3f} {drain_s:>8.3f} {share:>7.1f}% {drains:>7} {lost:>5}")
    sys.stdout.flush()
    through_nbspawn(args)


CELL = """import torch, torch.distributed as dist
t = torch.ones({numel})
for _ in range({n}):
    dist.all_reduce(t)
"""


def through_nbspawn(args: argparse.Namespace) -> None:
    from nbspawn import launch

    cell = CELL.format(numel=args.numel, n=args.n)
    rows: dict[str, list[tuple[float, float]]] = {"--xray off": [], "--xray on": []}
    for _round in range(args.rounds):
        for name, results in rows.items():
            cpu = time.process_time()
            run = launch(cell, nprocs=args.world, backend="gloo", xray=name.split()[-1], start_method="fork")
            results.append((run.duration or 0.0, time.process_time() - cpu))
            assert (run.xray is not None) == name.endswith("on")
    print(f"\nthrough nbspawn (launch(), fork), median of {args.rounds} rounds")
    print(f"{'row':<22} {'run s':>8} {'vs off':>8} {'kernel cpu s':>13} {'cpu % of run':>13}")
    base = statistics.median(wall for wall, _cpu in rows["--xray off"])
    for name, results in rows.items():
        wall = statistics.median(w for w, _c in results)
        cpu = statistics.median(c for _w, c in results)
        print(f"{name:<22} {wall:>8.3f} {wall / base:>8.3f} {cpu:>13.3f} {100 * cpu / wall:>12.1f}%")


if __name__ == "__main__":
    main()
