"""Rank output as ``[rank{r}]: `` lines: the rendering for terminal IPython and for plain text.

Lines are forwarded as soon as they are complete.  A line rewritten with ``\\r`` (a progress bar)
is shown once, in its latest state, instead of once per update; ``\\b`` erases.  stdout lines go to
the kernel's stdout and stderr lines to its stderr, so frontends keep them visibly apart.
"""

from __future__ import annotations

import sys
from typing import TextIO

from ._run import RankState, Run
from ._status import StatusComm

MAX_PENDING = 1 << 16  # a "line" longer than this is shown in pieces


def settle_line(raw: str) -> str:
    """What a terminal would show for one line: the text after the last carriage return, \\b applied."""
    raw = raw.rstrip("\r")
    if "\r" in raw:
        segments = [s for s in raw.split("\r") if s]
        raw = segments[-1] if segments else ""
    if "\b" in raw:
        chars: list[str] = []
        for ch in raw:
            if ch == "\b":
                if chars:
                    chars.pop()
            else:
                chars.append(ch)
        raw = "".join(chars)
    return raw


class TextView:
    """Prefix every line with its rank, as torchrun's ``--tee`` does."""

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._out = {"stdout": stdout, "stderr": stderr}
        self._pending: dict[tuple[int, str], str] = {}
        self._shown: frozenset[int] | None = None
        self._status = StatusComm()  # the labextension's toolbar item; a no-op outside a kernel

    def _stream(self, name: str) -> TextIO:
        return self._out[name] or (sys.stdout if name == "stdout" else sys.stderr)

    def started(self, run: Run) -> None:
        self._shown = run.spec.shown_ranks
        self._status.open(run)

    def output(self, rank: int, stream: str, text: str) -> None:
        if self._shown is not None and rank not in self._shown:
            return
        key = (rank, stream)
        pending = self._pending.get(key, "") + text
        *lines, pending = pending.split("\n")
        if len(pending) > MAX_PENDING:
            lines.append(pending)
            pending = ""
        elif "\r" in pending:
            pending = "\r" + settle_line(pending)  # keep only the latest state of a progress line
        self._pending[key] = pending
        if lines:
            prefix = f"[rank{rank}]: "
            self._stream(stream).write("".join(f"{prefix}{settle_line(line)}\n" for line in lines))

    def rank_ended(self, run: Run, state: RankState) -> None:
        self._flush_rank(state.rank)

    def tick(self, run: Run) -> None:
        self._status.update(run)

    def finished(self, run: Run) -> None:
        for rank in range(run.nprocs):
            self._flush_rank(rank)
        for stream in ("stdout", "stderr"):
            self._stream(stream).flush()
        self._status.close(run)

    def _flush_rank(self, rank: int) -> None:
        for stream in ("stdout", "stderr"):
            pending = settle_line(self._pending.pop((rank, stream), ""))
            if pending:
                self._stream(stream).write(f"[rank{rank}]: {pending}\n")
