"""Drive a real ipykernel over the Jupyter protocol, the way a notebook front end does.

nbspawn lives inside a kernel: its output arrives as iopub messages, its errors as execute_reply
content, and interrupts come from the kernel manager. Testing it through a real kernel is the only
way to see what a user sees, so there are no mocks here.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import signal_trace
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.kernelspec import KernelSpecManager

# Python 3.13's breakpoint() and pdb.set_trace() stop on their own line, older Pythons' on the next one
# (what a user of each sees in a notebook too): a debugger test answers TO_NEXT_LINE first to stand where
# the older ones stop, and names the line it stops on with STOP_LINE_SHIFT.
BREAKPOINT_STOPS_ON_ITS_LINE = sys.version_info >= (3, 13)
TO_NEXT_LINE = ["n"] if BREAKPOINT_STOPS_ON_ITS_LINE else []
STOP_LINE_SHIFT = -1 if BREAKPOINT_STOPS_ON_ITS_LINE else 0
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
KERNEL_NAME = "python3"
# `import nbspawn` too, so cells can call nbspawn.last_run() as they would after the README's setup.
# Runs show as `[rank{r}]: ` text lines, which tests read from stdout (rank_lines); in a Jupyter kernel
# the default is the live widget (tests/kernel/test_view_widget.py covers it, asking for it with --view widget).
LOAD = "%load_ext nbspawn\nimport nbspawn\n%config SpawnMagics.view = 'text'"
_spec_dir: tempfile.TemporaryDirectory | None = None


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


@dataclass
class ErrorInfo:
    ename: str
    evalue: str
    traceback: list[str]

    @property
    def traceback_text(self) -> str:
        """The traceback as a user reads it: lines joined, colors removed."""
        return strip_ansi("\n".join(self.traceback))


@dataclass
class ExecResult:
    status: str  # "ok" | "error" | "aborted", from the execute_reply
    execution_count: int | None
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)  # iopub contents, each with "msg_type"
    error: ErrorInfo | None = None

    @property
    def error_text(self) -> str:
        """ "" when the cell succeeded, so `result.stderr + result.error_text` always works."""
        return self.error.traceback_text if self.error else ""


@dataclass
class Kernel:
    """A started kernel: `manager` interrupts/kills it, `client` talks to it."""

    manager: KernelManager
    client: BlockingKernelClient

    @property
    def km(self) -> KernelManager:
        return self.manager

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid


def _kernel_spec_manager() -> KernelSpecManager:
    """A spec manager that knows one kernel: this interpreter running ipykernel.

    A user's or system `python3` kernelspec may point at another Python that has neither torch nor
    nbspawn. Writing our own spec (argv = sys.executable -m ipykernel_launcher ...) makes the kernel
    under test always the venv running pytest, whatever `jupyter kernelspec list` says.
    """
    global _spec_dir
    if _spec_dir is None:
        _spec_dir = tempfile.TemporaryDirectory(prefix="nbspawn-kernelspec-")
        write_kernel_spec(os.path.join(_spec_dir.name, KERNEL_NAME))
    return KernelSpecManager(kernel_dirs=[_spec_dir.name], ensure_native_kernel=False)


def private_shm_possible() -> bool:
    """Whether start_kernel(private_shm=True) can give a kernel a /dev/shm of its own: root (CI is), and
    util-linux's ``unshare``."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and os.path.isdir("/dev/shm")


def _in_private_shm(argv: list[str]) -> list[str]:
    """``argv`` run in a mount namespace of its own with an empty tmpfs on /dev/shm: the kernel and every
    process it starts (ranks, forkservers, torch's shared-memory managers) see only their own segments, so
    a leak test can count every segment there, its own and torch's, while other tests' ranks run beside it.
    The kernel keeps its pid (unshare and sh exec it); the test reads its /dev/shm at /proc/PID/root."""
    mount = 'mount -t tmpfs -o mode=1777 nbspawn-test-shm /dev/shm && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh", *argv]


