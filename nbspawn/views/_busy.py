"""Keep the kernel's status "busy" for the whole of a foreground run.

ipykernel 7 handles comm messages from the browser (the live view's replay and Stop, any widget on
the page) on a subshell, and publishes ``busy``/``idle`` around each one.  JupyterLab's status bar
shows the last status it received, whichever shell it came from, so one such message early in a
run made the status bar read "Idle" for the rest of it while the cell was still running.  While a
run holds the main shell, every ``idle`` published for another request is followed at once by a
``busy`` on behalf of the cell, so the status bar says what is true.  The run's start says ``busy``
once as well: a request answered between the cell's start and its run's (a page's comm, a control
request) has published an ``idle`` of its own already.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def kept_busy() -> Iterator[None]:
    kernel = _kernel()
    publish = getattr(kernel, "_publish_status", None)
    if kernel is None or publish is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    cell = kernel.get_parent("shell")  # the execute_request of the cell running this run

    def publish_status(status: str, channel: str, parent: Any = None) -> None:
        publish(status, channel, parent)
        if status == "idle" and (parent or kernel.get_parent(channel)) is not cell:
            publish("busy", "shell", cell)

    kernel._publish_status = publish_status
    publish("busy", "shell", cell)
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del kernel._publish_status  # the class's own method again


def _kernel() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    return getattr(get_ipython(), "kernel", None)
