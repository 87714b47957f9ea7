"""The run in a marimo notebook: the saved view's panes, drawn again as the ranks write, in the cell's output.

marimo runs cells in a kernel of its own, with no IPython display, no comms and no cell magics, so
the Jupyter widget (``_widget``) cannot open there.  What marimo has is a cell output that a running
cell may replace (``marimo.output.replace``); this view puts the run's static bundle there
(``_bundle.FrozenRun``: one pane per rank, statuses, the error, the X-ray), drawn again at most every
``EVERY`` seconds while the ranks write and once at the end, so the cell keeps the finished run as
its output.  marimo's own Stop (its interrupt) reaches the supervisor as a KeyboardInterrupt, as
Jupyter's does.  In ``python notebook.py`` (no marimo kernel) the call prints ``[rank{r}]:`` lines
instead (``_text``).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from .._runstate import RankState, Run
from ._bundle import FrozenRun
from ._protocol import READ_BUDGET, RunView
from ._tail import OutputTail, run_tails

log = logging.getLogger("nbspawn")
EVERY = 0.5  # seconds between two drawings of a running run: each sends the whole bundle to the page


def in_marimo() -> bool:
    """Whether this call runs in a marimo notebook's kernel (``marimo edit``, ``marimo run``)."""
    marimo = sys.modules.get("marimo")
    try:
        return marimo is not None and bool(marimo.running_in_notebook())
    except Exception:  # an older marimo, or one mid-import
        return False


class MarimoView(RunView):
    """The run's panes in the marimo cell's output, live and at the end."""

    rich = True  # a rank's displays (HTML, images) are kept as the saved view draws them
    read_budget: int | None = READ_BUDGET  # the widget's: what a page can show of a flood per poll
    shows_its_end = True  # drawn in its own cell's output at the end

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self.tails: dict[int, OutputTail] = {}
        self._drawn_at = 0.0
        self._changed = False

    def started(self, run: Run) -> None:
        self.tails = run_tails(state.rank for state in run.ranks)
        self._draw(run)

    def output(self, rank: int, stream: str, text: str) -> None:
        self.tails[rank].add(stream, text)
        self._changed = True

    def display(self, rank: int, item: dict[str, Any]) -> None:
        self.tails[rank].display(item)
        self._changed = True

    def skipped(self, rank: int, lines: int) -> None:
        self.tails[rank].skipped(lines)

    def rank_ended(self, run: Run, state: RankState) -> None:
        self._changed = True

    def hang_noticed(self, run: Run, verdict: str | None) -> None:
        self._changed = True

    def tick(self, run: Run) -> None:
        if self._changed and time.monotonic() - self._drawn_at >= self.every:
            self._draw(run)

    def flush(self, run: Run) -> None:
        self.tick(run)

    def finished(self, run: Run) -> None:
        frozen = FrozenRun(run, self.tails)
        run.shown_as(frozen._repr_mimebundle_())
        self._put(frozen.html)

    def _draw(self, run: Run) -> None:
        self._drawn_at, self._changed = time.monotonic(), False
        self._put(FrozenRun(run, self.tails).html)

    @staticmethod
    def _put(html: str) -> None:
        try:
            import marimo

            marimo.output.replace(marimo.Html(html))
        except Exception as err:  # a background run's thread has no cell to draw in: the logs have it all
            log.debug("nbspawn: marimo output not replaced: %s", err)