def shm_dir(pid: int | None = None) -> str:
    """The /dev/shm that process ``pid`` sees (a kernel started with private_shm has its own); None: ours."""
    return "/dev/shm" if pid is None else f"/proc/{pid}/root/dev/shm"


def start_kernel(
    startup_timeout: float = 60,
    cwd: str | None = None,
    env: dict[str, str | None] | None = None,
    log: Any = None,
    private_shm: bool = False,
) -> Kernel:
    """``env`` adds to this process's environment (e.g. a private TMPDIR for leak tests); ``log``, an
    open file, receives the kernel process's own stderr (what a Jupyter server prints to its console);
    ``private_shm``, a /dev/shm of the kernel's own where the machine allows it (private_shm_possible)."""
    # a value of None removes a variable (e.g. PYTEST_CURRENT_TEST, under which ipykernel captures nothing)
    extra: dict[str, Any] = {"env": {k: v for k, v in {**os.environ, **env}.items() if v is not None}} if env else {}
    if log is not None:
        extra["stderr"] = log
    for attempt in (1, 2):
        manager = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_kernel_spec_manager())
        assert Path(manager.kernel_spec.argv[0]).resolve() == Path(sys.executable).resolve()
        if private_shm and private_shm_possible():
            manager.kernel_spec.argv = _in_private_shm(manager.kernel_spec.argv)
        manager.start_kernel(cwd=cwd or os.getcwd(), **extra)
        client = manager.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=startup_timeout)
        except RuntimeError:
            died = not manager.is_alive()
            stop_kernel(Kernel(manager, client))
            # jupyter_client picks the kernel's five ports free, then the kernel binds them: a kernel
            # started by another test worker can take one in between ("Address already in use", seen
            # with 3 workers), and the kernel dies before its first reply.  A bare ipykernel: no
            # nbspawn yet.  Once more, on new ports.
            if attempt == 2 or not died:
                raise
            continue
        return Kernel(manager, client)
    raise AssertionError("unreachable")


def stop_kernel(kernel: Kernel) -> None:
    """Ask nicely, then kill: a test may have left the kernel busy, interrupted or already dead."""
    try:
        kernel.client.stop_channels()
    finally:
        if kernel.manager.has_kernel:
            try:
                kernel.manager.shutdown_kernel(now=not kernel.manager.is_alive())
            except Exception:
                kernel.manager.shutdown_kernel(now=True)
        kernel.manager.cleanup_resources()


