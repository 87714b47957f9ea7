"""Cost of handing tensors between the kernel and its ranks (``--share``, ``--out``), beside a memcpy.

Every ``%%spawn`` number is the wall time of one cell through a real ipykernel over the Jupyter
protocol (execute_request -> execute_reply), with 4 ranks, as a notebook user pays it.  A hand-off's
cost is a difference between two cells run back to back in the same repetition:

  baseline (t private)   `%%spawn -n 4` whose body reads one element of a new 1-element tensor, right
                         after `t = torch.ones(n)` (untimed)
  --share t, first use   `%%spawn -n 4 --share t` reading t[0]: t moves into shared memory
  baseline (t shared)    the plain cell again, now that t is shared (fork copies fewer page tables)
  --share t, reuse       the --share cell again: t is already shared, nothing should be copied
                         (these two alternate --pairs times per repetition; medians are kept)
  rank makes r           each rank runs `r = torch.ones(n)`
  --out r                the same cell with `--out r`: the 4 tensors come back through /dev/shm

  first use = (--share first) - (baseline, t private)
  reuse     = median over the pairs of (--share reuse) - (baseline, t shared)
  --out     = (--out r) - (rank makes r)

The yardsticks are timed inside the kernel (no protocol round trip):

  memcpy        dst.copy_(src) into memory already touched: the unit of "vs memcpy".  The best of 7
                with the kernel's intra-op threads and 7 with one thread (on a loaded machine a
                parallel copy may wait a scheduler slice for its second thread; at >= 256 MiB both
                are as fast), so "vs memcpy" is against the fastest copy seen, the strict reading
  clone         src.clone(): a copy into fresh memory, page faults included (best of 4, same way)
  ipyparallel   DirectView.push({'t': t}) to 4 warm engines, and .pull('r') of a tensor each engine
                made; run last, on their own, since they need several copies of the tensor

The machine may be noisy: each repetition times every row back to back, each ratio is computed
within its repetition, and the table shows medians over --reps repetitions ("±" is the median
absolute deviation of the per-repetition differences: a hand-off smaller than that is not resolved).

    .venv/bin/python bench/handoff.py                    # 1, 64, 256, 1024 MiB; fork and forkserver
    .venv/bin/python bench/handoff.py --quick            # 1 and 64 MiB
    .venv/bin/python bench/handoff.py --sizes 256 --reps 9 --methods fork,forkserver,spawn
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch import CLUSTER_START, CellError, Kernel, with_kernel

MiB = 1 << 20
SIZES = (1, 64, 256, 1024)
QUICK_SIZES = (1, 64)
RANKS = 4
IPP_BIG = 256  # above this many MiB, ipyparallel rows get --ipp-big-reps repetitions
IPP_MEMORY_FACTOR = 16  # ipyparallel peaked at ~14 GiB above baseline for one 1 GiB push + pull

KERNEL_SETUP = """
import gc, statistics, time, torch

def _bench_fresh(n):
    global t
    t = None
    gc.collect()
    t = torch.ones(n)

def _bench_copies(n):
    # best of 7 with the kernel's intra-op threads and best of 7 with one: on a loaded machine a
    # parallel copy can wait a whole scheduler slice (~8 ms) for its second thread
    src, dst = torch.ones(n), torch.zeros(n)   # both touched
    threads = torch.get_num_threads()
    copies, clones = [], []
    try:
        for count in (threads, 1):
            torch.set_num_threads(count)
            for _ in range(7):
                s = time.perf_counter(); dst.copy_(src); copies.append(time.perf_counter() - s)
            for _ in range(2):
                s = time.perf_counter(); c = src.clone(); clones.append(time.perf_counter() - s); del c
    finally:
        torch.set_num_threads(threads)
    del src, dst
    gc.collect()
    return min(copies), min(clones)

def _bench_check_out(n):
    global r
    ok = len(r) == 4 and all(x.numel() == n and float(x[-1]) == 1.0 for x in r)
    del r
    gc.collect()
    return ok

def _bench_ipp_push(n):
    t = torch.ones(n)
    s = time.perf_counter(); _bench_view.push({'t': t}, block=True); e = time.perf_counter() - s
    _bench_view.execute('del t; import gc; gc.collect()', block=True)
    del t
    gc.collect()
    return e

def _bench_ipp_pull(n):
    _bench_view.execute(f'import torch; r = torch.ones({n})', block=True)
    s = time.perf_counter(); rs = _bench_view.pull('r', block=True); e = time.perf_counter() - s
    ok = len(rs) == 4 and all(x.numel() == n for x in rs)
    del rs
    _bench_view.execute('del r; import gc; gc.collect()', block=True)
    gc.collect()
    if not ok:
        raise RuntimeError('pull returned the wrong tensors')
    return e
