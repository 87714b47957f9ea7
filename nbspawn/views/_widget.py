"""The live view: an anywidget while the run goes, replaced in place by the frozen bundle at the end.

Frontends choke on floods of kernel messages, and Colab ignores widget updates sent from background
threads.  So everything this view sends goes from the thread that runs the cell (the launcher calls
``started``, ``output``, ``tick``, ``finished`` there): every rank's new output is batched into at
most ten messages a second, each capped in size (what is cut is counted and shown as elided; the
logs keep everything), and the kernel keeps only a bounded tail per rank.

The browser sends two things, which may arrive on another thread while the cell runs (ipykernel 7
handles comm messages on a subshell, which JupyterLab >= 4.4 uses): ``stop`` (the Stop button; the
launcher then stops the run as an interrupt would) and ``replay`` (a view set up late, or a reloaded
page, asks for the kernel's tail).  Both only set flags under a lock; the replay is answered from
``tick``, on the cell's thread.

Front end: ``labextension/src/widget.ts``, built into ``nbspawn/_static/widget.js``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from .._runstate import RankState, Run
from . import _active
from ._bundle import FrozenRun, json_size, tail_within
from ._busy import kept_busy
from ._flushes import streams_flushed_in_one_round_trip
from ._messages import LiveHeader, LiveInfo, OutputMessage, ReplayMessage, WhereMessage, WidgetState, widget_request
from ._protocol import READ_BUDGET, RunView
from ._record import run_record
from ._status import StatusComm
from ._tail import OutputTail, merged_chunks, order_runs, run_tails
from ._xray_html import xray_html

STATIC = Path(__file__).parents[1] / "_static"  # built by npm into the package's root
FLUSH_SECONDS = 0.1  # at most 10 output messages a second
XRAY_EVERY = 2.0  # seconds between reads of the ranks' collectives records while a run goes on (they write every 2 s)
# A run that ends sooner than this shows only its frozen view: a live widget that would flash for a
# quick cell (a kept world's cell takes ~5 ms) costs more than the cell, and shows nothing live
# (as tqdm's ``delay``). SpawnMagics.live_after sets it.
LIVE_AFTER = 0.2
MAX_BYTES_PER_MESSAGE = 64 * 1024  # the chunks' JSON in one output message
# ... once the run is being stopped: each rank's newest lines only.  Under a flood the page is still
# taking in what was sent before the Stop, and draws the end (the frozen view) only after it; what
# the ranks write as they stop is in the logs and the frozen view's tails all the same
STOPPING_BYTES_PER_MESSAGE = 8 * 1024
MAX_REPLAY_BYTES = 1024 * 1024  # the tails' JSON in one replay message
LIVE_MIME = "application/vnd.nbspawn.live+json"
log = logging.getLogger(__name__)


def widget_available() -> bool:
    return (STATIC / "widget.js").exists()


@functools.cache
def _widget_class() -> type[anywidget.AnyWidget]:
    """Made on first use: anywidget reads the front end's files when the class is created."""

    class RunWidget(anywidget.AnyWidget):
        _esm = STATIC / "widget.js"
        _css = STATIC / "widget.css"
        header = traitlets.Dict().tag(sync=True)
        ranks: traitlets.List[dict[str, Any]] = traitlets.List().tag(sync=True)
        error = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
        xray_html = traitlets.Unicode("").tag(sync=True)  # the collectives X-ray's drawing (views._xray_html)

        def __repr__(self) -> str:  # the text/plain of a frontend that cannot show widgets
            h = self.header
            return f"nbspawn run {h.get('run_id', '')}: {h.get('nprocs', '?')} ranks, {h.get('status', 'starting')}"

    return RunWidget


