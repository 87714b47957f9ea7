"""What ``%spawn -- PROGRAM ARGS`` runs, checked before anything starts.

What the user wrote after ``--`` decides how each rank runs it:

* ``train.py ARGS`` or ``python train.py ARGS``: the script, with the kernel's own interpreter (so the
  kernel's environment is used, as torchrun does); its uncaught exception is the root cause, in the
  script's own file names and lines, without ``@record``;
* ``-m package.module ARGS`` (or ``python -m ...``): the module, likewise;
* ``python -c CODE ARGS``: the code, as python runs it;
* anything else: an executable, found on PATH or by its path; its exit code or signal and the last
  lines of its stderr say how it failed.

Every form runs behind ``nbspawn/ranks/_program.py``, which ties the rank's life to the kernel's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from typing import Literal

from .errors import SpawnUsageError

PYTHONS = {"python", "python3", os.path.basename(sys.executable)}


Form = Literal["script", "module", "code", "exec"]


@dataclass(frozen=True)
class ProgramLine:
    """What follows ``--``, read at the door: its form and what it names, nothing asked of any machine
    yet (the planner, and each cluster node's agent, :func:`locate` it where it runs)."""

    form: Form
    target: str  # the script's path, the module's name, the code, or the executable
    args: tuple[str, ...]  # the program's own arguments
    words: tuple[str, ...]  # as the user wrote it

    def __str__(self) -> str:
        return shlex.join(self.words)


@dataclass(frozen=True)
class Program:
    """What runs in every rank: the launcher's command line, and the words the user gave."""

    argv: tuple[str, ...]
    words: tuple[str, ...]
    python: bool  # a script or module: its exceptions are reported, its stacks can be dumped

    def __str__(self) -> str:
        return shlex.join(self.words)


def read_program_line(words: list[str] | tuple[str, ...] | str) -> ProgramLine:
    """What follows ``--``, read once (at the door): the form (script, ``-m``, ``-c``, executable) and
    its target; a line that names nothing runnable is refused here, before any machine is asked."""
    if isinstance(words, str):
        try:
            words = shlex.split(words)
        except ValueError as err:
            raise SpawnUsageError(f"cannot read the program's command line: {err}") from None
    words = tuple(words)
    if not words:
        raise SpawnUsageError("no program after --: write e.g. %spawn -n 2 -- train.py --lr 0.1")
    rest = words[1:] if os.path.basename(words[0]) in PYTHONS else words
    if not rest:
        raise SpawnUsageError("python needs a script or -m MODULE after it")
    if rest[0] == "-c":
        if len(rest) < 2:
            raise SpawnUsageError("-c needs the code to run, e.g. -- python -c \"print('hi')\"")
        return ProgramLine("code", rest[1], rest[2:], words)
    if rest[0] == "-m":
        if len(rest) < 2:
            raise SpawnUsageError("-m needs a module name, e.g. -- -m mypackage.train")
        return ProgramLine("module", rest[1], rest[2:], words)
    if rest[0].endswith(".py") or rest is not words:
        return ProgramLine("script", rest[0], rest[1:], words)
    return ProgramLine("exec", rest[0], rest[1:], words)


def locate(line: ProgramLine) -> Program:
    """The program read at the door, found on this machine (the kernel's, or a cluster node's): the
    script, module or executable exists here; the launcher's command line to run it."""
    # by path, not -m: importing the nbspawn package would import torch (seconds) before the program
    launcher = (sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks", "_program.py"))
    target = line.target
    if line.form == "module":
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise SpawnUsageError(f"no module named {target!r} for this kernel's Python ({sys.executable})")
    elif line.form == "script":
        if not os.path.isfile(target):
            raise SpawnUsageError(f"no such script: {target} (from {os.getcwd()})")
    elif line.form == "exec":
        found_exe = shutil.which(target) if os.sep not in target else (target if os.access(target, os.X_OK) else None)
        if found_exe is None:
            raise SpawnUsageError(f"no such program: {target} (not a file here, nor on PATH)")
    return Program((*launcher, line.form, target, *line.args), line.words, python=line.form != "exec")