"""

# the rows, in table order: (key, label, cell-timed?)
NBSPAWN_ROWS = [
    ("base_a", "baseline %%spawn -n 4 (t private)"),
    ("first", "--share t, first use"),
    ("base_b", "baseline %%spawn -n 4 (t shared)"),
    ("reuse", "--share t, reuse"),
    ("make_r", "ranks make r (no --out)"),
    ("out", "--out r"),
]
# hand-off = row - reference, per repetition
DIFFS = {"first": "base_a", "reuse": "base_b", "out": "make_r"}


class BenchKernel(Kernel):
    """bench/launch.py's kernel, plus in-kernel values read back through user_expressions."""

    def execute(self, code: str, values: dict[str, str] | None = None, timeout: float | None = None):
        """Run a cell; return (seconds from execute_request to execute_reply, {name: value})."""
        deadline = time.monotonic() + (timeout or self.timeout)
        started = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=False, allow_stdin=False, user_expressions=values or {})
        self.busy = True
        reply = self._wait(self.kc.get_shell_msg, msg_id, deadline)
        elapsed = time.perf_counter() - started
        output = []
        while True:
            msg = self._wait(self.kc.get_iopub_msg, msg_id, deadline)
            if msg["msg_type"] == "stream":
                output.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                output.append("\n".join(msg["content"]["traceback"]))
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        self.busy = False
        content = reply["content"]
        if content["status"] != "ok":
            raise CellError(f"{content.get('ename')}: {content.get('evalue')}\n{''.join(output)[-3000:]}".strip())
        results = {}
        for name, value in content.get("user_expressions", {}).items():
            if value["status"] != "ok":
                raise CellError(f"{name}: {value.get('ename')}: {value.get('evalue')}")
            results[name] = ast.literal_eval(value["data"]["text/plain"])
        return elapsed, results

    def value(self, code: str, expr: str, timeout: float | None = None):
        return self.execute(code, {"v": expr}, timeout)[1]["v"]


@dataclass
class Results:
    # reps[(size, method)] is a list of {key: seconds}, one dict per repetition; method "-" for the
    # kernel's copies, "ipp" for ipyparallel
    reps: dict[tuple[int, str], list[dict[str, float]]] = field(default_factory=lambda: defaultdict(list))
    skipped: dict[tuple[int, str], str] = field(default_factory=dict)


def nbspawn_cells(method: str, n: int, view: str) -> dict[str, str]:
    head = f"%%spawn -n {RANKS} --start-method {method} --view {view}"
    make = f"import torch\nr = torch.ones({n})"
    # the same kind of work as `x = float(t[0])`: a spawned rank's first tensor op costs a few ms
    base = "import torch\nx = float(torch.zeros(1)[0])"
    return {
        "base_a": f"{head}\n{base}",
        "first": f"{head} --share t\nx = float(t[0])",
        "base_b": f"{head}\n{base}",
        "reuse": f"{head} --share t\nx = float(t[0])",
        "make_r": f"{head}\n{make}",
        "out": f"{head} --out r\n{make}",
    }


