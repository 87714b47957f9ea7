"""Fresh ranks: new processes for one cell, through ``torch.multiprocessing.start_processes``.

Under fork the kernel compiles the cell and sets the shared part of the torchrun environment once,
just before it forks, and every rank inherits both (``ranks._cell.Inherited``); under spawn and
forkserver each rank gets the spec pickled and does it itself.  The forkserver preloads torch and
nbspawn once, so its ranks start as fast as forked ones.
"""

from __future__ import annotations

import multiprocessing
import sys
from multiprocessing.process import BaseProcess
from typing import Any

from .._cuda import collect_ipc
from .._listen import host_store
from .._runstate import Run
from .._spec import RunSpec
from ..handoff._ipc import Ledger
from ..ranks._capture import ready_to_fork_display, stdio_streams
from ..ranks._cell import Inherited, run_rank
from ..ranks._fds import kernel_descriptors
from ._base import Executor, RankEnd
from ._procs import (
    end_processes,
    environment,
    inherited_heap_frozen,
    one_flush,
    pid_of,
    prepare_forkserver,
    ranks_reaped,
    ranks_started,
)


class FreshRanks(Executor):
    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.processes: list[BaseProcess] = []
        self.store: Any = None  # the run's TCPStore, on loopback (a run on one machine)
        self.ipc = Ledger()  # the CUDA IPC references sent to the ranks: released for them once they are reaped

    def start(self, run: Run) -> list[int]:
        from torch.multiprocessing import start_processes

        spec = self.spec
        shared_env: dict[str, str] = {}
        inherited: Inherited | None = None
        if spec.start_method == "forkserver":
            prepare_forkserver()
        elif spec.start_method == "fork":
            stdio_streams()
            if "IPython" in sys.modules:
                ready_to_fork_display()  # made and read once here, inherited by every forked rank
            shared_env = spec.shared_env()
            inherited = Inherited(spec.cell.compile(), kernel_descriptors())  # last: what is open now
        with environment(shared_env), one_flush():
            try:
                with inherited_heap_frozen(spec.start_method == "fork"):
                    context = start_processes(
                        run_rank,
                        args=(spec, inherited),
                        nprocs=spec.nprocs,
                        join=False,
                        daemon=False,
                        start_method=spec.start_method,
                    )
                # hosted once every rank is forked: a connection it accepted earlier (rank 0 joining while
                # rank 3 is forked) would be a kernel socket the later ranks inherit unlisted. The reserved
                # socket listens meanwhile, so a rank that joins first waits in its backlog.
                if spec.hosts_store:
                    self.store = host_store(spec.master_addr, spec.master_port)
            except BaseException:
                self._kill_orphans()
                self._take_counters()
                self.ipc.release()
                raise
            finally:
                self._take_counters()
                if spec.namespace_payload is not None:
                    # pickled into every rank as it started: the run kept afterwards (last_run()) holds
                    # none of the cell's tensors, so `del g` in the kernel frees g (its GPU memory too)
                    spec.namespace_payload.release()
        self.processes = list(context.processes)
        pids = [pid_of(p) for p in self.processes]
        ranks_started(pids)
        return pids

    def _take_counters(self) -> None:
        payload = self.spec.namespace_payload
        if payload is not None:
            self.ipc.note(payload.counters)
            payload.counters.clear()

    def _kill_orphans(self) -> None:
        """start_processes failed half-way: find the ranks it did start through multiprocessing."""
        for process in multiprocessing.active_children():
            args: tuple[Any, ...] = getattr(process, "_args", ())  # multiprocessing keeps no public handle
            if len(args) > 2 and args[2] and args[2][0] is self.spec:
                process.kill()
                process.join()

    def waitables(self, rank: int) -> list[Any]:
        return [self.processes[rank].sentinel]

    def ended(self, rank: int, ready: Any) -> RankEnd:
        process = self.processes[rank]
        process.join()
        return RankEnd(process.exitcode or 0, died=True)

    def cleanup(self, lose: bool) -> None:
        pids = [pid_of(p) for p in self.processes]
        end_processes(self.processes)
        self.store = None  # every rank has left the group: it stops
        ranks_reaped(pids)
        # every rank is reaped: what one still held (stopped by a signal, stuck, never opened) is released
        # for it, so the GPU memory of --share tensors is the kernel's to free on `del`, however the run ended
        self.ipc.release()
        collect_ipc()
