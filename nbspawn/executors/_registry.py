"""What runs in the background of this kernel, and the last run: what ``%spawn status`` and
``%spawn stop`` list, ``nbspawn.last_run()`` returns, and the kernel's shutdown stops.

(Kept worlds, here and on clusters, have their own registry, in ``_kept``.)
"""

from __future__ import annotations

import atexit

from .._runstate import Run

_last_run: Run | None = None
_background_runs: dict[str, Run] = {}
_reported: set[str] = set()  # background runs whose failure a later cell told (each told once)


def last_run() -> Run | None:
    """The most recent run in this process, finished or not."""
    return _last_run


def began(run: Run | None) -> None:
    """``run`` is the last run from now on (None, or the one before: a look at a world that is no run
    of the user's, ``%spawn show WORLD NAME``, gives the place back)."""
    global _last_run
    _last_run = run


def runs_in_background(run: Run) -> None:
    _background_runs[run.run_id] = run


def background_runs() -> dict[str, Run]:
    """Background runs of this process, by run id, running or ended and not yet forgotten."""
    return dict(_background_runs)


def unreported_failures() -> list[Run]:
    """Background runs that failed and were neither waited for nor reported yet (each reported once).
    A run someone stopped (``%spawn stop``, ``run.stop()``, its Stop button) did not fail: it is not told;
    nor one whose view drew its end in its own cell (the widget): told again in a later cell, unrelated to
    it, the failure read as that cell's (issue #57, item 9)."""
    found = [
        r
        for r in _background_runs.values()
        if r.done and r.error is not None and r.status != "stopped" and not r.waited and not r.end_shown
        if r.run_id not in _reported
    ]
    _reported.update(run.run_id for run in found)
    return found


@atexit.register
def _stop_background_runs() -> None:
    """Kernel shutdown: background runs are stopped and cleaned up (their ranks would die anyway)."""
    for run in list(_background_runs.values()):
        if not run.done:
            run.stop()
    for run in list(_background_runs.values()):
        run.ended_within(10)
