"""Kept worlds: ranks that live across cells.

    %%spawn --world w -n 4 --backend gloo      # the first cell naming w starts its 4 ranks
    import torch.distributed as dist
    t = torch.ones(1) * dist.get_rank()

    %%spawn --world w                          # the same processes; t is still there
    dist.all_reduce(t); print(t)

    %spawn status                              # the kept worlds
    %spawn stop w                              # nothing of w is left but its logs

A :class:`World` owns its rank processes (started by ``torch.multiprocessing.start_processes`` with
``nbspawn.ranks._worldloop.run_world_rank``) and one pipe per rank.  Each cell on it is an ordinary run
(its own spec, log directory, view and error) whose executor, :class:`WorldCell`, hands the cell to
the ranks instead of starting new ones.  The supervisor applies the same failure policy as to a
fresh run, except that a failed cell *interrupts* the other ranks: if all of them come back within
the grace period the world lives on, else it is torn down the fresh way and the error says so.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, cast

from .. import _cuda
from .._clash import Settled
from .._decide import backend_here, resolve_nprocs
from .._listen import host_store
from .._machine import Machine
from .._options import ROW, Backend, StartMethod
from .._rankdir import RankDir
from .._runstate import Run
from .._source import CellSource
from .._spec import RunSpec
from ..errors import SpawnUsageError
from ..handoff._ipc import Ledger
from ..handoff._names import names_bound
from ..handoff._shm import Payload
from ..ranks._capture import ready_to_fork_display
from ..ranks._cell import EXIT_INTERRUPTED, EXIT_RAISED
from ..ranks._fds import kernel_descriptors
from ..ranks._worldloop import EXITED, INTERRUPTED, OK, RAISED, STARTED, WorldJob, run_world_rank
from . import _kept
from ._base import Executor, RankEnd, Supervision
from ._kept import KeptWorld, Lost
from ._procs import (
    end_processes,
    inherited_heap_frozen,
    interrupts_deferred,
    pid_of,
    prepare_forkserver,
    ranks_reaped,
    ranks_started,
    signal_group,
)


@dataclass(frozen=True)
class KeptFailure:
    """A failure a world's rank keeps for ``%spawn debug`` (``ranks._worldloop.keep_failure`` is its end)."""

    rank: int
    cell: CellSource  # the cell that failed there
    cell_no: int  # which of the world's cells it was
    summary: str  # "ValueError: bad shape"
    time: float  # when it was recorded: the earliest of a cell's failures is its root cause
    # IPython's cell files -> In[N] as that cell ran: what its post-mortem's pdb calls them
    cell_numbers: Mapping[str, int] = field(default_factory=dict)


NOT_KEPT = frozenset({"KeyboardInterrupt", "SystemExit", "GeneratorExit", "DebuggerQuit", "NoPromptError"})


