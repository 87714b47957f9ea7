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

from .errors import SpawnUsageError

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
    launcher = (sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks", "_program.py"))
    rest = words[1:] if os.path.basename(words[0]) in PYTHONS else words
    if not rest:
        raise SpawnUsageError("python needs a script or -m MODULE after it")
    if rest[0] == "-c":
        if len(rest) < 2:
            raise SpawnUsageError("-c needs the code to run, e.g. -- python -c \"print('hi')\"")
        return Program((*launcher, "code", rest[1], *rest[2:]), tuple(words), python=True)
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
