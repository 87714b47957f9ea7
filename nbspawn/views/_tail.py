"""What the kernel keeps of one rank's output for its views: the newest lines and displays, bounded.

A rank's output is a sequence of *entries*: text lines (each of one stream) and display items, in
the order the rank wrote them, with the rules a terminal (and ``labextension/src/text.ts``) applies:

* a line still open (no newline yet) is continued by the next text of its stream, even if the other
  stream wrote in between;
* a line rewritten after a carriage return is a progress bar: only its latest state is kept (the
  colours in force are kept too), and it moves to the end, where the eye is, each time it is redrawn,
  as ``tqdm.write`` keeps a bar under the lines printed meanwhile; when it ends it stays there;
* ``update`` items replace the data of the earlier items with their display id, in place, except a
  widget bar being driven (a running ``<progress>``, as ``tqdm.auto`` draws): it floats to the end as
  a text bar does, and where it finishes it stays;
* a bar still being drawn (a text bar not ended, a widget bar not finished) is kept *below* what was
  written after its last redraw, where the live view shows it (``labextension/src/output.ts``), so
  the frozen view and a replay show it where it was last seen;
* ``clear`` removes everything so far (``wait``: when the next output comes).

At most ``limit`` entries are kept; the older ones are counted as elided (the logs keep them).

Each entry is stamped with ``seq``, its place in the run's arrival order, from a clock the ranks'
tails share (:func:`run_tails`), each time it is put at the end of its rank's output (a bar redrawn
moves there).  So one rank's entries are in ``seq`` order, and :func:`merged_order` puts every rank's
entries back in the order they were printed, as the live view shows them: the saved view and a replay
carry that order (:func:`order_runs`), instead of guessing it from positions.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..events._display import WIDGET_MIME
from ._sgr import ESCAPE, sgr_sequence, style_after
from ._text import settle_line

TAIL_LINES = 2000  # entries per rank, in the kernel and in the browser
ANSI = ESCAPE  # every escape sequence: none of them is shown


class Line:
    """One line of one stream; ``text`` keeps colours and, for a bar, ``\\r`` before its latest state."""

    __slots__ = ("bar", "complete", "seq", "stream", "text")

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.text = ""
        self.complete = False
        self.bar = False
        self.seq = 0  # place in the run's arrival order (OutputTail._put_last)

    @property
    def plain(self) -> str:
        """What a terminal shows: colours removed, ``\\r`` and ``\\b`` applied."""
        return settle_line(ANSI.sub("", self.text))


class Display:
    """A display item (docs/run-bundle.md, section 2) kept in a rank's output."""

    __slots__ = ("item", "seq")

    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self.seq = 0  # place in the run's arrival order (OutputTail._put_last)


Entry = Line | Display


