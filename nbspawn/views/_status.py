"""The ``nbspawn.status`` comm: what the labextension's notebook toolbar item ("4 ranks running ■ Stop") shows.

Opened when a run starts, one message each time the set of running ranks changes, the final status
and a close when it ends::

    {"run_id": "...", "status": "running", "nprocs": 4, "running": [0, 1, 2, 3]}

Only in a Jupyter kernel (never in terminal IPython or plain Python), and every message is sent from
the thread that runs the cell.  A frontend without the target (no labextension) closes the comm on
its side; nothing breaks.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .._comms import create_comm
from .._runstate import Run
from .._shell import running_kernel
from ._messages import StatusMessage

TARGET = "nbspawn.status"
_ACTIVE = ("starting", "running")
log = logging.getLogger(__name__)


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel with a frontend to talk to."""
    return running_kernel() is not None


def status_data(run: Run) -> StatusMessage:
    return {
        "run_id": run.run_id,
        "status": "running" if run.status in _ACTIVE else run.status,
        "nprocs": sum(1 for rank in range(run.nprocs) if run.spec.runs(rank)),  # --on: those that run the cell
        "running": [state.rank for state in run.ranks if state.status in _ACTIVE],
    }


class StatusComm:
    """One run's status comm; every method is a no-op outside a kernel or once the comm failed.

    The comm opens only once the run has gone on for ``open_after`` seconds: a toolbar item that
    would flash for a quick cell is not worth its cost (~2 ms of a kept world's ~5 ms cell)."""

    def __init__(self, open_after: float = 0.2) -> None:
        self.open_after = open_after
        self.comm: Any = None
        self.last: StatusMessage | None = None
        self.wanted = False

    def open(self, run: Run) -> None:
        """From now on the run may get a toolbar item (its first ``update`` after ``open_after``)."""
        self.wanted = in_kernel()
        if self.wanted and self.open_after <= 0:
            self._open(run)

    def _open(self, run: Run) -> None:
        self.wanted = False
        data = status_data(run)
        try:
            self.comm = create_comm(target_name=TARGET, data=data)
            self.last = data
        except Exception as err:  # a status item is never worth failing a run for
            log.debug("nbspawn.status comm not opened: %s", err)
            self.comm = None

    def update(self, run: Run) -> None:
        if self.comm is None:
            if self.wanted and run.status in _ACTIVE and time.time() - run.started_at >= self.open_after:
                self._open(run)
            return
        data = status_data(run)
        if data != self.last:
            self._send(data)

    def close(self, run: Run) -> None:
        self.wanted = False
        self.update(run)  # the final status, unless already said
        if self.comm is None:
            return
        try:
            self.comm.close()
        except Exception as err:
            log.debug("nbspawn.status comm close failed: %s", err)
        self.comm = None

    def _send(self, data: StatusMessage) -> None:
        self.last = data
        try:
            self.comm.send(data)
        except Exception as err:
            log.debug("nbspawn.status comm send failed: %s", err)
            self.comm = None
