"""Sixteen nodes against two, in one run (issue #45): what grows with the nodes, and where the time goes.

Each node is a Linux network namespace with its own address and hostname and one ipyparallel engine
(tests/cluster/cluster_nodes.py's ``NetnsNodes``: root only). One real ipykernel, driven over the
Jupyter protocol, runs each row on 2 nodes, then on 16 (the clusters one after the other: this
machine has 2 cores, and both would share them); every row is warmed up once and timed ``--reps``
times (execute_request sent -> execute_reply received):

  cell                 ``%%spawn --cluster rc -n 1``: one fresh rank per node, ``pass``
  world cell           a cell on a kept world of one rank per node (gloo), ``pass``
  16 ranks' output     16 ranks printing 200 lines each: 2 nodes x 8 ranks, 16 nodes x 1
  failure named        a rank on the last node but two (node 13 of 16; node 1 of 2) raises once every rank
                       has started; from its raise (its own clock) to the cell's error in the kernel
  hang verdict         a rank on that node never enters a barrier (``--timeout 8``): does the verdict
                       name the node and the line

Targets: a world cell on 16 nodes <= 2x one on 2 nodes; a failure anywhere named within 2 s; a hang
verdict that names the node and line.  Also printed: the probe's share of a cell (every engine asked
once) and the run's, as bench/cluster.py splits them.

    sudo .venv/bin/python bench/cluster_scale.py [--reps K] [--nodes 16]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "cluster"))

from cluster_nodes import NetnsNodes, netns_skip_reason  # noqa: E402
from kernel_harness import execute, start_kernel, stop_kernel, strip_ansi  # noqa: E402

SETUP = """
%load_ext nbspawn
%config SpawnMagics.view = 'text'
import ipyparallel as ipp, time, json
rc = ipp.Client({url!r})
rc.wait_for_engines({engines}, timeout=120)
"""

BREAKDOWN = """
from nbspawn._source import CellSource
from nbspawn._request import RunRequest, Settings
from nbspawn.planning._cluster import plan_cluster
from nbspawn._effects import carry_out
from nbspawn.executors._supervisor import execute as _execute
from nbspawn.views._protocol import RunView
_t0 = time.perf_counter()
_request = RunRequest.of(CellSource("pass"), cluster="rc", settings=Settings(nprocs=1), namespace=globals())
_spec, _ex = carry_out(plan_cluster(_request, _request.work, _request.target, False))
_t1 = time.perf_counter()
_run = _execute(_spec, RunView(), _ex)
_t2 = time.perf_counter()
print(json.dumps({"probe": _t1 - _t0, "run": _t2 - _t1}))
"""

FAILURE = """%%spawn --cluster rc -n {per_node} --backend gloo
import os, time, torch.distributed as dist
dist.barrier()  # every rank has started
if dist.get_rank() == {rank}:
    print("raised at", repr(time.time()), flush=True)
    raise ValueError("bad shard")
time.sleep(60)
"""

HANG = """%%spawn --cluster rc -n 1 --backend gloo --timeout 8
import time, torch.distributed as dist
dist.barrier()
if dist.get_rank() == {rank}:
    time.sleep(60)