class OutputTail:
    """The newest ``limit`` entries of one rank's output.

    ``clock`` numbers the entries in arrival order; the tails of one run share one (:func:`run_tails`).
    """

    def __init__(self, limit: int = TAIL_LINES, clock: Iterator[int] | None = None) -> None:
        self.limit = limit
        self._clock = itertools.count() if clock is None else clock
        self.entries: dict[int, Entry] = {}  # insertion-ordered: key -> entry
        self.elided_lines = 0
        self._keys: dict[int, int] = {}  # id(entry) -> key
        self._next = 0
        self._open: dict[str, Line] = {}
        self._by_id: dict[str, list[Display]] = {}
        self._clear_pending = False
        # bars being drawn, in the order they became bars: always the last entries
        self._floating: list[Entry] = []

    def __len__(self) -> int:
        return len(self.entries)

    # -- writing ------------------------------------------------------------------------------------

    def add(self, stream: str, text: str) -> None:
        if not text:
            return
        self._clear_if_waiting()
        pieces = text.split("\n")
        for i, piece in enumerate(pieces):
            ends = i < len(pieces) - 1
            line = self._open.get(stream)
            if line is None:
                if not piece and not ends:
                    continue
                line = self._open[stream] = Line(stream)
                self._append(line)
            if "\r" in piece or "\r" in line.text:
                line.text = settle_rewrites(line.text + piece)
                if _rewritten(line.text) and ANSI.sub("", piece).strip("\r"):
                    line.bar = True
                    self._float(line)  # a bar redrawn: where the eye is
            else:
                line.text += piece
            if ends:
                line.complete = True
                del self._open[stream]
                self._land(line)  # it ends where it was last seen
        self._trim()

    def display(self, item: dict[str, Any]) -> None:
        kind = item.get("kind")
        if kind == "clear":
            if item.get("wait"):
                self._clear_pending = True
            else:
                self.clear()
            return
        if kind == "update":
            for entry in self._by_id.get(str(item.get("id")), []):
                entry.item = {**item, "kind": "data"}
                if entry.item.get("mime") == WIDGET_MIME and widget_running(entry.item.get("value")):
                    self._float(entry)  # a widget bar driven: at the bottom, as the live view shows it
                else:
                    self._land(entry)  # finished (or not a bar): stays where it was last seen
            return
        self._clear_if_waiting()
        entry = Display(dict(item))
        if item.get("id") is not None:
            self._by_id.setdefault(str(item["id"]), []).append(entry)
        self._append(entry)
        self._trim()

    def skipped(self, lines: int) -> None:
        self.elided_lines += lines

    def clear(self) -> None:
        self.entries.clear()
        self._keys.clear()
        self._open.clear()
        self._by_id.clear()
        self._floating.clear()
        self._clear_pending = False

    # -- reading ------------------------------------------------------------------------------------

    def chunks(self, entries: Sequence[Entry] | None = None) -> list[list[Any]]:
        """``[stream, text]`` and ``["display", item]`` chunks, neighbouring lines of a stream joined:
        what a replay sends and what ``text.ts`` reads back into the same lines."""
        return entry_chunks(list(self.entries.values()) if entries is None else entries)

    def newest(self, max_bytes: int, size_of: Callable[[Entry], int] | None = None) -> tuple[list[Entry], int]:
        """The newest entries that fit in about ``max_bytes`` (by ``size_of``, default their JSON;
        images count for nothing, they have their own budget), and how many entries were left out."""
        size_of = size_of or entry_size
        kept: list[Entry] = []
        room = max_bytes
        for entry in reversed(list(self.entries.values())):
            size = size_of(entry)
            if size > room:
                break
            room -= size
            kept.append(entry)
        kept.reverse()
        return kept, len(self.entries) - len(kept)

    # -- internals ----------------------------------------------------------------------------------

    def _append(self, entry: Entry) -> None:
        self._put_last(entry)
        for bar in self._floating:  # the bars being drawn stay below it
            self._move_to_end(bar)

    def _put_last(self, entry: Entry) -> None:
        key = self._next
        self._next += 1
        entry.seq = next(self._clock)
        self.entries[key] = entry
        self._keys[id(entry)] = key

    def _move_to_end(self, entry: Entry) -> None:
        key = self._keys.get(id(entry))
        if key is None:
            return
        if key == self._next - 1:  # last of its rank already, but later than what other ranks wrote since
            entry.seq = next(self._clock)
        else:
            del self.entries[key]
            self._put_last(entry)

    def _float(self, entry: Entry) -> None:
        """A bar drawn now: at the bottom, and kept below whatever comes until it lands (the bars
        being drawn in the order they became bars, as the live view draws them).  Each redraw puts
        them after what other ranks wrote meanwhile too (their ``seq``)."""
        if entry not in self._floating:
            self._floating.append(entry)
        for bar in self._floating:
            self._move_to_end(bar)

    def _land(self, entry: Entry) -> None:
        """A bar finished: it stays where it is (the bottom), and what comes next goes below it."""
        if entry in self._floating:
            self._floating.remove(entry)

    def _clear_if_waiting(self) -> None:
        if self._clear_pending:
            self.clear()

    def _trim(self) -> None:
        while len(self.entries) > self.limit:
            key = next(iter(self.entries))
            entry = self.entries.pop(key)
            self._keys.pop(id(entry), None)
            if entry in self._floating:
                self._floating.remove(entry)
            if isinstance(entry, Line):
                if self._open.get(entry.stream) is entry:
                    del self._open[entry.stream]
            elif entry.item.get("id") is not None:
                held = self._by_id.get(str(entry.item["id"]), [])
                if entry in held:
                    held.remove(entry)
            self.elided_lines += 1


def run_tails(ranks: Iterable[int], limit: int = TAIL_LINES) -> dict[int, OutputTail]:
    """One tail per rank, sharing one clock: their entries' ``seq`` is the run's arrival order."""
    clock = itertools.count()
    return {rank: OutputTail(limit, clock) for rank in ranks}


