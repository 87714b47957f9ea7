"""The two exceptions whose classes subclass torch's own, so that handlers written for
``torch.multiprocessing`` (``except ProcessRaisedException``) keep working.

Defining them imports torch, so this module is imported when one of them is first asked for
(``nbspawn.errors.RankRaisedError``, PEP 562), by the supervisor that raises them or by the user.
"""

from __future__ import annotations

from typing import Any

from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from ._failures import RankFailure, RootCauseError, RunFacts


class RankRaisedError(RootCauseError, ProcessRaisedException):
    """The root-cause rank raised an exception from the cell."""

    def __init__(
        self, failures: list[RankFailure], run: Any = None, facts: RunFacts | None = None, cause: str | None = None
    ) -> None:
        RootCauseError.__init__(self, failures, run, facts, cause)
        ProcessRaisedException.__init__(self, str(self), failures[0].rank, failures[0].pid or 0)
        self.error_pid = failures[0].pid or 0  # torch 2.4 sets only ``pid``; handlers read ``error_pid``

    @property
    def exc_type(self) -> str | None:
        return self.root.exc_type

    def __str__(self) -> str:
        return RootCauseError.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.failures, None, None, self.cause)


class RankExitedError(RootCauseError, ProcessExitedException):
    """The root-cause rank exited with a non-zero code or was killed by a signal (SIGSEGV, OOM...)."""

    def __init__(
        self, failures: list[RankFailure], run: Any = None, facts: RunFacts | None = None, cause: str | None = None
    ) -> None:
        RootCauseError.__init__(self, failures, run, facts, cause)
        root = failures[0]
        ProcessExitedException.__init__(self, str(self), root.rank, root.pid or 0, root.exit_code or 0, root.signal_name)
        self.error_pid = root.pid or 0  # torch 2.4 sets only ``pid``; handlers read ``error_pid``

    def __str__(self) -> str:
        return RootCauseError.__str__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.failures, None, None, self.cause)


RankRaisedError.__module__ = RankExitedError.__module__ = "nbspawn.errors"  # their public name, as the others'
