"""The kernel's kill watcher (``executors._reaper``), a real process started from this one: it reads as
what it is in ``ps`` and ``top``, not as the Python source it was started with."""

from __future__ import annotations

import os
import time

import psutil

from nbspawn.executors import _reaper


def test_the_kill_watcher_is_titled_in_ps_and_top():
    assert _reaper._pipe() >= 0  # started, as the first rank a kernel watches starts it
    title = _reaper.watcher_title(os.getpid())
    try:
        deadline = time.monotonic() + 10
        found: list[psutil.Process] = []
        while not found and time.monotonic() < deadline:
            found = [p for p in psutil.process_iter(["cmdline"]) if " ".join(p.info["cmdline"] or []).strip() == title]
            time.sleep(0.05)
        assert len(found) == 1, f"no process is titled {title!r}"
        watcher = found[0]
        with open(f"/proc/{watcher.pid}/comm") as comm:  # top's name for it: 15 bytes
            assert comm.read().strip() == "nbspawn watcher"
        assert "import" not in " ".join(watcher.cmdline())
    finally:
        _reaper._reset_after_fork()  # its pipe closed: it exits, as it does when the kernel dies
    watcher.wait(timeout=10)
