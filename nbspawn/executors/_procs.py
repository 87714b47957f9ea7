"""Rank processes at the OS level: starting them without losing one, signalling, killing, reaping.

Every rank leads its own process group (``ranks._cell`` calls ``setpgid``), so signalling the group
also reaches what the rank started (DataLoader workers, ``subprocess`` children).  Once a rank is
reaped its pid may belong to someone else: its group is signalled only while the pid is not another
process's (``nbspawn._pids``: the kernel notes each rank's start time in :func:`ranks_started`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from multiprocessing.process import BaseProcess

from .. import _pids
from . import _reaper


def ranks_started(pids: list[int]) -> None:
    """Ranks just started: their pids are theirs (start times noted), and the kernel's watcher kills
    their groups if the kernel dies (``_reaper``)."""
    _pids.remember(pids)
    _reaper.watch(pids)


def ranks_reaped(pids: list[int]) -> None:
    """Ranks reaped, and what they left killed: neither the kernel nor its watcher signals them again."""
    _reaper.forget(pids)
    _pids.forget(pids)


def signal_group(pid: int | None, sig: int) -> None:
    """Signal a rank and every process it started (each rank leads its own process group); nothing
    when its pid is another process's now (the rank was reaped by the forkserver, and the number reused)."""
    if pid is None or _pids.recycled(pid):
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)  # not yet a group leader: it was just forked


def kill_leftovers(pid: int | None) -> None:
    """SIGKILL whatever a reaped rank left running in its group (none when its pid is another's now)."""
    if pid is not None and not _pids.recycled(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def end_processes(processes: Sequence[BaseProcess]) -> None:
    """Kill every rank still running and reap it, then its group's leftovers; close each handle."""
    for process in processes:
        if process.exitcode is None:
            signal_group(process.pid, signal.SIGKILL)
    for process in processes:
        process.join()
    for process in processes:
        kill_leftovers(process.pid)
        with contextlib.suppress(ValueError):
            process.close()


def end_popens(procs: Sequence[subprocess.Popen]) -> None:
    """The same for ranks started with ``subprocess.Popen`` (a program's)."""
    for proc in procs:
        if proc.poll() is None:
            kill_leftovers(proc.pid)
            proc.wait()
        kill_leftovers(proc.pid)


def pid_of(process: BaseProcess) -> int:
    assert process.pid is not None  # started
    return process.pid


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[list[int]]:
    """Hold Ctrl-C while ranks are being started, so none is started and then forgotten."""
    hits: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield hits
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: hits.append(signum))
    try:
        yield hits
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set variables in the kernel only while it forks, so each rank inherits them for free."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _FlushedOnce:
    """The kernel's stream, with ``flush`` made free while ranks are being started.

    multiprocessing flushes stdout and stderr before every process it starts; in a kernel each flush
    is a round trip to the IOPub thread (~0.7 ms, twice per rank: 90 ms at 64 ranks). One flush
    before the first rank is enough; a rank never flushes the kernel's stream (it has its own).
    """

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def flush(self) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def one_flush() -> Iterator[None]:
    streams = sys.stdout, sys.stderr
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.flush()
    sys.stdout, sys.stderr = _FlushedOnce(streams[0]), _FlushedOnce(streams[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


_forking_ranks = False  # read by the at-fork hook, in the child, as the kernel set it before forking
_hooked = False


def _freeze_inherited() -> None:
    if _forking_ranks:
        import gc

        gc.freeze()


@contextlib.contextmanager
def inherited_heap_frozen(forking: bool) -> Iterator[None]:
    """Ranks forked meanwhile put everything they inherited in the garbage collector's permanent
    generation (``gc.freeze``, first thing in the child, from an ``os.register_at_fork`` hook:
    before any of the rank's own code can allocate and set a collection off).

    A forked rank then never collects what it inherited: the kernel's cyclic garbage not yet
    collected stays garbage there (it is the kernel's, and the kernel collects its own copy), so no
    kernel ``__del__`` or weakref callback runs in a rank, in the middle of the cell's code or of a
    ``pdb`` step; and a full collection in a rank walks its own objects only, never writing into
    every page of the kernel's heap it shares until then.  The kernel's own collector is left as it
    is (frozen in the child only: nothing to give back, and what the kernel or Python itself froze,
    as 3.12 does with 375 objects at start-up, stays as it was)."""
    global _forking_ranks, _hooked
    if not forking:
        yield
        return
    if not _hooked:
        os.register_at_fork(after_in_child=_freeze_inherited)
        _hooked = True
    _forking_ranks = True
    try:
        yield
    finally:
        _forking_ranks = False


_forkserver_ready = False


def prepare_forkserver() -> None:
    """Let the forkserver import torch and nbspawn once, instead of every rank importing them."""
    global _forkserver_ready
    if not _forkserver_ready:
        # and what a rank needs to look like a notebook (nbspawn.ranks._capture), when this is a kernel;
        # and where a descriptor sent with a rank's start is found (``--share``: a tensor's memory), which
        # each rank otherwise imports as it unpickles one (0.6 ms of its CPU)
        preload = ["torch", "nbspawn.ranks._cell", "IPython.core.interactiveshell", "multiprocessing.popen_forkserver"]
        if "ipykernel" in sys.modules:
            preload.append("ipykernel.zmqshell")
        multiprocessing.get_context("forkserver").set_forkserver_preload(preload)
        _forkserver_ready = True
