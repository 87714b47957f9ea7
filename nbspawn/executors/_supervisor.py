"""Starting the ranks, watching them, and stopping them: the failure policy lives here.

Ranks are started by ``torch.multiprocessing.start_processes`` (fork, spawn or forkserver) and then
supervised from the kernel's main thread, in one loop that waits on every rank's sentinel, forwards
new output to the view, and enforces the policy:

* the first rank that raises, exits non-zero or dies from a signal is the root cause; every other
  rank dumps its stack (SIGUSR1, faulthandler), gets SIGTERM, and SIGKILL after the grace period;
* ``--timeout`` does the same to every rank still running, so a hung collective says where it hangs;
* the kernel's interrupt (SIGINT) is passed to every rank first, so each raises KeyboardInterrupt
  where it is, then escalates to SIGTERM and SIGKILL; a second interrupt kills at once.

Whatever happens, the loop's ``finally`` reaps every rank and closes every descriptor it opened.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from .._run import RankState, Run
from .._source import STILL_STARTING, main_thread_stack, program_stack, rewrite_notebook_frames
from .._spec import RunSpec
from ..errors import (
    RankExitedError,
    RankFailure,
    RankRaisedError,
    SpawnInterrupted,
    SpawnOutputError,
    SpawnTimeoutError,
    SpawnUsageError,
)
from ..handoff import _shm
from ..handoff._names import discard_outputs, receive_outputs
from ..ranks._capture import rank_classes, stdio_streams
from ..ranks._cell import EXIT_INTERRUPTED, run_rank
from . import _reaper

# How often new output is looked for: soon after output arrived, then backing off while ranks are
# quiet, so a long silent run costs the kernel almost nothing. Exits wake the loop at once anyway.
POLL_MIN, POLL_MAX = 0.02, 0.25
STACK_DUMP_WAIT = 0.5  # how long to wait for faulthandler dumps before SIGTERM
STOPPING_READ_BUDGET = 4096  # bytes of each stream of each rank read per poll while a run is being stopped

_last_run: Run | None = None


class RunView(Protocol):
    """What the launcher tells a view; every call comes from the thread that runs the cell.

    Within a rank, ``output`` and ``display`` calls come in the order the rank wrote them.
    ``skipped`` says how many lines of a rank were not read, when the view's ``read_budget`` (bytes
    per text stream per read, None: everything) was exceeded; the logs have them.  A view whose
    ``rich`` is true can draw rich output, so ranks look like a notebook to the code they run.
    A view may also have ``wants_stop() -> bool`` (a Stop button): the run is then stopped as an
    interrupt would stop it.
    """

    @property
    def rich(self) -> bool: ...
    @property
    def read_budget(self) -> int | None: ...

    def started(self, run: Run) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def display(self, rank: int, item: dict) -> None: ...
    def skipped(self, rank: int, lines: int) -> None: ...
    def rank_ended(self, run: Run, state: RankState) -> None: ...
    def tick(self, run: Run) -> None: ...
    def finished(self, run: Run) -> None: ...


class SilentView:
    """No display: the Python API's default, output is only in the logs."""

    rich = False
    read_budget = 0

    def started(self, run: Run) -> None: ...
    def output(self, rank: int, stream: str, text: str) -> None: ...
    def display(self, rank: int, item: dict) -> None: ...
    def skipped(self, rank: int, lines: int) -> None: ...
    def rank_ended(self, run: Run, state: RankState) -> None: ...
    def tick(self, run: Run) -> None: ...
    def finished(self, run: Run) -> None: ...


def last_run() -> Run | None:
    """The most recent run in this process, finished or not."""
    return _last_run


class Executor(Protocol):
    """How one run's ranks are started and seen to end; the supervisor does everything else.

    ``FreshRanks`` starts new processes for the cell and ends them with it; a kept world's
    ``WorldCell`` (``nbspawn.executors._world``) hands the cell to ranks that live on.
    """

    keeps_ranks: bool  # the ranks outlive the cell: a failure interrupts them instead of ending them

    def start(self, run: Run) -> list[int]: ...  # pids in rank order; on failure, nothing left running
    def waitables(self, rank: int) -> list[Any]: ...  # ready when the rank's cell ends or it dies
    def ended(self, rank: int, ready: Any) -> tuple[int, bool] | None: ...  # (exit code, died), or None: not ended
    def cleanup(self, lose: bool) -> None: ...  # leave nothing running that should not be

    # Optional, for ranks that are not this machine's processes (a cluster's node agents report
    # them): ``remote = True``; ``read_output(final) -> list[Event]`` instead of reading local logs
    # (an event of kind "item" is a display already converted); ``signal_ranks(ranks, sig)``
    # instead of signalling pids; ``outputs() -> (values, missing)`` for ``--out``; ``poll_max``.


