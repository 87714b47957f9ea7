"""The executor: how one run's ranks are started, seen to end, reached and cleaned up.

The supervisor (``_supervisor``) does everything else, identically for every executor, as torch
elastic's ``PContext`` puts ``_start``/``_poll``/``_close`` behind ``start``/``wait``/``close``.
Four members are each executor's own; the rest have defaults that fit ranks that are processes of
this machine, writing their output to their rank directories:

* :meth:`start` the ranks (their pids, in rank order; on failure nothing is left running);
* :meth:`waitables`: what becomes ready when a rank's cell ends or the rank dies;
* :meth:`ended`: how it ended (a :class:`RankEnd`), or None if what woke was news, not its end;
* :meth:`cleanup`: leave nothing running that should not be (``lose``: a kept world is lost).

Where the supervisor's policy differs (ranks that outlive the cell, ranks on other machines, how
closely they are watched), the executor says so once, in its :attr:`Executor.supervision`.

Executors: ``_fresh.FreshRanks`` (new processes per cell), ``_world.WorldCell`` (a cell on a kept
world), ``_program.ProgramRanks`` (a program per rank), ``nbspawn.cluster._executor.ClusterRanks``
(every node's ranks, reported by the nodes' agents).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ..handoff._names import Outputs, receive_outputs
from ._procs import signal_group

if TYPE_CHECKING:
    from .._runstate import Run
    from ..events._streams import Event
from ..events._where import RankToAsk, Where, rank_collectives, rank_stacks

POLL_MAX = 0.25  # the longest the supervisor waits between looks for new output
CLUSTER_POLL_MAX = 0.05  # ... on a cluster, at either end (a node's agent, the kernel): how soon a node's news is acted on


class RankEnd(NamedTuple):
    """How a rank's part of the run ended (:meth:`Executor.ended`)."""

    exit_code: int  # 0, a cell's own code (ranks._cell.EXIT_RAISED, ...), or -signal
    died: bool  # the process is gone (a kept world's rank that finished its cell lives on)


@dataclass(frozen=True)
class Supervision:
    """The few ways the one supervisor treats executors' ranks differently, named once per executor
    (:attr:`Executor.supervision`) rather than spread as flags."""

    keeps_ranks: bool = False  # the ranks outlive the cell: a failure interrupts them instead of ending them
    remote: bool = False  # the ranks are not this machine's processes: their agents stop them and dump stacks
    poll_max: float = POLL_MAX  # the longest wait between looks for output (a node's agent: how soon a stop is acted on)
    # quiet ranks are looked at for a hang (a node's agent does not: the kernel shows no notes for a
    # cluster's ranks, and its looks would only fill their stacks.log)
    watches_hangs: bool = True
    # each rank makes its own <rank>/ directory as it begins the cell (``Run.prepare_logs``): ranks that
    # are running already (a kept world's) do it beside the kernel, not before it can send them the cell
    ranks_make_their_dirs: bool = False


NODE_AGENT = Supervision(poll_max=CLUSTER_POLL_MAX, watches_hangs=False)  # a node's ranks, watched by its agent for the kernel


class Executor(ABC):
    supervision: ClassVar[Supervision] = Supervision()

    @abstractmethod
    def start(self, run: Run) -> list[int]: ...

    @abstractmethod
    def waitables(self, rank: int) -> list[Any]: ...

    @abstractmethod
    def ended(self, rank: int, ready: Any) -> RankEnd | None: ...

    @abstractmethod
    def cleanup(self, lose: bool) -> None: ...

    def announcement(self) -> str | None:
        """A line printed before the run starts (a cluster's node order), if any."""
        return None

    def where(self, run: Run, wait: float) -> str | None:
        """Where its ranks are now, when they cannot be asked from this machine (a cluster's); None:
        ask them here (``Run.where``)."""
        return None

    def look(self, run: Run, ranks: list[int], wait: float) -> Where:
        """These ranks' stack dumps and recent collectives, asked now (``events._where``): from here
        by signal and their files; a remote executor asks the ranks' agents."""
        asked = [RankToAsk(r, run.ranks[r].pid, run.ranks[r].stacks_path) for r in ranks]
        dumps = rank_stacks(asked, wait=wait)
        return Where(dumps, rank_collectives(asked, dumps) if run.spec.program is None else {})

    def signal_ranks(self, ranks: list[int], pids: list[int], sig: int) -> None:
        """Deliver ``sig`` to these ranks (each rank's process group)."""
        for rank in ranks:
            signal_group(pids[rank], sig)

    def read_output(self, run: Run, final: bool, budget: int | None) -> list[Event]:
        """What the ranks wrote since the last call (from their log files here)."""
        return run.read_new_output(final=final, budget=budget)

    def outputs(self, run: Run) -> Outputs:
        """``--out``: each name's values by rank, and the (rank, name) pairs some rank did not define."""
        dirs = [state.dir if run.spec.runs(state.rank) else None for state in run.ranks]  # --on: None for the others
        return receive_outputs(dirs, run.spec.out_names)