def where_everything_is(limit: int = 16_000) -> str:
    """Every process this test started (kernels, their ranks, the ranks' children), and where each
    one's threads are, Python and native frames: what a cell that never replied was stuck on.  Read
    with py-spy (the ``test`` extra; it needs ptrace, which root has) where it is installed."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        return "(py-spy is not installed: no stacks of the processes)"
    dumps = []

    def depth(process: psutil.Process) -> int:
        with contextlib.suppress(psutil.Error):
            return len(process.parents())
        return 0

    # the kernels first, then the ranks, then their children: a cell that never replied is the kernel's
    # to explain, and what is cut (here at ``limit``, and a CI log's excerpt, which keeps the first lines
    # of a failure: the real CI's of a floor hang kept only the ranks', ci61 and stop 55's) is the deepest
    for process in sorted(psutil.Process().children(recursive=True), key=depth):
        try:
            command = " ".join(process.cmdline())[:160]
            answer = subprocess.run(
                [spy, "dump", "--native", "--pid", str(process.pid)], capture_output=True, text=True, timeout=20
            )
        except (psutil.Error, subprocess.SubprocessError, OSError) as err:
            dumps.append(f"== pid {process.pid}: {err}")
            continue
        dumps.append(f"== pid {process.pid} (parent {process.ppid()}): {command}\n{answer.stdout or answer.stderr}")
    text = "\n".join(dumps)
    return "where every process of this test was:\n" + (text if len(text) <= limit else text[:limit] + "\n[...]")


def execute(
    client: BlockingKernelClient, code: str, timeout: float = 60, seen: Callable[[list[dict[str, Any]]], None] | None = None
) -> ExecResult:
    """Run `code` and collect everything the kernel says about it, until it goes idle.

    Messages from earlier requests (a cell a test started and never waited for) are skipped by
    parent msg_id. Raises TimeoutError, showing what had arrived, if the kernel does not finish.
    ``seen`` is called with the outputs so far as each one arrives: a test that lets the cell end (a flag
    file) once it has seen what it looks for.
    """
    # stop_on_error=False: each cell is sent alone, after the last one's reply, so there is no queue to
    # abort; ipykernel 6.17 (Colab's, Kaggle's) would abort the next request if it came before its
    # zero-second "stop aborting" callback ran (a failed cell then the next, sent at once)
    msg_id = client.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
    deadline = time.monotonic() + timeout
    stdout, stderr, outputs = [], [], []
    iopub_error: dict | None = None

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"no reply within {timeout} s to {code[:80]!r}; so far stdout={''.join(stdout)[-2000:]!r} "
                f"stderr={''.join(stderr)[-2000:]!r}\n{where_everything_is()}"
            )
        return left

    while True:
        try:
            msg = client.get_iopub_msg(timeout=remaining())
        except queue.Empty:
            continue  # remaining() raises on the next turn
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        msg_type, content = msg["msg_type"], msg["content"]
        if msg_type == "status":
            if content["execution_state"] == "idle":
                break
            continue
        if msg_type == "execute_input":
            continue
        outputs.append({"msg_type": msg_type, **content})
        if msg_type == "stream":
            (stdout if content["name"] == "stdout" else stderr).append(content["text"])
        elif msg_type == "error":
            iopub_error = content
        if seen is not None:
            seen(outputs)

    while True:
        try:
            reply = client.get_shell_msg(timeout=remaining())
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg_id:
            break

    content = reply["content"]
    error = None
    if content["status"] == "error":
        source = content if "ename" in content else (iopub_error or {})
        error = ErrorInfo(source.get("ename", ""), source.get("evalue", ""), list(source.get("traceback", [])))
    return ExecResult(
        status=content["status"],
        execution_count=content.get("execution_count"),
        stdout="".join(stdout),
        stderr="".join(stderr),
        outputs=outputs,
        error=error,
    )


# -- what a run may leave behind ------------------------------------------------------------------


def descendants(pid: int, zombies: bool = False) -> list[psutil.Process]:
    """Processes below `pid`, recursively; zombies only if asked (they hold no resources but a pid)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for kid in kids:
        try:
            if zombies or kid.status() != psutil.STATUS_ZOMBIE:
                found.append(kid)
        except psutil.NoSuchProcess:
            pass
    return found


def shm_entries(prefix: str = "", pid: int | None = None) -> set[str]:
    """Names in the /dev/shm process ``pid`` sees (shm_dir; POSIX shared memory segments, torch's and
    multiprocessing's included)."""
    try:
        return {name for name in os.listdir(shm_dir(pid)) if name.startswith(prefix)}
    except FileNotFoundError:
        return set()


# -- cells, as the tests run them -----------------------------------------------------------------


def run(kernel: Kernel, code: str, timeout: float = 120) -> ExecResult:
    """`code` run in `kernel`, whatever its outcome."""
    return execute(kernel.client, code, timeout=timeout)


def ok(kernel: Kernel, code: str, timeout: float = 120) -> ExecResult:
    """`code` run in `kernel`, asserted to have succeeded (the failure shows its traceback and stderr)."""
    result = execute(kernel.client, code, timeout=timeout)
    # a rank killed by SIGTERM: who sent it (ci60, ci64: nbspawn had not)
    senders = [signal_trace.sigterms_to()] if "SIGTERM" in result.error_text else []
    assert result.status == "ok", (result.error_text, result.stderr, *senders)
    return result


