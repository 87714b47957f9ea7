"""What stops the processes ranks started when the kernel itself dies.

Each rank leads its own process group and dies with the kernel (``PR_SET_PDEATHSIG``).  But a rank's
own children (a DataLoader worker, ``subprocess.Popen(['sleep', ...])``, the processes a program
forks) have no such tie: killed with ``kill -9``, the kernel cannot stop them, and they would be
orphaned.  So the kernel keeps one small watcher process (started on first use) that knows every
live rank's process group, told over a pipe only the kernel writes to.  When that pipe closes (the
kernel is gone, however it ended), the watcher kills every group it was told of, and exits.

    +<pgid>\\n   a rank's group to watch        -<pgid>\\n   that group was cleaned up by the kernel
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

_WATCHER = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    sign, pgid = line[:1], line[1:].strip()
    if pgid.isdigit():
        (groups.add if sign == "+" else groups.discard)(int(pgid))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""

_lock = threading.Lock()
_watcher: subprocess.Popen | None = None


def _pipe() -> subprocess.Popen | None:
    global _watcher
    with _lock:
        if _watcher is None or _watcher.poll() is not None:
            try:
                _watcher = subprocess.Popen(
                    [sys.executable, "-S", "-c", _WATCHER],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # not in the kernel's group: an interrupt must not reach it
                    text=True,
                    bufsize=1,
                )
            except OSError:
                _watcher = None
        return _watcher


def watch(pgids: list[int]) -> None:
    _send("".join(f"+{pgid}\n" for pgid in pgids))


def forget(pgids: list[int]) -> None:
    _send("".join(f"-{pgid}\n" for pgid in pgids))


def _send(text: str) -> None:
    watcher = _pipe()
    if watcher is None or watcher.stdin is None or not text:
        return
    try:
        watcher.stdin.write(text)
        watcher.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass


def watcher_pid() -> int | None:
    """The watcher's pid, if it runs (tests use it)."""
    return _watcher.pid if _watcher is not None and _watcher.poll() is None else None


def _reset_after_fork() -> None:
    """A forked child (a rank) must not write to the kernel's watcher, nor hold its pipe open."""
    global _watcher
    if _watcher is not None and _watcher.stdin is not None:
        try:
            os.close(_watcher.stdin.fileno())
        except OSError:
            pass
    _watcher = None


os.register_at_fork(after_in_child=_reset_after_fork)
