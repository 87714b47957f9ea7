"""What the supervisor tells a view, as a base class whose every hook does nothing.

A view overrides what it draws; the rest stays a no-op, so the supervisor calls every hook on every
view without asking first.  Every call comes from the thread that supervises the run, and within a
rank ``output`` and ``display`` come in the order the rank wrote them.

* ``rich``: the view can draw rich output, so ranks look like a notebook to the code they run;
* ``read_budget``: bytes per text stream per read (None: everything); what is past it is
  ``skipped`` (counted, and kept in the logs);
* ``prints_output``: the ranks' output is printed to the kernel's stdout (a cell attached to a
  background run then need not show it again);
* ``shows_its_end``: the view draws how the run ended in its own cell, whenever that is (the widget, a
  marimo cell's output): a background run that failed need not be told in a later cell;
* ``wants_stop()``: a Stop button (True), or a reason to stop as a failure does (a string: a node
  agent's view, told by the kernel);
* ``interrupts()``: interrupts that came through the view, not as ``KeyboardInterrupt`` (a node
  agent's view: the kernel's, which must not raise wherever the agent happens to be).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._runstate import RankState, Run


READ_BUDGET = 32 * 1024  # bytes of each text stream of each rank a page's view reads per poll; the rest is skipped


class RunView:
    """A view that shows nothing: the Python API's default; output is only in the logs."""

    rich: bool = False
    read_budget: int | None = 0
    prints_output: bool = False  # ranks' output goes to the kernel's own stdout (a text view)
    shows_its_end: bool = False  # how the run ended is drawn in its own cell (the widget), not only said later

    def started(self, run: Run) -> None:
        """The ranks are about to start; ``run.ranks`` exist."""

    def output(self, rank: int, stream: str, text: str) -> None:
        """Text the rank wrote to ``stream`` (stdout or stderr)."""

    def display(self, rank: int, item: dict[str, Any]) -> None:
        """Something the rank displayed (``nbspawn.events._display`` says what an item holds).

        The default shows its text form as a line of stdout, for views that draw no rich output."""
        if item.get("kind") == "data" and item.get("text"):
            self.output(rank, "stdout", str(item["text"]).rstrip("\n") + "\n")

    def skipped(self, rank: int, lines: int) -> None:
        """That many lines of the rank were not read (past ``read_budget``)."""

    def rank_ended(self, run: Run, state: RankState) -> None:
        """The rank ended (``state.status``, ``state.failure``)."""

    def hang_noticed(self, run: Run, verdict: str | None) -> None:
        """The ranks have been quiet and look hung (``verdict``; the ranks' ``note`` say more), or,
        with None, no longer do."""

    def prompts_changed(self, run: Run, waiting: dict[int, str]) -> None:
        """Which ranks wait at a prompt now (rank -> what its ``note`` says: "at a breakpoint (Pdb, cell
        line 4)"); in the background, until a later cell attaches with ``%spawn debug RUN-ID``."""

    def command_answered(self, rank: int, line: str) -> None:
        """``rank``'s pdb prompt was answered; the rank writes ``line`` (its prompt and the command) to
        its stdout next, above pdb's answer, so its output reads as a terminal's session."""

    def stopping(self, run: Run) -> None:
        """The run is being stopped as the user asked (Stop, an interrupt, ``--timeout``): its ranks
        are about to be interrupted.  What they write from now on is still in the logs and read as
        before; a live view need only show the newest of it, until the frozen view replaces it."""

    def flush(self, run: Run) -> None:
        """Show now what the view holds back to redraw at its own pace (a rank's prompt is coming,
        and it blocks the loop that would have drawn it)."""

    def resources_sampled(self, run: Run) -> None:
        """The ranks' CPU and memory were sampled (each rank's ``cpu_percent``, ``rss``, ``peak_rss``;
        ``run.memory``, and ``run.memory_warning`` once they near its end)."""

    def tick(self, run: Run) -> None:
        """Once per turn of the supervision loop."""

    def finished(self, run: Run) -> None:
        """The run ended, its error is known, and nothing of it runs any more."""

    def wants_stop(self) -> bool | str:
        return False

    def interrupts(self) -> int:
        return 0  # how many since last asked: each acts as a Ctrl-C in the kernel does


SilentView = RunView
