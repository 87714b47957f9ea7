"""Displays that skip ipykernel's round trips for streams with nothing to send.

ipykernel flushes ``sys.stdout`` and ``sys.stderr`` before every ``display_data`` and
``update_display_data`` (``ZMQDisplayPublisher._flush_streams``), so a display never overtakes text
printed before it.  Each flush waits for a round trip through the kernel's I/O thread, written or not:
0.24 ms for the two here (2 cores), about a third of what the frozen view of a short run costs a kept
world's cell.  While a view displays, a stream is flushed only when it has text waiting
(``_flush_pending``, set by every write until the I/O thread takes the text), which keeps that order.
A stream that is not ipykernel's (``%%capture``, ``redirect_stdout``) is flushed as before.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def only_written_streams_flushed() -> Iterator[None]:
    publisher = _display_publisher()
    if publisher is None or threading.current_thread() is not threading.main_thread():
        yield  # a background run's thread leaves ipykernel's publisher as it is
        return

    def flush_written_streams() -> None:
        for stream in (sys.stdout, sys.stderr):
            if getattr(stream, "_flush_pending", True):
                stream.flush()

    publisher._flush_streams = flush_written_streams
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del publisher._flush_streams  # the class's own method again


def _display_publisher() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    publisher = getattr(get_ipython(), "display_pub", None)
    return publisher if callable(getattr(publisher, "_flush_streams", None)) else None
