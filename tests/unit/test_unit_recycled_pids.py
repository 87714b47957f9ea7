"""A rank's pid is signalled only while it still names the rank (``nbspawn._pids``, ``executors._procs``).

Real processes: a pid cannot be made to wrap around in a unit test (32768 starts here), so a pid
"reused" is a live process noted with another start time, which is what a reused pid reads as.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from nbspawn import _pids
from nbspawn.executors._procs import kill_leftovers, ranks_reaped, ranks_started, signal_group


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


# a sleeper that says "alive" on SIGWINCH: a signal sent after any other, and handled after them
_ANSWERING = (
    "import signal, time\nsignal.signal(signal.SIGWINCH, lambda *_: print('alive', flush=True))\n"
    "print('ready', flush=True)\ntime.sleep(60)\n"
)


def _answering_sleeper() -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", _ANSWERING], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def _no_signal_reached(process: subprocess.Popen) -> bool:
    """Whether no SIGTERM or SIGKILL sent to ``process`` before now has reached it, whenever it lands:
    SIGKILL ends it at once, and a pending SIGTERM is handled before this SIGWINCH (Linux hands a process
    its lowest-numbered pending signal first), so it says "alive" only if neither was sent.  Not a fixed
    0.2 s after which a late wrongful kill would have been missed."""
    process.send_signal(signal.SIGWINCH)
    assert process.stdout is not None
    return process.stdout.readline() == "alive\n"


def test_a_start_time_is_read_from_proc_and_none_for_no_process():
    assert _pids.start_time(os.getpid()) == _pids.start_time(os.getpid()) is not None
    child = _sleeper()
    started = _pids.start_time(child.pid)
    assert started is not None and started >= _pids.start_time(os.getpid())  # type: ignore[operator]
    child.kill()
    assert _pids.start_time(child.pid) == started  # a zombie until reaped: still its pid
    child.wait()
    assert _pids.start_time(child.pid) is None


def test_a_rank_is_signalled_while_its_pid_is_its_own():
    child = _sleeper()
    ranks_started([child.pid])
    try:
        assert not _pids.recycled(child.pid)
        signal_group(child.pid, signal.SIGTERM)
        assert child.wait(timeout=10) == -signal.SIGTERM
        assert not _pids.recycled(child.pid)  # gone: a signal fails harmlessly or reaches what it left
    finally:
        ranks_reaped([child.pid])
    assert _pids.recycled(child.pid)  # reaped: not the rank's any more, whoever has the number next


def test_a_reaped_ranks_pid_is_never_signalled_again_whatever_has_it_now():
    """A late signal meant for a reaped rank (a list kept after its run) reaches no one, even when the
    number names a process whose start time nobody noted."""
    other = _answering_sleeper()  # the process the reaped rank's pid names now
    ranks_started([other.pid])
    ranks_reaped([other.pid])
    try:
        signal_group(other.pid, signal.SIGTERM)
        kill_leftovers(other.pid)
        assert _no_signal_reached(other), "a process that only has a reaped rank's pid was killed"
        ranks_started([other.pid])  # the number a rank's again: it is signalled as one
        assert not _pids.recycled(other.pid)
        signal_group(other.pid, signal.SIGTERM)
        assert other.wait(timeout=10) == -signal.SIGTERM
    finally:
        ranks_reaped([other.pid])
        other.kill()
        other.wait()


def test_a_pid_that_names_another_process_now_is_never_signalled():
    other = _answering_sleeper()  # the process the rank's old pid names now
    started = _pids.start_time(other.pid)
    assert started is not None
    _pids._started[other.pid] = started - 1  # the rank, noted as it started, a tick before this one
    try:
        assert _pids.recycled(other.pid)
        signal_group(other.pid, signal.SIGKILL)
        kill_leftovers(other.pid)
        assert _no_signal_reached(other), "a process that only shares a reaped rank's pid was killed"
    finally:
        ranks_reaped([other.pid])
        other.kill()
        other.wait()


def test_a_pid_noted_gone_and_found_alive_later_is_another_process():
    """A forkserver's rank can end, and be reaped by the forkserver, before the kernel notes it."""
    other = _sleeper()
    _pids._started[other.pid] = None
    try:
        assert _pids.recycled(other.pid)
    finally:
        ranks_reaped([other.pid])
        other.kill()
        other.wait()
