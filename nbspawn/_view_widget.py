"""The live view: an anywidget while the run goes, replaced in place by the frozen bundle at the end.

Frontends drop kernel messages above ~1000 msg/s or 1 MB/s, and Colab ignores widget updates sent
from background threads.  So one forwarder, called from the thread that runs the cell, batches
every rank's new output into at most 10 messages a second, each capped in size (what is cut is
counted and shown as elided; the logs keep everything), and the kernel keeps only a bounded tail per
rank.  The browser asks for that tail when a view opens late (a reload), and the Stop button asks the
launcher to stop the run as an interrupt would.
"""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ._bundle import OutputTail, FrozenRun, rank_record, run_record
from ._run import RankState, Run

STATIC = Path(__file__).parent / "_static"
FLUSH_SECONDS = 0.1
MAX_BYTES_PER_MESSAGE = 48 * 1024  # x 10 messages/s stays well under Jupyter Server's 1 MB/s


def widget_available() -> bool:
    return (STATIC / "widget.js").exists()


@functools.cache
def _widget_class() -> type[anywidget.AnyWidget]:
    """Made on first use: anywidget reads the front end's file when the class is created."""

    class RunWidget(anywidget.AnyWidget):
        _esm = STATIC / "widget.js"
        header = traitlets.Dict().tag(sync=True)
        ranks = traitlets.List().tag(sync=True)
        error = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)

    return RunWidget


class WidgetView:
    def __init__(self) -> None:
        self.tails: dict[int, OutputTail] = {}
        self.pending: list[list[Any]] = []
        self.pending_bytes = 0
        self.elided: dict[int, int] = {}
        self.last_flush = 0.0
        self.dirty = True
        self.stop_event = threading.Event()
        self.widget: anywidget.AnyWidget | None = None
        self.handle = None
        self.shown: frozenset[int] | None = None

    # -- RunView ----------------------------------------------------------------------------------

    def started(self, run: Run) -> None:
        from IPython.display import display

        self.shown = run.spec.shown_ranks
        self.tails = {state.rank: OutputTail() for state in run.ranks}
        self.widget = _widget_class()()
        self.widget.on_msg(self._on_message)
        self._sync(run)
        self.handle = display(self.widget, display_id=True)

    def output(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].add(stream, text)
        if self.shown is not None and rank not in self.shown:
            return
        if self.pending_bytes + len(text) > MAX_BYTES_PER_MESSAGE:
            keep = max(0, MAX_BYTES_PER_MESSAGE - self.pending_bytes)
            self.elided[rank] = self.elided.get(rank, 0) + text[: len(text) - keep].count("\n")
            text = text[len(text) - keep :]
        if text:
            self.pending.append([rank, stream, text])
            self.pending_bytes += len(text)

    def rank_ended(self, run: Run, state: RankState) -> None:
        self.dirty = True

    def tick(self, run: Run) -> None:
        if time.monotonic() - self.last_flush >= FLUSH_SECONDS:
            self._flush(run)

    def wants_stop(self) -> bool:
        return self.stop_event.is_set()

    def finished(self, run: Run) -> None:
        self._flush(run)
        if self.handle is not None:
            self.handle.update(FrozenRun(run, self.tails))
        if self.widget is not None:
            self.widget.close()

    # -- internals --------------------------------------------------------------------------------

    def _flush(self, run: Run) -> None:
        self.last_flush = time.monotonic()
        if self.dirty or run.status != self.widget.header.get("status"):
            self._sync(run)
        if self.pending or self.elided:
            self.widget.send({"type": "output", "chunks": self.pending, "elided": self.elided})
            self.pending, self.pending_bytes, self.elided = [], 0, {}

    def _sync(self, run: Run) -> None:
        self.dirty = False
        record = run_record(run, {})
        del record["ranks"]
        record["elapsed"] = time.time() - run.started_at
        self.widget.header = record
        self.widget.error = record["error"]
        self.widget.ranks = [{k: v for k, v in rank_record(s, None).items() if k != "output"} for s in run.ranks]

    def _on_message(self, _widget: Any, content: dict, _buffers: list) -> None:
        """From the browser: Stop, or a late view asking for what it missed."""
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "stop":
            self.stop_event.set()
        elif kind == "replay" and self.widget is not None:
            tails = {rank: [list(c) for c in tail.chunks] for rank, tail in self.tails.items()}
            elided = {rank: tail.elided_lines for rank, tail in self.tails.items()}
            self.widget.send({"type": "replay", "tails": tails, "elided": elided})
