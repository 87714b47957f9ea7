"""The supervisor's prompt desk: a rank's ``input()``, ``breakpoint()`` and pdb answered through the
kernel's own stdin channel, one prompt at a time.

Ranks write their requests to the run's prompt channel (``events._prompts``, ``ranks._prompt``); the
supervision loop, woken by it, calls :meth:`PromptDesk._serve_prompts`: a failing rank's "post-mortem?"
is answered first (yes only to the first one, with ``--pdb``), then the next prompt in arrival order is
asked with the kernel's ``input()`` (a Jupyter ``input_request``).  While the kernel waits, a watcher
thread keeps the other ranks' output flowing and ends the prompt for Stop, ``--timeout`` or the
prompting rank's end.  A mixin of ``_supervisor._Supervisor``: the attributes below are the loop's.
"""

from __future__ import annotations

import _thread
import builtins
import contextlib
import getpass
import multiprocessing.connection
import threading
import time
from typing import Any

from .._run import Run
from .._spec import RunSpec
from ..events._prompts import PromptChannel, PromptRequest, decorate, leaves, next_prompt
from ..views._protocol import RunView

PROMPT_WATCH = 0.1  # while the kernel waits at a rank's prompt: how often Stop, --timeout and the rank are looked at
STICKY = 1.0  # seconds a rank in a pdb session keeps the prompt after a command that does not let it run on


class PromptDesk:
    run: Run
    spec: RunSpec
    view: RunView
    alive: dict[Any, int]
    stop_reason: str | None
    deadline: float
    prompts: PromptChannel | None  # where ranks ask (None: nothing can answer them)
    pending: list[PromptRequest]  # prompts waiting their turn, in arrival order
    last_prompted: int | None  # the rank answered last
    sticky_until: float  # ... which keeps the prompt until then (a pdb session under way)
    post_mortem: int | None  # the rank told to stop in post-mortem (--pdb)

    # the supervision loop's own
    def _forward_output(self, final: bool = False) -> bool:
        raise NotImplementedError

    def _check_stop(self) -> None:
        raise NotImplementedError

    def _check_clocks(self) -> None:
        raise NotImplementedError

    def _serve_prompts(self) -> None:
        """Answer what the ranks asked: whether a failing rank stops in post-mortem, then one prompt."""
        assert self.prompts is not None  # only called with a channel
        self.pending.extend(self.prompts.read())
        alive = set(self.alive.values())
        self.pending = [r for r in self.pending if r.rank in alive]
        for asked in [r for r in self.pending if r.kind == "failed"]:
            if self.stop_reason is None and self.post_mortem in alive:
                continue  # asked again once the post-mortem under way ends (its rank is the root cause)
            self.pending.remove(asked)
            stop = self.spec.pdb and self.stop_reason is None and self.post_mortem is None
            if stop:
                self.post_mortem = asked.rank
            self.prompts.answer(asked, value="post-mortem" if stop else "")
        if self.stop_reason is not None:  # the run ends: a rank still asking is stopped
            for asked in [r for r in self.pending if r.kind != "failed"]:
                self.pending.remove(asked)
                self.prompts.answer(asked, stop=True)
            return
        sticky = self.last_prompted in alive and time.monotonic() < self.sticky_until
        chosen = next_prompt(self.pending, self.last_prompted if sticky else None, sticky)
        if chosen is None:
            return
        request = chosen
        self.pending.remove(request)
        self._forward_output()  # what the rank printed (pdb's listing) comes before its prompt
        self.view.flush(self.run)  # shown now, not at the view's next redraw: the prompt blocks it
        waiting = sorted({r.rank for r in self.pending if r.kind != "failed"} - {request.rank})
        reply = self._ask(request, decorate(request, waiting))
        if reply is None:  # the prompt was ended (Stop, --timeout, the rank ended): the loop goes on
            return
        self.prompts.answer(request, **reply)
        self.last_prompted = request.rank
        command = str(reply.get("value", ""))
        going_on = request.kind != "pdb" or "value" not in reply or leaves(command)
        self.sticky_until = 0.0 if going_on else time.monotonic() + STICKY

    def _ask(self, request: PromptRequest, prompt: str) -> dict[str, Any] | None:
        """The kernel's own input() (a Jupyter input_request), the answer as the rank reads it; None
        if the prompt was ended for Stop, --timeout or the rank's end (a watcher thread interrupts the
        wait).  An interrupt from the user propagates: the run is interrupted as always."""
        lock, done, why = threading.Lock(), threading.Event(), []
        own = [w for w, r in self.alive.items() if r == request.rank]

        def watch() -> None:
            while not done.wait(PROMPT_WATCH):
                with lock:
                    if done.is_set():
                        return
                    reason = None
                    if time.monotonic() >= self.deadline:
                        reason = "timeout"
                    elif self.view.wants_stop() or self.run._stop_requested:
                        reason = "stop"
                    elif own and multiprocessing.connection.wait(own, timeout=0):
                        reason = "ended"
                    if reason is not None:
                        why.append(reason)
                        _thread.interrupt_main()
                        return
                    if self._forward_output():  # the other ranks run on meanwhile
                        self.view.flush(self.run)

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
                self._prompt_ended(why[0])
                return None
            except Exception as err:  # the frontend cannot answer (StdinNotImplementedError)
                reply = {"error": str(err) or type(err).__name__}
            with lock:
                done.set()
            if why:  # ended just as it was answered: its interrupt is on its way
                with contextlib.suppress(KeyboardInterrupt):
                    until = time.monotonic() + 0.5
                    while time.monotonic() < until:
                        time.sleep(0.01)
                self._prompt_ended(why[0])
                return None
            return reply
        finally:
            done.set()
            watcher.join()

    def _prompt_ended(self, why: str) -> None:
        if why == "stop" and self.stop_reason is None:
            self._check_stop()
        elif why == "timeout":
            self._check_clocks()