def run_nbspawn(kernel: BenchKernel, res: Results, sizes, methods, reps: int, pairs: int, view: str) -> None:
    kernel.execute("%load_ext nbspawn")
    print("warming up (fork server, first imports)", file=sys.stderr)
    for method in methods:
        kernel.execute(f"_bench_fresh({256 * 1024})")
        for code in nbspawn_cells(method, 1024, view).values():
            kernel.execute(code)
        kernel.value("", f"_bench_check_out({1024})")
    for size in sizes:
        n = size * MiB // 4
        for rep in range(reps):
            copy, clone = kernel.value("", f"_bench_copies({n})")
            res.reps[(size, "-")].append({"memcpy": copy, "clone": clone})
            order = methods[rep % len(methods) :] + methods[: rep % len(methods)]
            for method in order:
                cells = nbspawn_cells(method, n, view)
                times: dict[str, float] = {}
                kernel.execute(f"_bench_fresh({n})")
                kernel.execute(cells["base_a"])  # untimed: the first %%spawn after other cells is slower
                for key in ("base_a", "first"):
                    times[key] = kernel.execute(cells[key])[0]
                # reuse is cheap: alternate `pairs` baseline/reuse pairs and keep the medians, which
                # resolves a much smaller difference than one pair does
                shared_base, reuse, paired = [], [], []
                for i in range(pairs):
                    first_key = "base_b" if i % 2 == 0 else "reuse"
                    a = kernel.execute(cells[first_key])[0]
                    b = kernel.execute(cells["reuse" if first_key == "base_b" else "base_b"])[0]
                    base, used = (a, b) if first_key == "base_b" else (b, a)
                    shared_base.append(base)
                    reuse.append(used)
                    paired.append(used - base)
                times["base_b"] = statistics.median(shared_base)
                times["reuse"] = statistics.median(reuse)
                times["d_reuse"] = statistics.median(paired)
                if not kernel.value("", "bool(t.is_shared())"):
                    raise RuntimeError(f"--share t did not leave t shared ({method}, {size} MiB)")
                pair = ("make_r", "out") if rep % 2 == 0 else ("out", "make_r")
                for key in pair:
                    times[key] = kernel.execute(cells[key])[0]
                    if key == "out" and not kernel.value("", f"_bench_check_out({n})"):
                        raise RuntimeError(f"--out r brought back the wrong tensors ({method}, {size} MiB)")
                res.reps[(size, method)].append(times)
                kernel.execute("t = None; gc.collect()")
            line = "  ".join(
                f"{m}: first {ms(res.reps[(size, m)][-1], 'first'):+.1f} reuse {ms(res.reps[(size, m)][-1], 'reuse'):+.1f} "
                f"out {ms(res.reps[(size, m)][-1], 'out'):+.1f}"
                for m in methods
            )
            print(f"  {size:>5} MiB rep {rep + 1}/{reps}: memcpy {copy * 1e3:.1f} ms  {line}", file=sys.stderr)


def ms(times: dict[str, float], key: str) -> float:
    return diff(times, key) * 1e3


def diff(times: dict[str, float], key: str) -> float:
    """One repetition's hand-off: the row minus its reference (or the median of paired differences)."""
    return times.get("d_" + key, times[key] - times[DIFFS[key]])


def run_ipyparallel(kernel: BenchKernel, res: Results, sizes, reps: int, big_reps: int, max_mib: int) -> None:
    print(f"starting an ipyparallel cluster of {RANKS} engines", file=sys.stderr)
    try:
        kernel.execute(CLUSTER_START.format(n=RANKS), timeout=max(kernel.timeout, 300))
    except (CellError, TimeoutError) as e:
        for size in sizes:
            res.skipped[(size, "ipp")] = f"cluster did not start: {str(e).splitlines()[0]}"
        return
    kernel.execute(f"_bench_ipp_push({1 << 18}); _bench_ipp_pull({1 << 18})")  # warm-up
    for size in sizes:
        n = size * MiB // 4
        if size > max_mib:
            res.skipped[(size, "ipp")] = f"skipped (--ipp-max-mib {max_mib})"
            continue
        count = reps if size <= IPP_BIG else big_reps
        if count <= 0:
            res.skipped[(size, "ipp")] = "skipped (--ipp-big-reps 0)"
            continue
        for rep in range(count):
            need = IPP_MEMORY_FACTOR * size * MiB
            available = psutil.virtual_memory().available
            if available < need:
                res.skipped[(size, "ipp")] = f"skipped: {available / 2**30:.1f} GiB available, ~{need / 2**30:.0f} GiB needed"
                break
            copy, _clone = kernel.value("", f"_bench_copies({n})")
            try:
                push = kernel.value("", f"_bench_ipp_push({n})")
                pull = kernel.value("", f"_bench_ipp_pull({n})")
            except CellError as e:
                res.skipped[(size, "ipp")] = f"failed: {str(e).splitlines()[0]}"
                break
            res.reps[(size, "ipp")].append({"memcpy": copy, "push": push, "pull": pull})
            print(
                f"  {size:>5} MiB ipyparallel rep {rep + 1}/{count}: memcpy {copy * 1e3:.1f} ms  "
                f"push {push * 1e3:.0f} ms  pull {pull * 1e3:.0f} ms",
                file=sys.stderr,
            )


# -- the table -------------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values)


def mad(values: list[float]) -> float:
    m = med(values)
    return med([abs(v - m) for v in values])


def unresolved(diffs: list[float]) -> bool:
    """The median difference is within twice its median absolute deviation: not told apart from 0."""
    return abs(med(diffs)) <= 2 * mad(diffs)


def fmt_ratio(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:.0f}x"
    if abs(x) >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x"


