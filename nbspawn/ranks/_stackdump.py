"""How a rank answers the kernel's "where are you?" (SIGUSR1): every thread's stack, appended to its
``stacks.log`` (``events._where`` asks and reads).

faulthandler answers from its C signal handler, so a rank blocked in C (a collective, with the GIL
held or not) still answers.  But from Python 3.11 on that handler can crash the rank it asks: a
signal that lands while the main thread enters or leaves a Python function called from C, which
torch.compile and DDP's hooks do all the time, dumps a frame that is not one, a SIGSEGV (CPython
gh-123967).  The hang watch looks at every quiet rank, so a long ``torch.compile`` was killed by
being looked at.  Here a loop calling Python from C died within 6-226 requests on 3.11.7, 3.12.1 and
3.13.0 (3.10.13 lived through 2000: ``tests/unit/test_unit_stackdump.py``).  Upstream fixed it in 3.12.8
and 3.13.1, builds not at hand to test, and never in 3.11; so from 3.11 on a thread of the rank's
own dumps, with the GIL held, when no thread can be in the middle of such a call.  The signal reaches
it through Python's wakeup descriptor (``signal.set_wakeup_fd``), which Python's C-level handler
writes to on whichever thread the signal lands, even one torch started before this ran (a signal
mask would have to be set on every thread).  A rank holding the GIL in a long C call answers once it
lets go of it (a collective does: torch releases the GIL while it waits).

Standard library only: a program's rank loads this file by path (``ranks/_program.py``).
"""

from __future__ import annotations

import _thread
import atexit
import faulthandler
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, Literal, TextIO

HANDLER_CAN_CRASH = sys.version_info >= (3, 11)
# the process's SIGINT and SIGTERM are the main thread's: a helper thread of a rank blocks them
HELPER_THREAD_BLOCKS = {signal.SIGINT, signal.SIGTERM}
# the wakeup descriptor has one reader (the answering thread, once it runs): others that want to hear which
# signals Python handled (``ranks._stopped``: SIGTERM) are told by it, each call quick
answering = False
heard: list[Callable[[bytes], None]] = []


def open_stack_file(path: str, mode: Literal["w", "a"]) -> TextIO:
    """The rank's ``stacks.log``, made only once SIGUSR1 cannot kill the rank: the kernel asks a rank
    whose file exists (SIGUSR1, whose default is to kill), and :func:`answer_stack_requests` takes the
    signal only after.  Until then it is ignored (a look as a slow forkserver rank started killed it)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return open(path, mode)


def answer_stack_requests(
    stack_file: TextIO, *, then: Callable[[TextIO], None] | None = None, from_a_thread: bool = HANDLER_CAN_CRASH
) -> bool:
    """From now on SIGUSR1 appends every thread's stack to ``stack_file`` (its descriptor: one that
    is later pointed at another file with ``dup2`` is followed).  Called on the main thread, once.

    True when a thread of the rank's answers, and calls ``then(stack_file)`` after each dump (a
    rank's collectives are written beside it at once); False when faulthandler's handler answers,
    which tells nobody: a caller that must know watches the file grow."""
    global answering
    if from_a_thread:
        read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # the wakeup descriptor must not block
        os.set_blocking(read_end, True)
        signal.signal(signal.SIGUSR1, _asked)
        signal.siginterrupt(signal.SIGUSR1, False)  # a system call it lands in goes on (SA_RESTART)
        if signal.set_wakeup_fd(write_end, warn_on_full_buffer=False) == -1:
            answering = True
            _thread.start_new_thread(_answer, (stack_file, read_end, then))
            # Python's shutdown gives a signal with a Python handler back to SIG_DFL, which a request
            # arriving as the rank leaves (a spawn rank finalizes its interpreter) would die of
            atexit.register(signal.signal, signal.SIGUSR1, signal.SIG_IGN)
            return True
        signal.set_wakeup_fd(-1)  # someone's already (none in a rank nbspawn starts): theirs stays
        os.close(read_end)
        os.close(write_end)
    # faulthandler gives SIGUSR1 back to what was there when Python shuts down: ignore it then, so a
    # stack request that comes as the rank exits does not kill it
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    return False


def _asked(_signum: int, _frame: Any) -> None:
    """SIGUSR1's Python handler: nothing to do on the main thread (the answering thread dumps)."""


def _answer(stack_file: TextIO, read_end: int, then: Callable[[TextIO], None] | None) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_THREAD_BLOCKS)
    while True:
        woken_by = os.read(read_end, 64)  # a byte per signal Python handles: their numbers (PEP 475 retries)
        for listener in heard:
            try:
                listener(woken_by)
            except Exception:  # noqa: S110 - a listener never stops the answers
                pass
        if signal.SIGUSR1 in woken_by:
            try:
                faulthandler.dump_traceback(file=stack_file, all_threads=True)
            except (OSError, ValueError):  # the file is closed: the rank is leaving
                return
            if then is not None:
                try:
                    then(stack_file)
                except Exception:  # noqa: S110 - what follows a dump never takes the rank down
                    pass
