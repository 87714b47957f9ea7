"""The supervisor's prompt desk: a rank's ``input()``, ``breakpoint()`` and pdb answered through the
kernel's own stdin channel, one prompt at a time.

Ranks write their requests to the run's prompt channel (``events._prompts``, ``ranks._prompt``); the
supervision loop, woken by it, calls :meth:`PromptDesk.serve`: a failing rank's "post-mortem?"
is answered first (yes only to the first one, with ``--pdb``), then the next prompt in arrival order is
asked with the kernel's ``input()`` (a Jupyter ``input_request``).  While the kernel waits, a watcher
thread keeps the other ranks' output flowing and ends the prompt for Stop, ``--timeout`` or the
prompting rank's end.  One part of the supervisor (``_supervisor._Supervisor.desk``), as ``HangWatch``
is another: what it needs of the loop is :class:`Loop`.

A background run has no cell to ask in: its ranks wait at their prompts, their chips say so, and a
later cell attaches (``%spawn debug RUN-ID [RANK]``, :meth:`PromptDesk.attach`): that cell's own
``input()`` answers the waiting ranks, one at a time, while the run's thread supervises as before
(the two share ``pending`` under ``prompt_lock``).  Stop, ``--timeout`` and the rank's end still end it.
"""

from __future__ import annotations

import _thread
import builtins
import contextlib
import getpass
import multiprocessing.connection
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .._runstate import Run
from .._spec import RunSpec
from ..errors import SpawnUsageError
from ..events._prompts import PromptChannel, PromptRequest, decorate, leaves, next_prompt, stdin_answerable
from ..views._protocol import RunView

PROMPT_WATCH = 0.1  # while the kernel waits at a rank's prompt: how often Stop, --timeout and the rank are looked at
STICKY = 1.0  # seconds a rank in a pdb session keeps the prompt after a command that does not let it run on
ENDING_WAIT = 2.0  # seconds an attached cell waits for an ending run's status before it returns
ECHO_LINES = 15  # lines of a background rank's output shown when a cell attaches: where it stopped

_attachable: dict[str, PromptDesk] = {}  # background runs whose ranks may wait at prompts, by run id


def attachable(run_id: str) -> PromptDesk | None:
    """The prompt desk of this background run, if it is running and its ranks can prompt."""
    return _attachable.get(run_id)


def waiting_runs() -> dict[str, dict[int, str]]:
    """Background runs with ranks waiting at a prompt: run id -> rank -> what it waits at."""
    return {run_id: dict(desk.prompt_notes) for run_id, desk in list(_attachable.items()) if desk.prompt_notes}


class Loop(Protocol):
    """What the prompt desk needs of the supervision loop that owns it."""

    alive: dict[Any, int]  # waitable -> rank, for ranks still in the cell
    stop_reason: str | None
    deadline: float  # --timeout, monotonic

    def forward_output(self, final: bool = False) -> bool: ...

    def check_stop(self) -> None: ...

    def check_clocks(self) -> None: ...


class _EndedLoop:
    """The loop of a run that has ended, for a desk closed while a cell is still attached to it:
    nothing is left to wait for, and the attached cell returns."""

    def __init__(self) -> None:
        self.alive: dict[Any, int] = {}
        self.stop_reason: str | None = "ended"
        self.deadline = float("-inf")

    def forward_output(self, final: bool = False) -> bool:
        return False

    def check_stop(self) -> None:
        pass

    def check_clocks(self) -> None:
        pass


_ENDED: Loop = _EndedLoop()


