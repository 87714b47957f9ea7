"""``error.json``: how a rank's uncaught exception is recorded, written and read here only.

The file is torch elastic's (``TORCHELASTIC_ERROR_FILE``, what ``@record`` writes), so tools that read
elastic's error files read ours, with nbspawn's structured fields beside elastic's::

    {"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "...", "timestamp": "..."}},
     "nbspawn": {"exc_type": "ValueError", "exc_module": "builtins", "message": "bad",
                 "traceback": "... in the cell's own lines ...", "time": 1732390000.0}}

:func:`read` also understands a file that a program's own ``@record`` wrote (elastic's fields only).
Writes are atomic (a temporary file, then ``os.replace``): the kernel never reads half a file.

This module imports nothing but the standard library: a program's rank loads it by path, before (and
without) importing torch or nbspawn.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ErrorRecord:
    """One rank's error: its exception's type and message, and the traceback as the user reads it."""

    exc_type: str | None
    message: str | None
    traceback: str | None
    time: float = field(
        default_factory=time.time
    )  # when it was recorded: among ranks that ended together, the first is the root cause
    exc_module: str | None = None

    @classmethod
    def of(cls, exc: BaseException, traceback_text: str) -> ErrorRecord:
        return cls(type(exc).__name__, str(exc), traceback_text, time.time(), type(exc).__module__)

    @property
    def summary(self) -> str:
        """``Type: message``, as elastic's ``message`` field has it."""
        name = self.exc_type or "Error"
        return f"{name}: {self.message}" if self.message else name

    def to_json(self) -> dict[str, Any]:
        """The file's contents (also what a cluster node sends to the kernel)."""
        return {
            "message": {
                "message": self.summary,
                "extraInfo": {"py_callstack": self.traceback or "", "timestamp": str(int(self.time))},
            },
            "nbspawn": asdict(self),
        }

    @classmethod
    def from_json(cls, data: object) -> ErrorRecord | None:
        """nbspawn's fields if present, else torch elastic's own (a program's ``@record``); None if neither."""
        if not isinstance(data, dict):
            return None
        ours = data.get("nbspawn")
        if isinstance(ours, dict):
            return cls(
                exc_type=ours.get("exc_type"),
                message=ours.get("message"),
                traceback=ours.get("traceback"),
                time=float(ours.get("time") or 0.0) or float("inf"),
                exc_module=ours.get("exc_module"),
            )
        message = data.get("message")
        if isinstance(message, dict):  # {"message": "Type: text", "extraInfo": {"py_callstack": ..., "timestamp": ...}}
            exc_type, _, text = str(message.get("message", "")).partition(": ")
            extra = message.get("extraInfo") or {}
            # no time of ours: never chosen as the root cause over a rank that recorded one
            return cls(exc_type or "Error", text, extra.get("py_callstack"), float("inf"))
        return None


def write(path: str, record: ErrorRecord) -> None:
    # its own whole-file write, not _rankdir.write_json: a program's rank loads this module by path, alone
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(json.dumps(record.to_json(), separators=(",", ":")))
    os.replace(path + ".tmp", path)


def read(path: str) -> ErrorRecord | None:
    """The record at ``path``, or None when there is none (or it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return ErrorRecord.from_json(data)
