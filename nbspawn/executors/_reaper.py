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
if os.fork():  # the kernel reaps this one; the watcher goes on outside the kernel's process tree
    os._exit(0)
try:  # its name in ps and top, not this source: setproctitle alone, from where the kernel has it (-S)
    sys.path.insert(0, sys.argv[1])
    import setproctitle
    setproctitle.setproctitle(sys.argv[2])
except Exception:
    pass
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
_fd = -1  # the write end of the watcher's pipe: only the kernel holds it (no file object to finalize)


def _pipe() -> int:
    global _fd
    with _lock:
        if _fd < 0:
            read, write = os.pipe()  # both close-on-exec; Popen gives the read end to the starter
            try:
                starter = subprocess.Popen(
                    [sys.executable, "-S", "-c", _WATCHER, _setproctitle_home(), watcher_title(os.getpid())],
                    stdin=read,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # not in the kernel's group: an interrupt must not reach it
                )
                starter.wait()  # it forked the watcher and left
                _fd = write
            except OSError:
                os.close(write)
            finally:
                os.close(read)
        return _fd


def watcher_title(kernel_pid: int) -> str:
    """What ``ps`` shows for the watcher; ``top`` shows its first 15 bytes, ``nbspawn watcher``."""
    return f"nbspawn watcher: kills what the ranks of kernel {kernel_pid} started if it dies"


def _setproctitle_home() -> str:
    """The folder ``setproctitle`` is imported from (site-packages), for a watcher started without site."""
    import setproctitle

    path = os.path.abspath(setproctitle.__file__ or "")
    home = os.path.dirname(path)
    return os.path.dirname(home) if os.path.basename(path).startswith("__init__.") else home


def watch(pgids: list[int]) -> None:
    _send("".join(f"+{pgid}\n" for pgid in pgids))


def forget(pgids: list[int]) -> None:
    _send("".join(f"-{pgid}\n" for pgid in pgids))


def _send(text: str) -> None:
    global _fd
    fd = _pipe()
    if fd < 0 or not text:
        return
    try:
        os.write(fd, text.encode())
    except OSError:  # the watcher is gone: the next call starts another
        with _lock:
            os.close(fd)
            _fd = -1


def _reset_after_fork() -> None:
    """A forked child (a rank) must not hold the kernel's end of the watcher's pipe open."""
    global _fd
    if _fd >= 0:
        try:
            os.close(_fd)
        except OSError:
            pass
    _fd = -1


os.register_at_fork(after_in_child=_reset_after_fork)