def size_label(size: int) -> str:
    return f"{size // 1024} GiB" if size >= 1024 and size % 1024 == 0 else f"{size} MiB"


def table_rows(res: Results, sizes, methods) -> list[list[str]]:
    rows: list[list[str]] = []
    for size in sizes:
        kernel_reps = res.reps.get((size, "-"), [])
        if kernel_reps:
            copy = [r["memcpy"] for r in kernel_reps]
            clone = [r["clone"] for r in kernel_reps]
            rows.append([size_label(size), "kernel", "memcpy dst.copy_(src)", "", f"{med(copy) * 1e3:.2f}", "", "1.00x"])
            rows.append(
                [
                    size_label(size),
                    "kernel",
                    "clone() (fresh memory)",
                    "",
                    f"{med(clone) * 1e3:.2f}",
                    "",
                    fmt_ratio(med([c / m for c, m in zip(clone, copy, strict=True)])),
                ]
            )
        for method in methods:
            reps = res.reps.get((size, method), [])
            if not reps:
                continue
            copies = [r["memcpy"] for r in kernel_reps][: len(reps)]
            for key, label in NBSPAWN_ROWS:
                cell = med([r[key] for r in reps]) * 1e3
                if key in DIFFS:
                    diffs = [diff(r, key) for r in reps]
                    ratios = [d / c for d, c in zip(diffs, copies, strict=True)]
                    rows.append(
                        [
                            size_label(size),
                            method,
                            label,
                            f"{cell:.1f}",
                            f"{med(diffs) * 1e3:+.1f}",
                            f"±{mad(diffs) * 1e3:.1f}",
                            fmt_ratio(med(ratios)) + ("*" if unresolved(diffs) else ""),
                        ]
                    )
                else:
                    rows.append([size_label(size), method, label, f"{cell:.1f}", "", "", ""])
    for size in sizes:
        reps = res.reps.get((size, "ipp"), [])
        if reps:
            note = "" if len(reps) > 1 else " (1 rep)"
            copy = [r["memcpy"] for r in reps]
            for key, label in (("push", f"push({{'t': t}}) to {RANKS}{note}"), ("pull", f"pull('r') from {RANKS}{note}")):
                values = [r[key] for r in reps]
                rows.append(
                    [
                        size_label(size),
                        "ipyparallel",
                        label,
                        "",
                        f"{med(values) * 1e3:.1f}",
                        "",
                        fmt_ratio(med([v / c for v, c in zip(values, copy, strict=True)])),
                    ]
                )
        elif (size, "ipp") in res.skipped:
            rows.append([size_label(size), "ipyparallel", "push / pull: " + res.skipped[(size, "ipp")], "", "", "", ""])
    return rows


HEADER = ["size", "method", "row", "cell ms", "hand-off ms", "±", "vs memcpy"]


def render(rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * 4) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|").replace("*", "\\*") for c in row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(HEADER[i]), *(len(r[i]) for r in rows)) if rows else len(HEADER[i]) for i in range(len(HEADER))]
    left = {0, 1, 2}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(HEADER), "-" * len(line(HEADER))]
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            out.append("")
        previous = row[0]
        out.append(line(row))
    return "\n".join(out)


def goals(res: Results, sizes, methods) -> str:
    lines = [
        "goals: first use of --share <= 1 memcpy;",
        "       reuse and --out hand-off flat in size and <= 5% of one memcpy at 256 MiB.",
        "measured: median hand-off, its ratio to the memcpy of the same repetition, ± MAD (* = within noise):",
    ]
    limits = {"first": 1.0, "reuse": 0.05, "out": 0.05}
    for method in methods:
        for key, name in (("first", "first use"), ("reuse", "reuse"), ("out", "--out")):
            parts = []
            verdict = ""
            for size in sizes:
                reps = res.reps.get((size, method), [])
                copies = [r["memcpy"] for r in res.reps.get((size, "-"), [])]
                if not reps:
                    continue
                diffs = [diff(r, key) for r in reps]
                ratio = med([d / c for d, c in zip(diffs, copies, strict=True)])
                star = "*" if unresolved(diffs) else ""
                parts.append(f"{size_label(size)} {med(diffs) * 1e3:+.1f} ms {fmt_ratio(ratio)}{star} ±{mad(diffs) * 1e3:.1f}")
                if size == 256:
                    limit = limits[key]
                    noise = 2 * mad(diffs) / med(copies)
                    if ratio <= limit:
                        verdict = "met at 256 MiB"
                    elif unresolved(diffs):
                        verdict = f"not met by the median at 256 MiB ({fmt_ratio(ratio)}, limit {fmt_ratio(limit)})"
                    else:
                        verdict = f"NOT met at 256 MiB ({fmt_ratio(ratio)}, limit {fmt_ratio(limit)})"
                    if noise > limit and (ratio <= limit or unresolved(diffs)):
                        verdict += f"; noise (2 x MAD) is {noise:.0%} of a memcpy, so this is not resolved"
            if parts:
                lines.append(f"  {method:<10} {name:<9} " + ", ".join(parts))
                if verdict:
                    lines.append(f"  {'':<10} {'':<9} -> {verdict}")
    return "\n".join(lines)


