"""What a ``%%spawn --cluster`` cell costs, beside a local cell and ipyparallel's ``%%px``, in one run.

Two nodes of one engine each, in Linux network namespaces when run as root (each node its own
address and hostname; the controller in a namespace of its own), else engines on this machine posing
as two nodes (``NBSPAWN_NODE``).  One real ipykernel, driven over the Jupyter protocol, runs every row
(execute_request sent -> execute_reply received), each warmed up once and timed ``--reps`` times:

  cell: pass                          the protocol round trip alone
  %%px pass (2 engines)               ipyparallel on the same engines: one round trip to each
  %%spawn -n 4 (local, fork)          four fresh local ranks
  %%spawn --cluster rc -n 2 (2 nodes)  four fresh ranks, two on each node
  %%spawn --world lw / cw             a cell on a kept world of 4 ranks: local, and 2 nodes x 2
  --nodes rc: probe / run             where a cluster cell's time goes, timed inside the kernel

Goals: a cluster cell costs at most the local cell plus one ``%%px`` round trip; a cluster world
cell at most a local world cell plus one ``%%px`` round trip.

    .venv/bin/python bench/cluster.py [--reps K] [--local]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from cluster_nodes import LocalNodes, NetnsNodes, netns_skip_reason  # noqa: E402
from kernel_harness import execute, start_kernel, stop_kernel  # noqa: E402

SETUP = """
%load_ext nbspawn
%config SpawnMagics.view = 'text'
import ipyparallel as ipp, time, json
rc = ipp.Client({url!r})
rc.wait_for_engines({engines}, timeout=60)
rc[:].activate()
"""

# where the time of a cluster cell goes: the nodes asked (one round trip to every engine), then the
# run (agents start their ranks, supervise them and answer)
BREAKDOWN = """
from nbspawn._source import CellSource
from nbspawn._request import RunRequest, Settings
from nbspawn.planning._cluster import plan_cluster
from nbspawn._effects import carry_out
from nbspawn.executors._supervisor import execute as _execute
from nbspawn.views._protocol import RunView
_t0 = time.perf_counter()
_request = RunRequest.of(CellSource("pass"), cluster="rc", settings=Settings(nprocs=2), namespace=globals())
_spec, _ex = carry_out(plan_cluster(_request, _request.work, _request.target, False))
_t1 = time.perf_counter()
_run = _execute(_spec, RunView(), _ex)
_t2 = time.perf_counter()
print(json.dumps({"probe": _t1 - _t0, "run": _t2 - _t1}))
"""


def timed(kernel, code: str, reps: int) -> list[float]:
    result = execute(kernel.client, code, timeout=120)  # warm-up
    assert result.status == "ok", (code, result.error and result.error.traceback_text, result.stderr)
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        result = execute(kernel.client, code, timeout=120)
        times.append(time.perf_counter() - started)
        assert result.status == "ok", (code, result.error and result.error.traceback_text)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--local", action="store_true", help="engines posing as nodes, even as root")
    args = parser.parse_args()
    reason = "asked for --local" if args.local else netns_skip_reason()
    nodes = LocalNodes(2, 1) if reason else NetnsNodes(2, 1)
    where = f"engines on this machine posing as 2 nodes ({reason})" if reason else "2 network namespaces"
    with nodes:
        kernel = start_kernel()
        try:
            result = execute(kernel.client, SETUP.format(url=nodes.url_file, engines=len(nodes.engine_pids)), timeout=180)
            assert result.status == "ok", (result.error and result.error.traceback_text, result.stderr)
            rows = {
                "cell: pass": timed(kernel, "pass", args.reps),
                "%%px pass (2 engines)": timed(kernel, "%%px\npass", args.reps),
                "%%spawn -n 4 (local, fork)": timed(kernel, "%%spawn -n 4\npass", args.reps),
                "%%spawn --cluster rc -n 2 (2 nodes)": timed(kernel, "%%spawn --cluster rc -n 2\npass", args.reps),
            }
            for start in (
                "%%spawn --world lw -n 4 --backend gloo\npass",
                "%%spawn --cluster rc --world cw -n 2 --backend gloo\npass",
            ):
                result = execute(kernel.client, start, timeout=180)
                assert result.status == "ok", (start, result.error and result.error.traceback_text, result.stderr)
            rows["%%spawn --world lw (local world, 4 ranks)"] = timed(kernel, "%%spawn --world lw\npass", args.reps)
            rows["%%spawn --world cw (cluster world, 2x2)"] = timed(kernel, "%%spawn --world cw\npass", args.reps)
            execute(kernel.client, "%spawn stop", timeout=60)
            parts: dict[str, list[float]] = {"probe": [], "run": []}
            import json

            for _ in range(args.reps):
                result = execute(kernel.client, BREAKDOWN, timeout=120)
                assert result.status == "ok", (result.error and result.error.traceback_text, result.stderr)
                for key, value in json.loads(result.stdout.strip().splitlines()[-1]).items():
                    parts[key].append(value)
        finally:
            stop_kernel(kernel)
    print(f"\n%%spawn --cluster, {where}; median (min) of {args.reps}, ms\n")
    print(f"{'cell':<40} {'median':>8} {'min':>8}")
    for name, times in rows.items():
        print(f"{name:<40} {statistics.median(times) * 1000:8.1f} {min(times) * 1000:8.1f}")
    for key, label in (("probe", "  of which: checks (engines asked once)"), ("run", "  of which: the run (agents, ranks)")):
        print(f"{label:<40} {statistics.median(parts[key]) * 1000:8.1f} {min(parts[key]) * 1000:8.1f}")
    median = {name: statistics.median(times) for name, times in rows.items()}
    local, px, cluster = (
        median["%%spawn -n 4 (local, fork)"],
        median["%%px pass (2 engines)"],
        median["%%spawn --cluster rc -n 2 (2 nodes)"],
    )
    goal = local + px
    print(
        f"\ngoal: cluster cell <= local cell + one %%px round trip = {goal * 1000:.1f} ms; "
        f"measured {cluster * 1000:.1f} ms ({cluster / goal:.2f}x the goal): {'met' if cluster <= goal else 'NOT met'}"
    )
    local_world, cluster_world = (
        median["%%spawn --world lw (local world, 4 ranks)"],
        median["%%spawn --world cw (cluster world, 2x2)"],
    )
    goal = local_world + px
    print(
        f"goal: cluster world cell <= local world cell + one %%px round trip = {goal * 1000:.1f} ms; "
        f"measured {cluster_world * 1000:.1f} ms ({cluster_world / goal:.2f}x the goal): {'met' if cluster_world <= goal else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
