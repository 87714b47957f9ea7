"""Rank output as ``[rank{r}]: `` lines: the rendering for terminal IPython and for plain text.

Lines are forwarded as soon as they are complete, prefixed with their rank; prefixes are padded to
the widest rank of the run, so every rank's text starts in one column.  stdout lines go to stdout
and stderr lines to stderr, so frontends keep them visibly apart.  What a rank displays is shown in
its text form (docs/run-bundle.md, section 2): its ``text/plain``, a widget progress bar as a text
bar, an image without text as ``<image/png 640×480>``.

A line being redrawn (rewritten after ``\\r``, as tqdm does, or a display updated in place, such as a
``tqdm.notebook`` bar) is a *bar*:

* on a terminal (the view's stderr is a TTY: terminal IPython, ``python script.py``) every open bar
  is drawn live in a footer at the bottom of the terminal, one line per bar, sorted by rank, as tqdm
  with ``tqdm.write`` draws it: complete lines are printed above the footer (the footer is erased,
  the lines printed, the footer drawn again), at most ten times a second, each footer line clipped
  to the terminal's width so that it never wraps.  The footer is drawn on stderr, where tqdm draws
  its own bars: stdout stays free of escape codes, so ``ipython script.ipy > out.txt`` keeps only
  the ranks' complete lines there, and stderr is unbuffered in practice, so the footer is never
  held back behind a buffer;
* elsewhere (a Jupyter kernel with ``--view text``, a pipe) a bar is shown once, in its final state.

When a bar ends (its line is completed with ``\\n``, a widget bar turns ``success`` or ``danger``,
its rank ends) its final state is printed as a normal line.  ``\\b`` erases.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import html
import os
import re
import shutil
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

import wcwidth

from .._runstate import RankState, Run
from .._shell import wants_colour
from ..events._widgetbar import widget_text
from ._busy import kept_busy
from ._protocol import RunView
from ._sgr import ESCAPE, SGR
from ._status import StatusComm

MAX_PENDING = 1 << 16  # a "line" longer than this is shown in pieces
REDRAW_EVERY = 0.1  # seconds: a live footer is redrawn at most ten times a second
WIDGET_MIME = "application/vnd.nbspawn.widget+json"
_TAG = re.compile(r"<[^>]*>")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # an escape or a control: where a run of text ends
_ERASE_LINE, _UP = "\x1b[K", "\x1b[A"


def settle_line(raw: str) -> str:
    """What a terminal would show for one line: the text after the last carriage return, \\b applied."""
    raw = raw.rstrip("\r")
    if "\r" in raw:
        segments = [s for s in raw.split("\r") if s]
        raw = segments[-1] if segments else ""
    return erase_backspaces(raw)


def erase_backspaces(text: str) -> str:
    """Each ``\b`` erases the character before it, as a terminal's cursor would overwrite it."""
    if "\b" not in text:
        return text
    chars: list[str] = []
    for ch in text:
        if ch == "\b":
            if chars:
                chars.pop()
        else:
            chars.append(ch)
    return "".join(chars)


# -- display items as text --------------------------------------------------------------------------


def _progress_nodes(tree: Any) -> list[dict[str, Any]]:
    if not isinstance(tree, dict):
        return []
    if tree.get("type") == "progress":
        return [tree]
    return [node for child in tree.get("children") or [] for node in _progress_nodes(child)]


def _image_size(mime: str, value: Any) -> tuple[int, int] | None:
    """Width and height from a PNG's or GIF's header (base64), without decoding the image."""
    if not isinstance(value, str) or mime not in ("image/png", "image/gif"):
        return None
    try:
        head = base64.b64decode(value[:48] + "=" * (-len(value[:48]) % 4))
    except (binascii.Error, ValueError):
        return None
    if mime == "image/png" and head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if mime == "image/gif" and head[:4] == b"GIF8" and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])
    return None