def execute(spec: RunSpec, view: RunView | None = None, executor: Executor | None = None, background: bool = False) -> Run:
    """Run ``spec`` to completion; the returned run's ``error`` says how it failed, if it did.

    With ``background`` the ranks are started here and the run is supervised by a thread of its
    own: this returns at once, ``run.wait()`` joins it (and raises its error), ``run.stop()`` stops it.
    """
    global _last_run
    view = view or SilentView()
    executor = executor or FreshRanks(spec)
    if not spec.run_dir:
        spec.run_dir = os.path.join(tempfile.mkdtemp(prefix="nbspawn-"), spec.run_id)
    spec.rich = bool(getattr(view, "rich", False))
    run = Run(spec, background=background)
    try:
        run.prepare_logs()
    except OSError as err:
        run.close_logs()
        raise SpawnUsageError(f"cannot write logs to {spec.run_dir}: {err.strerror or err}") from None
    _last_run = run
    supervisor = _Supervisor(run, view, executor)
    try:
        view.started(run)
        supervisor.start()
    except BaseException:
        _finish(run, view, supervisor, supervise=False)
        raise
    if background:
        _background_runs[run.run_id] = run
        run._thread = threading.Thread(target=_finish, args=(run, view, supervisor), name=f"nbspawn-{run.run_id}", daemon=True)
        run._thread.start()
    else:
        _finish(run, view, supervisor)
    return run


def _finish(run: Run, view: RunView, supervisor: _Supervisor, supervise: bool = True) -> None:
    """Supervise to the end, leave nothing behind, say how it went; the same in the foreground or not."""
    spec = run.spec
    try:
        try:
            if supervise:
                supervisor.supervise()
        finally:
            # the ranks are gone: an interrupt now has nothing to stop, and must not lose the frozen view
            with _interrupts_deferred():
                supervisor.cleanup()
                try:
                    run.error = supervisor.outcome()
                    if run.error is None and spec.out_names:
                        _bring_outputs_home(run, supervisor.executor)
                finally:
                    if spec.shm_prefix:  # whatever a failed or killed run left: /dev/shm files and their handles
                        _shm.sweep(spec.shm_prefix)
                        discard_outputs([state.dir for state in run.ranks])
                view.finished(run)
    finally:
        run._done.set()


_background_runs: dict[str, Run] = {}


def background_runs() -> dict[str, Run]:
    """Background runs of this process, by run id, running or ended and not yet forgotten."""
    return dict(_background_runs)


def unreported_failures() -> list[Run]:
    """Background runs that failed and were neither waited for nor reported yet (each reported once)."""
    found = [r for r in _background_runs.values() if r.done and r.error is not None and not r.waited and not r.reported]
    for run in found:
        run.reported = True
    return found


@atexit.register
def _stop_background_runs() -> None:
    """Kernel shutdown: background runs are stopped and cleaned up (their ranks would die anyway)."""
    for run in list(_background_runs.values()):
        if not run.done:
            run.stop()
    for run in list(_background_runs.values()):
        run._done.wait(10)


