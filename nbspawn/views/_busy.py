"""Keep the kernel's status "busy" for the whole of a foreground run.

ipykernel 7 handles comm messages from the browser (the live view's replay and Stop, any widget on
the page) on a subshell, and publishes ``busy``/``idle`` around each one.  JupyterLab's status bar
shows the last status it received, whichever shell it came from, so one such message early in a
run made the status bar read "Idle" for the rest of it while the cell was still running.  While a
run holds the main shell, every ``idle`` published for another request is followed at once by a
``busy`` on behalf of the cell, so the status bar says what is true.

A request answered between the cell's start and its run's (a page's comm, a control request) has
published an ``idle`` of its own already: the run's start says ``busy`` again then, and only then
(a status message costs the cell's thread 0.2 ms).  To know, one watch per kernel sees every status
published from the moment nbspawn is loaded (``watch_statuses``, called by ``%load_ext``); a run
started before that (``launch()`` in a kernel that never loaded the extension) says ``busy`` anyway.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from .._shell import running_kernel


@runtime_checkable
class _KeepsBusy(Protocol):
    """A kernel's status watch as a run uses it: this module's ``_StatusWatch``, or one that an earlier
    import of this module (autoreload) left on the kernel, an instance of that import's class."""

    kernel: Any

    def keep_busy(self, cell: Any) -> None: ...

    def let_go(self) -> None: ...


class _StatusWatch:
    """Wraps one kernel's ``_publish_status``: remembers the last status published, and while a cell
    is kept busy answers every ``idle`` of another request with the cell's ``busy``.

    Statuses come from the main thread, the control thread and ipykernel 7's subshell threads.  Each
    is published and recorded under one lock, so ``last`` is the last one on the wire (two threads
    could otherwise send in one order and record in the other), and a ``busy`` answered for the cell
    is never sent after the run has let the cell go (it would follow the cell's own ``idle``)."""

    def __init__(self, kernel: Any, publish: Any) -> None:
        self.kernel = kernel
        self.publish = publish  # ipykernel's own
        self.lock = threading.Lock()
        self.last: tuple[str, Any] | None = None  # (status, parent message) of the last one published
        self.cell: Any = None  # the execute_request kept busy, while a run goes

    def __call__(self, status: str, channel: str, parent: Any = None) -> None:
        about = parent or self.kernel.get_parent(channel)
        with self.lock:
            self.publish(status, channel, parent)
            self.last = (status, about)
            if self.cell is not None and status == "idle" and about is not self.cell:
                self.publish("busy", "shell", self.cell)
                self.last = ("busy", self.cell)

    def keep_busy(self, cell: Any) -> None:
        with self.lock:
            self.cell = cell
            last = self.last
            if last is None or last[0] != "busy" or last[1] is not cell:  # another request's status came after the cell's busy
                self.publish("busy", "shell", cell)
                self.last = ("busy", cell)

    def let_go(self) -> None:
        with self.lock:
            self.cell = None


def watch_statuses() -> None:
    """Start watching this kernel's statuses (once per kernel; ``%reload_ext`` finds the watch there)."""
    _watch(running_kernel())


@contextlib.contextmanager
def kept_busy() -> Iterator[None]:
    watch = _watch(running_kernel())
    if watch is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    watch.keep_busy(watch.kernel.get_parent("shell"))  # the execute_request of the cell running this run
    try:
        yield
    finally:
        watch.let_go()


def _watch(kernel: Any) -> _KeepsBusy | None:
    if kernel is None:
        return None
    watch = vars(kernel).get("_publish_status")
    if isinstance(watch, _KeepsBusy):  # this module's, or an earlier import's (autoreload)
        return watch
    publish = getattr(kernel, "_publish_status", None)
    if publish is None:
        return None
    watch = _StatusWatch(kernel, publish)
    kernel._publish_status = watch
    return watch
