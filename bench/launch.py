"""Per-cell launch cost of %%spawn, beside its peers, measured the way a notebook user pays it.

Every number is the wall time of one cell through a real ipykernel over the Jupyter protocol: from
sending execute_request to receiving execute_reply. The cell body does nothing (`pass`, a no-op
function), so what is measured is the launcher, not the work. All rows run in the same kernel, which
has torch imported, so forks copy a realistic process:

  cell: pass                      the protocol round trip alone
  os.fork + waitpid               N bare forks that _exit(0): the floor for a fork-based launcher
  torch start_processes(fork)     torch.multiprocessing.start_processes of a no-op, what nbspawn wraps
  ipyparallel %%px                a `%%px pass` cell on N already-running (warm) engines
  pipe ping (N idle children)     one message to each of N idle forked children and one back: the floor
                                  for any kept world of N processes (each must wake, and answer)
  %%spawn <method>                nbspawn, if `%load_ext nbspawn` works in the kernel (else skipped)
  %%spawn --world (view)          a cell on a kept world of N ranks (started by the warm-up cell),
                                  with the live widget or with text lines

Each row is warmed up once, then timed --reps times; the table shows the median and the minimum.

    .venv/bin/python bench/launch.py [--quick] [--full] [--reps K]
    .venv/bin/python bench/launch.py --n 4 --rows pass,ping,bare,torch,px,fork,world   # the goal's rows only

After the table, the ratios the launch goals are stated in (world text or widget / %%px, fresh fork /
torch start_processes(fork), fresh fork / bare forks), for every N that has both rows.
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

REPO = Path(__file__).resolve().parents[1]
BARE, TORCH, PX, PASS = "os.fork + waitpid", "torch start_processes(fork)", "ipyparallel %%px", "cell: pass"
PING = "pipe ping (idle children)"

KERNEL_SETUP = """
import os, torch, torch.multiprocessing as _bench_tmp

def _bench_noop(rank):
    pass

def _bench_bare_fork(n):
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)

_bench_pingers = {}

def _bench_ping(n):  # one message to each of n idle forked children, one back from each (made once)
    from multiprocessing.connection import wait
    if n not in _bench_pingers:
        pipes = []
        for _ in range(n):
            parent, child = os.pipe(), os.pipe()  # kernel -> child, child -> kernel
            pid = os.fork()
            if pid == 0:
                while os.read(parent[0], 1) == b"j":
                    os.write(child[1], b"o")
                os._exit(0)
            pipes.append((parent[1], child[0], pid))
        _bench_pingers[n] = pipes
    pipes = _bench_pingers[n]
    for out, _, _ in pipes:
        os.write(out, b"j")
    left = {inp for _, inp, _ in pipes}
    while left:
        for fd in wait(list(left)):
            os.read(fd, 1)
            left.discard(fd)
"""

CLUSTER_START = """
import ipyparallel as _bench_ipp
_bench_rc = None
_bench_cluster = _bench_ipp.Cluster(n={n}, log_level=40)
_bench_rc = _bench_cluster.start_and_connect_sync()
_bench_rc.wait_for_engines({n}, timeout=300)
_bench_view = _bench_rc[:]
_bench_view.block = True
_bench_view.activate()  # registers %px / %%px for this view
"""

CLUSTER_STOP = """
for _bench_pipes in globals().get("_bench_pingers", {}).values():  # the ping rows' children leave
    for _bench_out, _bench_in, _bench_pid in _bench_pipes:
        os.write(_bench_out, b"q")
        os.waitpid(_bench_pid, 0)
        os.close(_bench_out)
        os.close(_bench_in)
globals().get("_bench_pingers", {}).clear()
if globals().get("_bench_cluster") is not None:
    if _bench_rc is not None:
        _bench_rc.close()
    _bench_cluster.stop_cluster_sync()
    _bench_cluster = _bench_rc = None
