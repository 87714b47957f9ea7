"""What sampling the ranks' CPU and memory costs (issue #44): the kernel does it, about once a second,
from ``/proc`` (``nbspawn.events._resources``).  This measures the kernel's side: one sample of N rank
processes (each with a child, as a DataLoader worker would be), holding M MB each, and its share of a
second.  A rank's only part is its GPU record (``nbspawn.ranks._devicememory``): a thread that looks
once a second; the last rows time one look, without CUDA initialized (what every CPU rank pays) and,
where a GPU is here, with it (the allocator's counters read and the record written when they changed).

    python bench/resources_cost.py                # 4 ranks of 200 MB, 200 samples
    python bench/resources_cost.py --ranks 8 --mb 500 --samples 500

Columns: ranks, MB each, processes on the machine, the median and 95th percentile of one sample, and
the share of one core at one sample a second (target: ≤ 1 %).  For comparison, the row
``smaps_rollup`` reads each rank's proportional set size instead (what ``psutil``'s
``memory_full_info`` and nbdistributed-like status commands read): its cost grows with the memory
mapped, which is why nbspawn reads ``statm``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time

from nbspawn.events._resources import memory_limit, read_processes, tree_totals

HOLDER = """
import os, sys, time
b = bytearray(b"x" * ({mb} * 1_000_000))
if os.fork() == 0:
    time.sleep(600)
print("ready", flush=True)
time.sleep(600)
"""


def sample(roots: dict[int, int]) -> None:
    tree_totals(read_processes(), roots)
    memory_limit()


def smaps(roots: dict[int, int]) -> None:
    for pid in roots.values():
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
            fh.read()


def timed(fn, roots: dict[int, int], samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        fn(roots)
        times.append(time.perf_counter() - began)
    return times


def rank_thread_rows(looks: int = 20_000) -> None:
    """One look of a rank's GPU-record thread, timed here (a rank's thread does this once a second)."""
    import tempfile

    import torch

    from nbspawn.ranks import _devicememory

    print(f"\n{'rank thread look':<28} {'median us':>10} {'rank core at 1/s':>17}")
    with tempfile.TemporaryDirectory() as rank_dir:
        _devicememory._state["dir"] = rank_dir
        cases = [("CUDA not initialized", None)]
        if torch.cuda.is_available():
            cases.append(("CUDA in use (1 tensor)", torch.ones(1 << 20, device="cuda")))
        for name, _held in cases:
            times = []
            for _ in range(looks):
                began = time.perf_counter()
                _devicememory.write_now()
                times.append(time.perf_counter() - began)
            median = statistics.median(times)
            print(f"{name:<28} {median * 1e6:>10.2f} {median * 100:>16.5f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER.format(mb=args.mb)], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        for _ in range(args.ranks)
    ]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        roots = {rank: holder.pid for rank, holder in enumerate(holders)}
        processes = len(read_processes())
        print(f"{'how':<14} {'ranks':>5} {'MB each':>8} {'processes':>9} {'median ms':>10} {'p95 ms':>8} {'core at 1/s':>12}")
        for name, fn in (("statm (nbspawn)", sample), ("smaps_rollup", smaps)):
            times = sorted(timed(fn, roots, args.samples))
            median, p95 = statistics.median(times), times[int(0.95 * (len(times) - 1))]
            print(
                f"{name:<14} {args.ranks:>5} {args.mb:>8} {processes:>9} {median * 1000:>10.2f} {p95 * 1000:>8.2f} {median * 100:>11.2f}%"
            )
        rank_thread_rows()
    finally:
        for holder in holders:  # each with its child: its own session, ended whole
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()


if __name__ == "__main__":
    main()
