"""Which notebook cell each run of this kernel belongs to: reattaching without the saved notebook.

A page reloaded (or opened) while a cell runs, or after it ended, shows what the notebook file
holds, which is the cell's previous output unless the notebook was saved during this run.  So the
kernel remembers, per cell id (JupyterLab and Notebook 7 send it as the execute_request's
``metadata.cellId``), the cell's latest run: its live display's facts while it runs, then its
frozen bundle.  The labextension asks for them when a notebook connects to its kernel, by opening
an ``nbspawn.active`` comm on a subshell of its own (the main shell may be running the cell); the
kernel answers with one message (``ActiveRunsMessage``) and the page closes the comm, then puts the
live display (which reattaches, reattach.ts) or the frozen run into the cell.

A page opens that comm only where the target is registered: it first asks the kernel which comms of
the target it has (``comm_info_request``), and ``install`` lists one that no page ever opened
(``LISTED``).  A kernel that has not loaded nbspawn (every notebook's kernel as the notebook opens,
before its ``%load_ext nbspawn``) has no run to show, and is sent no ``comm_open`` it would refuse: that
refusal, a ``comm_close`` for a comm the page's connection does not know, was logged as an error
("Comm not found") by every page on the kernel.

Small on purpose: the latest run of at most ``KEEP_CELLS`` cells, an ended one for ``KEEP_SECONDS``;
a cell that runs again forgets its earlier run.  Only in a Jupyter kernel, and only for cells whose
frontend sent a cell id.  Every method may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .._comms import comm_manager, listed_comm
from .._shell import kernel_of, running_shell
from ._messages import ActiveRequest, ActiveRun, ActiveRunsMessage, LiveInfo

TARGET = "nbspawn.active"
LISTED = "nbspawn-active-target"  # the comm a comm_info_request for TARGET finds once the target is registered
KEEP_CELLS = 8
KEEP_SECONDS = 30 * 60.0
log = logging.getLogger(__name__)


@dataclass
class _Entry:
    cell_id: str
    run_id: str
    execution_count: int | None
    live: LiveInfo | None = None
    frozen: dict[str, Any] | None = None
    ended_at: float | None = None  # time.monotonic()


class ActiveRuns:
    """The latest run of each recent cell (newest last)."""

    def __init__(self, keep_cells: int = KEEP_CELLS, keep_seconds: float = KEEP_SECONDS) -> None:
        self.keep_cells = keep_cells
        self.keep_seconds = keep_seconds
        self._lock = threading.Lock()
        self._cells: OrderedDict[str, _Entry] = OrderedDict()

    def started(self, cell_id: str, run_id: str, execution_count: int | None) -> None:
        with self._lock:
            self._cells.pop(cell_id, None)
            self._cells[cell_id] = _Entry(cell_id, run_id, execution_count)
            self._trim()

    def shown(self, run_id: str, live: LiveInfo) -> None:
        with self._lock:
            entry = self._find(run_id)
            if entry is not None:
                entry.live = live

    def ended(self, run_id: str, frozen: dict[str, Any]) -> None:
        with self._lock:
            entry = self._find(run_id)
            if entry is not None:
                entry.live, entry.frozen, entry.ended_at = None, frozen, time.monotonic()

    def cell_ran(self, cell_id: str | None) -> None:
        """The cell runs again: its earlier run is no longer what it shows."""
        if cell_id:
            with self._lock:
                self._cells.pop(cell_id, None)

    def answer(self, request: ActiveRequest | None = None) -> ActiveRunsMessage:
        request = request or {}
        have = set(request.get("have") or ())
        only = set(request["only"]) if "only" in request else None
        runs: list[ActiveRun] = []
        with self._lock:
            self._trim()
            for e in self._cells.values():
                if e.live is None and e.frozen is None:
                    continue  # not shown yet (a run's first 0.2 s): nothing to put in the cell
                if only is not None and e.run_id not in only:
                    continue
                runs.append(
                    {
                        "cell_id": e.cell_id,
                        "run_id": e.run_id,
                        "execution_count": e.execution_count,
                        "status": "ended" if e.frozen is not None else "running",
                        "live": e.live,
                        "frozen": e.frozen if e.run_id not in have else None,
                    }
                )
        return {"type": "active", "runs": runs}

    def _find(self, run_id: str) -> _Entry | None:
        return next((e for e in self._cells.values() if e.run_id == run_id), None)

    def _trim(self) -> None:
        now = time.monotonic()
        for cell_id in [c for c, e in self._cells.items() if e.ended_at is not None and now - e.ended_at > self.keep_seconds]:
            del self._cells[cell_id]
        while len(self._cells) > self.keep_cells:
            self._cells.popitem(last=False)


RUNS = ActiveRuns()
_installed: set[int] = set()  # id() of the kernels whose comm target and hook are in place


def current_cell() -> tuple[str | None, int | None]:
    """The running cell's id and prompt number, from the cell's own thread; (None, None) outside a kernel."""
    shell = running_shell()
    kernel = kernel_of(shell)
    if kernel is None:
        return None, None
    try:
        parent = kernel.get_parent("shell") or {}
    except Exception:  # an old or unusual kernel
        return None, None
    header = parent.get("header") or {}
    if header.get("msg_type") != "execute_request":
        return None, None
    cell_id = (parent.get("metadata") or {}).get("cellId")
    content = parent.get("content") or {}
    count = getattr(shell, "execution_count", None)
    # IPython advances its count before a cell it stores in history runs: the cell's prompt is one less
    stored = content.get("store_history", True) and not content.get("silent", False)
    count = count - 1 if isinstance(count, int) and stored else None
    return (cell_id if isinstance(cell_id, str) and cell_id else None), count


def install() -> None:
    """Once per kernel: the ``nbspawn.active`` comm target, and forgetting a cell's run when it runs again."""
    shell = running_shell()
    kernel = kernel_of(shell)
    if kernel is None or id(kernel) in _installed:
        return
    _installed.add(id(kernel))
    try:
        comm_manager().register_target(TARGET, _on_open)
        listed_comm(TARGET, LISTED)  # after the target: a page that sees it may open a comm at once
        shell.events.register("pre_run_cell", _pre_run_cell)
    except Exception as err:  # reattaching is never worth failing a run for
        log.debug("nbspawn.active not installed: %s", err)


def _pre_run_cell(info: Any) -> None:
    RUNS.cell_ran(getattr(info, "cell_id", None))


def _on_open(comm: Any, msg: dict[str, Any]) -> None:
    """A page asks which runs it should show (on a subshell's thread, or the main shell when idle)."""
    data = (msg.get("content") or {}).get("data")
    request: ActiveRequest = {}
    if isinstance(data, dict):
        for key in ("have", "only"):
            if isinstance(data.get(key), list):
                request[key] = [r for r in data[key] if isinstance(r, str)]
    try:
        comm.send(RUNS.answer(request))
    except Exception:
        comm.close()
        raise
    # left open: the page closes it (a comm_close from here would be logged by its connection as unknown)
