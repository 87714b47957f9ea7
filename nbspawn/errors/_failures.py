"""How a run failed, and the exceptions that say so (all of ``nbspawn.errors`` but the two whose
classes subclass torch's, in ``_torch``).

One exception per run, naming its root cause (the first rank observed to fail) and listing the ranks
that failed after it, in the spirit of torch elastic's ``ChildFailedError``.  They implement
``_render_traceback_`` so IPython shows the rank's traceback in the cell's own lines instead of
nbspawn's internals.  Nothing here imports torch or IPython: the door, the options and the planners'
checks raise these, and are imported without either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .._rankdir import ERROR, STDERR, STDOUT
from .._shell import wants_colour

_RED, _GREEN, _DIM, _BOLD, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[2m", "\x1b[1m", "\x1b[0m"
# a report's headline: bold in the text's own colour.  Bold red is drawn as "intense" red by Jupyter
# (#b22b31), which on the dark theme's red error background could hardly be read.
_HEAD = _BOLD


class SpawnUsageError(Exception):
    """Bad input, caught before any process starts.

    The magic raises it again as IPython's own ``UsageError``, which IPython prints as one line, no
    traceback: IPython does that for exactly that class (``etype is UsageError``), not for a subclass,
    so this one need not be one, and importing it does not import IPython.  Raised by a call
    (``nbspawn.launch``, ``nbspawn.spawn``), IPython shows it as one line too (``_render_traceback_``):
    the frames would be nbspawn's checks, not the user's code."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