"""


class CellError(RuntimeError):
    pass


class Kernel:
    """A real ipykernel running this interpreter (not whatever `python3` kernelspec is installed)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._spec_dir = tempfile.TemporaryDirectory(prefix="nbspawn-bench-kernelspec-")
        write_kernel_spec(os.path.join(self._spec_dir.name, "python3"))
        specs = KernelSpecManager(kernel_dirs=[self._spec_dir.name], ensure_native_kernel=False)
        self.km = KernelManager(kernel_name="python3", kernel_spec_manager=specs)
        self.km.start_kernel(cwd=str(REPO))
        self.pid = self.km.provisioner.process.pid
        self.busy = False  # a cell is running: close() must interrupt it first
        self.kc = self.km.client()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except RuntimeError:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
            raise

    def run(self, code: str, timeout: float | None = None) -> float:
        """Execute a cell; return seconds from execute_request sent to execute_reply received."""
        deadline = time.monotonic() + (timeout or self.timeout)
        started = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
        self.busy = True
        reply = self._wait(self.kc.get_shell_msg, msg_id, deadline)
        elapsed = time.perf_counter() - started
        stderr = []
        while True:  # drain this cell's output, so the next cell starts from an idle kernel
            msg = self._wait(self.kc.get_iopub_msg, msg_id, deadline)
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
                stderr.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        self.busy = False
        content = reply["content"]
        if content["status"] != "ok":
            raise CellError(f"{content.get('ename')}: {content.get('evalue')}\n{''.join(stderr)[-2000:]}".strip())
        return elapsed

    def _wait(self, get, msg_id: str, deadline: float) -> dict:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the kernel did not finish a cell within {self.timeout} s")
            try:
                msg = get(timeout=left)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def close(self) -> None:
        """Stop the ipyparallel cluster and the kernel, then kill anything of theirs still alive."""
        try:
            if self.busy:  # Ctrl-C or a timeout left a cell running
                self.km.interrupt_kernel()
                time.sleep(1)
            self.run(CLUSTER_STOP, timeout=60)
        except Exception as e:
            print(f"cleanup: could not stop the ipyparallel cluster from the kernel: {e}", file=sys.stderr)
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        self.kc.stop_channels()
        try:
            self.km.shutdown_kernel(now=False)
        except Exception:
            self.km.shutdown_kernel(now=True)
        _gone, alive = psutil.wait_procs(children, timeout=5)
        for proc in alive:
            print(f"cleanup: killing leftover pid {proc.pid} ({proc.name()})", file=sys.stderr)
            proc.kill()
        psutil.wait_procs(alive, timeout=5)
        self._spec_dir.cleanup()


TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU used so far by the kernel itself (every thread of it: ipykernel's I/O threads too) and by
    everything under it: live descendants (kept-world ranks, ipyparallel engines, ping children) and
    the children it has reaped (fresh ranks, bare forks), which /proc counts in its cutime/cstime."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    under = (int(fields[13]) + int(fields[14])) / TICKS  # cutime + cstime
    for child in psutil.Process(pid).children(recursive=True):
        try:
            times = child.cpu_times()  # its reaped children's, in clock ticks
            under += times.children_user + times.children_system + _threads_cpu(child.pid) / 1e9
        except (psutil.Error, OSError):
            continue  # ended meanwhile: counted once reaped
    return _threads_cpu(pid) / 1e9, under


def _threads_cpu(pid: int) -> int:
    """Nanoseconds on the CPU of every thread of ``pid`` (schedstat: exact, where ticks are 10 ms)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


@dataclass
class Row:
    method: str
    n: int | None
    times: list[float]
    kernel_cpu: float = 0.0  # CPU seconds per cell: the kernel process, all its threads
    others_cpu: float = 0.0  # ... and every process under it (ranks, engines, forks)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1e3

    @property
    def min_ms(self) -> float:
        return min(self.times) * 1e3


class Bench:
    def __init__(self, kernel: Kernel, reps: int):
        self.kernel, self.reps, self.rows = kernel, reps, []

    def measure(self, method: str, n: int | None, code: str) -> None:
        self.kernel.run(code)  # warm-up: imports, first fork server, caches
        own, under = cpu_seconds(self.kernel.pid)
        times = [self.kernel.run(code) for _ in range(self.reps)]
        own_after, under_after = cpu_seconds(self.kernel.pid)
        row = Row(method, n, times, (own_after - own) / self.reps, (under_after - under) / self.reps)
        self.rows.append(row)
        print(f"  {method:<28} N={n if n is not None else '-':<3} median {row.median_ms:9.1f} ms", file=sys.stderr)

    def table(self) -> str:
        def find(method: str, n: int | None) -> Row | None:
            return next((r for r in self.rows if r.method == method and r.n == n), None)

        def ratio(row: Row, base: Row | None) -> str:
            return f"{row.median_ms / base.median_ms:.1f}x" if base and row.n is not None else "-"

        lines = [
            f"{'method':<28} {'N':>3} {'median ms':>10} {'min ms':>9} {'vs fork':>8} {'vs %%px':>8} "
            f"{'kernel CPU':>11} {'others CPU':>11}"
        ]
        lines.append("-" * len(lines[0]))
        for row in self.rows:
            n = "-" if row.n is None else str(row.n)
            lines.append(
                f"{row.method:<28} {n:>3} {row.median_ms:>10.1f} {row.min_ms:>9.1f} "
                f"{ratio(row, find(BARE, row.n)):>8} {ratio(row, find(PX, row.n)):>8} "
                f"{row.kernel_cpu * 1e3:>11.2f} {row.others_cpu * 1e3:>11.2f}"
            )
        return "\n".join(lines)

    def ratios(self) -> str:
        """The ratios the launch goals are stated in, for each N that has both rows."""

        def find(method: str, n: int | None) -> Row | None:
            return next((r for r in self.rows if r.method == method and r.n == n), None)

        pairs = [
            ("%%spawn --world (text)", PX),
            ("%%spawn --world (widget)", PX),
            (PING, PX),
            ("%%spawn fork", TORCH),
            ("%%spawn fork", BARE),
        ]
        lines = []
        empty = find(PASS, None)
        for n in sorted({r.n for r in self.rows if r.n is not None}):
            for view in ("widget", "text") if empty else ():
                world = find(f"%%spawn --world ({view})", n)
                if world and empty:  # the goal's own terms: what a world cell adds to an empty kernel cell
                    lines.append(
                        f"N={n:<3} %%spawn --world ({view}) - {PASS}: median {world.median_ms - empty.median_ms:.2f} ms "
                        f"(kernel CPU +{(world.kernel_cpu - empty.kernel_cpu) * 1e3:.2f} ms, ranks {world.others_cpu * 1e3:.2f} ms)"
                    )
            for top, base in pairs:
                a, b = find(top, n), find(base, n)
                if a and b:
                    lines.append(
                        f"N={n:<3} {top} / {base}: median {a.median_ms / b.median_ms:.2f}x, min {a.min_ms / b.min_ms:.2f}x"
                    )
        return "\n".join(lines)


ROWS = ("pass", "ping", "bare", "torch", "px", "fork", "forkserver", "spawn", "world")


def run_all(bench: Bench, kernel: Kernel, args: argparse.Namespace) -> None:
    ns = args.n or ([1, 4, 16] if args.quick else [1, 4, 16, 64])
    rows = set(args.rows)
    kernel.run(KERNEL_SETUP)
    if "pass" in rows:
        bench.measure(PASS, None, "pass")
    for n in ns if "ping" in rows else []:
        bench.measure(PING, n, f"_bench_ping({n})")
    for n in ns if "bare" in rows else []:
        bench.measure(BARE, n, f"_bench_bare_fork({n})")
    for n in ns if "torch" in rows else []:
        bench.measure(TORCH, n, f"_bench_tmp.start_processes(_bench_noop, nprocs={n}, start_method='fork')")

    px_ns = args.n or ([1, 4, 16] if args.full else [1, 4])
    for n in px_ns if "px" in rows else []:
        print(f"starting an ipyparallel cluster of {n} engine(s)", file=sys.stderr)
        kernel.run(CLUSTER_START.format(n=n), timeout=max(args.timeout, 300))
        try:
            bench.measure(PX, n, "%%px\npass")
        finally:
            kernel.run(CLUSTER_STOP, timeout=120)

    methods = [m for m in args.methods.split(",") if m in rows]
    if args.no_nbspawn or not (methods or "world" in rows):
        return
    try:
        kernel.run("%load_ext nbspawn")
    except CellError as e:
        print(f"skipping the %%spawn rows: `%load_ext nbspawn` failed in the kernel: {e}", file=sys.stderr)
        return
    for method in methods:
        for n in ns:
            bench.measure(f"%%spawn {method}", n, f"%%spawn -n {n} --start-method {method}\npass")
    for n in ns if "world" in rows else []:  # a kept world: the warm-up cell starts it, the timed cells reuse its ranks
        for view in args.world_views.split(","):
            bench.measure(f"%%spawn --world ({view})", n, f"%%spawn --world bench{n} -n {n} --view {view}\npass")
        kernel.run(f"%spawn stop bench{n}")


def with_kernel(start: Callable[[], Kernel], work: Callable[[Kernel], None]) -> tuple[Kernel | None, int]:
    """Start a kernel and run ``work`` on it; on Ctrl-C, SIGTERM or an error, say so and keep going, so
    the caller can print what was measured.  The kernel (and any cluster) is closed whatever happens.
    Returns the kernel (None if it never started) and the exit status: 0, 130 or 1."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM cleans up like Ctrl-C
    kernel = None
    status = 0
    try:
        kernel = start()
        work(kernel)
    except KeyboardInterrupt:
        print("interrupted: showing what was measured", file=sys.stderr)
        status = 130
    except Exception as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        status = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C or SIGTERM must not abandon the cluster
            signal.signal(sig, signal.SIG_IGN)
        if kernel is not None:
            kernel.close()
    return kernel, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N up to 16 only (no 64-rank spawn/forkserver)")
    parser.add_argument("--full", action="store_true", help="also time ipyparallel with 16 engines")
    parser.add_argument("--no-nbspawn", action="store_true", help="time the peers only")
    parser.add_argument("--methods", default="fork,forkserver,spawn", help="%%%%spawn start methods to time (default: all three)")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per row (default 7)")
    parser.add_argument("--world-views", default="widget,text", help="views to time kept-world cells with (default: widget,text)")
    parser.add_argument(
        "--n", type=lambda v: [int(x) for x in v.split(",")], default=None, metavar="N[,N...]",
        help="rank/engine counts to time, e.g. 4 (default: 1,4,16,64; --quick 1,4,16; %%%%px 1,4)",
    )  # fmt: skip
    parser.add_argument(
        "--rows", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=list(ROWS), metavar="ROWS",
        help=f"which rows to time, comma-separated, from {','.join(ROWS)} (default: all); "
        "fork/forkserver/spawn pick %%%%spawn start methods (with --methods)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600, help="seconds one cell may take (default 600)")
    args = parser.parse_args()
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)} (choose from {', '.join(ROWS)})")

    print(
        f"python {platform.python_version()}, {len(os.sched_getaffinity(0))} cores, reps {args.reps}; "
        f"starting a kernel ({sys.executable})",
        file=sys.stderr,
    )
    bench = None

    def work(kernel: Kernel) -> None:
        nonlocal bench
        bench = Bench(kernel, args.reps)
        run_all(bench, kernel, args)

    _kernel, status = with_kernel(lambda: Kernel(args.timeout), work)
    if bench is not None:
        print(f"\nper-cell wall time, execute_request -> execute_reply; {kernel_versions()}")
        print("CPU ms per cell (mean): the kernel process (every thread) and the processes under it (ranks, engines)")
        print(bench.table())
        if ratios := bench.ratios():
            print(f"\ngoal ratios (medians; the goals: world text and widget <= 0.3x %%px, fresh fork <= 1.05x torch)\n{ratios}")
    return status


def kernel_versions() -> str:
    import ipykernel
    import ipyparallel
    import torch

    cores = len(os.sched_getaffinity(0))
    return f"torch {torch.__version__}, ipyparallel {ipyparallel.__version__}, ipykernel {ipykernel.__version__}, {cores} cores"


if __name__ == "__main__":
    sys.exit(main())
