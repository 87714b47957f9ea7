"""A rank's directory, ``<run-dir>/<rank>/``: the one place that names its files.

torch elastic's layout (``stdout.log``, ``stderr.log``, ``error.json``), plus what nbspawn adds:

* ``display.jsonl`` and ``order.bin``: what the rank displayed, and the order in which it wrote to
  its three streams (one :data:`ORDER_RECORD` each time it switches stream; made on first need);
* ``stacks.log``: faulthandler's dumps (SIGUSR1 when the kernel asks where the rank is, fatal signals);
* ``out.pickle``: the ``--out`` values the rank sends home;
* ``collectives.json``: its recent collectives, written when the kernel asked where it is (``ranks._watch``);
* ``xray.json``: the bounded record of every collective of the run, when it is X-rayed (``ranks._xray``);
* ``xray_values.json``: with ``--xray values``, its small tensors before and after each of its first
  collectives, written at the cell's end (``ranks._xray_values``);
* ``described.json``: what a name holds on this rank, for ``%spawn show WORLD NAME`` (``ranks._describe``);
* ``nccl_trace_<global rank>``: NCCL's flight-recorder dump when its watchdog times a collective out (torch
  writes it to ``TORCH_FR_DUMP_TEMP_FILE`` + the rank; ``nbspawn._cuda.dump_file_keys``);
* ``interrupt``: a kept world's rank only, made by the kernel just before it interrupts the rank's cell
  (SIGINT): the rank honours an interrupt only while the cell whose directory holds it runs, so one
  meant for a cell never lands in the next;
* ``answers.fifo``: the kernel's answers to the rank's prompts (``input()``, pdb), made by the rank at its
  first prompt; its requests go to the run's ``<run-dir>/prompts.fifo`` (:data:`PROMPTS`), which the kernel
  makes before the ranks start when it can answer (``ranks._prompt``, ``events._prompts``).

Everything that reads or writes one of these files takes its name from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass

STDOUT, STDERR, DISPLAY_FILE = "stdout.log", "stderr.log", "display.jsonl"
ERROR = "error.json"
STACKS = "stacks.log"
ORDER = "order.bin"
OUT = "out.pickle"
COLLECTIVES = "collectives.json"
XRAY = "xray.json"
XRAY_VALUES = "xray_values.json"
DEVICE_MEMORY = "device_memory.json"  # what torch holds on each GPU the rank used, about once a second (ranks._devicememory)
MEMORY_PEAK = "memory_peak.json"  # the most resident memory the rank held in the cell, written at its end (ranks._devicememory)
DESCRIBED = "described.json"  # %spawn show WORLD NAME: what the name holds on this rank (ranks._describe)
ANSWERS = "answers.fifo"
NCCL_TRACE = "nccl_trace_"  # the prefix torch's NCCL dump is given: it adds the global rank
PROMPTS = "prompts.fifo"  # in the run directory, one for all its ranks
INTERRUPT = "interrupt"  # a kept world's rank: the kernel interrupts this cell (made before its SIGINT)

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
    def interrupt(self) -> str:
        return self.file(INTERRUPT)

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
    def xray(self) -> str:
        return self.file(XRAY)

    @property
    def xray_values(self) -> str:
        return self.file(XRAY_VALUES)

    @property
    def device_memory(self) -> str:
        return self.file(DEVICE_MEMORY)

    @property
    def memory_peak(self) -> str:
        return self.file(MEMORY_PEAK)

    @property
    def answers(self) -> str:
        return self.file(ANSWERS)

    @property
    def nccl_trace_prefix(self) -> str:
        return self.file(NCCL_TRACE)

    def nccl_trace(self, global_rank: int) -> str:
        return self.file(f"{NCCL_TRACE}{global_rank}")


PARTIAL = ".tmp"  # what :func:`write_whole` writes first, beside the file


def write_whole(path: str, data: str | bytes) -> None:
    """``path`` written whole or not at all: first to ``path.tmp``, then renamed over it, so a reader
    (the kernel, while the rank runs) never sees half a file.  Every file a rank rewrites goes this way."""
    partial = path + PARTIAL
    if isinstance(data, bytes):
        with open(partial, "wb") as fh:
            fh.write(data)
    else:
        with open(partial, "w", encoding="utf-8") as fh:
            fh.write(data)
    os.replace(partial, path)


def write_json(path: str, value: object) -> None:
    """:func:`write_whole` of ``value`` as compact JSON.  ``json.dumps``, not ``json.dump``: dump's
    pure-Python encoder leaves reference cycles (its closures) for the collector, and a kept world's
    rank must leave none behind a cell (test_worlds)."""
    write_whole(path, json.dumps(value, separators=(",", ":")))


def remove_partial_writes(rank_dirs: list[str]) -> None:
    """Once a run's ranks are gone: what a rank killed mid-write left (a ``.tmp`` beside the file
    :func:`write_whole` was writing; a rank stopped at its timeout can die between the two steps)."""
    for rank_dir in rank_dirs:
        for written in (COLLECTIVES, XRAY, XRAY_VALUES, ERROR, OUT):
            with contextlib.suppress(OSError):  # none (the usual case), or the directory was never made
                os.unlink(os.path.join(rank_dir, written + PARTIAL))


def remove_if_empty(run_dir: str) -> bool:
    """A run that could not start: its directory, and every rank directory under it, removed if nothing
    in them holds a byte (no rank wrote anything to keep); whether it was."""
    files = []
    for folder, _dirs, names in os.walk(run_dir):
        files += [os.path.join(folder, name) for name in names]
    try:
        if any(os.path.getsize(path) for path in files if not os.path.islink(path)):
            return False
    except OSError:
        return False
    for folder, _dirs, names in os.walk(run_dir, topdown=False):
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    return not os.path.exists(run_dir)


def prompts_path(run_dir: str) -> str:
    """The run's prompt requests: every rank writes a JSON line to it, the kernel reads them."""
    return os.path.join(run_dir, PROMPTS)
