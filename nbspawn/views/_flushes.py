"""Displays that flush ipykernel's streams in one round trip instead of two.

ipykernel flushes ``sys.stdout`` and ``sys.stderr`` before every ``display_data`` and
``update_display_data`` (``ZMQDisplayPublisher._flush_streams``), so a display never overtakes text
printed before it.  Each flush is a round trip through the kernel's I/O thread: it schedules the
stream's send there and waits for a marker scheduled after it.  That was 0.24 ms for the two here
(2 cores), about a third of what the frozen view of a short run cost a kept world's cell.

While a view displays, both streams are flushed with one marker: a stream with text waiting
(``_flush_pending``, set by every write until the I/O thread takes its text) has its send scheduled,
then one marker, then one wait.  The wait cannot be skipped even when nothing is pending: the I/O
thread clears ``_flush_pending`` as it *begins* a flush, so a flush it is in the middle of has not
queued its send yet; it will have by the time the thread reaches the marker.  Streams that are not
ipykernel's (``%%capture``, ``redirect_stdout``), or ipykernel's without the parts used here, are
flushed as before.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

from .._shell import running_shell


@contextlib.contextmanager
def streams_flushed_in_one_round_trip() -> Iterator[None]:
    publisher = _display_publisher()
    if publisher is None or threading.current_thread() is not threading.main_thread():
        yield  # a background run's thread leaves ipykernel's publisher as it is
        return
    publisher._flush_streams = flush_streams
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del publisher._flush_streams  # the class's own method again


def flush_streams() -> None:
    """What ``_flush_streams`` does (every written text sent before what comes next), one round trip."""
    streams: tuple[Any, ...] = (sys.stdout, sys.stderr)
    io_thread = _io_thread_of(streams)
    if io_thread is None:
        for stream in streams:
            stream.flush()
        return
    for stream in streams:
        if stream._flush_pending:
            io_thread.schedule(stream._flush)
    reached = threading.Event()
    io_thread.schedule(reached.set)
    if not reached.wait(getattr(sys.stdout, "flush_timeout", 10)):
        print("IOStream.flush timed out", file=sys.__stderr__)  # as ipykernel says it


def _io_thread_of(streams: tuple[Any, ...]) -> Any:
    """The I/O thread both streams send through, if they are ipykernel's and it runs beside this
    thread (ipykernel's own condition for a round trip); else None."""
    io_thread = getattr(streams[0], "pub_thread", None)
    thread = getattr(io_thread, "thread", None)
    if thread is None or not thread.is_alive() or thread.ident == threading.get_ident():
        return None
    if not callable(getattr(io_thread, "schedule", None)):
        return None
    for stream in streams:
        if getattr(stream, "pub_thread", None) is not io_thread or not callable(getattr(stream, "_flush", None)):
            return None
        if not isinstance(getattr(stream, "_flush_pending", None), bool):
            return None
    return io_thread


def _display_publisher() -> Any:
    publisher = getattr(running_shell(), "display_pub", None)
    return publisher if callable(getattr(publisher, "_flush_streams", None)) else None
