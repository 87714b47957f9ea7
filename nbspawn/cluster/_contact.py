"""How the kernel reaches a node's agent while the agent is busy: signals, which ipyparallel's nanny
delivers to an engine running an ``apply`` (and its data channel, the way back).

* SIGINT: interrupt (the kernel's interrupt or Stop; twice: kill), as on one machine; while a run
  is the agent's, counted here for the node's supervisor to take at its next turn
  (:func:`interrupts_heard`), never raised as ``KeyboardInterrupt`` wherever the agent happens to
  be: one that came while the agent was still unpacking a world's cell ended its task, and the
  kernel took the node's part of the world for lost;
* SIGUSR2 (:data:`STOP_SIGNAL`): stop the node's ranks as a failure stops them (stacks, then
  SIGTERM): another node failed, or the run timed out;
* SIGWINCH (:data:`HEARTBEAT_SIGNAL`), every :data:`HEARTBEAT_EVERY` s while the run (or a kept
  world) lives: the kernel is alive.  Engines outlive a kernel, so an agent that hears nothing for
  :data:`HEARTBEAT_LOST` s stops its ranks itself;
* SIGURG (:data:`WHERE_SIGNAL`): say where the ranks are now (``%spawn where``, the Where button).

The handlers are installed by the probe and stay: a signal that arrives after a run ended finds a
handler, not SIGUSR2's default action (which would end the engine).  What they heard is this
module's alone; the agent (``_agent``) and its kept worlds (``_nodeworld``) ask through functions.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

STOP_SIGNAL = signal.SIGUSR2
HEARTBEAT_SIGNAL = signal.SIGWINCH
WHERE_SIGNAL = signal.SIGURG  # ignored by default: one that comes before the handler harms nothing
HEARTBEAT_EVERY = 0.5
HEARTBEAT_LOST = 3.0


class _Heard:
    last_beat = time.monotonic()
    stop_asked = False
    where_asked = 0  # how many times the kernel asked where the ranks are
    where_told = 0
    interrupts = 0  # the kernel's interrupts heard during this run
    interrupts_taken = 0


def _beat(_signum: int, _frame: object) -> None:
    _Heard.last_beat = time.monotonic()


def _ask_stop(_signum: int, _frame: object) -> None:
    _Heard.stop_asked = True


def _ask_where(_signum: int, _frame: object) -> None:
    _Heard.where_asked += 1


def _ask_interrupt(_signum: int, _frame: object) -> None:
    _Heard.interrupts += 1


def install_handlers() -> None:
    signal.signal(HEARTBEAT_SIGNAL, _beat)
    signal.signal(STOP_SIGNAL, _ask_stop)
    signal.signal(WHERE_SIGNAL, _ask_where)


@contextlib.contextmanager
def node_run() -> Iterator[None]:
    """A run (or a world's cell) is this node's: no stop asked yet, the kernel heard just now, and its
    interrupts counted rather than raised until the run's task ends (the engine's own handler then)."""
    install_handlers()
    _Heard.stop_asked, _Heard.last_beat = False, time.monotonic()
    _Heard.interrupts_taken = _Heard.interrupts
    previous = signal.signal(signal.SIGINT, _ask_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupts_heard() -> int:
    """How many interrupts came from the kernel since this was last asked (each taken once)."""
    heard = _Heard.interrupts - _Heard.interrupts_taken
    _Heard.interrupts_taken += heard  # only the handler adds to ``interrupts``: none is lost meanwhile
    return heard


def stop_asked() -> bool:
    return _Heard.stop_asked


def kernel_silent() -> bool:
    """No heartbeat for :data:`HEARTBEAT_LOST` s: the kernel is gone."""
    return time.monotonic() - _Heard.last_beat > HEARTBEAT_LOST


def where_wanted() -> int | None:
    """The number of a ``where`` asked since the last was answered (now counted as answered), or None."""
    if _Heard.where_asked <= _Heard.where_told:
        return None
    _Heard.where_told = _Heard.where_asked
    return _Heard.where_told


def publisher() -> Any:
    """ipyparallel's data channel, when this is an engine running an apply."""
    from ipykernel.zmqshell import ZMQInteractiveShell

    shell = ZMQInteractiveShell.instance()
    pub = getattr(shell, "data_pub", None)  # ipykernel's shell, not ours: an engine's has one
    if pub is None:
        raise RuntimeError("run_node runs on an ipyparallel engine (it has no data channel here)")
    return pub.publish_data
