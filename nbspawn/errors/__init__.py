"""What a failed run raises in the kernel, and what bad input raises before anything starts.

One exception per run, naming its root cause (the first rank observed to fail) and listing the ranks
that failed after it (``_failures``).  ``RankRaisedError`` and ``RankExitedError`` subclass torch's
``ProcessRaisedException`` / ``ProcessExitedException`` so handlers written for
``torch.multiprocessing`` keep working; they are defined in ``_torch`` and made on first use (PEP 562),
so importing this package, as the door, the options and the planners' checks do, imports neither
torch nor IPython.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._failures import (
    RankFailure,
    RootCauseError,
    RunFacts,
    SpawnError,
    SpawnInterrupted,
    SpawnOutputError,
    SpawnTimeoutError,
    SpawnUsageError,
    rank_spans,
)

if TYPE_CHECKING:
    from ._torch import RankExitedError, RankRaisedError

__all__ = [
    "RankExitedError",
    "RankFailure",
    "RankRaisedError",
    "RootCauseError",
    "RunFacts",
    "SpawnError",
    "SpawnInterrupted",
    "SpawnOutputError",
    "SpawnTimeoutError",
    "SpawnUsageError",
    "rank_spans",
]

# Their public name is this package's (tracebacks, reprs, pickles say nbspawn.errors.X), wherever defined:
# every class of __all__ here now (the torch ones say so themselves, when made)
for _public in [globals().get(_name) for _name in __all__]:
    if isinstance(_public, type):
        _public.__module__ = __name__


def __getattr__(name: str) -> Any:
    """``RankRaisedError`` and ``RankExitedError``: torch is imported when one is first asked for."""
    if name not in ("RankRaisedError", "RankExitedError"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import _torch

    made = {"RankRaisedError": _torch.RankRaisedError, "RankExitedError": _torch.RankExitedError}
    globals().update(made)  # asked once
    return made[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
