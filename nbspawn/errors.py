"""What a failed run raises in the kernel.

One exception per run, naming its root cause (the first rank observed to fail) and listing the ranks
that failed after it, in the spirit of torch elastic's ``ChildFailedError``.  The classes subclass
torch's ``ProcessRaisedException`` / ``ProcessExitedException`` so handlers written for
``torch.multiprocessing`` keep working, and implement ``_render_traceback_`` so IPython shows the
rank's traceback in the cell's own lines instead of nbspawn's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from IPython.core.error import UsageError
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from ._rankdir import ERROR, STDERR, STDOUT

__all__ = [
    "RankExitedError",
    "RankFailure",
    "RankRaisedError",
    "SpawnError",
    "SpawnInterrupted",
    "SpawnOutputError",
    "SpawnTimeoutError",
    "SpawnUsageError",
]

_RED, _GREEN, _DIM, _BOLD, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[2m", "\x1b[1m", "\x1b[0m"


class SpawnUsageError(UsageError):
    """Bad input, caught before any process starts; IPython prints it as one line, no traceback."""


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

    @property
    def summary(self) -> str:
        if self.exc_type:
            return f"{self.exc_type}: {self.message}" if self.message else self.exc_type
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


def _alike(failures: list[RankFailure]) -> list[list[RankFailure]]:
    """Group ranks that ended identically, so 63 ranks stopped in one collective read as one line."""
    groups: dict[tuple, list[RankFailure]] = {}
    for failure in failures:
        key = (failure.stopped, failure.after, failure.summary, failure.traceback, failure.stack)
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


def _describe(failures: list[RankFailure]) -> list[str]:
    """One entry per way of ending: its ranks, its traceback (or where the ranks were stopped)."""
    lines: list[str] = []
    for group in _alike(failures):
        failure = group[0]
        if len(group) == 1:
            lines.append(failure.headline())
        else:
            verb = "were stopped" if failure.stopped else failure.verb
            lines.append(f"ranks {rank_spans(sorted(f.rank for f in group))} {verb} the same way: {failure.summary}")
        if failure.traceback and not failure.stack:
            lines.extend("  " + ln for ln in failure.traceback.rstrip().splitlines())
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
        return self._report(color=True)

    def __str__(self) -> str:
        return "\n".join(self._report(color=False))


class _RootCause(SpawnError):
    def __init__(self, failures: list[RankFailure], run: Any = None, facts: RunFacts | None = None) -> None:
        self.failures = failures
        self.root = failures[0]
        self.run, self.facts = run, facts

    @property
    def rank(self) -> int:
        return self.root.rank

    def _report(self, color: bool) -> list[str]:
        root = self.root
        head = f"{type(self).__name__}: {root.headline()}"
        lines = [f"{_RED}{_BOLD}{head}{_RESET}" if color else head]
        if root.traceback:
            for ln in root.traceback.rstrip().splitlines():
                lines.append(f"{_GREEN}{ln}{_RESET}" if color and ln.lstrip().startswith("Cell In") else ln)
        else:
            lines.extend(_where(root))
        return lines + self._others(color) + self._logs_line(color)


class RankRaisedError(_RootCause, ProcessRaisedException):
    """The root-cause rank raised an exception from the cell."""

    def __init__(self, failures: list[RankFailure], run: Any = None, facts: RunFacts | None = None) -> None:
        _RootCause.__init__(self, failures, run, facts)
        ProcessRaisedException.__init__(self, str(self), failures[0].rank, failures[0].pid or 0)
        self.error_pid = failures[0].pid or 0  # torch 2.4 sets only ``pid``; handlers read ``error_pid``

    @property
    def exc_type(self) -> str | None:
        return self.root.exc_type

    def __str__(self) -> str:
        return _RootCause.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.failures,)


class RankExitedError(_RootCause, ProcessExitedException):
    """The root-cause rank exited with a non-zero code or was killed by a signal (SIGSEGV, OOM...)."""

    def __init__(self, failures: list[RankFailure], run: Any = None, facts: RunFacts | None = None) -> None:
        _RootCause.__init__(self, failures, run, facts)
        root = failures[0]
        ProcessExitedException.__init__(self, str(self), root.rank, root.pid or 0, root.exit_code or 0, root.signal_name)
        self.error_pid = root.pid or 0  # torch 2.4 sets only ``pid``; handlers read ``error_pid``

    def __str__(self) -> str:
        return _RootCause.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.failures,)


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
        head = f"SpawnTimeoutError: the run timed out after {self.seconds:g} s with {len(running)} rank(s) still running"
        lines = [f"{_RED}{_BOLD}{head}{_RESET}" if color else head, *_verdict(self.verdict, color)]
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
            head = f"SpawnInterrupted: the run was stopped ({self.stopped_by}); the ranks were stopped"
        else:
            head = "KeyboardInterrupt: %%spawn was interrupted; the ranks were stopped"
        lines = [f"{_RED}{_BOLD}{head}{_RESET}" if color else head, *_verdict(self.verdict, color)]
        return lines + _describe(self.failures) + self._logs_line(color)

    def _render_traceback_(self) -> list[str]:
        return self._report(color=True)

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
            lines.append(f"{_RED}{_BOLD}{head}{_RESET}" if color else head)
        return lines + self._logs_line(color)