def machine() -> str:
    import ipyparallel
    import torch

    try:
        thp = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        thp = "?"
    mem = psutil.virtual_memory().total / 2**30
    return (
        f"python {platform.python_version()}, torch {torch.__version__}, ipyparallel {ipyparallel.__version__}, "
        f"{len(os.sched_getaffinity(0))} cores, {mem:.0f} GiB, shmem THP {thp}, {RANKS} ranks"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per row (default 5)")
    parser.add_argument("--pairs", type=int, default=5, help="baseline/reuse cell pairs per repetition, medians kept (default 5)")
    parser.add_argument("--sizes", default=None, help="comma-separated MiB (default 1,64,256,1024)")
    parser.add_argument("--quick", action="store_true", help="1 and 64 MiB only")
    parser.add_argument("--methods", default="fork,forkserver", help="start methods (default fork,forkserver)")
    parser.add_argument("--view", default="text", help="%%spawn --view for the timed cells (default text)")
    parser.add_argument("--no-ipyparallel", action="store_true", help="skip the ipyparallel rows")
    parser.add_argument("--ipp-max-mib", type=int, default=1024, help="largest size for ipyparallel (default 1024)")
    parser.add_argument(
        "--ipp-big-reps", type=int, default=1, help=f"ipyparallel repetitions above {IPP_BIG} MiB (default 1: ~1 min each)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every repetition's seconds here")
    parser.add_argument("--from-json", default=None, metavar="PATH", help="print the table of a --json file; measure nothing")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one cell may take (default 600)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(QUICK_SIZES if args.quick else SIZES)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.from_json:
        with open(args.from_json) as fh:
            saved = json.load(fh)
        res = Results()
        for key, reps in saved["reps"].items():
            size, method = key.split(":")
            res.reps[(int(size), method)] = reps
        for key, why in saved["skipped"].items():
            size, method = key.split(":")
            res.skipped[(int(size), method)] = why
        report(res, saved["sizes"], saved["methods"], saved["header"], args.markdown)
        return 0

    print(f"{machine()}; reps {args.reps}; starting a kernel ({sys.executable})", file=sys.stderr)
    res = Results()
    started = time.monotonic()

    def work(kernel: BenchKernel) -> None:
        kernel.execute(KERNEL_SETUP)
        run_nbspawn(kernel, res, sizes, methods, args.reps, args.pairs, args.view)
        if not args.no_ipyparallel:
            run_ipyparallel(kernel, res, sizes, args.reps, args.ipp_big_reps, args.ipp_max_mib)

    kernel, status = with_kernel(lambda: BenchKernel(args.timeout), work)
    if kernel is not None:
        left = glob.glob(f"/dev/shm/nbspawn.{kernel.pid}.*")
        if left:
            print(f"warning: {len(left)} file(s) left in /dev/shm by the kernel: {left[:3]}", file=sys.stderr)
            status = status or 1
    header = f"hand-off cost, {machine()}; median of {args.reps} reps; {time.monotonic() - started:.0f} s in all"
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "header": header,
                    "sizes": sizes,
                    "methods": methods,
                    "reps": {f"{size}:{method}": reps for (size, method), reps in res.reps.items()},
                    "skipped": {f"{size}:{method}": why for (size, method), why in res.skipped.items()},
                },
                fh,
                indent=1,
            )
    print()
    report(res, sizes, methods, header, args.markdown)
    return status


def report(res: Results, sizes, methods, header: str, markdown: bool) -> None:
    print(header)
    print("cell ms: execute_request -> execute_reply; hand-off ms: minus the cell before it (see bench/handoff.py)")
    print(render(table_rows(res, sizes, methods), markdown))
    print("* within noise: |median hand-off| <= 2 x MAD. At 1 MiB a memcpy takes ~0.02 ms, so ratios there say little.")
    print()
    print(goals(res, sizes, methods))


if __name__ == "__main__":
    sys.exit(main())
