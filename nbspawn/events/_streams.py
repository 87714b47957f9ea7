"""Reading a rank's output back, in the order it was written, within a budget.

The rank side (``nbspawn.ranks._capture``) writes three files and, at every switch between them, a record of
their sizes in ``order.bin``.  :class:`RankStreams` replays them: the bytes each file had at a switch
come before the bytes after it, so the kernel shows lines in the order the rank wrote them however
far behind it reads.

A view that cannot show everything (a browser receives at most ~64 KB ten times a second) gives a
budget: of what arrived since the last read, each text stream keeps its newest whole lines within
the budget and the rest is *skipped* without being decoded, only counted, so a rank printing
gigabytes costs the kernel a ``bytes.count`` and the last lines of stdout *and* stderr are always
shown.  Displays are never skipped (the view caps images itself).  The logs keep everything.
"""

from __future__ import annotations

import codecs
import json
import os
from dataclasses import dataclass
from typing import Any

from .._rankdir import DISPLAY, FILES, ORDER, ORDER_RECORD, STREAMS


@dataclass
class Event:
    """Something a rank produced: text of a stream, a display record, or a count of skipped lines."""

    rank: int
    kind: str  # stdout | stderr | display | skipped
    value: Any  # str | dict | int


class RankStreams:
    """Incremental, ordered reader of one rank's stdout.log, stderr.log and display.jsonl."""

    def __init__(self, rank: int, rank_dir: str, made: bool = True) -> None:
        """``made``: the kernel makes the rank's stdout and stderr now, so it reads them from the start;
        else the rank makes them (a kept world's, as it begins a cell) and they are opened once there."""
        self.rank = rank
        self.dir = rank_dir
        # looked for at every read until the rank has made them
        self.paths = [os.path.join(rank_dir, name) for name in FILES]
        self.order_path = os.path.join(rank_dir, ORDER)
        if made:
            flags = os.O_RDONLY | os.O_CREAT
            self.fds = [os.open(self.paths[0], flags, 0o600), os.open(self.paths[1], flags, 0o600), -1]
        else:
            self.fds = [-1, -1, -1]
        self.order_fd = -1
        self.released = False
        self.pos = [0, 0, 0]  # bytes of each file already turned into events
        self.current = 0  # the stream the rank was writing at the last record read
        self.order_buf = b""
        self.pending: list[tuple[int, tuple[int, int, int]]] = []  # records not yet replayed
        self.decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(2)]
        self.line_open = [False, False]  # the last text shown of that stream did not end its line
        self.display_buf = b""

    @property
    def closed(self) -> bool:
        return self.released

    def _lazy(self) -> None:
        """Open the files the rank makes (display.jsonl, order.bin; a world rank's all) once they are there."""
        fds = self.fds
        for stream in (0, 1, 2):
            if fds[stream] < 0:
                fds[stream] = _open_if_there(self.paths[stream])
        if self.order_fd < 0:
            self.order_fd = _open_if_there(self.order_path)

    def read(self, budget: int | None = None) -> list[Event]:
        """Everything new, in written order; with ``budget``, at most about that many bytes per text stream."""
        if self.closed:
            return []
        self._lazy()
        self._read_order()
        ends = [os.fstat(fd).st_size if fd >= 0 else 0 for fd in self.fds]
        if ends == self.pos and not self.pending:
            return []  # nothing new: most reads of most ranks (the supervisor reads every rank at every wake)
        spans = self._spans(ends)
        if budget is not None:
            self._apply_budget(spans, budget)
        events: list[Event] = []
        for i, (stream, start, end, keep_from, switched) in enumerate(spans):
            # under a budget, a line still being written waits for its end (a bar being redrawn does
            # not): shown half, then skipped, it would stay cut in the view. Only the last span can
            # wait: what the rank wrote after it, to another stream, must not come out before it. Nor
            # can a span that ends where order.bin says the rank switched to another stream: the
            # rank wrote there next, whether or not those bytes are in their file yet (its record is
            # written first), and a span held now would be read after them.
            hold = budget is not None and i == len(spans) - 1 and not switched
            self._emit(stream, start, end, keep_from, events, hold)
        return events

    def close(self) -> list[Event]:
        """The rest, unbudgeted decoders flushed; then the descriptors are closed."""
        if self.closed:
            return []
        events = self.read()
        for stream in (0, 1):
            tail = self.decoders[stream].decode(b"", final=True)
            if tail:
                events.append(Event(self.rank, STREAMS[stream], tail))
        self.release()
        return events

    def release(self) -> None:
        for fd in (*self.fds, self.order_fd):
            if fd >= 0:
                os.close(fd)
        self.fds = [-1, -1, -1]
        self.order_fd = -1
        self.released = True

    # -- internals ----------------------------------------------------------------------------------

    def _read_order(self) -> None:
        if self.order_fd < 0:
            return
        chunks = [self.order_buf]
        while data := os.read(self.order_fd, 1 << 16):
            chunks.append(data)
        buf = b"".join(chunks)
        size = ORDER_RECORD.size
        whole = len(buf) - len(buf) % size
        for offset in range(0, whole, size):
            stream, *sizes = ORDER_RECORD.unpack_from(buf, offset)
            self.pending.append((stream, tuple(sizes)))
        self.order_buf = buf[whole:]

    def _spans(self, ends: list[int]) -> list[list[int]]:
        """[stream, start, end, keep_from, switched] byte ranges in written order, up to ``ends``;
        ``switched``: the range ends where a record says the rank switched to another stream."""
        spans: list[list[int]] = []
        pos = list(self.pos)

        def upto(limits: tuple[int, ...] | list[int], first: int, switched: bool) -> None:
            for stream in (first, *(s for s in (0, 1, 2) if s != first)):
                end = min(limits[stream], ends[stream])
                if end > pos[stream]:
                    if spans and spans[-1][0] == stream and spans[-1][2] == pos[stream]:
                        spans[-1][2] = end
                        spans[-1][4] = switched
                    else:
                        spans.append([stream, pos[stream], end, end, switched])
                    pos[stream] = end

        done = 0
        for stream, sizes in self.pending:
            if any(sizes[s] > ends[s] for s in (0, 1, 2)):
                break  # written after we looked at the files: next time
            upto(sizes, self.current, True)
            self.current = stream
            done += 1
        del self.pending[:done]
        upto(ends, self.current, False)
        for span in spans:
            span[3] = span[1]  # keep everything unless a budget says otherwise
        return spans

    def _apply_budget(self, spans: list[list[int]], budget: int) -> None:
        """Per text stream, keep only the newest ``budget`` bytes of this read (from a line's start)."""
        for stream in (0, 1):
            room = budget
            for span in reversed([s for s in spans if s[0] == stream]):
                size = span[2] - span[1]
                if size <= room:
                    room -= size
                else:
                    span[3] = span[2] - room  # keep_from; _emit moves it to a line's start
                    room = 0

    def _emit(self, stream: int, start: int, end: int, keep_from: int, events: list[Event], hold: bool = False) -> None:
        fd = self.fds[stream]
        if stream == DISPLAY:
            data = self.display_buf + os.pread(fd, end - start, start)
            lines = data.split(b"\n")
            self.display_buf = lines.pop()
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    events.append(Event(self.rank, "display", record))
            self.pos[stream] = end
            return
        if keep_from > start:
            skipped, ends_line = _count_lines(fd, start, keep_from)
            kept = os.pread(fd, end - keep_from, keep_from)
            if not ends_line:  # what is kept starts at a line's start: the rest of a cut line goes too
                cut = kept.find(b"\n") + 1 or len(kept)
                if cut > len(kept) // 2:  # unless it is most of what is kept (one line longer than the budget)
                    kept = CUT_LINE + _from_a_character(kept)  # its end is shown, marked as cut
                else:
                    skipped += kept[:cut].count(b"\n")
                    kept = kept[cut:]
            self.decoders[stream].reset()
            if self.line_open[stream]:
                events.append(Event(self.rank, STREAMS[stream], "\n"))  # close the line the view has open
                self.line_open[stream] = False
                skipped = max(0, skipped - 1)  # the first newline skipped ended that line: shown, not skipped
            if skipped:
                events.append(Event(self.rank, "skipped", skipped))
        else:
            kept = os.pread(fd, end - start, start)
        if hold:
            tail = kept[kept.rfind(b"\n") + 1 :]
            if tail and b"\r" not in tail:
                kept = kept[: len(kept) - len(tail)]
                end -= len(tail)  # read again next time, with the rest of its line
        self.pos[stream] = end
        text = self.decoders[stream].decode(kept)
        if text:
            events.append(Event(self.rank, STREAMS[stream], text))
            self.line_open[stream] = not text.endswith("\n")


CUT_LINE = "[…] ".encode()  # what starts a line shown only from the middle: it was longer than a read keeps


def _from_a_character(data: bytes) -> bytes:
    """``data`` from its first UTF-8 character that starts in it (not a continuation byte)."""
    start = 0
    while start < min(len(data), 3) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


def _open_if_there(path: str) -> int:
    """Asked at every read while the rank has not made the file (most ranks never display): a failed
    ``access`` costs 0.5 µs here, a failed ``open`` with its exception 1.6 µs."""
    if not os.access(path, os.F_OK):
        return -1
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # gone meanwhile (a kept world's rank begins its next cell)
        return -1


def _count_lines(fd: int, start: int, end: int) -> tuple[int, bool]:
    """Newlines in bytes [start, end) of a file, read a MiB at a time; and whether it ends with one."""
    count, last = 0, b""
    while start < end:
        block = os.pread(fd, min(1 << 20, end - start), start)
        if not block:
            break
        count += block.count(b"\n")
        start += len(block)
        last = block[-1:]
    return count, last == b"\n"
