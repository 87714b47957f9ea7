"""The supervisor's eye on a run that may hang: ranks quiet for a while are looked at, and a run
about to be stopped is looked at first.

Looking is asking every rank where it is (``events._where``: its stack by faulthandler, its place in
its collectives from torch's flight recorder).  While a run goes on, a rank waiting in a collective
that another has not entered gets a note (its chip says so), once it has waited there long enough not
to be merely waiting for a straggler (``events._where.suspect_after``: 10 s at most, less under a short
timeout; a look that finds a younger wait looks again when it is that old); when it is stopped by ``--timeout``,
interrupt or Stop, what was seen makes the error's hang verdict.  One part of the supervisor
(``_supervisor._Supervisor.hangs``), with its own state: the loop tells it when output flowed and
which ranks are still in the cell, and reads back what was seen when the run was stopped.
"""

from __future__ import annotations

import time
from typing import Any

from .._runstate import Run
from .._source import main_thread_stack, program_stack
from .._spec import RunSpec
from ..events._where import hang_verdict, live_notes, suspect_at
from ..views._protocol import RunView
from ._base import Executor

STACK_DUMP_WAIT = 0.5  # how long to wait for faulthandler dumps before SIGTERM
HANG_FIRST_LOOK = 3.0  # seconds of silence before the ranks are looked at (then 6, 12, ... while nothing hangs)
HANG_RELOOK = 10.0  # while they look hung
HANG_LAST_LOOK = 300.0  # the longest silence between two looks
NOTE_REFRESH = 1.0  # while hung, the chips' "for N s" is recounted from the last look this often
WRITING_WITHIN = 0.5  # seconds: a rank that wrote output this recently is not blocked in a collective


