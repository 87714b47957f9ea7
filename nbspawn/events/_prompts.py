"""The kernel's end of the ranks' prompts (``nbspawn.ranks._prompt`` is the ranks' end).

:class:`PromptChannel` is the run's request FIFO (``<run-dir>/prompts.fifo``), made before the ranks
start and only where something can answer (:func:`stdin_answerable`): the supervisor waits on it with
the ranks, reads :class:`PromptRequest` lines, asks the kernel's own ``input()`` and answers each rank
on its ``answers.fifo``.  The choice of which request is asked next is :func:`next_prompt` (pure).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._rankdir import RankDir, prompts_path
from .._shell import running_kernel

LEAVING = frozenset({"c", "cont", "continue", "q", "quit", "exit", "EOF"})  # pdb commands that let the rank run on


@dataclass(frozen=True)
class PromptRequest:
    rank: int
    kind: str  # input | pdb | failed (a failing rank asks whether to stop in post-mortem)
    prompt: str
    id: int
    password: bool = False
    where: str = ""  # a pdb prompt: where the rank stopped ("cell line 4", "train.py line 12")

    @classmethod
    def parse(cls, line: bytes) -> PromptRequest | None:
        try:
            raw = json.loads(line)
            return cls(
                int(raw["rank"]),
                str(raw["kind"]),
                str(raw.get("prompt", "")),
                int(raw["id"]),
                bool(raw.get("password")),
                str(raw.get("where") or ""),
            )
        except (ValueError, KeyError, TypeError):
            return None

    @property
    def waiting_note(self) -> str:
        """What the rank's chip says while it waits here: "at a breakpoint (Pdb, cell line 4)"."""
        if self.kind == "pdb":
            return f"at a breakpoint (Pdb{', ' + self.where if self.where else ''})"
        return "waiting for input (getpass)" if self.password else "waiting for input (input())"


def stdin_answerable() -> bool:
    """Whether a prompt asked now would be answered: a Jupyter request sent with ``allow_stdin`` (a
    notebook frontend; not nbclient, nbconvert or papermill), or a terminal.  Only the main thread asks."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(os, "mkfifo"):
        return False
    kernel = running_kernel()
    if kernel is not None:
        return bool(getattr(kernel, "_allow_stdin", False))
    try:
        return bool(sys.stdin is not None and sys.stdin.isatty())
    except (OSError, ValueError):
        return False


class PromptChannel:
    """The run's request FIFO, open for reading (and by the kernel for writing too, so it never reads as
    ended between two ranks' requests)."""

    def __init__(self, path: str, rank_dirs: Sequence[str]) -> None:
        self.path = path
        self.rank_dirs = list(rank_dirs)
        os.mkfifo(path, 0o600)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self.buffer = b""
        self.used: set[int] = set()  # ranks that asked: their answer FIFOs are removed at the end

    @classmethod
    def open(cls, run_dir: str, rank_dirs: Sequence[str]) -> PromptChannel | None:
        try:
            return cls(prompts_path(run_dir), rank_dirs)
        except OSError:  # a file system without FIFOs: prompts fail in the ranks, saying so
            return None

    def fileno(self) -> int:
        return self.fd

    def read(self) -> list[PromptRequest]:
        """The requests written since the last call, in the order they came."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        requests = [r for r in map(PromptRequest.parse, lines) if r is not None]
        self.used.update(r.rank for r in requests)
        return requests

    def answer(self, request: PromptRequest, **reply: Any) -> bool:
        """Write the answer to ``request``; False if its rank is no longer there to read it."""
        if not 0 <= request.rank < len(self.rank_dirs):
            return False
        line = (json.dumps({**reply, "id": request.id}) + "\n").encode()
        try:
            fd = os.open(RankDir(self.rank_dirs[request.rank]).answers, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            os.write(fd, line)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def close(self) -> None:
        for fd in (self.fd, self.keep):
            with contextlib.suppress(OSError):
                os.close(fd)
        paths = [self.path, *(RankDir(self.rank_dirs[r]).answers for r in self.used if 0 <= r < len(self.rank_dirs))]
        for path in paths:  # a FIFO left in the logs would hang whatever reads them (cat, tar)
            with contextlib.suppress(OSError):
                os.unlink(path)


def next_prompt(pending: Sequence[PromptRequest], last: int | None, sticky: bool) -> PromptRequest | None:
    """Which waiting prompt is asked next: one at a time, in the order they came, except that a rank
    in the middle of a pdb session (``sticky``: its last command did not leave, and it has not come
    back yet) keeps the prompt, so one rank's session is not interleaved with another's."""
    prompts = [r for r in pending if r.kind != "failed"]
    if last is not None:
        own = next((r for r in prompts if r.rank == last), None)
        if own is not None:
            return own
        if sticky:
            return None
    return prompts[0] if prompts else None


def leaves(command: str) -> bool:
    """Whether a pdb command lets the rank run on (another rank's prompt may come first then)."""
    word = command.strip().split(" ", 1)[0].split(";", 1)[0]
    return word in LEAVING


def decorate(request: PromptRequest, waiting: Sequence[int]) -> str:
    """The prompt the kernel shows: it names the rank, and the ranks waiting their turn."""
    prompt = request.prompt if request.kind == "pdb" else f"[rank {request.rank}] {request.prompt}"
    if waiting:
        ranks = ", ".join(map(str, sorted(waiting)))
        many = len(waiting) > 1
        prompt = f"(rank{'s' if many else ''} {ranks} wait{'' if many else 's'}: one prompt at a time, in arrival order) {prompt}"
    return prompt
