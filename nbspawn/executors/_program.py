"""Programs: ``%spawn -n 4 -- train.py --lr 0.1`` runs a program on N ranks, as torchrun would.

Each rank is a new process (``subprocess.Popen``, torch elastic's SubprocessContext way) with the
torchrun environment of a cell, its stdout and stderr written straight to the rank's log files, its
own process group, and ``nbspawn.ranks._program`` in front of the program to tie its life to the
kernel's (``nbspawn._program`` says what forms a program takes).  The supervisor, failure policy,
views and logs are the ones a cell has; only the executor differs.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from .._listen import host_store
from .._program import Program
from .._rankdir import RankDir
from .._runstate import Run
from .._spec import RunSpec
from ..ranks._watch import recorder_env
from ..ranks._xray import XRAY_FR_ENTRIES
from ._base import Executor, RankEnd
from ._procs import end_popens, ranks_reaped, ranks_started


class ProgramRanks(Executor):
    def __init__(self, spec: RunSpec) -> None:
        assert spec.program is not None  # a program's run
        self.spec = spec
        self.program: Program = spec.program
        self.procs: list[subprocess.Popen] = []
        self.pidfds: list[int] = []
        self.store: Any = None  # the run's TCPStore, on loopback: a program's init_process_group() joins it

    def start(self, run: Run) -> list[int]:
        spec = self.spec
        try:
            if spec.hosts_store:
                self.store = host_store(spec.master_addr, spec.master_port)
            for rank in range(spec.nprocs):
                files = RankDir(spec.rank_dir(rank))
                env = {**os.environ, "NBSPAWN_PARENT_PID": str(os.getpid())}
                spec.apply_env(rank, env)
                env.pop("MPLBACKEND", None)  # the kernel's inline backend means nothing to a script
                if self.program.python:
                    # made by the rank once faulthandler listens: only then may it be sent SIGUSR1
                    env["NBSPAWN_STACKS_FILE"] = files.stacks
                if spec.xrayed:  # the rank drains its recorder into its xray.json (ranks._program)
                    recorder_env(env, entries=str(XRAY_FR_ENTRIES))
                    env["NBSPAWN_XRAY"] = spec.rank_dir(rank)
                with (
                    open(files.stdout, "ab") as out,
                    open(files.stderr, "ab") as err,
                ):
                    proc = subprocess.Popen(
                        self.program.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True
                    )
                self.procs.append(proc)
                self.pidfds.append(os.pidfd_open(proc.pid))
        except BaseException:
            self.cleanup(lose=True)
            raise
        pids = [p.pid for p in self.procs]
        ranks_started(pids)
        return pids

    def waitables(self, rank: int) -> list[Any]:
        return [self.pidfds[rank]]

    def ended(self, rank: int, ready: Any) -> RankEnd:
        return RankEnd(self.procs[rank].wait(), died=True)

    def cleanup(self, lose: bool) -> None:
        end_popens(self.procs)
        self.store = None
        ranks_reaped([p.pid for p in self.procs])
        for fd in self.pidfds:
            os.close(fd)
        self.pidfds = []
