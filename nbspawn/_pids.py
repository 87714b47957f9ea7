"""Whether a rank's pid still names the rank: a reaped rank's pid is soon someone else's.

Linux hands pid numbers out again once the counter wraps (``pid_max``: 32768 on many machines, a
few minutes of a busy test run), and a rank started by the forkserver is reaped by it, not by the
kernel, the moment it ends.  A kernel that keeps such a pid (a kept world's, a run's after a rank
ended) and signals it later could reach another kernel's rank, which, leading its own process group
as every rank does, ``killpg`` would reach too.  So each rank's start time (``/proc/PID/stat``) is
noted when it starts, and a pid whose process started at another time is never signalled.

A process group's number stays taken while any member lives, so a leader's pid that now names
another process means the leader's group is empty too: nothing of the rank is left to signal.

A reaped rank's pid stays noted, as reaped: a signal meant for it that comes late (from a list kept
after the run) finds it not the rank's whatever the number names by then, with no start time to read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

_started: dict[int, int | None] = {}  # pid -> its process's start time (clock ticks after boot), None: gone then
_REAPED = -1  # noted for a pid whose rank was reaped: whatever has the number now is another process


def remember(pids: Iterable[int | None]) -> None:
    """Note these ranks' start times, as they start."""
    for pid in pids:
        if pid is not None:
            _started[pid] = start_time(pid)


def forget(pids: Iterable[int | None]) -> None:
    """These ranks were reaped and whatever they left was killed: their pids are no longer ours (noted
    as reaped, one entry per pid number: at most ``pid_max`` of them)."""
    for pid in pids:
        if pid is not None:
            _started[pid] = _REAPED


def recycled(pid: int) -> bool:
    """Whether ``pid`` now names another process than the rank it was noted for: true of every rank
    reaped already (:func:`forget`), whatever has its number now.

    False for a pid never noted (nothing to compare), for one with no process now (a signal to it
    fails harmlessly, or reaches what the rank left in its group), and where there is no ``/proc``."""
    if pid not in _started:
        return False
    noted = _started[pid]
    if noted == _REAPED:
        return True
    now = start_time(pid)
    return now is not None and now != noted


def start_time(pid: int) -> int | None:
    """When the process started, from Linux's ``/proc/PID/stat`` (its 22nd field); None: no such
    process, or no ``/proc``."""
    try:
        return int(_stat_fields(pid)[19])  # the 22nd field is the 20th after the name
    except (OSError, IndexError, ValueError):
        return None


def state(pid: int) -> str | None:
    """The process's state letter as ``/proc/PID/stat`` says it ("Z": a zombie; "X": gone); None where
    there is no ``/proc`` to ask."""
    try:
        fields = _stat_fields(pid)
    except FileNotFoundError:
        return "X" if os.path.isdir("/proc/self") else None
    except OSError:
        return None
    return fields[0].decode("ascii", "replace") if fields else None


def _stat_fields(pid: int) -> list[bytes]:
    """``/proc/PID/stat``'s fields from the 3rd on, those after the command's name (which, in
    parentheses, may hold anything); OSError: no such process, or no ``/proc``."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read()
    return stat[stat.rfind(b")") + 2 :].split()
