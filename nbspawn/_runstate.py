"""The state of one run, shared by the launcher (which writes it) and the views (which read it).

It is also what users inspect afterwards: ``nbspawn.last_run()`` returns it, with every rank's exit
code or signal, duration, log paths and error.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from . import _errorfile
from ._errorfile import ErrorRecord
from ._options import ROW
from ._rankdir import RankDir
from ._spec import RunSpec
from .errors import RankFailure, RunFacts, SpawnError
from .events._display import DisplayItems
from .events._gpumemory import DeviceHeld, GpuTotal
from .events._resources import MemoryLimit
from .events._streams import Event, RankStreams
from .events._where import ANSWER_WAIT, RankToAsk, where_now
from .events._xray import XRay, analyse, read_records
from .events._xray_values import beyond, line_up, read_values

# the views' messages carry these as they are (views._messages; their TypeScript twins in messages.ts)
# failed_after: it failed once the run's first failure had (``failure.after`` names that rank), most often because
# of it (a peer's collective broke as that rank left); absent: --on, it sits the cell out
RankStatus = Literal["starting", "running", "done", "failed", "failed_after", "stopped", "absent"]
RunStatus = Literal["starting", "running", "succeeded", "failed", "timeout", "interrupted", "stopped"]


@dataclass
class RankState:
    rank: int
    dir: str
    pid: int | None = None
    status: RankStatus = "starting"
    exit_code: int | None = None  # negative: killed by that signal
    signal_name: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    # a kept world's rank that ended the cell and not its process (it raised, say, and runs the next cell):
    # its exit_code is the cell's outcome (1: it raised), not a process's, so the views show none (issue #57)
    lives_on: bool = False
    failure: RankFailure | None = None
    # A cluster run's rank: its node ("node 1 (hostb)") and where its logs are there ("hostb:/tmp/...");
    # ``dir`` is then the kernel's copy of what the rank's agent reported (error.json, stacks.log).
    node: str | None = None
    remote_dir: str | None = None
    # what nbspawn noticed while the rank runs: "waiting in barrier #3 for 25 s; rank 2 has not entered it"
    note: str | None = None
    prompt: str | None = None  # at a prompt now: "pdb" (a breakpoint, a post-mortem) or "input" (input(), getpass())
    stack_from: int | None = None  # where in stacks.log the dump asked for when it was stopped begins
    # what it costs, sampled about once a second from the kernel's side (its children included):
    # CPU now (percent of one core), resident memory now and its peak in this run, in bytes
    cpu_percent: float | None = None
    rss: int | None = None
    peak_rss: int | None = None
    # on the GPUs it used (its own thread's record, ``ranks._devicememory``): what its torch holds there
    # now, each device's peaks being this run's; () where it used none (or its node's rank: not sampled)
    gpu: tuple[DeviceHeld, ...] = ()

    @property
    def peak_gpu_allocated(self) -> int | None:
        """The most its tensors took on its GPUs in this run (torch's ``max_memory_allocated``), bytes."""
        return sum(device.peak_allocated for device in self.gpu) if self.gpu else None

    @property
    def peak_gpu_reserved(self) -> int | None:
        """The most its torch reserved on its GPUs in this run (its caching allocator's pool), bytes."""
        return sum(device.peak_reserved for device in self.gpu) if self.gpu else None

    def read_stacks(self, limit: int | None = None) -> str:
        """The stack dump taken when the rank was stopped (the whole log if none was asked for), or
        its first ``limit`` characters."""
        try:
            with open(self.stacks_path, encoding="utf-8", errors="replace") as fh:
                fh.seek(self.stack_from or 0)
                return fh.read(limit) if limit is not None else fh.read()
        except OSError:
            return ""

    def log_path(self, name: str) -> str:
        """Where the user finds the rank's ``name`` log (a ``nbspawn._rankdir`` name): here, or
        ``host:path`` on its node."""
        return f"{self.remote_dir}/{name}" if self.remote_dir else os.path.join(self.dir, name)

    @property
    def files(self) -> RankDir:
        return RankDir(self.dir)

    @property
    def stdout_path(self) -> str:
        return self.files.stdout

    @property
    def stderr_path(self) -> str:
        return self.files.stderr

    @property
    def error_path(self) -> str:
        return self.files.error

    @property
    def display_path(self) -> str:
        return self.files.display

    @property
    def stacks_path(self) -> str:
        return self.files.stacks

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    def read_error(self) -> ErrorRecord | None:
        """The rank's error.json (torch elastic's layout, plus nbspawn's structured fields)."""
        return _errorfile.read(self.error_path)


@dataclass
class Run:
    spec: RunSpec
    ranks: list[RankState] = field(default_factory=list)
    status: RunStatus = "starting"
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    # a stopped run (Stop, an interrupt, --timeout): when its supervisor began to stop it, and when it
    # interrupted the ranks; with the ranks' ended_at and the run's, where the time from a click went
    stop_began_at: float | None = None
    ranks_signalled_at: float | None = None
    error: BaseException | None = None
    outputs: dict[str, list] = field(default_factory=dict)  # --out: name -> one value per rank
    background: bool = ROW["background"].typed_default  # supervised by a thread of its own (%%spawn --bg)
    waited: bool = False  # run.wait() was called after it ended (its error, if any, was raised)
    end_shown: bool = False  # its view draws how it ended in its own cell (the widget): nothing to tell later
    world: str | None = None  # the kept world this cell ran on
    world_cell: int | None = None  # which of that world's cells this is, from 1
    world_dir: str | None = None  # that world's directory (its ranks' own, between cells)
    world_lost: str | None = None  # why that world could not go on, if it could not
    shown: dict[str, object] | None = field(default=None, repr=False)  # its frozen view's mime bundle (%spawn show)
    memory: MemoryLimit | None = None  # the machine's (or container's) memory at the last sample
    memory_warning: str | None = None  # said once, when the ranks brought it (or a GPU's) near its end
    # each GPU the ranks used, at the most they held on it together in one sample (by GpuTotal.key)
    gpu_peaks: dict[str, GpuTotal] = field(default_factory=dict)
    node_batches: list[int] = field(default_factory=list)  # a cluster run: data messages received from each node
    xray: XRay | None = field(default=None, repr=False)  # what the ranks did together (--xray), read by read_xray()
    display_items: DisplayItems = field(init=False, repr=False)
    _streams: list[RankStreams] = field(default_factory=list, init=False, repr=False)

    # Its own; other modules go through its methods (the supervisor's state is the supervisor's)
    _done: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _stop_requested: str | None = field(default=None, init=False, repr=False)  # who asked: "run.stop()", "%spawn stop"
    _on_wait: list[Callable[[Run], None]] = field(default_factory=list, init=False, repr=False)  # when_waited's
    _on_end: list[Callable[[Run], None]] = field(default_factory=list, init=False, repr=False)  # when_ended's
    _ending: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _ask_elsewhere: Callable[[float], str] | None = field(default=None, init=False, repr=False)  # where_asked_by's

    def __post_init__(self) -> None:
        self.display_items = DisplayItems(self.spec.asked.max_image_kb * 1024, {})

    def read_xray(self, live: bool = False) -> XRay | None:
        """What the ranks did together so far, from the records they write (``ranks._xray``): kept in
        ``run.xray``; None for a run not X-rayed or one whose ranks ran no collective.  ``live``: the
        run goes on, so a collective some ranks entered and others not yet is in flight, not a hang
        (a straggler is not hung: issue #41, L2); the hang watch says when one is."""
        if not self.spec.xrayed:
            return None
        dirs = {state.rank: state.dir for state in self.ranks if self.spec.runs(state.rank)}
        records = read_records(dirs)
        if not records:
            return None
        calls = {} if live else read_values(dirs)  # the cell's calls, written at its end: a live read finds none yet
        xray = analyse(records, in_flight=live, calls=calls)
        if self.spec.xray_values and calls:
            xray = replace(xray, values=line_up(calls, xray.numbers), values_beyond=beyond(calls))
        if xray.count or xray.unrecorded:  # a cell of sends and receives only has its view too
            self.xray = xray
        return self.xray

    # -- what torch's ProcessContext.join and elastic's PContext.wait offer, in one shape ----------

    @property
    def done(self) -> bool:
        """Whether the run has ended (ranks gone, logs closed, its error known)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends or ``timeout`` seconds pass; then raise its error, as a foreground
        cell would, or return whether it has ended. ``--out`` names are bound once it has."""
        if not self._done.wait(timeout):
            return False
        if not self.waited:
            self.waited = True
            for callback in self._on_wait:
                callback(self)
        self.raise_for_status()
        return True

    def ended_within(self, timeout: float | None) -> bool:
        """Whether the run has ended, waiting up to ``timeout`` seconds for it; unlike ``wait`` it raises
        nothing and binds nothing (for the package's own threads, not the user's)."""
        return self._done.wait(timeout)

    def when_ended(self, callback: Callable[[Run], None]) -> None:
        """Call ``callback(run)`` once the run has ended, as it ends (now, if it has): before the run
        reads ``done`` (``ended``), so a callback must not wait for the run."""
        with self._ending:
            if not self.done:
                self._on_end.append(callback)
                return
        callback(self)

    def when_waited(self, callback: Callable[[Run], None]) -> None:
        """Call ``callback(run)`` in the first ``wait()`` that sees the run ended, before its error is
        raised (a background run's ``--out`` names, bound in the kernel then)."""
        self._on_wait.append(callback)

    def ended(self) -> None:
        """The run is over (by its supervisor): what waited for it is told, then it is ``done``.

        In that order, so that whatever returns once the run is done (``%spawn stop``, ``wait()``) finds
        its ``Out[]`` line already redrawn: told after, the redraw could come once the cell that stopped
        the run had ended, and land nowhere the user looks. A callback added while others run is called
        before the run is done too."""
        while True:
            with self._ending:
                callbacks, self._on_end = self._on_end, []
                if not callbacks:
                    self._done.set()
                    return
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:  # noqa: S112 - one broken display must not keep the others from their end
                    continue

    def _ipython_display_(self) -> None:
        """``Out[N]`` of a run (``%%spawn --bg``'s value): its line, redrawn as the run ends, however it
        ends (stopped by ``%spawn stop`` too), instead of saying "running" forever."""
        from IPython.display import display

        if self.done:
            display({"text/plain": repr(self)}, raw=True)
            return
        handle = display({"text/plain": repr(self)}, raw=True, display_id=True)
        self.when_ended(lambda run: handle.update({"text/plain": repr(run)}, raw=True))

    def stop(self, by: str = "run.stop()") -> None:
        """Stop every rank, as the view's Stop button does; returns at once (``wait()`` to join)."""
        self._stop_requested = by

    @property
    def stop_requested_by(self) -> str | None:
        """Who asked the run to stop (``"run.stop()"``, ``"%spawn stop"``), or None if no one has; its
        supervisor stops it when it next looks."""
        return self._stop_requested

    def where_asked_by(self, ask: Callable[[float], str]) -> None:
        """From now on ``where`` is answered by ``ask(wait)``: ranks that cannot be asked from this
        machine (a cluster's, by their nodes' agents), said by their executor."""
        self._ask_elsewhere = ask

    def ran_on_world(self, name: str, cell: int, world_dir: str | None = None) -> None:
        """This run is cell number ``cell`` (from 1) of kept world ``name``, whose ranks were started with
        their directories under ``world_dir`` (where torch writes what it writes once a process)."""
        self.world, self.world_cell, self.world_dir = name, cell, world_dir

    def where(self, wait: float = ANSWER_WAIT) -> str:
        """Every running rank's stack now, ranks at the same place grouped (``%spawn where``, the
        Where button); empty if no rank runs."""
        if self._ask_elsewhere is not None:
            return self._ask_elsewhere(wait)
        asked = [RankToAsk(s.rank, s.pid, s.stacks_path, s.node) for s in self.ranks if s.status == "running"]
        return where_now(asked, self.spec.cell, self.spec.program, self.spec.cell_numbers, wait=wait)

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def run_dir(self) -> str:
        return self.spec.run_dir

    @property
    def nprocs(self) -> int:
        return self.spec.nprocs

    @property
    def duration(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def facts(self, status: RunStatus | None = None) -> RunFacts:
        """What its error says of it besides its ranks; ``status``: how it ended, where its error is made
        before the run is told (``ended_as``)."""
        return RunFacts(
            self.run_dir,
            status or self.status,
            self.world,
            self.world_lost,
            self.world_cell,
            self.node_log_dirs(),
            self.nccl_dumps(),
        )

    # -- what its supervisor and samplers record.  After it is made, a run's fields are written only
    # here: the supervisor, the resource sampler, a cluster's executor and the views call these, and
    # what is theirs (a background run told at a later cell, a page's runs) they keep themselves.

    def began(self) -> None:
        """Its ranks are started."""
        self.status = "running"

    def stop_began(self) -> None:
        """Its supervisor begins to stop it (Stop, an interrupt, ``--timeout``, a failure)."""
        self.stop_began_at = time.time()

    def ranks_signalled(self) -> None:
        """Its ranks were sent a signal to stop: the first time counts."""
        if self.ranks_signalled_at is None:
            self.ranks_signalled_at = time.time()

    def world_lost_because(self, why: str | None) -> None:
        """Why the kept world it ran on cannot go on (None: it goes on); said by its next cell."""
        self.world_lost = why

    def ended_as(self, status: RunStatus, error: BaseException | None = None) -> None:
        """How it ended, and the error that says so (``raise_for_status``); the last word on it."""
        self.status, self.error = status, error

    def brought_home(self, outputs: dict[str, list]) -> None:
        """Its ``--out`` values, one per rank by name, read in the kernel."""
        self.outputs = outputs

    def sampled_memory(self, memory: MemoryLimit | None) -> None:
        """The machine's (or its container's) memory at the latest sample."""
        self.memory = memory

    def gpu_held(self, total: GpuTotal) -> None:
        """What the ranks held on one GPU together in one sample: kept where it is the most yet
        (``gpu_peaks``: what the run needed of that GPU)."""
        before = self.gpu_peaks.get(total.key)
        if before is None or total.reserved > before.reserved:
            self.gpu_peaks[total.key] = total

    def warn_memory(self, warning: str) -> None:
        """Memory (a machine's, a GPU's, a node's) nears its end: said once, the first warning kept."""
        if self.memory_warning is None:
            self.memory_warning = warning

    def counts_batches(self, nodes: int) -> None:
        """A cluster run on ``nodes`` nodes: their data messages are counted from here, none yet."""
        self.node_batches = [0] * nodes

    def batch_from(self, node: int) -> None:
        """A cluster run's data message from its node number ``node``, counted."""
        self.node_batches[node] += 1

    def shown_as(self, bundle: dict[str, object]) -> None:
        """Its frozen view's mime bundle, as its view drew it at its end (``%spawn show`` draws it again)."""
        self.shown = bundle

    def nccl_dumps(self) -> tuple[str, ...]:
        """The dumps NCCL's watchdog wrote into the ranks' directories when it timed a collective out.  A
        kept world's rank has the file name it was given at its start, in the world's directory, not the
        cell's (torch's writer is a process-wide singleton that keeps the first name it was given)."""
        offset = self.spec.rank_offset
        dirs = [(offset + state.rank, state.dir) for state in self.ranks if not state.node]
        if self.world_dir is not None:
            dirs += [(rank, os.path.join(self.world_dir, str(rank))) for rank, _ in dirs]
        found = (RankDir(rank_dir).nccl_trace(rank) for rank, rank_dir in dirs)
        return tuple(dict.fromkeys(path for path in found if os.path.exists(path)))

    def nodes(self) -> dict[int, str]:
        """A cluster run's node of each rank ("node 1 (b)"); empty on one machine."""
        return {state.rank: state.node for state in self.ranks if state.node}

    def node_log_dirs(self) -> dict[str, str]:
        """A cluster run's log directories, ``host:path`` by node, as far as its agents told them."""
        return {state.node: state.remote_dir.rsplit("/", 1)[0] for state in self.ranks if state.node and state.remote_dir}

    def prepare_logs(self, ranks_make_theirs: bool = False) -> None:
        """Create ``<run-dir>/<rank>/`` and open a reader on its files before any rank writes.

        ``ranks_make_theirs``: each rank makes its own directory and files as it begins the cell (a kept
        world's ranks, which are running already: beside the kernel's work, not in its way); the kernel
        makes the run directory and reads the ranks' files once they are there."""
        os.makedirs(self.spec.run_dir, mode=0o700, exist_ok=True)  # private to the user (docs/guide.md: What a run exposes)
        for rank in range(self.spec.nprocs):
            state = RankState(rank=rank, dir=self.spec.rank_dir(rank))
            if not ranks_make_theirs:
                os.mkdir(state.dir, 0o700)
            self.ranks.append(state)
            self._streams.append(RankStreams(rank, state.dir, made=not ranks_make_theirs))
            self.display_items.paths[rank] = state.display_path

    def read_new_output(self, final: bool = False, budget: int | None = None) -> list[Event]:
        """Everything the ranks wrote since the last call, each rank's in the order it was written.

        ``budget``: about how many bytes of each text stream of each rank to keep from this read
        (the newest whole lines; the rest is skipped and counted).  ``final`` also flushes and closes.
        """
        out: list[Event] = []
        for streams in self._streams:
            if final:
                out.extend(streams.read(budget))
                out.extend(streams.close())
            else:
                out.extend(streams.read(budget))
        return out

    def close_logs(self) -> None:
        """Its ranks' files are read for the last time: the run has ended (``ended_at``), how is said next."""
        for streams in self._streams:
            streams.release()
        self.ended_at = time.time()

    def raise_for_status(self) -> None:
        if self.error is not None:
            raise self.error

    def __repr__(self) -> str:
        ranks = ", ".join(f"{r.rank}:{r.status}" for r in self.ranks)
        took = f" in {self.duration:.2f}s" if self.duration is not None else ""
        return f"<nbspawn Run {self.run_id} {self.status}{took} [{ranks}] logs={self.run_dir}>"


__all__ = ["RankState", "Run", "SpawnError"]