# gloo's own line on connecting (an unconditional print in torch 2.10's gloo, pytorch/gloo#462: Kaggle's
# torch), which a rank writes whatever its cell does: not the cell's output the tests look at
GLOO_CONNECTED = re.compile(
    r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of connected peer ranks is : \d+$"
)


def rank_lines(text: str, rank: int) -> list[str]:
    """The text view's lines of `rank` (``[rank{rank}]: text``), prefix removed, in order (gloo's own
    connection line left out)."""
    prefix = re.compile(rf"^\[rank{rank}\]: ?")
    lines = (prefix.sub("", line) for line in text.splitlines() if prefix.match(line))
    return [line for line in lines if not GLOO_CONNECTED.match(line)]


def load_nbspawn(kernel: Kernel, timeout: float = 120) -> Kernel:
    """Run LOAD in `kernel`; on failure stop it and fail the test (the first import of torch is slow
    on a cold disk, hence the long timeout)."""
    result = execute(kernel.client, LOAD, timeout=timeout)
    if result.status != "ok":
        stop_kernel(kernel)
        pytest.fail(f"{LOAD!r} failed in the kernel:\n{result.error_text}{result.stderr}", pytrace=False)
    return kernel


def loaded_kernel(**start: Any) -> Kernel:
    """A new kernel (start_kernel's arguments) with nbspawn loaded; the caller stops it.

    Asked with no arguments, it is the spare one started while the test before ran (_Spare), when the
    spare was started in the same directory and environment as this call's; then the next spare starts.
    """
    global _spare
    if start:
        return _loaded_now(**start)
    spare, _spare = _spare, None
    kernel = spare.take() if spare is not None else None
    if kernel is None:
        kernel = _loaded_now()
    _spare = _Spare()
    return kernel


def _loaded_now(**start: Any) -> Kernel:
    kernel = start_kernel(**start)
    try:
        return load_nbspawn(kernel)
    except BaseException:
        if kernel.manager.has_kernel:
            stop_kernel(kernel)
        raise


class _Spare:
    """The next loaded_kernel(), started in a thread while the test that asked for this one runs.

    A kernel with nbspawn loaded takes 2.2 s to start (0.5 s to be ready, 1.7 s for LOAD, which imports
    torch), about 90 times a run of the suite and again in each runtime job; the test beside it mostly
    waits on its ranks, so the start costs the test next to nothing. It is used only by a call made in
    the directory and environment it was started in, as a kernel started then would be.  A test that
    forks this process itself waits for it first (settle_kernels: a fork amid a start could copy a
    lock the starting thread holds)."""

    def __init__(self) -> None:
        self.cwd, self.env = os.getcwd(), _environment()
        self.kernel: Kernel | None = None
        self.started = threading.Event()
        threading.Thread(target=self._start, name="nbspawn-spare-kernel", daemon=True).start()

    def _start(self) -> None:
        try:
            self.kernel = _loaded_now()
        except BaseException:  # the caller starts one itself, and sees the error then
            self.kernel = None
        finally:
            self.started.set()

    def take(self) -> Kernel | None:
        self.started.wait()
        if self.kernel is not None and (
            (self.cwd, self.env) != (os.getcwd(), _environment()) or not self.kernel.manager.is_alive()
        ):
            self.discard()
        return self.kernel

    def discard(self) -> None:
        self.started.wait()
        kernel, self.kernel = self.kernel, None
        if kernel is not None:
            stop_kernel(kernel)


_spare: _Spare | None = None


def _environment() -> dict[str, str]:
    """What a kernel inherits; the name of the test running differs between any two calls, and only
    whether it is set matters to ipykernel."""
    return {**os.environ, "PYTEST_CURRENT_TEST": "set" if "PYTEST_CURRENT_TEST" in os.environ else ""}