def _bring_outputs_home(run: Run, executor: Executor) -> None:
    remote = getattr(executor, "outputs", None)
    if remote is not None:
        run.outputs, missing = remote()
    else:
        run.outputs, missing = receive_outputs([state.dir for state in run.ranks], run.spec.out_names)
    if missing:
        run.outputs = {}
        run.status = "failed"
        run.error = SpawnOutputError(missing, run)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[list[int]]:
    """Hold Ctrl-C while ranks are being started, so none is started and then forgotten."""
    hits: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield hits
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: hits.append(signum))
    try:
        yield hits
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set variables in the kernel only while it forks, so each rank inherits them for free."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _FlushedOnce:
    """The kernel's stream, with ``flush`` made free while ranks are being started.

    multiprocessing flushes stdout and stderr before every process it starts; in a kernel each flush
    is a round trip to the IOPub thread (~0.7 ms, twice per rank: 90 ms at 64 ranks). One flush
    before the first rank is enough; a rank never flushes the kernel's stream (it has its own).
    """

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def flush(self) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _one_flush() -> Iterator[None]:
    streams = sys.stdout, sys.stderr
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()
    sys.stdout, sys.stderr = _FlushedOnce(streams[0]), _FlushedOnce(streams[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


_forkserver_ready = False


def _prepare_forkserver() -> None:
    """Let the forkserver import torch and nbspawn once, instead of every rank importing them."""
    global _forkserver_ready
    if not _forkserver_ready:
        # and what a rank needs to look like a notebook (nbspawn.ranks._capture), when this is a kernel
        preload = ["torch", "nbspawn.ranks._cell", "IPython.core.interactiveshell"]
        if "ipykernel" in sys.modules:
            preload.append("ipykernel.zmqshell")
        multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
        _forkserver_ready = True


class FreshRanks:
    """New rank processes for one cell, through ``torch.multiprocessing.start_processes``."""

    keeps_ranks = False

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.processes: list[multiprocessing.process.BaseProcess] = []

    def start(self, run: Run) -> list[int]:
        from torch.multiprocessing import start_processes

        spec = self.spec
        inherited: dict[str, str] = {}
        if spec.start_method == "forkserver":
            _prepare_forkserver()
        elif spec.start_method == "fork":
            spec.compiled = spec.cell.compile()
            stdio_streams()
            if "IPython" in sys.modules:
                rank_classes()  # made once here, inherited by every forked rank
            inherited = spec.shared_env()
            spec.shared_env_inherited = True
        with _environment(inherited), _one_flush():
            try:
                context = start_processes(
                    run_rank, args=(spec,), nprocs=spec.nprocs, join=False, daemon=False, start_method=spec.start_method
                )
            except BaseException:
                self._kill_orphans()
                raise
        self.processes = list(context.processes)
        return [_pid(p) for p in self.processes]

    def _kill_orphans(self) -> None:
        """start_processes failed half-way: find the ranks it did start through multiprocessing."""
        for process in multiprocessing.active_children():
            args: tuple[Any, ...] = getattr(process, "_args", ())
            if len(args) > 2 and args[2] and args[2][0] is self.spec:
                process.kill()
                process.join()

    def waitables(self, rank: int) -> list[Any]:
        return [self.processes[rank].sentinel]

    def ended(self, rank: int, ready: Any) -> tuple[int, bool]:
        process = self.processes[rank]
        process.join()
        return process.exitcode or 0, True

    def cleanup(self, lose: bool) -> None:
        for process in self.processes:
            if process.exitcode is None:
                _signal_group(process.pid, signal.SIGKILL)
                process.join()
        for process in self.processes:
            # Whatever a rank left running in its group. The rank itself is reaped, so its pid may
            # already belong to someone else: only its group is signalled, never the pid.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(_pid(process), signal.SIGKILL)
            process.close()


class _Supervisor:
    def __init__(self, run: Run, view: RunView, executor: Executor) -> None:
        self.run = run
        self.spec = run.spec
        self.view = view
        self.executor = executor
        self.pids: list[int] = []
        self.alive: dict[Any, int] = {}  # waitable -> rank, for ranks still in the cell
        self.signalled: set[int] = set()  # ranks nbspawn sent a stopping signal to
        self.stop_reason: str | None = None  # failure | timeout | interrupt | stop
        self.stage = ""
        self.escalate_at = float("inf")
        self.deadline = float("inf")
        self.root: int | None = None
        self.end_order: list[int] = []
        self.lost: str | None = None  # a kept world that cannot go on: why
        self.stopped_by: str | None = None  # "Stop button" | "run.stop()" | why a node agent was told to stop
        self.remote = bool(getattr(executor, "remote", False))
        self.poll_max = float(getattr(executor, "poll_max", POLL_MAX))
        self.interrupted_after_stop = False

    # -- starting ---------------------------------------------------------------------------------

    def start(self) -> None:
        now = time.time()
        with _interrupts_deferred() as interrupted:
            self.pids = self.executor.start(self.run)
        if not self.executor.keeps_ranks and not self.remote:  # a kept world tells the watcher itself
            _reaper.watch(self.pids)
        for rank, pid in enumerate(self.pids):
            state = self.run.ranks[rank]
            # a remote rank's pid is not known yet (0): its agent tells it
            state.pid, state.started_at, state.status = pid or None, now, "running"
            for waitable in self.executor.waitables(rank):
                self.alive[waitable] = rank
        self.run.status = "running"
        if self.spec.timeout is not None:
            self.deadline = time.monotonic() + self.spec.timeout
        if interrupted:
            self._begin_stop("interrupt")

    # -- the loop ---------------------------------------------------------------------------------

    def supervise(self) -> None:
        poll = POLL_MIN
        while self.alive:
            try:
                wait = min(poll, max(0.0, min(self.deadline, self.escalate_at) - time.monotonic()))
                ready = multiprocessing.connection.wait(list(self.alive), timeout=wait)
                # Stop first: under a flood, reading output is most of what this loop does
                if self.stop_reason is None:
                    self._check_stop()
                poll = POLL_MIN if self._forward_output() else min(self.poll_max, poll * 2)
                for waitable in sorted(ready, key=self._error_time):
                    if waitable in self.alive:
                        self._reap(self.alive[waitable], waitable)
                self._check_clocks()
                self.view.tick(self.run)
            except KeyboardInterrupt:
                self._on_interrupt()
        self._forward_output(final=True)

    def _check_stop(self) -> None:
        """The view's Stop button or ``run.stop()``; or, from a node agent's view, a reason to stop
        its ranks as a failure does (another node failed, the kernel is gone)."""
        request = getattr(self.view, "wants_stop", bool)()
        if isinstance(request, str) and request:
            self.stopped_by = request
            self._begin_stop("peer")
        elif request or self.run._stop_requested:
            self.stopped_by = "run.stop()" if self.run._stop_requested else "Stop button"
            self._begin_stop("stop")

    def _error_time(self, waitable: Any) -> float:
        """Among ranks that ended together, the one whose error was recorded first is the root cause."""
        record = self.run.ranks[self.alive[waitable]].read_error()
        return record.get("nbspawn", {}).get("time", float("inf")) if record else float("inf")

    def _forward_output(self, final: bool = False) -> bool:
        view = self.view
        budget = getattr(view, "read_budget", None)
        if budget is not None and self.stop_reason is not None:
            budget = min(budget, STOPPING_READ_BUDGET)  # ending: only the newest lines, and fast
        remote = getattr(self.executor, "read_output", None)
        events = remote(final) if remote is not None else self.run.read_new_output(final=final, budget=budget)
        items = self.run.display_items
        display = getattr(view, "display", None) or self._display_as_text
        for event in events:
            if event.kind == "display":
                for item in items.convert(event.rank, event.value):
                    display(event.rank, item)
            elif event.kind == "item":
                display(event.rank, event.value)
            elif event.kind == "skipped":
                getattr(view, "skipped", _ignore)(event.rank, event.value)
            else:
                view.output(event.rank, event.kind, event.value)
        return bool(events)

    def _display_as_text(self, rank: int, item: dict) -> None:
        """For a view that draws no rich output: what a display says in text, as a line of stdout."""
        if item.get("kind") == "data" and item.get("text"):
            self.view.output(rank, "stdout", str(item["text"]).rstrip("\n") + "\n")

    def _reap(self, rank: int, waitable: Any) -> None:
        ended = self.executor.ended(rank, waitable)
        if ended is None:  # news from the rank, not its end (a kept world's rank began the cell)
            return
        for other in [w for w, r in self.alive.items() if r == rank]:
            del self.alive[other]
        code, died = ended
        state = self.run.ranks[rank]
        state.ended_at = time.time()
        state.exit_code = code
        self.end_order.append(rank)
        if died and self.executor.keeps_ranks and self.lost is None:
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            with contextlib.suppress(ValueError):
                how = signal.Signals(-code).name if code < 0 else how
            self.lost = f"rank {rank} died ({how})"
        if state.exit_code == 0:
            state.status = "done"
        else:
            state.failure = self._failure(state)
            state.status = "stopped" if state.failure.stopped else "failed"
            if state.status == "failed" and self.root is None and self.stop_reason is None:
                self.root = rank
                self.view.rank_ended(self.run, state)  # first: a node agent tells the kernel at once
                self._begin_stop("failure")
                return
            if died and self.lost and self.stage in ("", "sigint"):
                self._terminate()  # a kept world's rank died while others were being interrupted
        self.view.rank_ended(self.run, state)

    def _failure(self, state: RankState) -> RankFailure:
        code = state.exit_code or 0
        failure = RankFailure(rank=state.rank, pid=state.pid, exit_code=code, node=state.node)
        if code < 0:
            with contextlib.suppress(ValueError):
                failure.signal_name = state.signal_name = signal.Signals(-code).name
            failure.signal_name = failure.signal_name or f"signal {-code}"
        record = _error_record(state.read_error())
        if record:
            failure.exc_type = record.get("exc_type")
            failure.message = record.get("message")
            # frames in functions from earlier cells: "Cell In[3], line 2, in f", for every view
            traceback = rewrite_notebook_frames(record.get("traceback") or "", self.spec.cell_numbers)
            failure.traceback = traceback or None
        interrupted = failure.exc_type == "KeyboardInterrupt" or code == EXIT_INTERRUPTED
        failure.stopped = state.rank in self.signalled and (record is None or interrupted)
        if (failure.stopped or failure.signal_name) and not failure.traceback:
            failure.stack = self._stack(state)  # no traceback of its own: say where it was
        if not failure.stopped and not failure.traceback and not failure.stack:
            tail = _last_lines(state.stderr_path, 10)  # a program's own last words
            failure.traceback = f"last lines of its stderr ({state.stderr_path}):\n{tail}" if tail else None
        return failure

    def _stack(self, state: RankState) -> str | None:
        try:
            with open(state.stacks_path, encoding="utf-8", errors="replace") as fh:
                dump = fh.read()
        except OSError:
            dump = ""
        if dump.strip():
            if self.spec.program is not None:
                return program_stack(dump) or None
            return main_thread_stack(dump, self.spec.cell) or None
        # Signalled before it could report: it had not installed its handlers, so not begun the cell.
        # (A program that is not Python has no stack to give.)
        if self.remote:  # its agent sent no stack: there was none to send
            return None
        return STILL_STARTING if state.rank in self.signalled and self.spec.program is None else None

    # -- stopping ---------------------------------------------------------------------------------

    def _check_clocks(self) -> None:
        now = time.monotonic()
        if self.stop_reason is None and now >= self.deadline:
            self._begin_stop("timeout")
        elif self.alive and now >= self.escalate_at:
            self._escalate()

    def _on_interrupt(self) -> None:
        if self.stop_reason == "stop" and not self.interrupted_after_stop:
            # the same request again: the page falls back on an interrupt when Stop seems unheard
            self.interrupted_after_stop = True
            return
        if self.stop_reason in (None, "failure", "timeout") and self.stage != "sigkill":
            if self.stop_reason is None:
                self._begin_stop("interrupt")
            else:
                self._escalate()
        else:  # a second interrupt: no more patience
            if self.executor.keeps_ranks and self.lost is None:
                self.lost = "interrupted twice"
            self._send(signal.SIGKILL)
            self.stage, self.escalate_at = "sigkill", float("inf")

    def _begin_stop(self, reason: str) -> None:
        self.stop_reason = reason
        # ranks that live on are interrupted first, so they can come back and the world survives
        if reason in ("interrupt", "stop") or (self.executor.keeps_ranks and self.lost is None):
            self._send(signal.SIGINT)
            self.stage = "sigint"
            self.escalate_at = time.monotonic() + self.spec.grace_period
        else:
            self._terminate()

    def _escalate(self) -> None:
        if self.stage == "sigint":
            if self.executor.keeps_ranks and self.lost is None:
                stuck = ", ".join(map(str, sorted(set(self.alive.values()))))
                self.lost = (
                    f"rank {stuck} did not come back within {self.spec.grace_period:g} s of the interrupt "
                    "(stuck where Python cannot be interrupted, such as a collective)"
                )
            self._terminate()
        else:
            self._send(signal.SIGKILL)
            self.stage, self.escalate_at = "sigkill", float("inf")

    def _terminate(self) -> None:
        """Ask every running rank for its stack, then SIGTERM; SIGKILL follows after the grace period."""
        # Only ranks that installed faulthandler (their stacks.log exists) can take SIGUSR1; for one
        # still starting, SIGUSR1 would be fatal and misreported. (Remote ranks: their agent does it.)
        alive = set() if self.remote else set(self.alive.values())
        waiting = {r for r in alive if os.path.exists(self.run.ranks[r].stacks_path)}
        for rank in waiting:
            _signal_group(self.pids[rank], signal.SIGUSR1)
        until = time.monotonic() + STACK_DUMP_WAIT
        while waiting and time.monotonic() < until:
            waiting = {r for r in waiting if not _nonempty(self.run.ranks[r].stacks_path)}
            if waiting:
                time.sleep(0.01)
        self._send(signal.SIGTERM)
        self.stage = "sigterm"
        self.escalate_at = time.monotonic() + self.spec.grace_period

    def _send(self, sig: int) -> None:
        ranks = sorted(set(self.alive.values()))
        batch = getattr(self.executor, "signal_ranks", None)  # a cluster: one request per node
        if batch is not None:
            self.signalled.update(ranks)
            batch(ranks, sig)
            return
        deliver = getattr(self.executor, "signal", None)  # an executor may know better when a rank can take it
        for rank in ranks:
            self.signalled.add(rank)
            if deliver is not None:
                deliver(rank, sig)
            else:
                _signal_group(self.pids[rank], sig)

    # -- the end ----------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Leave nothing behind: no rank, no zombie, no descriptor, no process a rank started."""
        with _interrupts_deferred():  # an impatient second Ctrl-C must not leave ranks unreaped (nested: fine)
            self._cleanup()

    def _cleanup(self) -> None:
        if self.executor.keeps_ranks and self.alive and self.lost is None:
            self.lost = "its cell did not finish"  # an error in the supervisor itself
        self.executor.cleanup(lose=self.lost is not None)
        if not self.executor.keeps_ranks and not self.remote:
            _reaper.forget(self.pids)
        self.run.world_lost = self.lost
        self.alive.clear()
        self.run.close_logs()
        self.run.ended_at = time.time()

    def outcome(self) -> BaseException | None:
        run, ranks = self.run, self.run.ranks
        stopped = [f for r in self.end_order if (f := ranks[r].failure) and r != self.root]
        if self.stop_reason is None:
            run.status = "succeeded"
            return None
        if self.stop_reason == "failure" and self.root is not None:
            run.status = "failed"
            root = ranks[self.root].failure
            assert root is not None  # the root cause is chosen once its failure is recorded
            kind = RankRaisedError if root.exc_type else RankExitedError
            return kind([root, *stopped], run)
        if self.stop_reason == "timeout":
            run.status = "timeout"
            return SpawnTimeoutError(self.spec.timeout or 0, stopped, run)
        # interrupt, Stop, or (a node agent's run) stopped for the kernel's reasons
        run.status = "interrupted" if self.stop_reason == "interrupt" else "stopped"
        return SpawnInterrupted(stopped, run, stopped_by=self.stopped_by)


def _pid(process: multiprocessing.process.BaseProcess) -> int:
    assert process.pid is not None  # started
    return process.pid


def _ignore(*_args: object) -> None:
    return None


def _error_record(record: dict | None) -> dict | None:
    """nbspawn's fields of an error.json, or those of torch elastic's own (a program's ``@record``)."""
    if not record:
        return None
    if "nbspawn" in record:
        return record["nbspawn"]
    message = record.get("message")
    if isinstance(message, dict):  # {"message": "Type: text", "extraInfo": {"py_callstack": ...}}
        head = str(message.get("message", ""))
        exc_type, _, text = head.partition(": ")
        extra = message.get("extraInfo") or {}
        return {"exc_type": exc_type or "Error", "message": text, "traceback": extra.get("py_callstack")}
    return None


def _last_lines(path: str, count: int) -> str:
    """The last ``count`` lines of a log, from its last 64 KB."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 65536))
            data = fh.read()
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").rstrip("\n").splitlines()[-count:]
    return "\n".join("  " + line for line in lines)


def _nonempty(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def _signal_group(pid: int | None, sig: int) -> None:
    """Signal a rank and every process it started (each rank leads its own process group)."""
    if pid is None:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)  # not yet a group leader: it was just forked