class PromptDesk:
    def __init__(self, run: Run, view: RunView, loop: Loop) -> None:
        self.run = run
        self.spec: RunSpec = run.spec
        self.view = view
        self.loop = loop
        self.prompts: PromptChannel | None = None  # where ranks ask (None: nothing can answer them)
        self.pending: list[PromptRequest] = []  # prompts waiting their turn, in arrival order
        self.last_prompted: int | None = None  # the rank answered last
        self.sticky_until = 0.0  # ... which keeps the prompt until then (a pdb session under way)
        self.post_mortem: int | None = None  # the rank told to stop in post-mortem (--pdb)
        self.prompt_lock = threading.Lock()  # pending, asking and attached: shared with a cell attached to a background run
        self.asking: PromptRequest | None = None  # the prompt being asked now
        self.attached = False  # a later cell answers this background run's prompts
        self.prompt_notes: dict[int, str] = {}  # rank -> what it waits at, as its chip says

    def open(self, answerable: bool) -> None:
        """The prompt channel, where something can answer (``answerable``: the cell that starts the run
        was sent with stdin): its own input box, or (a background run) a later cell's, which attaches.
        A run started without stdin (nbclient, papermill) has none: its prompts fail at once."""
        if answerable:
            self.prompts = PromptChannel.open(self.spec.run_dir, [state.dir for state in self.run.ranks])
        if self.prompts is not None and self.run.background:
            _attachable[self.run.run_id] = self

    def close(self) -> None:
        """The run is over: no rank asks any more.  The desk also lets go of its loop: the supervisor
        and the desk refer to each other, and that cycle kept the supervisor, and what it holds (the
        cell's job, the tensors its ranks sent home), alive until the garbage collector came by."""
        _attachable.pop(self.run.run_id, None)
        with self.prompt_lock:
            self.pending.clear()
            self._mark_prompts()
        if self.prompts is not None:
            self.prompts.close()
        self.loop = _ENDED

    def serve(self) -> None:
        """Answer what the ranks asked: whether a failing rank stops in post-mortem, then one prompt
        (a background run's wait for a cell to attach)."""
        assert self.prompts is not None  # only called with a channel
        with self.prompt_lock:
            self._take_requests()
            if self.loop.stop_reason is not None or self.run.background:
                self._mark_prompts()
                return
        alive = set(self.loop.alive.values())
        sticky = self.last_prompted in alive and time.monotonic() < self.sticky_until
        chosen = next_prompt(self.pending, self.last_prompted if sticky else None, sticky)
        if chosen is None:
            self._mark_prompts()
            return
        request = chosen
        self.pending.remove(request)
        self.asking = request
        self._mark_prompts()
        self.loop.forward_output()  # what the rank printed (pdb's listing) comes before its prompt
        self.view.flush(self.run)  # shown now, not at the view's next redraw: the prompt blocks it
        waiting = sorted({r.rank for r in self.pending if r.kind != "failed"} - {request.rank})
        try:
            reply = self._ask(request, decorate(request, waiting))
        finally:
            self.asking = None
        if reply is None:  # the prompt was ended (Stop, --timeout, the rank ended): the loop goes on
            return
        command = str(reply.get("value", ""))
        if request.kind == "pdb" and "value" in reply:  # the rank echoes it (ranks._prompt.echo_command)
            self.view.command_answered(request.rank, f"{request.prompt}{command}")
        self.prompts.answer(request, **reply)
        self.last_prompted = request.rank
        going_on = request.kind != "pdb" or "value" not in reply or leaves(command)
        self.sticky_until = 0.0 if going_on else time.monotonic() + STICKY
        if going_on:
            self._mark_prompts()

    def _take_requests(self) -> None:
        """New requests read; those of ranks gone dropped; failing ranks told whether to stop in
        post-mortem; with the run ending, every waiting rank told to stop.  Under ``prompt_lock``."""
        assert self.prompts is not None
        self.pending.extend(self.prompts.read())
        alive = set(self.loop.alive.values())
        self.pending = [r for r in self.pending if r.rank in alive]
        for asked in [r for r in self.pending if r.kind == "failed"]:
            if self.loop.stop_reason is None and self.post_mortem in alive:
                continue  # asked again once the post-mortem under way ends (its rank is the root cause)
            self.pending.remove(asked)
            stop = self.spec.asked.pdb and self.loop.stop_reason is None and self.post_mortem is None
            if stop:
                self.post_mortem = asked.rank
            self.prompts.answer(asked, value="post-mortem" if stop else "")
        if self.loop.stop_reason is not None:  # the run ends: a rank still asking is stopped
            for asked in [r for r in self.pending if r.kind != "failed"]:
                self.pending.remove(asked)
                self.prompts.answer(asked, stop=True)

    def _mark_prompts(self) -> None:
        """Each rank at a prompt has a note saying so (its chip: "at a breakpoint (Pdb, cell line 4)"),
        and the view is told when that changes; a rank that went on has its note taken back."""
        asked = [r for r in [*self.pending, *([self.asking] if self.asking is not None else [])] if r.kind != "failed"]
        notes = {r.rank: r.waiting_note for r in asked}
        kinds = {r.rank: "pdb" if r.kind == "pdb" else "input" for r in asked}
        if self.last_prompted is not None and time.monotonic() < self.sticky_until and self.last_prompted in self.prompt_notes:
            notes.setdefault(self.last_prompted, self.prompt_notes[self.last_prompted])  # mid-session: it comes back
            kinds.setdefault(self.last_prompted, "pdb")
        if self.run.background and not self.attached:
            notes = {r: f"{note}; run %spawn debug {self.run.run_id} to attach" for r, note in notes.items()}
        if notes == self.prompt_notes:
            return
        for state in self.run.ranks:
            old, new = self.prompt_notes.get(state.rank), notes.get(state.rank)
            state.prompt = kinds.get(state.rank)
            if new is not None:
                state.note = new
            elif old is not None and state.note == old:
                state.note = None
        self.prompt_notes = notes
        self.view.prompts_changed(self.run, dict(notes))

    def _ask(self, request: PromptRequest, prompt: str) -> dict[str, Any] | None:
        """The kernel's own input() (a Jupyter input_request), the answer as the rank reads it; None
        if the prompt was ended for Stop, --timeout or the rank's end (a watcher thread interrupts the
        wait).  An interrupt from the user propagates: the run is interrupted as always."""
        own = [w for w, r in self.loop.alive.items() if r == request.rank]

        def look() -> str | None:
            if time.monotonic() >= self.loop.deadline:
                return "timeout"
            if self.view.wants_stop() or self.run.stop_requested_by:
                return "stop"
            if own and multiprocessing.connection.wait(own, timeout=0):
                return "ended"
            if self.loop.forward_output():  # the other ranks run on meanwhile
                self.view.flush(self.run)
            return None

        reply, why = _input(request, prompt, look)
        if why == "stop" and self.loop.stop_reason is None:
            self.loop.check_stop()
        elif why == "timeout":
            self.loop.check_clocks()
        return reply

    # -- a later cell attached to a background run ------------------------------------------------

    def attach(self, rank: int | None) -> str:
        """``%spawn debug RUN-ID [RANK]``: this cell's ``input()`` answers the background run's ranks
        waiting at a prompt (``rank``'s only, if given), one at a time, each until it goes on (``c``,
        ``q``, an answer to ``input()``); then this returns, saying how it ended, and the run goes on.
        An interrupt of this cell detaches: the rank waits again."""
        run_id = self.run.run_id
        with self.prompt_lock:
            waiting = sorted({r.rank for r in self.pending if r.kind != "failed"})
            if self.attached:
                raise SpawnUsageError(f"another cell is attached to run {run_id} already")
            if not waiting or (rank is not None and rank not in waiting):
                who = "no rank of" if rank is None else f"rank {rank} of"
                also = f" (waiting: rank {', '.join(map(str, waiting))})" if waiting else ""
                raise SpawnUsageError(f"{who} run {run_id} is {'' if rank is None else 'not '}waiting at a prompt{also}")
            if not stdin_answerable():
                raise SpawnUsageError(
                    f"%spawn debug {run_id} needs a frontend that answers input(): this cell was sent without stdin "
                    "(allow_stdin false: nbclient, nbconvert, papermill)"
                )
            self.attached = True
            self._mark_prompts()
        served = [rank] if rank is not None else waiting
        print(
            f"attached to background run {run_id}: rank {', '.join(map(str, served))} at a prompt; c continues, q quits",
            flush=True,
        )
        offsets: dict[int, dict[str, int]] = {}
        how = "went on"
        current: PromptRequest | None = None
        try:
            how = self._answer_attached(rank, offsets)
        except KeyboardInterrupt:
            how = "detached (interrupted): it waits at its prompt again"
        finally:
            with self.prompt_lock:
                current, self.asking = self.asking, None
                if current is not None:  # asked, not answered: it waits again
                    self.pending.insert(0, current)
                self.attached = False
                self._mark_prompts()
            for r, offset in offsets.items() if not self.view.prints_output else ():
                _echo(self.run.ranks[r].stdout_path, self.run.ranks[r].stderr_path, offset)
        left = sorted(self.prompt_notes)
        still = f"; rank {', '.join(map(str, left))} waits: %spawn debug {run_id} attaches" if left else ""
        return f"run {run_id}: {how}{still}"

    def _how_it_ends(self, reason: str | None) -> str:
        """What an attached cell says of a run that is ending: how it ended, once it has (its status is
        known only then; the desk may be closed a moment before), or why it is ending if that takes
        longer than ENDING_WAIT (a rank that takes its grace period)."""
        if self.run.ended_within(ENDING_WAIT):
            return f"the run ended ({self.run.status})"
        return f"the run is ending ({reason})"

    def _answer_attached(self, rank: int | None, offsets: dict[int, dict[str, int]]) -> str:
        last_answer, going_on, last_rank = time.monotonic(), False, None
        while True:
            with self.prompt_lock:
                reason = self.loop.stop_reason
                ending = self.run.done or reason is not None
                if not ending:
                    candidates = [r for r in self.pending if r.kind != "failed" and rank in (None, r.rank)]
                    sticky = last_rank is not None and not going_on
                    chosen = next_prompt(candidates, last_rank if sticky else None, sticky)
                    if chosen is not None:
                        self.pending.remove(chosen)
                        self.asking = chosen
            if ending:  # out of the lock: the run's end takes it to close the desk
                went = f"rank {last_rank} went on; " if last_rank is not None and going_on else ""
                return went + self._how_it_ends(reason)
            if chosen is None:
                if sticky and last_rank is not None and self.run.ranks[last_rank].status == "running":
                    time.sleep(0.02)  # mid-session: it comes back once its command ran
                    continue
                if last_rank is not None and self.run.ranks[last_rank].status != "running":
                    # it may end before the run does (the others still finishing): say it was let go all the same
                    went = "went on and " if going_on else ""
                    return f"rank {last_rank} {went}ended ({self.run.ranks[last_rank].status})"
                if time.monotonic() - last_answer > STICKY:
                    return f"rank {last_rank} went on; the run goes on in the background"
                time.sleep(0.02)
                continue
            state = self.run.ranks[chosen.rank]
            if chosen.rank not in offsets:  # where it stopped, shown once
                offsets[chosen.rank] = _tail_offsets(state.stdout_path, state.stderr_path)
                _echo(state.stdout_path, state.stderr_path, offsets[chosen.rank])
            elif not self.view.prints_output:  # its answers (p, l) come here, not only to the earlier cell's view
                _echo(state.stdout_path, state.stderr_path, offsets[chosen.rank])
            others = sorted({r.rank for r in self.pending if r.kind != "failed"} - {chosen.rank})

            def look(request: PromptRequest = chosen) -> str | None:
                if self.run.done or self.loop.stop_reason is not None:
                    return "stop"
                return "ended" if self.run.ranks[request.rank].status != "running" else None

            reply, why = _input(chosen, decorate(chosen, others), look)
            if why is not None or reply is None:
                with self.prompt_lock:
                    self.asking = None
                return f"rank {chosen.rank} ended" if why == "ended" else self._how_it_ends(self.loop.stop_reason)
            assert self.prompts is not None
            with self.prompt_lock:
                self.asking = None
                self.prompts.answer(chosen, **reply)
                last_rank, last_answer = chosen.rank, time.monotonic()
                going_on = chosen.kind != "pdb" or "value" not in reply or leaves(str(reply.get("value", "")))
                self._mark_prompts()