_stopping: list[threading.Thread] = []


def stop_kernel_later(kernel: Kernel) -> None:
    """stop_kernel in a thread, for a fixture done with its kernel: the next test need not wait the 0.7 s
    a shutdown takes (the kernel answers, then its process is waited for)."""
    _stopping[:] = [thread for thread in _stopping if thread.is_alive()]
    thread = threading.Thread(target=stop_kernel, args=(kernel,), name="nbspawn-kernel-stop", daemon=True)
    thread.start()
    _stopping.append(thread)


def settle_kernels() -> None:
    """Wait until no kernel is starting or stopping in a thread: before this process forks (test_shm,
    the fork tests), and at the session's end."""
    if _spare is not None:
        _spare.started.wait()
    for thread in _stopping:
        thread.join()


def stop_spare_kernel() -> None:
    """The session's end: the last spare was never used; the kernels stopping are waited for."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None:
        spare.discard()
    settle_kernels()


# -- a run's processes ----------------------------------------------------------------------------


def run_processes(pid: int) -> list[psutil.Process]:
    """Live descendants of `pid`, the fork server and the resource tracker excluded: they are
    multiprocessing's, started once and shared by every run."""
    found = []
    for kid in descendants(pid):
        try:
            line = " ".join(kid.cmdline())
            if "forkserver" not in line and "multiprocessing.resource_tracker" not in line:
                found.append(kid)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_for_ranks(pid: int, count: int, timeout: float = 60) -> list[psutil.Process]:
    """At least `count` run processes under `pid` (the kernel), or AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = run_processes(pid)
        if len(kids) >= count:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"expected {count} ranks under {pid}, found {run_processes(pid)}")


def ready_line(folder: str | os.PathLike) -> str:
    """A statement for a cell (or a rank's script): this rank has reached it.  It writes the rank's pid
    to ``folder/<RANK>``; put it on the line before the call the rank is to be found blocked in, or on
    the same line (``ready; time.sleep(100)``) where a traceback is to name that line either way."""
    folder = os.fspath(folder)
    return f"__import__('pathlib').Path({folder!r}, __import__('os').environ['RANK']).write_text(str(__import__('os').getpid()))"


def until_flag(path: str | os.PathLike, seconds: float = 120) -> str:
    """A statement for a cell: wait until the test has written ``path`` (a flag file: it has seen what it
    looks for), ``seconds`` at most, a hang guard; a rank holds its state until then rather than for a
    fixed time a loaded machine may not keep to."""
    wait = f"import os, time\nend = time.monotonic() + {seconds!r}\nwhile not os.path.exists({os.fspath(path)!r}) and time.monotonic() < end:\n    time.sleep(0.05)\n"
    return f"exec({wait!r}, {{}})"


# wait_until_blocked's body: run by the test, and by a rank that is to act once its peers are in place
_BLOCKED = """
import pathlib, time, psutil
asleep, deadline = {{}}, time.monotonic() + {timeout!r}
while True:
    pids = []
    for entry in sorted(pathlib.Path({folder!r}).iterdir()):
        try:
            pids.append(int(entry.read_text()))
        except ValueError:  # being written
            pass
    if len(pids) >= {count!r}:
        for pid in pids:
            try:
                state = psutil.Process(pid).status()
            except psutil.NoSuchProcess:
                state = "gone"
            asleep[pid] = asleep.get(pid, 0) + 1 if state == psutil.STATUS_SLEEPING else 0
        if all(asleep[pid] >= 3 for pid in pids):
            break
    assert time.monotonic() < deadline, "not {count} ranks blocked after their ready line in {folder}: %r" % asleep
    time.sleep(0.1)
"""


def wait_until_blocked(folder: str | os.PathLike, count: int, timeout: float = 60) -> None:
    """Return once ``count`` ranks have run :func:`ready_line` into ``folder`` (it must exist) and
    each one is blocked in the call after it: its main thread asleep (in a sleep, a collective, a read) at
    three looks in a row, 0.1 s apart.  Where a rank is, then, is a fact, not a guess at how long a loaded
    machine takes to start it (a fixed second after the processes existed was too little for ranks at
    nice 19).  AssertionError after ``timeout`` s: only a hang."""
    exec(_BLOCKED.format(folder=os.fspath(folder), count=count, timeout=timeout), {})


def blocked_line(folder: str | os.PathLike, count: int, timeout: float = 60) -> str:
    """:func:`wait_until_blocked` as one statement for a cell: a rank that is to fail, say, only once its
    peers are blocked where the test expects them (after their :func:`ready_line`)."""
    return f"exec({_BLOCKED.format(folder=os.fspath(folder), count=count, timeout=timeout)!r}, {{}})"


def interrupt_later(kernel: Kernel, ready: str | os.PathLike, ranks: int) -> threading.Thread:
    """Interrupt ``kernel`` once ``ranks`` ranks have run :func:`ready_line` into ``ready`` and are
    blocked in the call after it (:func:`wait_until_blocked`)."""

    def go() -> None:
        wait_until_blocked(ready, ranks)
        kernel.manager.interrupt_kernel()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def dead_to_the_kernel(kernel, world: str, rank: int, timeout: float = 30) -> None:
    """Wait until the kernel can tell that ``rank`` of ``world`` has ended (what the next cell asks before
    it is sent): a fixed 0.5 s once stood for it.  A hang guard of ``timeout`` s."""
    deadline = time.monotonic() + timeout
    ask = f"from nbspawn._dispatch import kept_worlds\nprint(kept_worlds()[{world!r}].processes[{rank}].is_alive())"
    while (alive := ok(kernel, ask, timeout=60).stdout.strip()) != "False":
        assert time.monotonic() < deadline, f"rank {rank} of {world} outlived its SIGKILL: {alive}"
        time.sleep(0.05)


# -- what a process exposes -----------------------------------------------------------------------


def sockets_of(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds (whatever process shares them)."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            held.add(target[len("socket:[") : -1])
    return held


def listening(pid: int) -> dict[str, tuple[str, int]]:
    """The TCP sockets ``pid`` listens on: inode -> (address, port), read in the process's own network
    namespace (``/proc/<pid>/net``: a node in a namespace of its own is seen as it is)."""
    held = sockets_of(pid)
    found = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in held:  # TCP_LISTEN
                    address, port = fields[1].split(":")
                    found[fields[9]] = (_address(address), int(port, 16))
    return found


def _address(hexed: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hexed)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def kernel_segments(pid: int) -> set[str]:
    """The segments a leak test counts for kernel ``pid``, in the /dev/shm it sees (its own, started with
    private_shm): its own nbspawn segments and any not named by nbspawn (torch's, multiprocessing's);
    other kernels' nbspawn segments are left out where it shares the machine's."""
    return {e for e in shm_entries(pid=pid) if e.startswith(f"nbspawn.{pid}.") or not e.startswith("nbspawn.")}


def leak_snapshot(pid: int, tmp_dir: str) -> dict:
    """What a run could leak in kernel `pid`: descriptors, threads, processes, zombies, shared memory
    segments and files under `tmp_dir`; two snapshots around runs must be equal."""
    proc = psutil.Process(pid)
    fds = sorted(os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    tmp = sorted(os.path.relpath(os.path.join(d, n), tmp_dir) for d, dirs, files in os.walk(tmp_dir) for n in dirs + files)
    return {
        "fds": fds,
        "threads": proc.num_threads(),
        "children": [c.pid for c in run_processes(pid)],
        "zombies": [c.pid for c in proc.children(recursive=True) if c.status() == psutil.STATUS_ZOMBIE],
        "shm": sorted(kernel_segments(pid)),
        "tmp": tmp,
    }


def steady_snapshot(pid: int, tmp_dir: str, timeout: float = 10) -> dict:
    """leak_snapshot once two looks 0.2 s apart agree: what runs just ended let go of (a thread
    joining, a segment unlinked) is let go, however slowly a loaded machine does it; after ``timeout``
    s, the last look."""
    deadline = time.monotonic() + timeout
    last = leak_snapshot(pid, tmp_dir)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = leak_snapshot(pid, tmp_dir)
        if now == last:
            return now
        last = now
    return last


def snapshot_back_to(pid: int, tmp_dir: str, before: dict, timeout: float = 10) -> dict:
    """leak_snapshot, looked at again until it equals ``before`` (what the last run lets go of, it lets
    go of in its own time); after ``timeout`` s, the last look, for the caller's ``== before`` to show."""
    deadline = time.monotonic() + timeout
    while (after := leak_snapshot(pid, tmp_dir)) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    return after


# -- a frontend that answers the kernel's prompts (stdin channel) ----------------------------------


@dataclass
class Conversation:
    result: ExecResult
    prompts: list[str] = field(default_factory=list)  # every input_request's prompt, in order
    passwords: list[bool] = field(default_factory=list)

    @property
    def text(self) -> str:
        return strip_ansi(self.result.stdout + self.result.stderr + self.result.error_text)


Answer = Callable[[str], str | None]  # prompt -> what to type (None: interrupt the kernel instead)


def converse(kernel: Kernel, code: str, answers: list[str] | Answer, timeout: float = 120) -> Conversation:
    """Run ``code`` with stdin allowed (as a notebook runs cells: the kernel can answer a rank's
    prompts), answering each input_request in turn, until the kernel is idle."""
    kc = kernel.client
    script = list(answers) if isinstance(answers, list) else None
    msg_id = kc.execute(code, store_history=True, allow_stdin=True, stop_on_error=False)  # see execute()
    deadline = time.monotonic() + timeout
    stdout, stderr, outputs, prompts, passwords = [], [], [], [], []
    error = None
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no end within {timeout} s; prompts {prompts}; stdout {''.join(stdout)[-3000:]!r}")
        try:
            msg = kc.get_stdin_msg(timeout=0.02)
        except queue.Empty:
            pass
        else:
            if msg["msg_type"] == "input_request" and msg["parent_header"].get("msg_id") == msg_id:
                prompt = msg["content"]["prompt"]
                prompts.append(prompt)
                passwords.append(bool(msg["content"].get("password")))
                if script is not None:
                    assert script, f"an unexpected prompt {prompt!r}; stdout {''.join(stdout)[-2000:]!r}"
                    reply: str | None = script.pop(0)
                else:
                    assert not isinstance(answers, list)
                    reply = answers(prompt)
                if reply is None:
                    kernel.manager.interrupt_kernel()
                else:
                    kc.input(reply)
        idle = False
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=0)
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                idle = True
                break
            outputs.append({"msg_type": kind, **content})
            if kind == "stream":
                (stdout if content["name"] == "stdout" else stderr).append(content["text"])
            elif kind == "error":
                error = content
        if idle:
            break
    reply_msg = kc.get_shell_msg(timeout=30)
    while reply_msg["parent_header"].get("msg_id") != msg_id:
        reply_msg = kc.get_shell_msg(timeout=30)
    content = reply_msg["content"]
    info = None
    if content["status"] == "error":
        source = content if "ename" in content else (error or {})
        info = ErrorInfo(source.get("ename", ""), source.get("evalue", ""), list(source.get("traceback", [])))
    result = ExecResult(content["status"], content.get("execution_count"), "".join(stdout), "".join(stderr), outputs, info)
    if script:
        raise AssertionError(f"prompts never asked for {script}; prompts seen {prompts}; text {result.stdout[-2000:]!r}")
    return Conversation(result, prompts, passwords)