def merged_order(outputs: Mapping[int, Sequence[Entry]]) -> list[int]:
    """Whose entry comes next, over every rank's entries merged by arrival (``seq``): one rank per
    entry.  Each rank's own entries stay in their order, so the ranks alone say the whole order."""
    streams = [[(entry.seq, rank) for entry in entries] for rank, entries in outputs.items()]
    return [rank for _, rank in heapq.merge(*streams)]


def entry_chunks(entries: Sequence[Entry]) -> list[list[Any]]:
    """``[stream, text]`` and ``["display", item]`` chunks of one rank's entries, neighbouring lines
    of a stream joined (``OutputTail.chunks``)."""
    out: list[list[Any]] = []
    for entry in entries:
        if isinstance(entry, Display):
            out.append(["display", entry.item])
            continue
        text = entry.text + ("\n" if entry.complete else "")
        if out and out[-1][0] == entry.stream and out[-1][1].endswith("\n"):
            out[-1][1] += text
        else:
            out.append([entry.stream, text])
    return out


def merged_chunks(outputs: Mapping[int, Sequence[Entry]]) -> tuple[dict[int, list[list[Any]]], list[int]]:
    """Each rank's chunks (``entry_chunks``), joined only within a run of its entries that nothing
    of another rank came between, and whose chunk comes next in arrival order: one rank per chunk."""
    chunks: dict[int, list[list[Any]]] = {rank: [] for rank in outputs}
    order: list[int] = []
    at = dict.fromkeys(outputs, 0)
    for rank, group in itertools.groupby(merged_order(outputs)):
        n = sum(1 for _ in group)
        run = entry_chunks(outputs[rank][at[rank] : at[rank] + n])
        at[rank] += n
        chunks[rank] += run
        order += [rank] * len(run)
    return chunks, order


def order_runs(ranks: Sequence[int]) -> str:
    """``merged_order`` written short, as the saved view and a replay carry it: runs of one rank as
    ``rank*count`` (``rank`` alone for one), comma-separated: ``[1, 1, 1, 0, 2]`` -> ``"1*3,0,2"``.
    A run never takes more than ``len(str(rank)) + 1`` characters an entry."""
    runs = []
    for rank, group in itertools.groupby(ranks):
        n = sum(1 for _ in group)
        runs.append(f"{rank}*{n}" if n > 1 else str(rank))
    return ",".join(runs)


def entry_size(entry: Entry) -> int:
    """About the bytes an entry takes in a saved notebook; images count for nothing (their own budget)."""
    if isinstance(entry, Line):
        return len(entry.text.encode("utf-8", "surrogatepass")) + 24
    item = entry.item
    if str(item.get("mime", "")).startswith("image/"):
        return 64 + len(str(item.get("text", "")))
    return len(json.dumps(item, ensure_ascii=False)) + 48


def widget_running(tree: Any, depth: int = 0) -> bool:
    """Whether a widget tree shows a bar still running (not full, not finished in success or error),
    as ``widgetRunning`` in ``labextension/src/entry.ts``."""
    if not isinstance(tree, dict) or depth > 20:
        return False
    if tree.get("type") == "progress":
        high = tree.get("max", 100)
        value = tree.get("value", 0)
        high = high if isinstance(high, (int, float)) else 100
        value = value if isinstance(value, (int, float)) else 0
        return value < high and tree.get("bar_style") not in ("success", "danger")
    children = tree.get("children")
    return tree.get("type") == "box" and isinstance(children, list) and any(widget_running(c, depth + 1) for c in children)


def _rewritten(text: str) -> bool:
    """Whether a line's text starts over after a carriage return (a bar drawing its next state)."""
    return "\r" in ANSI.sub("", text).rstrip("\r")


def settle_rewrites(text: str) -> str:
    """``text`` without the line states a carriage return overwrote (a progress bar's old frames).

    After a ``\\r``, the next visible character starts the line over (as the renderers and
    :func:`settle_line` do), so everything of that line before the last such return is dead, except
    colour codes, which still set the colour of what follows.  What is shown does not change.
    """
    if "\r" not in text:
        return text
    return "\n".join(_settle_rewrites_line(line) if "\r" in line else line for line in text.split("\n"))


def _settle_rewrites_line(line: str) -> str:
    parts = line.split("\r")
    for k in range(len(parts) - 1, 0, -1):
        if ANSI.sub("", parts[k]).strip("\b"):
            break
    else:
        return line
    before = "\r".join(parts[:k])
    colours = sgr_sequence(style_after(before)) if "\x1b" in before else ""
    return colours + "\r" + "\r".join(parts[k:])
