"""The kernel's descriptors a forked rank lets go of, first thing.

A forked rank starts with every descriptor the kernel had open: its ZMQ sockets (shell, iopub,
stdin, control, heartbeat, and the epoll and event descriptors behind them), a run's TCPStore, the
pipes of kept worlds and of the orphan watcher, IPython's history database.  None of them is the
rank's, and a rank that holds the kernel's listening sockets keeps them from the kernel (a kernel
restarted on the same ports, a rank left behind).

Which to let go of is decided in the kernel just before it forks (:func:`kernel_descriptors`, its
descriptors of those kinds, with their identity), so the rank does no more than check and replace
each (:func:`let_go`): every socket, pipe, event/epoll descriptor and directory, and the kernel's
own files.  Kept: 0-2 (the rank points them at its logs itself), devices (GPU driver handles,
``/dev/null``), shared memory (``/dev/shm``, memfd: tensors mapped from them), the user's own open
files (a cell may write to a file the notebook opened), and multiprocessing's resource tracker and
forkserver pipes (a rank's ``SharedMemory`` and forkserver children use them, as the kernel does).

Each is *replaced* with ``/dev/null`` rather than closed: the kernel's Python objects that name the
number (a ``Connection``, a socket, a file) live on in the rank's copy of its memory, and one freed
there later would close or write to whatever the rank opened under that number next.  Spawned and
forkserver ranks inherit nothing of the kernel's and need none of this.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys

Descriptor = tuple[int, int, int]  # (fd, st_dev, st_ino): the number, and what it must still be


def kernel_descriptors(keep: frozenset[int] = frozenset()) -> tuple[Descriptor, ...]:
    """In the kernel, just before it forks: the descriptors a forked rank must let go of (all but
    ``keep``, the ranks' own made before: a world's pipes)."""
    kept = _multiprocessing_fds() | keep
    own_files = _kernel_files()
    found: list[Descriptor] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux
        return ()
    for name in names:
        fd = int(name)
        if fd <= 2 or fd in kept:
            continue
        try:
            st = os.fstat(fd)
        except OSError:  # listdir's own descriptor, closed by now
            continue
        mode = st.st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            continue
        if stat.S_ISREG(mode) and (st.st_dev, st.st_ino) not in own_files:
            continue  # the user's file, or shared memory
        found.append((fd, st.st_dev, st.st_ino))
    return tuple(found)


def let_go(descriptors: tuple[Descriptor, ...]) -> None:
    """In a forked rank, before anything else: each of the kernel's descriptors that is still what
    it was in the kernel becomes ``/dev/null`` (its number stays taken)."""
    if not descriptors:
        return
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd, dev, ino in descriptors:
            if fd == null:
                continue
            try:
                st = os.fstat(fd)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (dev, ino):
                with contextlib.suppress(OSError):
                    os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _multiprocessing_fds() -> set[int]:
    """The resource tracker's and the forkserver's pipes, when this process started them."""
    fds: set[int] = set()
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    server = sys.modules.get("multiprocessing.forkserver")
    for value in (
        getattr(getattr(tracker, "_resource_tracker", None), "_fd", None),
        getattr(getattr(server, "_forkserver", None), "_forkserver_alive_fd", None),
    ):
        if isinstance(value, int):
            fds.add(value)
    return fds


def _kernel_files() -> set[tuple[int, int]]:
    """The kernel's own files (IPython's history database and its journals), as (st_dev, st_ino)."""
    files: set[tuple[int, int]] = set()
    interactive = sys.modules.get("IPython.core.interactiveshell")
    shell_class = getattr(interactive, "InteractiveShell", None)
    if shell_class is None or not shell_class.initialized():
        return files
    history = getattr(shell_class.instance(), "history_manager", None)
    path = str(getattr(history, "hist_file", "") or "")
    for name in (path, path + "-journal", path + "-wal", path + "-shm") if path and path != ":memory:" else ():
        with contextlib.suppress(OSError):
            st = os.stat(name)
            files.add((st.st_dev, st.st_ino))
    return files
