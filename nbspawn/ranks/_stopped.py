"""A rank stopped by SIGTERM lets go of what it received before it dies, where it can.

nbspawn stops ranks with SIGTERM (a peer failed, ``--timeout``, an interrupt nobody answered), and a
rank that dies holding a CUDA tensor the kernel sent never decrements its CUDA IPC reference counter.
The kernel releases those counters for it once it is reaped (``handoff._ipc``), whatever the rank
did; this is the rank's own part, so that what it holds is freed as a finished rank's is: on SIGTERM
it drops its names (the caller's ``drop``: after its GPU settled, as when it leaves) and only then
dies of the signal, as it did before (its exit status still says SIGTERM).

Python runs a signal handler only between the main thread's bytecodes: a rank stuck in C (a gloo or
NCCL wait, a long copy) would run it only when that returns, and would wait for SIGKILL meanwhile.
So the signal's arrival is also heard from the thread that reads Python's wakeup descriptor (the
one answering stack requests, ``ranks._stackdump``; else one of this module's), which sends it on to
the main thread (the kernel may have handed it to another thread and left the main one asleep); if the
handler has not begun within :data:`PATIENCE`, the rank dies of the signal at once, as with ``SIG_DFL``.  A
handler put in place for a while (``ranks._cell.write_error`` holds SIGTERM until its record is on
disk) is left to do its job.

What needs no main thread is said at once, from whichever thread hears the signal first: the
``last_words`` (the collectives X-ray written down: a rank stuck in the very collective that hung is the
one whose record matters, and its main thread never comes back to say it).
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import os
import select
import signal
import sys
import threading
from collections.abc import Callable

from . import _stackdump

PATIENCE = 1.0  # seconds the main thread has to begin letting go before the rank dies without it
_FIRST_LOOK = 0.2  # how long the main thread may take to begin on its own before the signal is sent on to it

_drop: Callable[[], object] | None = None
_begun = threading.Event()
_listening = False
_own_fd: int | None = None  # the wakeup descriptor this module set, when no one else reads one
_last_words: Callable[[], object] | None = None
_saying = threading.Lock()  # the last words are said once: a second thread waits until they are
_said = False


def install(drop: Callable[[], object], last_words: Callable[[], object] | None = None) -> None:
    """From now on SIGTERM runs ``last_words`` (best effort, on any thread, at once) and ``drop`` (on
    the main thread) and then ends the process by that signal."""
    global _drop, _listening, _own_fd, _last_words, _said
    _drop, _last_words, _said = drop, last_words, False
    signal.signal(signal.SIGTERM, _on_term)
    if _listening:
        return
    if _stackdump.answering:  # its thread reads the wakeup descriptor (ranks._stackdump): it tells us too
        _stackdump.heard.append(_heard)
        _listening = True
        return
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if signal.set_wakeup_fd(write, warn_on_full_buffer=False) != -1:
            raise ValueError("someone else's wakeup descriptor")
    except ValueError:  # not the main thread, or one that is not ours: the handler alone
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)
        return
    _own_fd, _listening = write, True
    _thread.start_new_thread(_watch, (read,))


def _on_term(signum: int, frame: object) -> None:
    _begun.set()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # another SIGTERM (the watcher's, the kernel's) waits for the drop
    say_last_words()
    if _drop is not None:
        with contextlib.suppress(BaseException):
            _drop()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    die()


def say_last_words() -> None:
    """The ``last_words``, once, whichever thread comes first; another that comes meanwhile waits
    until they are said (the main thread dies only after them)."""
    global _said
    with _saying:
        if _said or _last_words is None:
            return
        _said = True
        with contextlib.suppress(BaseException):
            _last_words()


def die() -> None:
    """End this process by SIGTERM, from any thread (its exit status is the signal's, as ever)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL, where Python cannot set it
    os.kill(os.getpid(), signal.SIGTERM)


def _watch(read: int) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, _stackdump.HELPER_THREAD_BLOCKS)  # the process's SIGTERM is the main thread's
    while True:
        select.select([read], [], [])
        try:
            data = os.read(read, 64)
        except BlockingIOError:
            continue
        except OSError:
            return
        _heard(data)


def _heard(data: bytes) -> None:
    """Signals Python handled, by number: on SIGTERM, see that the main thread begins (not here: the
    thread that reads them answers stack requests too)."""
    if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) is _on_term and not _begun.is_set():
        _thread.start_new_thread(_see_it_begin, ())


def _see_it_begin() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, _stackdump.HELPER_THREAD_BLOCKS)
    say_last_words()  # now: a main thread stuck in C would never say them
    if _begun.wait(_FIRST_LOOK):
        return  # the main thread began, as it does at once when the signal came to it
    # delivered to another thread (the main one had a signal pending, say a stack request), the main thread
    # sleeps on and Python's handler waits for it: the signal again, to the main thread, interrupts its
    # wait; one stuck in C that waits on regardless is ended below
    with contextlib.suppress(Exception):
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
    if not _begun.wait(PATIENCE):
        die()


def _blocking_for_the_fork() -> None:
    """Before a rank forks: SIGTERM waits, on the forking thread, until the child has let go of the
    rank's handler and wakeup pipe (:func:`_forked`).  A child that took it sooner would write it to the
    rank's pipe: a ``Pool`` whose ``map`` ends before its second worker has finished starting is
    terminated at once (``with Pool(2)``), and the rank then heard its worker's SIGTERM as its own and
    died of it (ci60, ci64; here 6 of 10 fork cells of 20 short-lived pools each)."""
    if _drop is None:
        return
    with contextlib.suppress(Exception):
        _at_fork.mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _unblocked_after_the_fork() -> None:
    """The forking thread's mask as it was (in the rank, and in the child once it has let go)."""
    mask, _at_fork.mask = getattr(_at_fork, "mask", None), None
    if mask is not None and signal.SIGTERM not in mask:
        with contextlib.suppress(Exception):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _forked() -> None:
    """A process the rank forks (a DataLoader worker, a ``Pool``'s) is not the rank: SIGTERM ends it as
    before, and the signals it takes are not written to the rank's wakeup pipe, which it shares (the
    rank's reading thread would hear a child's SIGTERM as its own and stop the rank).  A SIGTERM that
    came meanwhile was held (:func:`_blocking_for_the_fork`) and now ends the child."""
    global _drop, _listening, _own_fd
    if _drop is None:  # not a rank's child (a rank the kernel or a node's agent forks): left as it was
        return
    _drop, _listening = None, False
    with contextlib.suppress(Exception):
        signal.set_wakeup_fd(-1)  # whoever's it is (this module's, or ranks._stackdump's): the rank's
        if signal.getsignal(signal.SIGTERM) is _on_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _own_fd = None
    _unblocked_after_the_fork()


# the forking thread's mask before SIGTERM was held for its fork: each thread's own (two threads of a rank
# may fork at once, a DataLoader's main thread and a Pool's worker handler; the child's one thread keeps it)
_at_fork = threading.local()
os.register_at_fork(before=_blocking_for_the_fork, after_in_parent=_unblocked_after_the_fork, after_in_child=_forked)