class WidgetView(RunView):
    """The live widget: a RunView for the launcher (see ``nbspawn.executors._supervisor.RunView``)."""

    rich = True
    read_budget: int | None = READ_BUDGET  # RunView's type: a view may read everything (None)
    shows_its_end = True  # a background run's end is drawn in its own cell's widget

    def __init__(self, live_after: float = LIVE_AFTER) -> None:
        self.live_after = live_after
        self.tails: dict[int, OutputTail] = {}
        self.pending: list[list[Any]] = []  # [rank, stream, text], in arrival order
        self.pending_chars: dict[int, int] = {}
        self.elided: dict[int, int] = {}  # lines cut from live messages since the last one
        self.open_lines: set[tuple[int, str]] = set()  # (rank, stream) whose last sent text ended mid-line
        self.gaps: set[tuple[int, str]] = set()  # (rank, stream) whose text was cut since the last send
        self.mid_line: set[tuple[int, str]] = set()  # (rank, stream) whose cut text ended mid-line
        self.last_flush = 0.0
        self.dirty = True
        self.widget: anywidget.AnyWidget | None = None
        self.handle: Any = None
        self.status = StatusComm(open_after=live_after)
        self.broken = False
        # set by the browser, possibly from another thread
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._replay_wanted = False
        self._where_wanted = False  # the Where button: answered from the cell's thread, at the next flush
        self._stop_seen = False
        self._stopping = False  # the run is being stopped: smaller messages (STOPPING_BYTES_PER_MESSAGE)
        self._busy = contextlib.ExitStack()
        self._xray_read_at = 0.0
        self._xray: tuple[object, str] = (None, "")  # the X-ray drawn, and its drawing

    # -- RunView ----------------------------------------------------------------------------------

    def started(self, run: Run) -> None:
        self.tails = run_tails(state.rank for state in run.ranks)  # one clock: the order they print in
        self.last_flush = time.monotonic()
        if not run.background:  # a background run leaves the kernel free, and says so
            self._busy.enter_context(kept_busy())
        self.status.open(run)
        cell_id, execution_count = _active.current_cell()  # on the cell's thread, background or not
        if cell_id is not None:  # a page loaded later asks the kernel for this cell's run (_active)
            _active.install()
            _active.RUNS.started(cell_id, run.run_id, execution_count)
        if run.background or self.live_after <= 0:  # a background run's thread could not say which cell it is in
            self._show(run)

    def _show(self, run: Run) -> None:
        """The live widget, displayed where the run's output goes (its pending output follows)."""
        from IPython.display import display

        self.dirty = False
        self.widget = _widget_class()(**self._state(run))  # in comm_open: the view has it from the start
        self.widget.on_msg(self._on_message)
        _route_to_the_frontends_subshell(self.widget)
        mimebundle = self.widget._repr_mimebundle_()
        assert mimebundle is not None  # None only for a widget with no view; this one has its front end
        bundle = mimebundle[0] if isinstance(mimebundle, tuple) else mimebundle  # (data, metadata) or data
        display_id = uuid.uuid4().hex
        # for a page reloaded mid-run, which cannot get the widget's model while the kernel is busy
        live: LiveInfo = {
            "run_id": run.run_id,
            "model_id": self.widget.model_id,
            "display_id": display_id,
            "started_at": run.started_at,
            "nprocs": sum(1 for rank in range(run.nprocs) if run.spec.runs(rank)),  # --on: those that run the cell
            "log_dir": run.run_dir,
        }
        bundle[LIVE_MIME] = live
        self.handle = display(bundle, raw=True, display_id=display_id)
        _active.RUNS.shown(run.run_id, live)

    def output(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].add(stream, text)
        self.pending.append([rank, stream, text])
        self.pending_chars[rank] = self.pending_chars.get(rank, 0) + len(text)
        # a rank printing far faster than anything can show: keep only its newest output pending
        if self.pending_chars[rank] > 8 * self._message_bytes:
            self._cut_pending({rank: 2 * self._message_bytes})

    def display(self, rank: int, item: dict) -> None:
        self.tails[rank].display(item)
        self.pending.append([rank, "display", item])

    def skipped(self, rank: int, lines: int) -> None:
        self.tails[rank].skipped(lines)
        self.elided[rank] = self.elided.get(rank, 0) + lines

    def rank_ended(self, run: Run, state: RankState) -> None:
        self.dirty = True

    def hang_noticed(self, run: Run, verdict: str | None) -> None:
        self.dirty = True  # the chips' notes go with the next sync

    def resources_sampled(self, run: Run) -> None:
        self.dirty = True  # each rank's CPU and memory, with the next sync (about once a second)

    def prompts_changed(self, run: Run, waiting: dict[int, str]) -> None:
        self.dirty = True  # a rank's chip says it is at a prompt ("at a breakpoint"), or no longer

    def tick(self, run: Run) -> None:
        if self.widget is None and not self.broken and time.time() - run.started_at >= self.live_after:
            self._show_now(run)
        if self.widget is not None and run.spec.xrayed and time.monotonic() - self._xray_read_at >= XRAY_EVERY:
            self._xray_read_at = time.monotonic()
            before = run.xray
            with contextlib.suppress(Exception):  # a record being replaced: the next read has it
                run.read_xray(live=True)
            self.dirty |= run.xray is not before
        if time.monotonic() - self.last_flush >= FLUSH_SECONDS:
            self._flush(run)

    def flush(self, run: Run) -> None:
        if self.widget is None and not self.broken:  # a rank asks something: its pane must be there
            self._show_now(run)
        self._flush(run)

    def _show_now(self, run: Run) -> None:
        try:
            self._show(run)
        except Exception as err:  # a broken live view must not break the run: the logs have it all
            self.broken = True
            log.warning("nbspawn: live view not shown: %s", err)

    def wants_stop(self) -> bool | str:
        return self._stop.is_set()

    def stopping(self, run: Run) -> None:
        """From now on each message holds the ranks' newest lines only.  The header that says the run
        is stopping goes now, before the ranks are looked at and interrupted, with the text pending
        counted as elided: the page drops what it has not drawn too, and draws the end next."""
        self._stopping = True
        self._cut_pending(dict.fromkeys({chunk[0] for chunk in self.pending}, 0))
        self._flush(run)

    def finished(self, run: Run) -> None:
        self._busy.close()
        self._flush(run)
        self.status.close(run)
        frozen = FrozenRun(run, self.tails)
        bundle = frozen._repr_mimebundle_()
        run.shown_as(bundle)  # %spawn show draws it again (a page reloaded before a save)
        _active.RUNS.ended(run.run_id, bundle)  # for a page loaded after the end
        try:
            with streams_flushed_in_one_round_trip():
                if self.handle is not None:
                    self.handle.update(bundle, raw=True)
                else:  # a quick run: its frozen view is all it shows
                    from IPython.display import display

                    display(bundle, raw=True)  # the bundle made above, not IPython's formatters again
        except Exception as err:  # the frozen view must not hide the run's own error
            log.warning("nbspawn: could not show the frozen view: %s", err)
        if self.widget is not None:
            layout = getattr(self.widget, "layout", None)  # ipywidgets made one; it goes too
            self.widget.close()
            if layout is not None:
                layout.close()

    # -- internals --------------------------------------------------------------------------------

    def _flush(self, run: Run) -> None:
        self.last_flush = time.monotonic()
        if self.widget is None or self.broken:
            return
        try:
            if not self._stop_seen and self._stop.is_set():
                self._stop_seen = self.dirty = True
            if self.dirty or run.status != self.widget.header.get("status"):
                self._sync(run)
            self.status.update(run)
            with self._lock:
                replay, self._replay_wanted = self._replay_wanted, False
            if self._where_wanted:
                self._where_wanted = False
                self._send_where(run)
            if replay:
                self._send_replay()
            elif self.pending or self.elided:
                self._send_output()
        except Exception as err:  # a broken live view must not break the run: the logs have it all
            self.broken = True
            log.warning("nbspawn: live view stopped updating: %s", err)

    def _send_output(self) -> None:
        assert self.widget is not None  # sent by _flush, only once the widget exists
        if _over(self.pending, self._message_bytes):
            self._cut_pending(self._shares(self._message_bytes - 1024))
        for key in list(self.mid_line):  # a line whose start was cut earlier goes on here: cut its rest
            for chunk in self.pending:
                if (chunk[0], chunk[1]) == key:
                    cut = chunk[2].find("\n")
                    chunk[2] = chunk[2][cut + 1 :] if cut >= 0 else ""
                    if cut >= 0:
                        self.elided[key[0]] = self.elided.get(key[0], 0) + 1
                        self.mid_line.discard(key)
                        break
        for key in list(self.gaps):  # text of this stream was cut: close the line the browser has open
            first = next((c for c in self.pending if (c[0], c[1]) == key and c[2]), None)
            if first is not None:
                if key in self.open_lines:
                    first[2] = "\n" + first[2]
                self.gaps.discard(key)
        for rank, stream, text in self.pending:
            if text and stream != "display":
                if text.endswith("\n"):
                    self.open_lines.discard((rank, stream))
                else:
                    self.open_lines.add((rank, stream))
        chunks = [c for c in self.pending if c[2]]
        elided = {str(rank): n for rank, n in self.elided.items() if n}
        self.pending, self.pending_chars, self.elided = [], {}, {}
        message: OutputMessage = {"type": "output", "chunks": chunks, "elided": elided}
        self.widget.send(message)

    @property
    def _message_bytes(self) -> int:
        """The most an output message holds (its chunks' JSON)."""
        return STOPPING_BYTES_PER_MESSAGE if self._stopping else MAX_BYTES_PER_MESSAGE

    def _send_replay(self) -> None:
        """Everything kept, which already holds whatever was pending: every view starts over from it."""
        assert self.widget is not None  # sent by _flush, only once the widget exists
        ranks = [rank for rank, tail in self.tails.items() if len(tail) or tail.elided_lines]
        share = MAX_REPLAY_BYTES // max(1, len(ranks))
        kept, elided = {}, {}
        for rank in ranks:
            tail = self.tails[rank]
            kept[rank], left_out = tail.newest(share)
            if tail.elided_lines + left_out:
                elided[str(rank)] = tail.elided_lines + left_out
        by_rank, order = merged_chunks(kept)  # the views merge them in the order they were printed
        tails = {str(rank): chunks for rank, chunks in by_rank.items()}
        for rank, chunks in by_rank.items():
            for stream in ("stdout", "stderr"):
                last = next((text for s, text in reversed(chunks) if s == stream), "\n")
                if last.endswith("\n"):
                    self.open_lines.discard((rank, stream))
                else:
                    self.open_lines.add((rank, stream))
        self.pending, self.pending_chars, self.elided = [], {}, {}
        self.gaps.clear()
        self.mid_line.clear()
        message: ReplayMessage = {"type": "replay", "tails": tails, "order": order_runs(order), "elided": elided}
        self.widget.send(message)

    def _send_where(self, run: Run) -> None:
        """Every rank's stack now, grouped, for the Where button (a cluster's ranks are their agents')."""
        assert self.widget is not None  # sent by _flush, only once the widget exists
        text = run.where(wait=1.0) or "no rank is running"
        message: WhereMessage = {"type": "where", "text": text}
        self.widget.send(message)

    def _shares(self, budget: int) -> dict[int, int]:
        """Split ``budget`` bytes among the ranks with pending output: the quiet ones get all they
        need, the loud ones share the rest equally."""
        need: dict[int, int] = {}
        for chunk in self.pending:
            need[chunk[0]] = need.get(chunk[0], 0) + 16
        # a rank whose text alone is more characters than the budget has bytes (each takes one or
        # more) needs more than any share: its exact size, its JSON, is not worked out (megabytes
        # of a flood, at every message)
        loud = {rank for rank, chars in self._pending_text_chars().items() if chars > budget}
        for chunk in self.pending:
            if chunk[0] not in loud:
                need[chunk[0]] += _chunk_size(chunk)
        for rank in loud:
            need[rank] = budget + 1
        shares: dict[int, int] = {}
        left = budget
        order = sorted(need, key=lambda rank: need[rank])
        for i, rank in enumerate(order):
            fair = left // (len(order) - i)
            shares[rank] = min(need[rank], fair)
            left -= shares[rank]
        return shares

    def _cut_pending(self, allowance: dict[int, int]) -> None:
        """Keep, for each rank in ``allowance``, only its newest whole lines within that many bytes.

        The lines cut are counted as elided.  What is kept of a stream starts at a line's start (the
        rest of a line whose start was cut goes too), and ``_send_output`` first closes the line the
        browser had open, so no two lines run together.
        """
        for rank, room in allowance.items():
            # displays are never cut (images have their own budget): the text shares what they leave
            room -= sum(_chunk_size(c) + 16 for c in self.pending if c[0] == rank and c[1] == "display")
            mine = [c for c in self.pending if c[0] == rank and c[1] != "display"]
            original = [c[2] for c in mine]
            for chunk in reversed(mine):  # newest first: whole chunks while they fit, then whole lines
                if room <= 18:  # not even an empty text's JSON and its place: nothing more fits
                    chunk[2], room = "", 0
                    continue
                size = json_size(chunk[2]) + 16
                if size <= room:
                    room -= size
                    continue
                chunk[2] = tail_within(chunk[2], max(0, room - 16), whole_lines=True)
                room = 0
            for stream in ("stdout", "stderr"):
                key = (rank, stream)
                idx = [i for i, c in enumerate(mine) if c[1] == stream]
                lost = any(len(mine[i][2]) < len(original[i]) for i in idx)
                if not lost and key not in self.mid_line:
                    continue
                if lost:
                    self.gaps.add(key)
                line_start = key not in self.mid_line  # does the text before the next chunk end a line?
                for i in idx:
                    text, whole = mine[i][2], original[i]
                    before = whole[: len(whole) - len(text)]
                    if text and not (before.endswith("\n") if before else line_start):
                        cut = text.find("\n")  # the rest of a line whose start was cut
                        mine[i][2] = text = text[cut + 1 :] if cut >= 0 else ""
                    if text:
                        self.mid_line.discard(key)
                        break
                    line_start = whole.endswith("\n") if whole else line_start
                else:  # nothing of this stream is left: the next text may go on mid-line
                    if line_start:
                        self.mid_line.discard(key)
                    else:
                        self.mid_line.add(key)
            cut_lines = sum(o.count("\n") for o in original) - sum(c[2].count("\n") for c in mine)
            if cut_lines > 0:
                self.elided[rank] = self.elided.get(rank, 0) + cut_lines
            self.pending_chars[rank] = sum(len(c[2]) for c in mine)
        self.pending = [c for c in self.pending if c[2]]

    def _pending_text_chars(self) -> dict[int, int]:
        """Characters of text pending, by rank (displays aside)."""
        chars: dict[int, int] = {}
        for rank, stream, value in self.pending:
            if stream != "display":
                chars[rank] = chars.get(rank, 0) + len(value)
        return chars

    def _state(self, run: Run) -> WidgetState:
        """The synced traits: the run record without output, split as the front end reads it."""
        record = run_record(run)
        header: LiveHeader = {
            **{key: value for key, value in record.items() if key != "ranks"},  # type: ignore[typeddict-item]
            "elapsed": time.time() - run.started_at,
            "stopping": self._stop_seen,
        }
        return {"header": header, "ranks": record["ranks"], "error": record["error"], "xray_html": self._xray_html(run)}

    def _xray_html(self, run: Run) -> str:
        """The X-ray's drawing, made again only when the ranks' records said something new."""
        if run.xray is None:
            return ""
        if self._xray[0] is not run.xray:
            self._xray = (run.xray, xray_html(run.xray))
        return self._xray[1]

    def _sync(self, run: Run) -> None:
        assert self.widget is not None  # called by _flush, only once the widget exists
        self.dirty = False
        state = self._state(run)
        with self.widget.hold_sync():  # one message
            for name, value in state.items():
                setattr(self.widget, name, value)

    def _on_message(self, _widget: Any, content: Any, _buffers: list) -> None:
        """From the browser, maybe on a subshell's thread: only flags, answered from the cell's thread."""
        kind = widget_request(content)
        if kind == "stop":
            self._stop.set()
        elif kind == "replay":
            with self._lock:
                self._replay_wanted = True
        elif kind == "where":
            self._where_wanted = True


