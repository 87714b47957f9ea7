"""Programs: ``%spawn -n 4 -- train.py --lr 0.1`` runs a program on N ranks, as torchrun would.

Each rank is a new process (``subprocess.Popen``, torch elastic's SubprocessContext way) with the
torchrun environment of a cell, its stdout and stderr written straight to the rank's log files, its
own process group, and ``nbspawn.ranks._program`` in front of the program to tie its life to the
kernel's.  What the user wrote after ``--`` decides how it runs:

* ``train.py ARGS`` or ``python train.py ARGS``: the script, with the kernel's own interpreter (so the
  kernel's environment is used, as torchrun does); its uncaught exception is the root cause, in the
  script's own file names and lines, without ``@record``;
* ``-m package.module ARGS`` (or ``python -m ...``): the module, likewise;
* anything else: an executable, found on PATH or by its path; its exit code or signal and the last
  lines of its stderr say how it failed.

The supervisor, failure policy, views and logs are the ones a cell has; only the executor differs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from .._run import Run
from .._spec import RunSpec
from ..errors import SpawnUsageError

PYTHONS = {"python", "python3", os.path.basename(sys.executable)}


@dataclass(frozen=True)
class Program:
    """What runs in every rank: the launcher's command line, and the words the user gave."""

    argv: tuple[str, ...]
    words: tuple[str, ...]
    python: bool  # a script or module: its exceptions are reported, its stacks can be dumped

    def __str__(self) -> str:
        return shlex.join(self.words)


def parse_program(words: list[str] | str) -> Program:
    """What follows ``--``, checked before anything starts: the script, module or executable exists."""
    if isinstance(words, str):
        try:
            words = shlex.split(words)
        except ValueError as err:
            raise SpawnUsageError(f"cannot read the program's command line: {err}") from None
    words = list(words)
    if not words:
        raise SpawnUsageError("no program after --: write e.g. %spawn -n 2 -- train.py --lr 0.1")
    # by path, not -m: importing the nbspawn package would import torch (seconds) before the program
    launcher = (sys.executable, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ranks", "_program.py"))
    rest = words[1:] if os.path.basename(words[0]) in PYTHONS else words
    if not rest:
        raise SpawnUsageError("python needs a script or -m MODULE after it")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise SpawnUsageError("-m needs a module name, e.g. -- -m mypackage.train")
        import importlib.util

        try:
            found = importlib.util.find_spec(rest[1])
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise SpawnUsageError(f"no module named {rest[1]!r} for this kernel's Python ({sys.executable})")
        return Program((*launcher, "module", rest[1], *rest[2:]), tuple(words), python=True)
    target = rest[0]
    if target.endswith(".py") or rest is not words:
        if not os.path.isfile(target):
            raise SpawnUsageError(f"no such script: {target} (from {os.getcwd()})")
        return Program((*launcher, "script", target, *rest[1:]), tuple(words), python=True)
    found_exe = shutil.which(target) if os.sep not in target else (target if os.access(target, os.X_OK) else None)
    if found_exe is None:
        raise SpawnUsageError(f"no such program: {target} (not a file here, nor on PATH)")
    return Program((*launcher, "exec", target, *rest[1:]), tuple(words), python=False)


class ProgramRanks:
    """The executor of a program run (see ``nbspawn.executors._supervisor.Executor``)."""

    keeps_ranks = False

    def __init__(self, spec: RunSpec, program: Program) -> None:
        self.spec = spec
        self.program = program
        self.procs: list[subprocess.Popen] = []
        self.pidfds: list[int] = []

    def start(self, run: Run) -> list[int]:
        spec = self.spec
        try:
            for rank in range(spec.nprocs):
                rank_dir = spec.rank_dir(rank)
                env = {**os.environ, **spec.rank_env(rank), "NBSPAWN_PARENT_PID": str(os.getpid())}
                env.pop("MPLBACKEND", None)  # the kernel's inline backend means nothing to a script
                if self.program.python:
                    # made by the rank once faulthandler listens: only then may it be sent SIGUSR1
                    env["NBSPAWN_STACKS_FILE"] = os.path.join(rank_dir, "stacks.log")
                with (
                    open(os.path.join(rank_dir, "stdout.log"), "ab") as out,
                    open(os.path.join(rank_dir, "stderr.log"), "ab") as err,
                ):
                    proc = subprocess.Popen(
                        self.program.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True
                    )
                self.procs.append(proc)
                self.pidfds.append(os.pidfd_open(proc.pid))
        except BaseException:
            self.cleanup(lose=True)
            raise
        return [p.pid for p in self.procs]

    def waitables(self, rank: int) -> list[Any]:
        return [self.pidfds[rank]]

    def ended(self, rank: int, ready: Any) -> tuple[int, bool]:
        return self.procs[rank].wait(), True

    def cleanup(self, lose: bool) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what the program left in its group
        for fd in self.pidfds:
            os.close(fd)
        self.pidfds = []
