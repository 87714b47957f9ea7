"""A rank's directory, ``<run-dir>/<rank>/``: the one place that names its files.

torch elastic's layout (``stdout.log``, ``stderr.log``, ``error.json``), plus what nbspawn adds:

* ``display.jsonl`` and ``order.bin``: what the rank displayed, and the order in which it wrote to
  its three streams (one :data:`ORDER_RECORD` each time it switches stream; made on first need);
* ``stacks.log``: faulthandler's dumps (SIGUSR1 when the kernel asks where the rank is, fatal signals);
* ``out.pickle``: the ``--out`` values the rank sends home;
* ``collectives.json``: its recent collectives, written when the kernel asked where it is (``ranks._watch``);
* ``answers.fifo``: the kernel's answers to the rank's prompts (``input()``, pdb), made by the rank at its
  first prompt; its requests go to the run's ``<run-dir>/prompts.fifo`` (:data:`PROMPTS`), which the kernel
  makes before the ranks start when it can answer (``ranks._prompt``, ``events._prompts``).

Everything that reads or writes one of these files takes its name from here.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

STDOUT, STDERR, DISPLAY_FILE = "stdout.log", "stderr.log", "display.jsonl"
ERROR = "error.json"
STACKS = "stacks.log"
ORDER = "order.bin"
OUT = "out.pickle"
COLLECTIVES = "collectives.json"
ANSWERS = "answers.fifo"
PROMPTS = "prompts.fifo"  # in the run directory, one for all its ranks

STREAMS = ("stdout", "stderr", "display")  # stream numbers, as order.bin records them
FILES = (STDOUT, STDERR, DISPLAY_FILE)  # each stream's file
DISPLAY = 2  # the display stream's number
ORDER_RECORD = struct.Struct("<B3Q")  # the stream written next, then the three files' sizes


@dataclass(frozen=True)
class RankDir:
    """The paths of one rank's files."""

    path: str

    def __str__(self) -> str:
        return self.path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def stdout(self) -> str:
        return self.file(STDOUT)

    @property
    def stderr(self) -> str:
        return self.file(STDERR)

    @property
    def display(self) -> str:
        return self.file(DISPLAY_FILE)

    @property
    def error(self) -> str:
        return self.file(ERROR)

    @property
    def stacks(self) -> str:
        return self.file(STACKS)

    @property
    def order(self) -> str:
        return self.file(ORDER)

    @property
    def out(self) -> str:
        return self.file(OUT)

    @property
    def collectives(self) -> str:
        return self.file(COLLECTIVES)

    @property
    def answers(self) -> str:
        return self.file(ANSWERS)


def remove_partial_writes(rank_dirs: list[str]) -> None:
    """Once a run's ranks are gone: what a rank killed mid-write left (``collectives.json`` is written to
    a ``.tmp`` beside it and renamed; a rank stopped at its timeout can die between the two)."""
    for rank_dir in rank_dirs:
        try:
            os.unlink(os.path.join(rank_dir, COLLECTIVES + ".tmp"))
        except OSError:  # none (the usual case), or the directory was never made
            pass


def prompts_path(run_dir: str) -> str:
    """The run's prompt requests: every rank writes a JSON line to it, the kernel reads them."""
    return os.path.join(run_dir, PROMPTS)
