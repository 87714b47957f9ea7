"""Starting the ranks, watching them, and stopping them: the failure policy lives here.

:func:`execute` takes a frozen spec, a view and an executor (``_base.Executor``: fresh ranks, a kept
world's cell, a program, a cluster's nodes), starts the ranks through the executor, and supervises
them in one loop (the kernel's main thread, or a thread of the run's own in the background) that
waits on what the executor says becomes ready when a rank ends, forwards new output to the view, and
enforces the policy:

* the first rank that raises, exits non-zero or dies from a signal is the root cause; every other
  rank dumps its stack (SIGUSR1, faulthandler), gets SIGTERM, and SIGKILL after the grace period;
* ``--timeout`` does the same to every rank still running, so a hung collective says where it hangs;
* the kernel's interrupt (SIGINT) is passed to every rank first, so each raises KeyboardInterrupt
  where it is, then escalates to SIGTERM and SIGKILL; a second interrupt kills at once.

A rank's prompt (``input()``, ``breakpoint()``, pdb: ``nbspawn.ranks._prompt``) is a request on the
run's prompt FIFO, which the loop waits on with the ranks where the kernel can answer: the output so
far is shown, then the kernel's own ``input()`` asks, one prompt at a time, while a watcher ends the
prompt for Stop, ``--timeout`` or the rank's end.  With ``--pdb`` (``%pdb on``) the first failing rank
is told to stop in post-mortem.

Whatever happens, the loop's ``finally`` reaps every rank and closes every descriptor it opened.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import signal
import threading
import time
from typing import Any

from .. import _pids
from .._options import ROW
from .._rankdir import remove_if_empty, remove_partial_writes
from .._runstate import RankState, Run, RunStatus
from .._source import (
    CELL_ENDED,
    NOT_ASKED,
    STILL_STARTING,
    fold_library_frames,
    main_thread_stack,
    program_stack,
    rewrite_notebook_frames,
)
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
from ..events._gpumemory import is_cuda_out_of_memory
from ..events._prompts import stdin_answerable
from ..events._where import await_dumps, hang_verdict, left_without
from ..handoff import _shm
from ..handoff._names import discard_outputs
from ..ranks._cell import EXIT_INTERRUPTED
from ..views._protocol import RunView
from . import _registry
from ._base import Executor
from ._hangwatch import STACK_DUMP_WAIT, HangWatch
from ._procs import interrupts_deferred, signal_group
from ._prompting import PromptDesk
from ._resourcewatch import ResourceWatch

# How often new output is looked for: soon after output arrived, then backing off while ranks are
# quiet (up to the executor's ``supervision.poll_max``), so a long silent run costs the kernel almost nothing.
# Exits wake the loop at once anyway.
log = logging.getLogger(__name__)
POLL_MIN = 0.02
# ... except while the ranks write more than the view keeps (it skipped some): then at the pace a live
# view sends (ten messages a second).  Reading sooner only turns more lines into text nobody sees, and
# under a 16-rank flood that took the kernel's main thread (and, with it, the GIL its message threads
# need to hear the Stop button) for most of each second.
POLL_FLOOD = 0.1
LIVENESS_EVERY = 0.5  # seconds between looks for ranks that ended while their children hold their pipes
# After a rank's failure, how long the others may take to end on their own before they are stopped: a
# collective broken by the failed rank's exit raises in milliseconds (gloo), and a rank computing on
# ends by SIGTERM this much later than it used to
FAILURE_SETTLE = 0.5
STOPPING_READ_BUDGET = 4096  # bytes of each stream of each rank read per poll while a run is being stopped


def execute(spec: RunSpec, view: RunView, executor: Executor, background: bool = ROW["background"].typed_default) -> Run:
    """Run ``spec`` to completion; the returned run's ``error`` says how it failed, if it did.

    With ``background`` the ranks are started here and the run is supervised by a thread of its
    own: this returns at once, ``run.wait()`` joins it (and raises its error), ``run.stop()`` stops it.
    """
    run = Run(spec, background=background, end_shown=view.shows_its_end)
    try:
        run.prepare_logs(ranks_make_theirs=executor.supervision.ranks_make_their_dirs)
    except OSError as err:
        run.close_logs()
        remove_if_empty(spec.run_dir)  # what a start that failed half-way made (thousands of empty directories)
        raise SpawnUsageError(f"cannot write logs to {spec.run_dir}: {err.strerror or err}") from None
    _registry.began(run)
    supervisor = _Supervisor(run, view, executor)
    try:
        view.started(run)
        supervisor.start()
    except BaseException:
        _finish(run, view, supervisor, supervise=False)
        remove_if_empty(spec.run_dir)  # no rank wrote a byte: nothing of a start that failed is left
        raise
    if background:
        _registry.runs_in_background(run)
        threading.Thread(target=_finish, args=(run, view, supervisor), name=f"nbspawn-{run.run_id}", daemon=True).start()
    else:
        _finish(run, view, supervisor)
    return run


class _Supervising(threading.local):
    run: Run | None = None  # the run this thread supervises now


_supervising = _Supervising()


def supervises_here(run: Run) -> bool:
    """Whether this thread is the one supervising ``run`` now (a background run's own thread, or the
    kernel's for a run in the foreground): what may use the run's own connections."""
    return _supervising.run is run


def _finish(run: Run, view: RunView, supervisor: _Supervisor, supervise: bool = True) -> None:
    """Supervise to the end, leave nothing behind, say how it went; the same in the foreground or not."""
    spec = run.spec
    _supervising.run = run
    try:
        try:
            if supervise:
                supervisor.supervise()
        finally:
            # the ranks are gone: an interrupt now has nothing to stop, and must not lose the frozen view
            with interrupts_deferred():
                supervisor.cleanup()
                remove_partial_writes([state.dir for state in run.ranks])
                _read_xray(run)  # written for good: the outcome reads which collective a rank that left skipped
                try:
                    run.ended_as(*supervisor.outcome())
                    # a start that raised is the root cause (re-raised by execute): no rank ran to write values
                    if run.error is None and spec.out_names and supervise:
                        _bring_outputs_home(run, supervisor.executor)
                finally:
                    if spec.shm_prefix:  # whatever a failed or killed run left: /dev/shm files and their handles
                        _shm.sweep(spec.shm_prefix)
                        discard_outputs([state.dir for state in run.ranks])
                view.finished(run)
    finally:
        _supervising.run = None
        run.ended()


def _read_xray(run: Run) -> None:
    """The ranks' collectives, read once they are written for good: a record that cannot be read
    leaves the run without its X-ray, never without its result."""
    try:
        run.read_xray()
    except Exception as err:
        log.warning("nbspawn: could not read the collectives X-ray: %s", err)


def _bring_outputs_home(run: Run, executor: Executor) -> None:
    outputs, missing = executor.outputs(run)
    if missing:
        run.ended_as("failed", SpawnOutputError(missing, run, run.facts("failed")))
    else:
        run.brought_home(outputs)


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
        self.policy = executor.supervision
        self.interrupted_after_stop = False
        self.flooded = False  # the last read of output skipped some: the ranks write more than the view keeps
        self.hangs = HangWatch(run, view, executor)  # quiet ranks looked at; where they were when stopped
        self.desk = PromptDesk(run, view, self)  # the ranks' input(), breakpoint() and pdb, answered here
        # each rank's CPU and memory, sampled here for this machine's ranks (a node's agent samples its own
        # and relays them: ResourceWatch.relayed)
        self.costs = ResourceWatch(run, view, enabled=not self.policy.remote)
        self._liveness_at = 0.0  # when to look next for a rank that ended without its sentinel saying so
        self._ended_at_last_look: set[int] = set()  # ranks whose process had ended then, not yet reaped

    # -- starting ---------------------------------------------------------------------------------

    def start(self) -> None:
        now = time.time()
        if not self.policy.remote:
            self.desk.open(stdin_answerable())
        else:
            executor, run = self.executor, self.run
            run.where_asked_by(lambda wait: executor.where(run, wait) or "")
        with interrupts_deferred() as interrupted:
            self.pids = self.executor.start(self.run)
        self.hangs.ranks_started()
        for rank, pid in enumerate(self.pids):
            state = self.run.ranks[rank]
            # a remote rank's pid is not known yet (0): its agent tells it; --on: one sitting the cell out is "absent"
            state.pid, state.started_at, state.status = pid or None, now, "running" if self.spec.runs(rank) else "absent"
            for waitable in self.executor.waitables(rank):
                self.alive[waitable] = rank
        self.run.began()
        self.costs.ranks_started()
        if self.spec.asked.timeout is not None:
            self.deadline = time.monotonic() + self.spec.asked.timeout
        if interrupted:
            self._begin_stop("interrupt")

    @property
    def _world_goes_on(self) -> bool:
        """Its ranks outlive the cell (a kept world) and nothing has lost them yet: a failure, a stop
        or a timeout interrupts them, and they are not to be ended."""
        return self.policy.keeps_ranks and self.lost is None

    def _running(self) -> list[int]:
        """The ranks still in the cell."""
        return sorted(set(self.alive.values()))

    # -- the loop ---------------------------------------------------------------------------------

    def supervise(self) -> None:
        poll = POLL_MIN
        while self.alive:
            try:
                waitables: list[Any] = list(self.alive)
                if self.desk.prompts is not None:
                    waitables.append(self.desk.prompts)
                    if self.desk.pending and not self.run.background:
                        poll = POLL_MIN
                wait = min(poll, max(0.0, min(self.deadline, self.escalate_at) - time.monotonic()))
                ready: list[Any] = multiprocessing.connection.wait(waitables, timeout=wait)
                for _ in range(self.view.interrupts()):  # a node agent's: the kernel's, heard meanwhile
                    self._on_interrupt()
                # Stop first: under a flood, reading output is most of what this loop does
                if self.stop_reason is None:
                    self.check_stop()
                flowed = self.forward_output(heed_stop=True)
                if self.stop_reason is None:  # again, as a turn's reading can take a while under a flood
                    self.check_stop()
                if flowed:
                    poll = min(POLL_FLOOD, self.policy.poll_max) if self.flooded else POLL_MIN
                    self.hangs.output_flowed()
                else:
                    poll = min(self.policy.poll_max, poll * 2)
                    if not self.desk.prompt_notes:  # a rank at a prompt is not hung, nor are those waiting for it
                        self.hangs.quiet(self._running(), stopping=self.stop_reason is not None)
                news = [w for w in ready if w in self.alive]
                if len(news) > 1:  # each key reads a rank's error file: not for one alone (most wakes)
                    news.sort(key=self._error_time)
                for waitable in news:
                    if waitable in self.alive:
                        self._reap(self.alive[waitable], waitable)
                self._reap_the_silently_dead()
                self.check_clocks()
                self.costs.sample()
                if self.desk.prompts is not None and (self.desk.pending or self.desk.prompts in ready):
                    self.desk.serve()
                self.view.tick(self.run)
            except KeyboardInterrupt:
                self._on_interrupt()
        self.forward_output(final=True)

    def _reap_the_silently_dead(self) -> None:
        """A rank whose process ended while a child of its lives on (a ``Pool`` worker it forked, which
        holds a copy of the rank's end of its sentinel pipe and of its connection): neither says the
        rank is gone, and the cell would wait forever.  So, every :data:`LIVENESS_EVERY`, each running
        rank's process is looked at (``/proc``, ~20 µs), and one found ended at two looks in a row is
        reaped as if its sentinel had said so.  Not at the first look: a rank that has just ended as
        usual is its sentinel's to report, after the loop has read all it wrote (reaped at once, a bar's
        last states came after the rank's end and were printed as lines: the terminal test saw it)."""
        now = time.monotonic()
        if self.policy.remote or not self.policy.watches_hangs or now < self._liveness_at:
            return  # a node's agent: its ranks are watched as before (the kernel's run ends if one goes silent)
        self._liveness_at = now + LIVENESS_EVERY
        ended = {rank for rank in self._running() if self._exited(rank)}
        silent, self._ended_at_last_look = sorted(ended & self._ended_at_last_look), ended
        if not silent:
            return
        self.forward_output()  # all it wrote before it ended, before its end is told
        for rank in silent:
            waitables = [w for w, r in self.alive.items() if r == rank]
            if waitables:
                self._reap(rank, waitables[-1])  # its sentinel (a kept world's rank: after its connection)

    # -- prompts ----------------------------------------------------------------------------------

    def check_stop(self) -> None:
        """The view's Stop button or ``run.stop()``; or, from a node agent's view, a reason to stop
        its ranks as a failure does (another node failed, the kernel is gone)."""
        request = self.view.wants_stop()
        if isinstance(request, str) and request:
            self.stopped_by = request
            self._begin_stop("peer")
        elif request or self.run.stop_requested_by:
            self.stopped_by = self.run.stop_requested_by or "Stop button"
            self._begin_stop("stop")

    def _error_time(self, waitable: Any) -> float:
        """Among ranks that ended together, the one whose error was recorded first is the root cause."""
        record = self.run.ranks[self.alive[waitable]].read_error()
        return record.time if record else float("inf")

    def forward_output(self, final: bool = False, heed_stop: bool = False) -> bool:
        """New output to the view; whether there was any.  ``heed_stop`` (the loop's own turns): a Stop
        that came while it was read is acted on before the view takes it in (under a flood each can
        take a while; a prompt's watcher, which also forwards output, leaves Stop to the prompt)."""
        view = self.view
        budget = view.read_budget
        if budget is not None and self.stop_reason is not None:
            budget = min(budget, STOPPING_READ_BUDGET)  # ending: only the newest lines, and fast
        events = self.executor.read_output(self.run, final, budget)
        if heed_stop and self.stop_reason is None:
            self.check_stop()
        items = self.run.display_items
        shown = self.spec.shown_ranks  # --ranks: the one place the others' output is left out
        self.flooded = any(event.kind == "skipped" for event in events)
        relayed = False
        now = time.monotonic()
        for event in events:
            if event.kind != "costs":
                self.hangs.rank_wrote(event.rank, now)
            if event.kind == "costs":  # a node's rank's figures, as its agent sampled them
                self.costs.relayed(self.run.ranks[event.rank], event.value)
                relayed = True
                continue
            if shown is not None and event.rank not in shown:
                continue
            if event.kind == "display":
                for item in items.convert(event.rank, event.value):
                    view.display(event.rank, item)
            elif event.kind == "item":
                view.display(event.rank, event.value)
            elif event.kind == "skipped":
                view.skipped(event.rank, event.value)
            else:
                view.output(event.rank, event.kind, event.value)
        if relayed:
            self.costs.relayed_all()
        return any(event.kind != "costs" for event in events)  # figures are not output: quiet ranks stay quiet (a hang's look)

    def _reap(self, rank: int, waitable: Any) -> None:
        ended = self.executor.ended(rank, waitable)
        if ended is None:  # news from the rank, not its end (a kept world's rank began the cell)
            return
        for other in [w for w, r in self.alive.items() if r == rank]:
            del self.alive[other]
        code, died = ended.exit_code, ended.died
        state = self.run.ranks[rank]
        state.ended_at = time.time()
        state.exit_code, state.lives_on = code, not died
        self.costs.read_gpu(state)  # what it held on its GPUs at the last (its peaks, for the saved view)
        self.costs.read_peak(state)  # and its own peak resident memory: a cell shorter than a sample has one
        self.end_order.append(rank)
        if died and self._world_goes_on:
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            with contextlib.suppress(ValueError):
                how = signal.Signals(-code).name if code < 0 else how
            if rank not in self.signalled:
                how = self.costs.killed_for_memory(state) or how
            self.lost = f"rank {rank} died ({how})"
        if state.exit_code == 0:
            state.status = "done"
        else:
            state.failure = self._failure(state)
            state.status = "stopped" if state.failure.stopped else "failed"
            if state.status == "failed" and self.root is None and self.stop_reason is None:
                self.root = self._first_to_fail(rank)
                if self.root != rank:  # another rank raised first, and is still leaving
                    _failed_after(state, self.root)
                self.view.rank_ended(self.run, state)  # first: a node agent tells the kernel at once
                self._begin_stop("failure")
                return
            if state.status == "failed" and self.root not in (None, rank) and self._failed_later(state):
                _failed_after(state, self.root)  # its collective broke as the first failure's rank left, say
            if died and self.lost and self.stage in ("", "sigint"):
                self._terminate()  # a kept world's rank died while others were being interrupted
        self.view.rank_ended(self.run, state)

    def _first_to_fail(self, rank: int) -> int:
        """The run's first failure: this rank, unless a rank still running (leaving, its error written)
        recorded its error earlier. Its peers can fail and exit before it has (their collective breaks
        as soon as it raised), and the root cause is the one that raised first, not the first reaped."""
        mine = self.run.ranks[rank].read_error()
        if mine is None:
            return rank
        first, when = rank, mine.time
        for other in sorted(set(self.alive.values())):
            record = self.run.ranks[other].read_error()
            if record is not None and record.time < when and record.exc_type != "KeyboardInterrupt":
                first, when = other, record.time
        return first

    def _failed_later(self, state: RankState) -> bool:
        """It raised, and ended after the run's first failure was chosen: told as failing after it (a
        peer's collective fails, "Connection closed by peer", once the rank that raised has left; or
        the same bug raised on every rank).  Its record's time may be a little earlier than the first
        failure's: taken before it was written, it was not there yet when the first was chosen (the
        earliest record there then, ``_first_to_fail``), so the two raised together."""
        assert self.root is not None
        return self.run.ranks[self.root].read_error() is not None and state.read_error() is not None

    def _failure(self, state: RankState) -> RankFailure:
        code = state.exit_code or 0
        failure = RankFailure(rank=state.rank, pid=state.pid, exit_code=code, node=state.node)
        if code < 0:
            with contextlib.suppress(ValueError):
                failure.signal_name = state.signal_name = signal.Signals(-code).name
            failure.signal_name = failure.signal_name or f"signal {-code}"
            if state.rank not in self.signalled:
                failure.memory = self.costs.killed_for_memory(state)
        record = state.read_error()
        if record:
            failure.exc_type = record.exc_type
            failure.message = record.message
            if is_cuda_out_of_memory(record.exc_type, record.message):
                failure.memory = self.costs.out_of_gpu_memory(state, record.message)
            # frames in functions from earlier cells: "Cell In[3], line 2, in f", for every view
            traceback = rewrite_notebook_frames(record.traceback or "", self.spec.cell_numbers)
            failure.traceback = traceback or None
        interrupted = failure.exc_type == "KeyboardInterrupt" or code == EXIT_INTERRUPTED
        failure.stopped = state.rank in self.signalled and (record is None or interrupted)
        seen = self.hangs.seen_at_stop.get(state.rank)
        if (
            failure.stopped
            and interrupted
            and seen
            and seen not in (STILL_STARTING, CELL_ENDED, NOT_ASKED)
            and self.spec.program is None
        ):
            # where it was, not how the interrupt unwound it (inside torch's logging, a peer's
            # "Connection closed"): ranks stopped at the same place then read as one
            failure.traceback, failure.stack = None, seen
        if (failure.stopped or failure.signal_name) and not failure.traceback and not failure.stack:
            failure.stack = self._stack(state)  # no traceback of its own: say where it was
        if not failure.stopped and not failure.traceback and not failure.stack:
            tail = _last_lines(state.stderr_path, 10)  # a program's own last words
            failure.traceback = f"last lines of its stderr ({state.stderr_path}):\n{tail}" if tail else None
        return failure

    def _stack(self, state: RankState) -> str | None:
        dump = state.read_stacks()
        if dump.strip():
            if self.spec.program is not None:
                return program_stack(dump) or None
            return main_thread_stack(dump, self.spec.cell) or None
        # Signalled before it could report: it had not installed its handlers, so not begun the cell
        # (a program that is not Python has no stack to give); unless it had installed them by the time
        # the signal came, unasked: it may have begun, where is not known.
        if self.policy.remote:  # its agent sent no stack: there was none to send
            return None
        if state.rank not in self.signalled or self.spec.program is not None:
            return None
        return NOT_ASKED if os.path.exists(state.stacks_path) else STILL_STARTING

    # -- stopping ---------------------------------------------------------------------------------

    def check_clocks(self) -> None:
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
            if self._world_goes_on:
                self.lost = "interrupted twice"
            self._send(signal.SIGKILL)
            self.stage, self.escalate_at = "sigkill", float("inf")

    def _begin_stop(self, reason: str) -> None:
        self.run.stop_began()
        if reason in ("interrupt", "stop", "timeout"):
            self.view.stopping(self.run)  # first: the page hears it before the look below
            self.hangs.look_before_stopping(self._running())
        self.stop_reason = reason
        # ranks that live on are interrupted first, so they can come back and the world survives
        if reason in ("interrupt", "stop") or self._world_goes_on:
            self._send(signal.SIGINT)
            self.stage = "sigint"
            self.escalate_at = time.monotonic() + self.spec.asked.grace_period
        elif reason == "failure":
            # the others fail on their own as the first failure's rank leaves their collective ("Connection
            # closed by peer"): given a moment to, they are told as failing after it, with their own error,
            # not as stopped (a busy machine once left them too little time to raise before the SIGTERM)
            self.stage = "settling"
            self.escalate_at = time.monotonic() + FAILURE_SETTLE
        else:
            self._terminate()

    def _escalate(self) -> None:
        if self.stage == "settling":
            self._terminate()
        elif self.stage == "sigint":
            if self._world_goes_on:
                stuck = ", ".join(map(str, sorted(set(self.alive.values()))))
                self.lost = (
                    f"rank {stuck} did not come back within {self.spec.asked.grace_period:g} s of the interrupt "
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
        alive = set() if self.policy.remote else set(self.alive.values())
        asked: dict[int, tuple[str, int]] = {}
        for rank in alive:
            state = self.run.ranks[rank]
            if os.path.exists(state.stacks_path):
                state.stack_from = _size(state.stacks_path)  # earlier dumps (a look while it ran) are not this one
                asked[rank] = (state.stacks_path, state.stack_from)
                signal_group(self.pids[rank], signal.SIGUSR1)
        if asked:  # whole dumps: SIGTERM in the middle of one would cut off where the rank was
            await_dumps(asked, STACK_DUMP_WAIT)
        self._send(signal.SIGTERM)
        self.stage = "sigterm"
        self.escalate_at = time.monotonic() + self.spec.asked.grace_period

    def _send(self, sig: int) -> None:
        ranks = sorted(set(self.alive.values()))
        self.signalled.update(rank for rank in ranks if not self._exited(rank))
        self.executor.signal_ranks(ranks, self.pids, sig)
        self.run.ranks_signalled()

    def _exited(self, rank: int) -> bool:
        """The rank's process has ended, not reaped yet: it ended as it chose (``os._exit(3)`` as another
        rank failed), so a signal now stops nothing, and it is told as a rank that failed, not one stopped."""
        if self.policy.remote or not self.pids[rank]:
            return False
        if _pids.recycled(self.pids[rank]):
            return True  # reaped (by the forkserver), and its pid another process's since
        state = _pids.state(self.pids[rank])
        if state is not None:
            return state in "ZX"  # a zombie until its parent reaps it (or reaped already: gone)
        import psutil  # no /proc (importing it took 36 ms of a Stop here, 0.2 s under a flood)

        try:  # a zombie until its parent reaps it: the kernel, or the forkserver that forked it
            return psutil.Process(self.pids[rank]).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.NoSuchProcess:  # reaped already (by the forkserver)
            return True
        except psutil.Error:
            return False

    # -- the end ----------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Leave nothing behind: no rank, no zombie, no descriptor, no process a rank started."""
        with interrupts_deferred():  # an impatient second Ctrl-C must not leave ranks unreaped (nested: fine)
            self._cleanup()

    def _cleanup(self) -> None:
        if self._world_goes_on and self.alive:
            self.lost = "its cell did not finish"  # an error in the supervisor itself
        self.run.world_lost_because(self.lost)  # first: a kept world records why it was lost (its next cell says it)
        self.executor.cleanup(lose=self.lost is not None)
        self.desk.close()
        self.alive.clear()
        self.run.close_logs()

    def outcome(self) -> tuple[RunStatus, BaseException | None]:
        """How the run ended, and the error that says so (``Run.ended_as``)."""
        run, ranks = self.run, self.run.ranks
        stopped = [f for r in self.end_order if (f := ranks[r].failure) and r != self.root]
        if self.stop_reason is None:
            return "succeeded", None
        if self.stop_reason == "failure" and self.root is not None:
            root = ranks[self.root].failure
            assert root is not None  # the root cause is chosen once its failure is recorded
            kind = RankRaisedError if root.exc_type else RankExitedError
            return "failed", kind([root, *stopped], run, run.facts("failed"), cause=self._left_without(root))
        # what the look before stopping saw; on a cluster whose agents did not answer it in time, the
        # stacks each agent sent with its ranks' ends are what there is
        seen = self.hangs.seen_at_stop or {f.rank: f.stack for f in stopped if f.stack and self.policy.remote}
        # the verdict and the chips' notes count the same seconds: to the look before stopping, where there was one
        now = self.hangs.looked_at_stop or time.time()
        verdict = hang_verdict(
            seen,
            self.hangs.collectives_at_stop,
            now=now,
            sitting_out=self.spec.sitting_out(),
            at_stop=True,
            nodes=run.nodes(),
            finished=self.hangs.finished(),
        )
        self.hangs.mark_where_stopped(seen, now)
        if self.stop_reason == "timeout":
            return "timeout", SpawnTimeoutError(self.spec.asked.timeout or 0, stopped, run, run.facts("timeout"), verdict=verdict)
        # interrupt, Stop, or (a node agent's run) stopped for the kernel's reasons
        status: RunStatus = "interrupted" if self.stop_reason == "interrupt" else "stopped"
        return status, SpawnInterrupted(stopped, run, stopped_by=self.stopped_by, facts=run.facts(status), verdict=verdict)

    def _left_without(self, root: RankFailure) -> str | None:
        """The cause of the root rank's failure when it is a peer that skipped a collective and finished
        the cell (``events._where.left_without``); the chips of both say it, as a hang's would."""
        finished = self.hangs.finished()
        skipped = left_without(self.run.xray, root.rank, finished, root.traceback) if finished else None
        if skipped is None:
            return None
        for rank, note in skipped.notes().items():
            self.run.ranks[rank].note = note
        return skipped.text


def _failed_after(state: RankState, root: int) -> None:
    """The rank failed once the run's first failure (``root``) had: its own status, and its traceback
    cut to the user's lines, torch's and gloo's frames under them counted (a peer's broken collective
    is the same few frames of torch.distributed on every rank)."""
    assert state.failure is not None
    state.status, state.failure.after = "failed_after", root
    if state.failure.traceback:
        state.failure.traceback = fold_library_frames(state.failure.traceback)


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


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