@dataclass
class World(KeptWorld):
    """A kept world here: rank processes of this machine that run cell after cell, until stopped or lost."""

    # spec: how it was started: nprocs, start method, backend, env, ports, the between-cells logs
    base_dir: str  # where its cells' <run-id>/ directories go
    processes: list[BaseProcess] = field(default_factory=list)
    conns: list[Connection] = field(default_factory=list)
    killed: bool = False
    kept: dict[int, KeptFailure] = field(default_factory=dict)  # rank -> the last failure it keeps
    # --start-method as the user gave it (auto unless given): a lost world started again resolves it
    # again, for the kernel as it is then (CUDA touched since, say), instead of insisting on spec's
    asked_start_method: StartMethod = ROW["start_method"].typed_default
    store: Any = None  # the world's TCPStore, on loopback, for its life (a world on one machine)
    # the CUDA IPC references its cells sent: what a rank still holds when the world ends (a DDP model over
    # --share parameters, a rank killed) is released for it once it is reaped (handoff._ipc)
    ipc: Ledger = field(default_factory=Ledger)

    def keep_failures(self, run: Run, cell: CellSource) -> None:
        """What each rank that raised in this cell keeps (the ranks' rule: an exception, not an interrupt)."""
        for state in run.ranks:
            record = state.read_error() if state.status in ("failed", "failed_after") else None
            if record is not None and record.exc_type and record.exc_type not in NOT_KEPT:
                summary = f"{record.exc_type}: {record.message}" if record.message else record.exc_type
                self.kept[state.rank] = KeptFailure(state.rank, cell, self.cells, summary, record.time, run.spec.cell_numbers)

    @property
    def pids(self) -> list[int]:
        return [pid_of(p) for p in self.processes]

    @property
    def log_dir(self) -> str:
        """What the ranks print between cells goes to <log_dir>/<rank>/."""
        return self.spec.run_dir

    def settled(self) -> Settled:
        return _kept.settled_here(self.spec)

    def refuse_if_lost(self) -> None:
        lose_if_a_rank_died(self)

    def auto_nprocs(self, here: Machine) -> int:  # on a TPU world: its own count, one rank per chip (nbspawn._tpu), not the GPUs'
        return self.spec.nprocs if self.spec.accelerator_envs else resolve_nprocs("auto", here.with_user_env(self.spec.env))

    def auto_backend(self, nprocs: int, here: Machine) -> str:
        return backend_here("auto", nprocs, here.with_user_env(self.spec.env))

    def lost_record(self, why: str | None) -> Lost:
        """Its settings as they were resolved, but its start method as the user asked for it (auto
        unless given): the lost world's own (fork, chosen by auto) would be refused as an explicit fork
        once CUDA was touched in the kernel (after an NCCL failure, say), though the user never chose one."""
        spec = self.spec
        backend = cast(Backend, spec.backend)
        # the options that define it as it ran (its first cell's: fixed_of), those decided with its ranks resolved
        return Lost(
            why,
            replace(spec.asked, nprocs=spec.nprocs, start_method=self.asked_start_method, backend=backend, env=dict(spec.env)),
        )

    def pids_now(self) -> list[int]:
        return self.pids

    def logs(self) -> str:
        return self.log_dir

    def start(self) -> None:
        from torch.multiprocessing import start_processes

        spec = self.spec
        os.makedirs(spec.run_dir, mode=0o700, exist_ok=True)
        for rank in range(spec.nprocs):
            os.makedirs(spec.rank_dir(rank), mode=0o700, exist_ok=True)
        pipes = [multiprocessing.Pipe() for _ in range(spec.nprocs)]
        # a forked rank keeps the ranks' ends (it closes the others' itself), never the kernel's
        ranks_ends = frozenset(child.fileno() for _parent, child in pipes)
        kernel_fds = kernel_descriptors(ranks_ends) if spec.start_method == "fork" else ()
        if spec.start_method == "fork" and "IPython" in sys.modules:
            ready_to_fork_display()  # made and read once here, inherited by every forked rank
        if spec.start_method == "forkserver":
            prepare_forkserver()
        with interrupts_deferred(), inherited_heap_frozen(spec.start_method == "fork"):
            context = start_processes(
                run_world_rank,
                args=(spec, [child for _parent, child in pipes], kernel_fds, self.name),
                nprocs=spec.nprocs,
                join=False,
                daemon=False,
                start_method=spec.start_method,
            )
        if spec.hosts_store:  # once every rank is forked (see executors/_fresh: no accepted socket is inherited)
            self.store = host_store(spec.master_addr, spec.master_port)
        for _parent, child in pipes:
            child.close()
        self.processes = list(context.processes)
        self.conns = [parent for parent, _child in pipes]
        self.state = "idle"
        ranks_started(self.pids)

    def leave(self, wait: float) -> None:
        """Ask every rank to leave (its process group is destroyed), then make sure nothing is left."""
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        deadline = time.monotonic() + wait
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self.kill()

    def end(self) -> None:
        self.kill()

    def kill(self) -> None:
        """Every rank and whatever it started, killed and reaped; pipes closed."""
        if self.killed:
            return
        self.killed = True
        pids = self.pids
        end_processes(self.processes)
        self.store = None  # its ranks are gone: it stops
        for conn in self.conns:
            conn.close()
        self.conns = []
        ranks_reaped(pids)
        self.ipc.release()  # every rank is reaped: the kernel's --share GPU memory is its own to free on `del`

    def where(self) -> str:
        """Where every rank is now (between cells: idle), asked by signal, read from its files."""
        from ..events._where import RankToAsk, where_now

        asked = [RankToAsk(r, pid, RankDir(self.spec.rank_dir(r)).stacks) for r, pid in enumerate(self.pids)]
        text = where_now(asked, None, idle="idle: waiting for the next cell")
        return f"world {self.name!r} ({self.state}, {self.cells} cell{'s' if self.cells != 1 else ''}):\n{text}"