def _input(request: PromptRequest, prompt: str, look: Callable[[], str | None]) -> tuple[dict[str, Any] | None, str | None]:
    """This thread's (the kernel's main thread's) ``input()`` for ``request``, and why it was ended if
    it was: ``look`` (called by a watcher thread every PROMPT_WATCH seconds) says a reason to end it,
    and the wait is interrupted.  An interrupt from the user propagates."""
    lock, done, why = threading.Lock(), threading.Event(), []

    def watch() -> None:
        while not done.wait(PROMPT_WATCH):
            with lock:
                if done.is_set():
                    return
                reason = look()
                if reason is not None:
                    why.append(reason)
                    _thread.interrupt_main()
                    return

    watcher = threading.Thread(target=watch, name="nbspawn-prompt", daemon=True)
    watcher.start()
    try:
        try:
            value = getpass.getpass(prompt) if request.password else builtins.input(prompt)
            reply: dict[str, Any] = {"value": value}
        except EOFError:
            reply = {"eof": True}
        except KeyboardInterrupt:
            with lock:
                done.set()
            if not why:
                raise
            return None, why[0]
        except Exception as err:  # the frontend cannot answer (StdinNotImplementedError)
            reply = {"error": str(err) or type(err).__name__}
        with lock:
            done.set()
        if why:  # ended just as it was answered: its interrupt is on its way
            with contextlib.suppress(KeyboardInterrupt):
                until = time.monotonic() + 0.5
                while time.monotonic() < until:
                    time.sleep(0.01)
            return None, why[0]
        return reply, None
    finally:
        done.set()
        watcher.join()


def _tail_offsets(*paths: str) -> dict[str, int]:
    """Where to show a rank's logs from when a cell attaches: its last ECHO_LINES lines (where it stopped)."""
    offsets = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - 8192))
                data = fh.read()
        except OSError:
            offsets[path] = 0
            continue
        lines = data.splitlines(keepends=True)[-ECHO_LINES:]
        offsets[path] = size - sum(len(line) for line in lines)
    return offsets


def _echo(stdout_path: str, stderr_path: str, offsets: dict[str, int]) -> None:
    """What a background rank wrote since ``offsets``, shown in the attached cell (pdb's listing, p's values)."""
    for path, stream in ((stdout_path, sys.stdout), (stderr_path, sys.stderr)):
        try:
            with open(path, "rb") as fh:
                fh.seek(offsets.get(path, 0))
                data = fh.read()
        except OSError:
            continue
        offsets[path] = offsets.get(path, 0) + len(data)
        if data:
            stream.write(data.decode("utf-8", "replace"))
            stream.flush()