@dataclass
class RankFailure:
    """How one rank ended badly: an exception, an exit code, or a signal."""

    rank: int
    pid: int | None
    exit_code: int | None = None
    signal_name: str | None = None
    exc_type: str | None = None  # "ZeroDivisionError"
    message: str | None = None
    traceback: str | None = None  # in the cell's own lines
    stopped: bool = False  # ended by nbspawn (after another rank failed, a timeout, Stop, interrupt)
    stack: str | None = None  # where it was when nbspawn stopped it
    node: str | None = None  # a cluster run's rank: "node 1 (hostb)"
    after: int | None = None  # it failed after this rank did, the run's first failure (most often because of it)
    # the out-of-memory killer's: "killed for memory at 5.1 GB; the ranks held 11.9 GB of 12.7 GB"; or beside a CUDA
    # out-of-memory error, what each rank held on that GPU: "rank 2 ran out of memory on GPU 0 (...): rank 0 held 3.1 GB, ..."
    memory: str | None = None

    @property
    def summary(self) -> str:
        if self.exc_type:
            return f"{self.exc_type}: {self.message}" if self.message else self.exc_type
        if self.memory:
            return self.memory
        if self.signal_name:
            return f"killed by {self.signal_name}"
        return f"exited with code {self.exit_code}"

    def headline(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"rank {self.rank}{where} (pid {self.pid}) {self.verb}: {self.summary}"

    @property
    def verb(self) -> str:
        if self.stopped:
            return "was stopped"
        return "failed" if self.after is None else f"failed after rank {self.after}"


# A peer's address in an error (gloo's "Connection closed by peer [127.0.0.1]:22960", "10.0.0.2:29500"):
# each rank names its own peer's port, so ranks that failed the same way differ only there
_ADDRESS = re.compile(r"(\[[^\]\s]+\]|\b(?:\d{1,3}\.){3}\d{1,3}|\blocalhost):\d+\b")


def _anywhere(text: str | None) -> str | None:
    """``text`` with every address and port the same: what ranks that failed alike have in common."""
    return _ADDRESS.sub("<address>", text) if text else text


def _any_port(text: str) -> str:
    """A group's summary: its first rank's, the port left out (each rank's peer had its own)."""
    return _ADDRESS.sub(lambda m: f"{m.group(1)}:<port>", text)


def _alike(failures: list[RankFailure]) -> list[list[RankFailure]]:
    """Group ranks that ended identically, so 63 ranks stopped in one collective read as one line
    (addresses and ports aside: each rank's broken connection was to its own peer)."""
    groups: dict[tuple, list[RankFailure]] = {}
    for failure in failures:
        key = (failure.stopped, failure.after, _anywhere(failure.summary), _anywhere(failure.traceback), failure.stack)
        groups.setdefault(key, []).append(failure)
    return list(groups.values())


def rank_spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (sorted ranks)."""
    spans: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(spans)


def _where(failure: RankFailure) -> list[str]:
    if failure.stack:
        return ["  where it was (most recent call last):", *("  " + ln for ln in failure.stack.splitlines())]
    return []


def _gpu_account(failure: RankFailure) -> list[str]:
    """Beside a CUDA out-of-memory error, what each rank held on that GPU (``RankFailure.memory``)."""
    return [failure.memory] if failure.exc_type and failure.memory else []


def _describe(failures: list[RankFailure]) -> list[str]:
    """One entry per way of ending: its ranks, its traceback (or where the ranks were stopped)."""
    lines: list[str] = []
    for group in _alike(failures):
        failure = group[0]
        if len(group) == 1:
            lines.append(failure.headline())
        else:
            verb = "were stopped" if failure.stopped else failure.verb
            lines.append(f"ranks {rank_spans(sorted(f.rank for f in group))} {verb} the same way: {_any_port(failure.summary)}")
        if len(group) == 1:
            lines.extend("  " + line for line in _gpu_account(failure))
        if failure.traceback and not failure.stack:
            traceback = failure.traceback if len(group) == 1 else _any_port(failure.traceback)
            lines.extend("  " + ln for ln in traceback.rstrip().splitlines())
        lines.extend(_where(failure))
    return lines


@dataclass(frozen=True)
class RunFacts:
    """What an error says of its run besides its ranks: where the logs are, and a lost world's fate.

    (The run itself, ``nbspawn.Run``, is the error's ``.run``; the error never reads it.)"""

    run_dir: str = ""
    status: str = ""
    world: str | None = None
    world_lost: str | None = None  # why that world could not go on
    world_cell: int | None = None  # which of that world's cells this was, from 1 (1: the cell that started it)
    node_log_dirs: dict[str, str] = field(default_factory=dict)  # a cluster run's: node -> host:path
    nccl_dumps: tuple[str, ...] = ()  # NCCL's flight-recorder dumps its watchdog wrote at a timeout


def _logs_lines(facts: RunFacts | None, color: bool) -> list[str]:
    """Where the logs are, and, for a kept world that could not go on, that it is gone and why."""
    if facts is None or not facts.run_dir:
        return []
    lines = []
    if facts.world_lost:
        note = f"The world {facts.world!r} was lost: {facts.world_lost}; the next cell that names it starts a new one."
        lines.append(f"{_RED}{note}{_RESET}" if color else note)
    elif facts.world:
        # the names they had: none, if this cell started the world (a new one, or one lost and started again)
        had = ", with the names they had" if (facts.world_cell or 0) > 1 else ""
        note = f"World {facts.world!r} is intact: its ranks are back at the prompt{had}."
        lines.append(f"{_GREEN}{note}{_RESET}" if color else note)
    line = f"Logs: {facts.run_dir}/<rank>/{{{STDOUT},{STDERR},{ERROR}}}"
    nodes = facts.node_log_dirs
    if nodes:  # a cluster run: each node keeps its own ranks' logs
        line = "Logs, on each node: " + "; ".join(f"{node} {where}/<rank>/" for node, where in nodes.items())
    if facts.nccl_dumps:
        line += f"; NCCL's flight recorder, dumped at its timeout: {', '.join(facts.nccl_dumps)}"
    return [*lines, f"{_DIM}{line}{_RESET}" if color else line]


def _verdict(verdict: str | None, color: bool) -> list[str]:
    """The one line that says why a stopped run was stuck, right under the error's head."""
    if not verdict:
        return []
    line = f"Hang: {verdict}"
    return [f"{_BOLD}{line}{_RESET}" if color else line]


class SpawnError(Exception):
    """A ``%%spawn`` run that did not succeed; ``.run`` has every rank's state and log paths."""

    run: Any = None  # the nbspawn.Run that failed
    facts: RunFacts | None = None
    failures: list[RankFailure]

    def _report(self, color: bool) -> list[str]:
        raise NotImplementedError

    def _logs_line(self, color: bool) -> list[str]:
        return _logs_lines(self.facts, color)

    def _others(self, color: bool) -> list[str]:
        lines = _describe(self.failures[1:])
        if lines:
            lines.insert(0, f"{_BOLD}Other ranks:{_RESET}" if color else "Other ranks:")
        return lines

    def _render_traceback_(self) -> list[str]:
        return self._report(color=wants_colour())

    def __str__(self) -> str:
        return "\n".join(self._report(color=False))


class RootCauseError(SpawnError):
    """A run whose first failing rank is its root cause: ``_torch.RankRaisedError``, ``RankExitedError``.

    ``cause``: what made that rank fail when another rank's doing did, said first ("rank 1 never entered
    all_reduce #1 (it finished the cell); rank 0 waited in it at Cell In[2], line 6: ..."): gloo's
    "Connection closed by peer" on the waiting rank is the consequence of a peer that skipped the
    collective and left, and blamed the rank that did nothing wrong (issue #57)."""

    def __init__(
        self, failures: list[RankFailure], run: Any = None, facts: RunFacts | None = None, cause: str | None = None
    ) -> None:
        self.failures = failures
        self.root = failures[0]
        self.run, self.facts = run, facts
        self.cause = cause

    @property
    def rank(self) -> int:
        return self.root.rank

    def _report(self, color: bool) -> list[str]:
        root = self.root
        head = f"{type(self).__name__}: {self.cause or root.headline()}"
        lines = [f"{_HEAD}{head}{_RESET}" if color else head]
        if self.cause:
            lines.append(f"Because of it, {root.headline()}")
        if root.traceback:
            for ln in root.traceback.rstrip().splitlines():
                lines.append(f"{_GREEN}{ln}{_RESET}" if color and ln.lstrip().startswith("Cell In") else ln)
        else:
            lines.extend(_where(root))
        lines.extend(_gpu_account(root))
        return lines + self._others(color) + self._logs_line(color)


class SpawnTimeoutError(SpawnError, TimeoutError):
    """``--timeout`` expired; each rank still running says where it was."""

    def __init__(
        self,
        seconds: float,
        failures: list[RankFailure],
        run: Any = None,
        facts: RunFacts | None = None,
        verdict: str | None = None,
    ) -> None:
        self.seconds = seconds
        self.failures = failures
        self.run, self.facts = run, facts
        self.verdict = verdict  # why the ranks were stuck, when their places say it (a hang)

    def _report(self, color: bool) -> list[str]:
        running = [f for f in self.failures if f.stopped]
        head = f"SpawnTimeoutError: the run timed out after {self.seconds:g} s with {len(running)} rank{'s' if len(running) != 1 else ''} still running"
        lines = [f"{_HEAD}{head}{_RESET}" if color else head, *_verdict(self.verdict, color)]
        return lines + _describe(self.failures) + self._logs_line(color)


class SpawnInterrupted(KeyboardInterrupt):
    """The kernel was interrupted, or the run was stopped (its Stop button, ``run.stop()``).

    Every rank was told first, so each says where it was.  ``stopped_by`` says what stopped it
    (``"Stop button"``, ``"run.stop()"``); when not given, a run whose status is ``"stopped"`` (the
    supervisor sets it before raising) was stopped by its Stop button, any other was interrupted.
    """

    def __init__(
        self,
        failures: list[RankFailure],
        run: Any = None,
        stopped_by: str | None = None,
        facts: RunFacts | None = None,
        verdict: str | None = None,
    ) -> None:
        self.failures = failures
        self.run, self.facts = run, facts
        self.verdict = verdict
        self._stopped_by = stopped_by
        how = self.stopped_by
        super().__init__(f"the run was stopped ({how})" if how else "the run was interrupted")

    @property
    def stopped_by(self) -> str | None:
        """What stopped the run, or None when the kernel was interrupted."""
        if self._stopped_by is not None:
            return self._stopped_by
        return "Stop button" if self.facts is not None and self.facts.status == "stopped" else None

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.failures, None, self.stopped_by)

    def _logs_line(self, color: bool) -> list[str]:
        return _logs_lines(self.facts, color)

    def _report(self, color: bool) -> list[str]:
        if self.stopped_by:
            head = f"SpawnInterrupted: the run was stopped ({self.stopped_by})"  # its ranks with it: said once
        else:
            head = "KeyboardInterrupt: %%spawn was interrupted; the ranks were stopped"
        lines = [f"{_HEAD}{head}{_RESET}" if color else head, *_verdict(self.verdict, color)]
        return lines + _describe(self.failures) + self._logs_line(color)

    def _render_traceback_(self) -> list[str]:
        return self._report(color=wants_colour())

    def __str__(self) -> str:
        return "\n".join(self._report(color=False))


class SpawnOutputError(SpawnError, LookupError):
    """``--out`` named a value that some rank did not define."""

    def __init__(self, missing: list[tuple[int, str]], run: Any = None, facts: RunFacts | None = None) -> None:
        self.missing = missing
        self.failures = []
        self.run, self.facts = run, facts

    def _report(self, color: bool) -> list[str]:
        by_name: dict[str, list[int]] = {}
        for rank, name in self.missing:
            by_name.setdefault(name, []).append(rank)
        lines = []
        for name, ranks in by_name.items():
            which = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
            head = f"SpawnOutputError: --out {name!r} is not defined on {which}"
            lines.append(f"{_HEAD}{head}{_RESET}" if color else head)
        return lines + self._logs_line(color)