def _over(pending: list[list[Any]], max_bytes: int) -> bool:
    """Whether the chunks' JSON is more than ``max_bytes``: their text's characters say so at once when
    they alone are more (each is a byte or more), without encoding megabytes of a flood."""
    if sum(len(chunk[2]) for chunk in pending if isinstance(chunk[2], str)) > max_bytes:
        return True
    return sum(_chunk_size(chunk) for chunk in pending) > max_bytes


def _chunk_size(chunk: list[Any]) -> int:
    """Bytes of a pending chunk in a message: its text's JSON, or a display item's."""
    value = chunk[2]
    return json_size(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def _route_to_the_frontends_subshell(widget: anywidget.AnyWidget) -> None:
    """Let the browser's messages run on the subshell the frontend sent them to.

    ipykernel >= 7.4 routes a comm's incoming messages to the shell the kernel last published on
    (for a cell that awaits a widget's reply), here the main shell, which is busy running this very
    cell until the run ends: Stop would arrive too late.  This widget never awaits a reply, and
    its handler only sets flags, so the frontend's choice (JupyterLab: a subshell) is the right one.
    """
    comm = getattr(widget, "comm", None)
    if comm is not None and hasattr(comm, "_reply_subshell_for"):
        comm._reply_subshell_for = lambda _data, default: default