def item_text(item: dict[str, Any]) -> str:
    """What a display item says in text (docs/run-bundle.md, section 2)."""
    mime, value = str(item.get("mime") or ""), item.get("value")
    if mime == WIDGET_MIME:
        return widget_text(value)
    if mime == "text/plain":  # its own text, or what the kernel says of an image it dropped
        return str(value if value is not None else item.get("text") or "")
    text = str(item.get("text") or "")
    if text:
        return text
    if mime.startswith("image/"):
        meta = item.get("meta") or {}
        size = (meta.get("width"), meta.get("height")) if isinstance(meta, dict) else (None, None)
        if not all(isinstance(v, (int, float)) for v in size):
            size = _image_size(mime, value) or (None, None)
        return f"<{mime} {size[0]:g}×{size[1]:g}>" if all(size) else f"<{mime}>"
    if mime == "text/html" and isinstance(value, str):
        lines = (html.unescape(_TAG.sub("", line)).strip() for line in value.splitlines())
        return "\n".join(line for line in lines if line)
    return str(value) if isinstance(value, str) else ""


def _finished_bar(item: dict[str, Any]) -> bool | None:
    """None: not a progress widget; else whether all its bars are done (``success`` or ``danger``)."""
    if item.get("mime") != WIDGET_MIME:
        return None
    nodes = _progress_nodes(item.get("value"))
    if not nodes:
        return None
    return all(node.get("bar_style") in ("success", "danger") for node in nodes)


# -- the terminal -----------------------------------------------------------------------------------


def graphemes(text: str) -> Iterator[str]:
    """``text``'s grapheme clusters: what a terminal draws as one character (``e`` + a combining
    accent, a flag, a ZWJ emoji family), segmented by Unicode's rules (wcwidth >= 0.3), else, with
    the older wcwidth a runtime may already have, by :func:`joined_clusters`."""
    segment = getattr(wcwidth, "iter_graphemes", None)
    return iter(segment(text)) if segment is not None else joined_clusters(text)


def joined_clusters(text: str) -> Iterator[str]:
    """Clusters as far as an old wcwidth can tell them: a zero-width character (an accent, a
    joiner, a variation selector, a skin tone) or one after a zero-width joiner stays with the
    character before it, and two regional indicators make one flag."""
    cluster = ""
    for ch in text:
        flag = len(cluster) == 1 and _regional(cluster) and _regional(ch)
        if cluster and (flag or cluster[-1] == "\u200d" or wcwidth.wcwidth(ch) == 0 or "\U0001f3fb" <= ch <= "\U0001f3ff"):
            cluster += ch
        else:
            if cluster:
                yield cluster
            cluster = ch
    if cluster:
        yield cluster


def _regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def columns(cluster: str) -> int:
    """Terminal columns of one grapheme cluster (wcwidth's ``width``, or before 0.3 ``wcswidth``,
    which already measures a ZWJ sequence, a flag, a VS16 emoji whole); -1 for one a terminal does
    not print."""
    measure = getattr(wcwidth, "width", None)
    return int(measure(cluster)) if measure is not None else int(wcwidth.wcswidth(cluster))


def clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` terminal columns, never inside a grapheme cluster (a joined emoji, a
    letter and its accents); colours (SGR) kept, other escapes and controls dropped."""
    out: list[str] = []
    used = 0
    coloured = False
    pos = 0
    line = line.expandtabs(8)
    while pos < len(line):
        ch = line[pos]
        if ch == "\x1b":
            match = ESCAPE.match(line, pos)  # a lone ESC is dropped by itself
            end = match.end() if match else pos + 1
            sequence = line[pos:end]
            if sequence.startswith("\x1b[") and sequence.endswith("m"):
                out.append(sequence)
                coloured = True
            pos = end
            continue
        if ch < " " or ch == "\x7f":
            pos += 1
            continue
        control = _CONTROL.search(line, pos)
        end = control.start() if control else len(line)
        for cluster in graphemes(line[pos:end]):
            w = columns(cluster)
            if w < 0:  # not printable (a C1 control)
                continue
            if used + w > width:
                return "".join(out) + ("\x1b[0m" if coloured else "")
            out.append(cluster)
            used += w
        pos = end
    if coloured:
        out.append("\x1b[0m")
    return "".join(out)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _terminal_size(stream: TextIO) -> os.terminal_size:
    with contextlib.suppress(AttributeError, ValueError, OSError):
        return os.get_terminal_size(stream.fileno())
    return shutil.get_terminal_size()


class TextView(RunView):
    """Prefix every line with its rank, as torchrun's ``--tee`` does; bars live at the bottom on a terminal.

    ``live``: draw open bars in a footer (None: when the stderr stream is a terminal).
    """

    rich = False  # ranks need not look like a notebook: their displays are drawn as text
    prints_output = True  # a background run's lines come to whatever cell runs: an attached cell need not echo them
    read_budget: int | None = None  # a terminal shows everything (the logs have it too)

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None, live: bool | None = None) -> None:
        self._out = {"stdout": stdout, "stderr": stderr}
        # the streams this view wrote to: only those are flushed at the end (in a kernel, a flush is a
        # round trip to its I/O thread, ~0.25 ms each, for a quiet cell that printed nothing)
        self._wrote: set[str] = set()
        self._live_choice = live
        self._live = False
        self._pending: dict[tuple[int, str], str] = {}  # (rank, stream) -> the open line
        self._bars: dict[tuple[int, str], str] = {}  # (rank, key) -> an open bar's latest text, in order of appearance
        self._printed: dict[tuple[int, str], str] = {}  # (rank, display id) -> what was last printed of it
        self._queue: list[tuple[str, str]] = []  # (stream, text) not yet written (live only)
        self._dirty = False  # a bar changed since the footer was drawn
        self._footer = 0  # footer lines on the terminal now
        self._drawn_at = 0.0
        self._prefix_width = len("[rank0]:")
        self._status = StatusComm()  # the labextension's toolbar item; a no-op outside a kernel
        self._busy = contextlib.ExitStack()  # the kernel says Busy while a foreground run goes (_busy)
        self._said: str | None = None  # the hang last said
        self._told_waiting: set[int] = set()  # a background run's ranks said to wait at a prompt
        self._memory_told = False  # the memory warning is said once
        self._typed: dict[int, str] = {}  # rank -> its pdb command's echo, not printed again on a terminal
        self._plain: set[str] = set()  # the streams that get no colour codes (NO_COLOR, no terminal): wants_colour

    def _stream(self, name: str) -> TextIO:
        return self._out[name] or (sys.stdout if name == "stdout" else sys.stderr)

    def prefix(self, rank: int) -> str:
        """``[rank3]: ``, padded to the run's widest rank so every rank's text starts in one column."""
        return f"[rank{rank}]:".ljust(self._prefix_width) + " "

    # -- the view protocol (nbspawn.executors._supervisor.RunView) --------------------------------------------

    def started(self, run: Run) -> None:
        self._prefix_width = len(f"[rank{max(run.nprocs - 1, 0)}]:")
        choice = self._live_choice
        self._live = _isatty(self._stream("stderr")) if choice is None else choice
        self._plain = {name for name in ("stdout", "stderr") if not wants_colour(self._stream(name))}
        if not run.background:
            self._busy.enter_context(kept_busy())
        self._status.open(run)

    def output(self, rank: int, stream: str, text: str) -> None:
        self._end_open_lines(rank, but=stream)
        key = (rank, stream)
        pending = self._pending.get(key, "") + text
        *lines, pending = pending.split("\n")
        if len(pending) > MAX_PENDING:
            lines.append(pending)
            pending = ""
        elif "\r" in pending:
            pending = "\r" + settle_line(pending)  # keep only the latest state of a progress line
        self._pending[key] = pending
        if stream == "stdout" and rank in self._typed and self._typed[rank] in lines:
            lines.remove(self._typed.pop(rank))
        if lines:
            self._bar(key, None)  # the line it was redrawing is complete: printed as a line
            prefix = self.prefix(rank)
            self._emit(stream, "".join(f"{prefix}{settle_line(line)}\n" for line in lines))
        if pending.startswith("\r"):
            self._bar(key, pending[1:] if pending[1:].strip() else None)  # tqdm clears its bar to write a line
        self._render()

    def display(self, rank: int, item: dict) -> None:
        """A rank's display item, in text: a line (or lines) of stdout; an updated one is a bar."""
        kind = item.get("kind")
        if kind not in ("data", "update"):
            return  # clear_output() has nothing to clear in text
        self._end_open_lines(rank)
        key = (rank, f"display:{item.get('id')}") if item.get("id") is not None else None
        text = item_text(item).rstrip("\n")
        done = _finished_bar(item)
        if key is None:
            self._print(rank, text)
        elif done or (kind == "data" and done is None):  # a finished bar, or a display seen the first time
            self._bar(key, None)
            if text and self._printed.get(key) != text:
                self._print(rank, text)
            self._printed[key] = text
        else:  # a bar, or a display updated in place: redrawn until it ends
            self._bar(key, text if text.strip() else None)
        self._render()

    def skipped(self, rank: int, lines: int) -> None:
        return None  # the text view reads everything (no read_budget)

    def rank_ended(self, run: Run, state: RankState) -> None:
        self._flush_rank(state.rank)
        self._render(force=True)

    def flush(self, run: Run) -> None:
        self._render(force=True)

    def hang_noticed(self, run: Run, verdict: str | None) -> None:
        """Said once per kind of hang, on stderr: ``nbspawn: looks hung: rank 2 never entered ...``."""
        kind = verdict.split(" for ", 1)[0] if verdict else None  # the same hang, a later look: not again
        if verdict and kind != self._said:
            self._emit("stderr", f"nbspawn: looks hung: {verdict}\n")
            self._render(force=True)
        self._said = kind

    def resources_sampled(self, run: Run) -> None:
        """The memory warning, once, on stderr: ``nbspawn: memory is running out: ...``."""
        if run.memory_warning and not self._memory_told:
            self._memory_told = True
            self._emit("stderr", f"nbspawn: {run.memory_warning}\n")
            self._render(force=True)

    def prompts_changed(self, run: Run, waiting: dict[int, str]) -> None:
        """A background run's rank at a prompt is said once, on stderr, with how to attach (a foreground
        run's prompt is asked in its own cell)."""
        if not run.background:
            return
        for rank, note in sorted(waiting.items()):
            if rank not in self._told_waiting and "%spawn debug" in note:
                what = note.split(";", 1)[0]
                self._emit("stderr", f"nbspawn: rank {rank} is {what}: run `%spawn debug {run.run_id}` to attach\n")
                self._render(force=True)
        self._told_waiting = {r for r in waiting if "%spawn debug" in waiting[r]}

    def command_answered(self, rank: int, line: str) -> None:
        """On a terminal (terminal IPython) the command typed at the prompt stays on the screen, where
        the session reads in order already: the rank's echo of it is not printed a second time.  In a
        notebook's cell (VS Code keeps no echo of its input box) it is printed, above its answer."""
        if _isatty(self._stream("stdout")):
            self._typed[rank] = line

    def tick(self, run: Run) -> None:
        self._status.update(run)
        self._render()

    def finished(self, run: Run) -> None:
        self._busy.close()
        for rank in range(run.nprocs):
            self._flush_rank(rank)
        self._render(force=True)
        # what the ranks did together, in words (a terminal draws no lanes); a background run's end is not
        # said in whatever cell runs then: run.xray has it
        if run.xray is not None and not run.background:
            self._emit("stdout", f"collectives: {run.xray.summary}\n")
        for stream in sorted(self._wrote):
            with contextlib.suppress(OSError, ValueError):
                self._stream(stream).flush()
        self._status.close(run)

    # -- lines and bars ---------------------------------------------------------------------------

    def _print(self, rank: int, text: str) -> None:
        if text:
            prefix = self.prefix(rank)
            self._emit("stdout", "".join(f"{prefix}{line}\n" for line in text.split("\n")))

    def _bar(self, key: tuple[int, str], text: str | None) -> None:
        if text is None:
            self._dirty |= self._bars.pop(key, None) is not None
        elif self._bars.get(key) != text:
            self._bars[key] = text
            self._dirty = True

    def _end_open_lines(self, rank: int, but: str | None = None) -> None:
        """What the rank wrote next comes after the line it left open (``write("abc")``, then the cell's
        value shown, or a line on its other stream): that line is printed now, as far as it got. A bar
        being redrawn (``\r``) stays in the footer."""
        for stream in ("stdout", "stderr"):
            pending = self._pending.get((rank, stream), "")
            if stream != but and pending and not pending.startswith("\r"):
                self._pending[(rank, stream)] = ""
                self._emit(stream, f"{self.prefix(rank)}{settle_line(pending)}\n")

    def _flush_rank(self, rank: int) -> None:
        """A rank ended: its open lines and bars, in their final states, become normal lines."""
        for stream in ("stdout", "stderr"):
            pending = settle_line(self._pending.pop((rank, stream), ""))
            self._bar((rank, stream), None)
            if pending:
                self._emit(stream, f"{self.prefix(rank)}{pending}\n")
        for key in [k for k in self._bars if k[0] == rank]:
            text = self._bars[key]
            self._bar(key, None)
            if text != self._printed.get(key):
                self._print(rank, text)
                self._printed[key] = text

    def _emit(self, stream: str, text: str) -> None:
        if stream in self._plain:
            text = SGR.sub("", text)  # a rank's colours too: NO_COLOR, or a file, asks for none
        if self._live:
            self._queue.append((stream, text))
        else:
            self._wrote.add(stream)
            self._stream(stream).write(text)

    # -- the footer -------------------------------------------------------------------------------

    def _render(self, force: bool = False) -> None:
        """Erase the footer, print the lines waiting, draw the footer: at most ten times a second."""
        if not self._live or not (self._queue or self._dirty):
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < REDRAW_EVERY:
            return
        footer_stream = "stderr"
        writes: list[tuple[str, str]] = []
        if self._footer:
            writes.append((footer_stream, "\r" + _ERASE_LINE + (_UP + _ERASE_LINE) * (self._footer - 1)))
        writes.extend(self._queue)
        footer = self._footer_lines()
        if footer:
            footer_text = "\n".join(footer)
            writes.append((footer_stream, SGR.sub("", footer_text) if footer_stream in self._plain else footer_text))
        self._queue.clear()
        self._footer, self._dirty, self._drawn_at = len(footer), False, now
        merged: list[list[str]] = []
        for stream, text in writes:
            if merged and merged[-1][0] == stream:
                merged[-1][1] += text
            else:
                merged.append([stream, text])
        for stream, text in merged:  # each stream flushed before the other writes: one terminal, in order
            out = self._stream(stream)
            try:
                out.write(text)
                out.flush()
            except (OSError, ValueError):
                pass

    def _footer_lines(self) -> list[str]:
        if not self._bars:
            return []
        size = _terminal_size(self._stream("stderr"))
        width = max(size.columns - 1, 10)  # never the last column: some terminals wrap there
        room = max(size.lines - 2, 1)
        lines: list[str] = []
        for (rank, _key), text in sorted(self._bars.items(), key=lambda kv: kv[0][0]):
            prefix = self.prefix(rank)
            lines.extend(clip(prefix + part, width) for part in text.split("\n"))
        if len(lines) > room:
            more = len(lines) - room + 1
            lines = [*lines[: room - 1], clip(f"... and {more} more bar line{'s' if more > 1 else ''}", width)]
        return lines
