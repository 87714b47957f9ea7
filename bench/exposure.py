"""What keeping a run to itself costs per cell, measured inside a real ipykernel (its real descriptors).

  kernel_descriptors      the kernel lists what a forked rank must let go of, once per fork cell
  let_go (in a child)     a forked child replaces each with /dev/null, first thing (each rank, in parallel)
  reserve + host_store    a loopback port reserved, the run's TCPStore hosted on it and dropped, once per run

    .venv/bin/python bench/exposure.py [--reps K]

``bench/launch.py`` gives the whole cell's cost beside its peers (the `%%spawn fork` row).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

CODE = """
import os, statistics, time
from nbspawn import _listen
from nbspawn.ranks import _fds

def median_us(f, n):
    times = []
    for _ in range(n):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6, min(times) * 1e6

def store():
    port = _listen.reserve(_listen.LOOPBACK)
    s = _listen.host_store(_listen.LOOPBACK, port)
    del s

listed = _fds.kernel_descriptors()
r, w = os.pipe()
for _ in range({reps}):
    pid = os.fork()
    if pid == 0:
        t = time.perf_counter(); _fds.let_go(tuple(d for d in listed if d[0] != w)); t = time.perf_counter() - t
        os.write(w, f"{{t * 1e6:.1f}}\\n".encode()); os._exit(0)
    os.waitpid(pid, 0)
os.close(w)
child = sorted(float(v) for v in os.read(r, 1 << 20).split())
os.close(r)
rows = [
    ("kernel_descriptors", *median_us(_fds.kernel_descriptors, {reps})),
    ("let_go (in a child)", child[len(child) // 2], child[0]),
    ("reserve + host_store", *median_us(store, {reps})),
]
print(f"kernel: {{len(os.listdir('/proc/self/fd'))}} descriptors open, {{len(listed)}} let go of by a forked rank")
print(f"{{'step':<24}}{{'median us':>12}}{{'min us':>10}}")
for name, med, low in rows:
    print(f"{{name:<24}}{{med:>12.1f}}{{low:>10.1f}}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    from kernel_harness import loaded_kernel, ok, stop_kernel

    kernel = loaded_kernel(cwd=str(REPO))
    try:
        print(ok(kernel, CODE.format(reps=args.reps)).stdout, end="")
    finally:
        stop_kernel(kernel)


if __name__ == "__main__":
    main()