class WorldCell(Executor):
    """The executor of one cell on a kept world: its ranks live on after it."""

    supervision = Supervision(keeps_ranks=True, ranks_make_their_dirs=True)

    def __init__(self, world: World, job: WorldJob, bound: set[str] | None = None) -> None:
        self.world = world
        self.job = job
        self.bound = bound  # the names the cell binds, from its plan (show, debug jobs: parsed here)
        self.started: set[int] = set()  # ranks that said they run the cell (and can be interrupted)
        self.held: dict[int, int] = {}  # rank -> SIGINT held until it has started the cell
        self.run: Run | None = None

    def signal_ranks(self, ranks: list[int], pids: list[int], sig: int) -> None:
        for rank in ranks:
            self._signal(rank, sig)

    def _signal(self, rank: int, sig: int) -> None:
        """A rank that has not begun the cell would ignore SIGINT (idle ranks do): hold it until it has."""
        if sig == signal.SIGINT:
            if rank not in self.started:
                self.held[rank] = sig
                return
            # the rank takes a SIGINT only with this cell's mark in this cell's directory: one that
            # arrives once the cell is over (it ended as the signal was sent) is never the next cell's
            with contextlib.suppress(OSError):
                open(RankDir(self.job.rank_dir(rank)).interrupt, "w").close()
        signal_group(self.world.pids[rank], sig)

    def start(self, run: Run) -> list[int]:
        self.run = run
        self.world.state = "running"
        self.world.cells += self.job.is_cell
        if self.job.is_cell:
            bound = self.bound if self.bound is not None else names_bound(self.job.cell.tree)
            self.world.owned.update(bound)  # from now on, whatever the cell does
        run.ran_on_world(self.world.name, self.world.cells, self.world.spec.run_dir)
        # every rank is sent the cell (--on: those that do not run it are told to sit it out, with none
        # of the kernel's names or --share tensors): a world's first cell makes its process group
        sitting_out = replace(self.job, names=None, shared=(), out_names=())
        for rank, conn in enumerate(self.world.conns):
            try:
                conn.send(self.job if self._runs(rank) else sitting_out)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # the rank died just now: its sentinel tells the supervisor, which loses the world
        if isinstance(self.job.names, Payload):
            self.world.ipc.note(self.job.names.counters)
            self.job.names.counters.clear()
            self.job.names.release()  # pickled as it was sent: the run kept afterwards pins none of its tensors
        return self.world.pids

    def _runs(self, rank: int) -> bool:
        return self.job.runs(self.job.rank_offset + rank)  # a cluster node's ranks are numbered from its offset

    def waitables(self, rank: int) -> list[Any]:
        if not self._runs(rank):  # --on: it sits the cell out and answers nothing
            return []
        return [self.world.conns[rank], self.world.processes[rank].sentinel]

    def ended(self, rank: int, ready: Any) -> RankEnd | None:
        conn = self.world.conns[rank]
        if ready is conn:
            try:
                outcome, code = conn.recv()
            except (EOFError, OSError):
                pass  # the rank is gone: its sentinel says how
            else:
                if outcome == STARTED:
                    self.started.add(rank)
                    if rank in self.held:
                        self._signal(rank, self.held.pop(rank))
                    return None
                code = {OK: 0, RAISED: EXIT_RAISED, INTERRUPTED: EXIT_INTERRUPTED, EXITED: code}.get(outcome, 1)
                return RankEnd(code, died=False)
        process = self.world.processes[rank]
        process.join()
        return RankEnd(process.exitcode or 0, died=True)

    def cleanup(self, lose: bool) -> None:
        world = self.world
        if self.run is not None and self.job.is_cell:
            world.keep_failures(self.run, self.job.cell)
        if lose:
            world.lose(self.run.world_lost if self.run is not None else None)
        else:
            world.state = "idle"
            world.ipc.prune()  # the references its ranks let go of after the cell (keep_in_step)
        _cuda.collect_ipc()  # what the ranks released of this cell's --share tensors


def lose_if_a_rank_died(world: World) -> None:
    """A rank that died between cells (the OOM killer, NCCL's watchdog) loses the world: said now,
    before the cell is sent to the others, and nothing of the world is left running."""
    dead = [(rank, process.exitcode) for rank, process in enumerate(world.processes) if not process.is_alive()]
    if not dead:
        return
    how = "; ".join(f"rank {rank} died ({_exit_text(code)})" for rank, code in dead)
    world.lose(how)
    raise SpawnUsageError(
        f"world {world.name!r} was lost between cells: {how}; nothing of it runs now. Run the cell again to "
        f"start a new world with the same settings ({world.settings()}), without the names its ranks had."
    )


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def start_world(name: str, spec: RunSpec, asked_start_method: StartMethod = ROW["start_method"].typed_default) -> World:
    """A new world, started with the settings of ``spec`` (its first cell's); its ranks print
    between cells to ``<log-dir>/<run-id>-world-<name>/``."""
    base = os.path.dirname(spec.run_dir)
    world_id = f"{spec.run_id}-world-{name}"
    wspec = replace(spec, run_id=world_id, run_dir=os.path.join(base, world_id), namespace=None, namespace_payload=None)
    world = World(name=name, spec=wspec, base_dir=base, asked_start_method=asked_start_method)
    world.start()
    _kept.keep(world)
    return world