dist.barrier()
"""


KERNEL_CPU: dict[str, float] = {}  # row -> the kernel process's CPU seconds per cell (its serial share)


def timed(kernel, code: str, reps: int, row: str = "") -> list[float]:
    result = execute(kernel.client, code, timeout=300)  # warm-up
    assert result.status == "ok", (code, result.error and result.error.traceback_text, result.stderr)
    times = []
    process = psutil.Process(kernel.pid)
    cpu = sum(process.cpu_times()[:2])
    for _ in range(reps):
        started = time.perf_counter()
        result = execute(kernel.client, code, timeout=300)
        times.append(time.perf_counter() - started)
        assert result.status == "ok", (code, result.error and result.error.traceback_text)
    KERNEL_CPU[row] = (sum(process.cpu_times()[:2]) - cpu) / reps
    return times


def measure(n: int, reps: int) -> dict[str, object]:
    """Every row on ``n`` nodes."""
    out: dict[str, object] = {}
    started = time.perf_counter()
    with NetnsNodes(n, 1, timeout=300) as nodes:
        out["start"] = time.perf_counter() - started
        kernel = start_kernel()
        try:
            result = execute(kernel.client, SETUP.format(url=nodes.url_file, engines=n), timeout=300)
            assert result.status == "ok", (result.error and result.error.traceback_text, result.stderr)
            out["cell"] = timed(kernel, "%%spawn --cluster rc -n 1\npass", reps, "cell")
            result = execute(kernel.client, "%%spawn --cluster rc -n 1 --world w --backend gloo\npass", timeout=300)
            assert result.status == "ok", (result.error and result.error.traceback_text, result.stderr)
            out["world cell"] = timed(kernel, "%%spawn --world w\npass", reps, "world cell")
            execute(kernel.client, "%spawn stop w", timeout=120)
            per_node = 16 // n
            flood = f"%%spawn --cluster rc -n {per_node}\nfor i in range(200):\n    print('line', i)"
            out["16 ranks' output"] = timed(kernel, flood, reps, "16 ranks' output")
            parts: dict[str, list[float]] = {"probe": [], "run": []}
            for _ in range(reps):
                result = execute(kernel.client, BREAKDOWN, timeout=300)
                assert result.status == "ok", (result.error and result.error.traceback_text, result.stderr)
                for key, value in json.loads(result.stdout.strip().splitlines()[-1]).items():
                    parts[key].append(value)
            out["probe"], out["run"] = parts["probe"], parts["run"]
            node = n - 3 if n > 3 else n - 1
            named: list[float] = []
            for _ in range(reps):
                result = execute(kernel.client, FAILURE.format(per_node=1, rank=node), timeout=300)
                ended = time.time()
                said = strip_ansi(result.stdout + (result.error.traceback_text if result.error else ""))
                raised = re.search(r"raised at ([0-9.]+)", said)
                assert raised and f"rank {node} on node {node} (" in said and "bad shard" in said, said[-3000:]
                named.append(ended - float(raised.group(1)))
            out["failure named"] = named
            out["kernel cpu"] = dict(KERNEL_CPU)
            result = execute(kernel.client, HANG.format(rank=node), timeout=300)
            said = strip_ansi(result.stdout + result.stderr + (result.error.traceback_text if result.error else ""))
            verdict = next((line for line in said.splitlines() if "Hang" in line or "never entered" in line), "")
            out["hang verdict"] = verdict.strip()
            out["verdict names node and line"] = f"rank {node} on node {node} (" in verdict and bool(
                re.search(r"Cell In\[\d+\], line \d+", verdict)
            )
        finally:
            stop_kernel(kernel)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=16)
    args = parser.parse_args()
    reason = netns_skip_reason()
    if reason:
        print(f"cluster_scale: needs network namespaces ({reason})", file=sys.stderr)
        return 2
    small, large = measure(2, args.reps), measure(args.nodes, args.reps)
    print(f"\n%%spawn --cluster on 2 and {args.nodes} network-namespace nodes; median (min) of {args.reps}, ms\n")
    print(f"{'row':<34} {'2 nodes':>16} {f'{args.nodes} nodes':>16} {'ratio':>7}")
    for row in ("cell", "world cell", "16 ranks' output", "probe", "run", "failure named"):
        a, b = small[row], large[row]
        assert isinstance(a, list) and isinstance(b, list)
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{row:<34} {ma * 1000:7.0f} ({min(a) * 1000:6.0f}) {mb * 1000:7.0f} ({min(b) * 1000:6.0f}) {mb / ma:7.2f}")
    print(f"{'cluster started (engines up)':<34} {small['start']:15.1f}s {large['start']:15.1f}s")
    for row in ("cell", "world cell", "16 ranks' output"):
        a, b = small["kernel cpu"][row], large["kernel cpu"][row]  # type: ignore[index]
        print(f"{'  kernel CPU per ' + row:<34} {a * 1000:15.0f}  {b * 1000:15.0f}  {b / a:7.2f}")
    world = statistics.median(large["world cell"]) / statistics.median(small["world cell"])  # type: ignore[arg-type]
    failure = max(large["failure named"] + small["failure named"])  # type: ignore[operator]
    print(f"\ntarget: world cell on {args.nodes} nodes <= 2x on 2: {world:.2f}x, {'met' if world <= 2 else 'NOT met'}")
    print(f"target: a failure named within 2 s: slowest {failure:.2f} s, {'met' if failure <= 2 else 'NOT met'}")
    for n, got in ((2, small), (args.nodes, large)):
        print(f"hang verdict on {n} nodes: {got['hang verdict']!r}; names node and line: {got['verdict names node and line']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
