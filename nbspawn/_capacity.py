"""How many ranks this machine can hold: a rank count beyond it is refused before anything is made.

``-n 99999`` once answered "Too many open files" after it had made ~10,000 log directories.  Each rank
costs the kernel some open files (its logs' readers, its process's sentinel and pipes), costs the user
some processes (the rank and its threads: Linux counts threads against ``ulimit -u`` and the system's
``pid_max`` / ``threads-max``), and costs memory (a forked rank only the pages it writes to; a spawned
or forkserver rank an interpreter with torch imported).  The costs below were measured on this
project's ranks (docs/guide.md, "How many ranks"); the rule is a pure function of them and of the
machine's facts (:class:`Room`: what room it has for ranks, read by :func:`this_machine`), so it is tested on any numbers.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from .errors import SpawnUsageError

# The kernel's open files per rank while a run is up: stdout and stderr readers, the process sentinel,
# torch's start_processes pipes (measured with psutil, 2 and 8 gloo ranks: 4.7 a rank, whatever the
# start method; a kept world's rank adds its pipe).
FILES_PER_RANK = 5
FILES_SPARE = 64  # what the kernel needs besides (its own sockets, a store, files a cell opens)
# Tasks (processes and threads, as Linux counts them for ulimit -u) per rank: its main thread, its
# output and stack-answer threads, gloo's and OpenMP's (measured: 5 a fork or forkserver rank, 6 a spawned
# one, with one OpenMP thread each; more cores give each rank more).
TASKS_PER_RANK = 6
# Memory a rank takes of its own (USS: what ending it frees) before its cell does any work, measured on a
# gloo rank with torch imported: a forked rank shares the kernel's pages until it writes to them (6 MiB),
# a forkserver rank its fork server's (9 MiB), a spawned rank imports torch anew (153 MiB).  Its cell's
# own tensors come on top: the bound is the least the ranks need, so a count past it cannot run.
MIB = 1 << 20
MEMORY_PER_RANK = {"fork": 6 * MIB, "forkserver": 10 * MIB, "spawn": 155 * MIB}


@dataclass(frozen=True)
class Room:
    """What bounds the ranks here; None: no bound known (unlimited, or not Linux)."""

    open_files: int | None  # RLIMIT_NOFILE, soft: the kernel's descriptors
    open_now: int  # descriptors the kernel holds now
    tasks: int | None  # the fewest of RLIMIT_NPROC (soft), pid_max and threads-max
    tasks_now: int  # tasks that count against it now (this user's, where that is the bound)
    memory: int | None  # bytes available: MemAvailable, or what the kernel's cgroup has left if less


def refusal(nprocs: int, start_method: str, machine: Room) -> str | None:
    """Why ``nprocs`` ranks cannot run here, as one line with the numbers; None if they can."""
    reasons = []
    if machine.open_files is not None:
        needed = nprocs * FILES_PER_RANK + machine.open_now + FILES_SPARE
        if needed > machine.open_files:
            most = max(0, (machine.open_files - machine.open_now - FILES_SPARE) // FILES_PER_RANK)
            reasons.append(
                (most, f"each takes {FILES_PER_RANK} of the kernel's open files and it may open {machine.open_files} (ulimit -n)")
            )
    if machine.tasks is not None:
        needed = nprocs * TASKS_PER_RANK + machine.tasks_now
        if needed > machine.tasks:
            most = max(0, (machine.tasks - machine.tasks_now) // TASKS_PER_RANK)
            reasons.append(
                (
                    most,
                    f"each is about {TASKS_PER_RANK} processes and threads, and {machine.tasks - machine.tasks_now} "
                    "more may start (ulimit -u, pid_max, threads-max)",
                )
            )
    per_rank = MEMORY_PER_RANK.get(start_method, MEMORY_PER_RANK["spawn"])
    if machine.memory is not None and nprocs * per_rank > machine.memory:
        most = machine.memory // per_rank
        reasons.append(
            (most, f"each {start_method} rank takes at least {per_rank // MIB} MiB and {machine.memory // MIB} MiB is available")
        )
    if not reasons:
        return None
    most, why = min(reasons)
    return f"-n {nprocs}: this machine can hold at most {most} ranks: {why}"


def refuse_beyond(nprocs: int, start_method: str, room: Room) -> None:
    """Refuse, in one line and before anything is made, more ranks than this machine (``room``) can hold."""
    why = refusal(nprocs, start_method, room)
    if why is not None:
        raise SpawnUsageError(why)


def this_machine(nprocs: int) -> Room:
    """The facts :func:`refusal` weighs ``nprocs`` ranks against.  What takes more than a few system
    calls (counting this user's tasks) is asked only when ``nprocs`` could come near its bound."""
    soft_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    open_files = None if soft_files == resource.RLIM_INFINITY else soft_files
    open_now = _count("/proc/self/fd") if open_files is not None and nprocs * FILES_PER_RANK * 4 > open_files else 0
    bounds = []
    soft_tasks = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft_tasks != resource.RLIM_INFINITY:
        bounds.append(soft_tasks)
    bounds += [n for n in (_read_int("/proc/sys/kernel/pid_max"), _read_int("/proc/sys/kernel/threads-max")) if n]
    tasks = min(bounds) if bounds else None
    tasks_now = _tasks_now() if tasks is not None and nprocs * TASKS_PER_RANK * 2 > tasks else 0
    return Room(open_files, open_now, tasks, tasks_now, _memory_available())


def _count(path: str) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def _read_int(path: str) -> int | None:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _tasks_now() -> int:
    """Tasks on this machine now (every user's: pid_max and threads-max count them all, and
    ulimit -u this user's, which are fewer: the larger count is the safe one)."""
    total = 0
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            total += _count(f"/proc/{entry}/task") or 1
    return total


def _memory_available() -> int | None:
    """MemAvailable, or the kernel's cgroup's room (memory.max less memory.current) where that is less."""
    available = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        room = max(0, limit - used)
        available = room if available is None else min(available, room)
    return available