class HangWatch:
    def __init__(self, run: Run, view: RunView, executor: Executor) -> None:
        self.run = run
        self.spec: RunSpec = run.spec
        self.view = view
        self.executor = executor
        self.seen_at_stop: dict[int, str] = {}  # where each rank was when the run was stopped
        self.collectives_at_stop: dict[int, list[dict[str, Any]]] = {}  # and how far in its collectives
        # when it was asked: how long a rank had waited is counted to then, not to the end of the grace after it
        self.looked_at_stop: float | None = None
        self.quiet_since = time.monotonic()  # when the ranks last wrote anything
        self.hang_look_after = HANG_FIRST_LOOK
        self.noticed = False  # the ranks' chips say they look hung
        # what the last look saw while they looked hung: stacks, collectives, the ranks sitting out
        self.last_look: tuple[dict[int, str], dict[int, list[dict[str, Any]]], str] | None = None
        self.notes_counted_at = 0.0  # when the chips' "for N s" was last recounted
        self.wrote_at: dict[int, float] = {}  # each rank's last output (time.monotonic())

    def ranks_started(self) -> None:
        """Silence counts from when the ranks exist: a slow start (a forkserver's first, which imports
        torch: over 3 s on CI) is no quiet rank to look at, and a rank still setting up can answer no look."""
        self.quiet_since = time.monotonic()

    def output_flowed(self) -> None:
        """The ranks wrote something: nothing hangs, and the next look is a while away."""
        self.quiet_since = time.monotonic()
        self.hang_look_after = HANG_FIRST_LOOK
        self.last_look = None
        if self.noticed:
            self.noticed = False
            for state in self.run.ranks:
                state.note = None
            self.view.hang_noticed(self.run, None)

    def rank_wrote(self, rank: int, now: float) -> None:
        self.wrote_at[rank] = now

    def all_writing(self, running: list[int], within: float = WRITING_WITHIN) -> bool:
        """Whether every rank still in the cell wrote output in the last ``within`` seconds: none is
        blocked in a collective, so there is no hang to look for (a look under a 16-rank flood costs a
        quarter of a second before Stop can act: issue #57, item 11)."""
        now = time.monotonic()
        return bool(running) and all(now - self.wrote_at.get(rank, -1e9) <= within for rank in running)

    def quiet(self, running: list[int], stopping: bool) -> None:
        """The ranks wrote nothing this turn: look at ``running`` if they have been quiet long
        enough (not once the run is being stopped), and keep the chips' counts fresh while they look hung."""
        if not stopping:
            self._watch_for_hangs(running)
        self._recount_hang_notes()

    def _watch_for_hangs(self, running: list[int]) -> None:
        """Ranks quiet for a while are looked at (their stacks and collectives); if some wait in a
        collective that another has not entered, their chips say so while it lasts.  Nothing is
        asked while output flows, and the looks back off while the ranks are merely busy."""
        now = time.monotonic()
        if not self.executor.supervision.watches_hangs or now < self.quiet_since + self.hang_look_after:
            return
        dumps, collectives = self.executor.look(self.run, running, STACK_DUMP_WAIT)
        stacks = {r: main_thread_stack(d, self.spec.cell) for r, d in dumps.items() if d} if self.spec.program is None else {}
        sitting_out = self.spec.sitting_out()  # --on: ranks a collective may wait for, which do not run the cell
        timeout = self.spec.asked.timeout  # a collective is a hang suspect once old: sooner under a short --timeout
        finished = self.finished()
        notes = live_notes(stacks, collectives, sitting_out=sitting_out, run_timeout=timeout, finished=finished)
        verdict = (
            hang_verdict(
                stacks, collectives, sitting_out=sitting_out, run_timeout=timeout, nodes=self.run.nodes(), finished=finished
            )
            if notes
            else None
        )
        for state in self.run.ranks:
            state.note = notes.get(state.rank)
        self.view.hang_noticed(self.run, verdict)
        self.noticed = verdict is not None
        self.last_look = (stacks, collectives, sitting_out) if self.noticed else None
        self.notes_counted_at = now
        # while hung, the chips' "for N s" is kept fresh; else look again later and later
        self.hang_look_after = HANG_RELOOK if self.noticed else min(HANG_LAST_LOOK, self.hang_look_after * 2)
        ripe_at = None if self.noticed else suspect_at(stacks, collectives, timeout)
        if ripe_at is not None:  # a rank waits in a collective too young to blame anyone yet: look when it is not
            self.hang_look_after = min(self.hang_look_after, max(NOTE_REFRESH, ripe_at - time.time() + STACK_DUMP_WAIT))
        self.quiet_since = time.monotonic()

    def _recount_hang_notes(self) -> None:
        """While the ranks look hung, the chips' "for N s" and the verdict count on each second from
        what the last look saw (asking the ranks again is every ``HANG_RELOOK`` s): they never lag."""
        now = time.monotonic()
        if not self.noticed or self.last_look is None or now < self.notes_counted_at + NOTE_REFRESH:
            return
        self.notes_counted_at = now
        stacks, collectives, sitting_out = self.last_look
        timeout = self.spec.asked.timeout
        finished = self.finished()
        notes = live_notes(stacks, collectives, sitting_out=sitting_out, run_timeout=timeout, finished=finished)
        if not notes or all(state.note == notes.get(state.rank) for state in self.run.ranks):
            return
        for state in self.run.ranks:
            state.note = notes.get(state.rank)
        verdict = hang_verdict(
            stacks, collectives, sitting_out=sitting_out, run_timeout=timeout, nodes=self.run.nodes(), finished=finished
        )
        self.view.hang_noticed(self.run, verdict)

    def finished(self) -> tuple[int, ...]:
        """The ranks that have finished the cell while others run it (a fresh rank that ended well, a kept
        world's rank back at its prompt): one that skipped a collective the others wait in is its cause."""
        return tuple(state.rank for state in self.run.ranks if state.status == "done")

    def look_before_stopping(self, running: list[int]) -> None:
        """Where each running rank is, asked before it is interrupted (an interrupt unwinds it, and
        a rank in a collective then reports its peers' noise): what the hang verdict is made of.

        On a cluster this asks the nodes' agents too: each agent also looks at its own ranks before
        it stops them, but the agents stop at different moments, and a rank whose peer on another
        node was stopped first fails ("Connection closed") before its own agent looks."""
        self.looked_at_stop = time.time()
        if self.all_writing(running):
            return  # every rank is printing: none waits in a collective, and Stop is not kept waiting
        dumps, collectives = self.executor.look(self.run, running, STACK_DUMP_WAIT)
        self.collectives_at_stop = collectives  # a cell's ranks write them down (ranks._watch); a program's do not
        for rank, dump in dumps.items():
            if dump:
                stack = program_stack(dump) if self.spec.program is not None else main_thread_stack(dump, self.spec.cell)
                if stack:
                    self.seen_at_stop[rank] = stack
        self.mark_where_stopped(self.seen_at_stop, self.looked_at_stop)

    def mark_where_stopped(self, stacks: dict[int, str], now: float | None = None) -> None:
        """Each rank's note becomes where it was when the run was stopped (``live_notes`` of the look
        before stopping: "waiting in barrier #1 for 10 s", "has not entered barrier #1 (Cell In[2], line
        4: ...)"), or none: the chips keep it while the ranks end, in the frozen view and in the saved
        notebook, as the verdict does in the banner.  From now on nothing recounts or clears them."""
        notes = live_notes(
            stacks, self.collectives_at_stop, now=now, sitting_out=self.spec.sitting_out(), at_stop=True, finished=self.finished()
        )
        for state in self.run.ranks:
            if state.prompt is None:  # a rank at a prompt keeps saying so
                state.note = notes.get(state.rank)
        self.noticed, self.last_look = False, None
