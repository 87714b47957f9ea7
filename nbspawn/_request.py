"""What the user asked for, as the two doors (``%%spawn`` and ``launch()``) write it down.

A :class:`RunRequest` is frozen and typed: every option was read once, at the door
(``nbspawn._door``), into what it means (a count, a Literal, seconds as a float, sizes as ints, the
environment as a dict, rank lists as sets), a default filled in where the user gave none, and a
malformed one refused there.  It says what runs (:data:`Work`) and where (:data:`Target`) as types,
and :meth:`RunRequest.of` refuses what no request can be.  What it cannot know yet is left to the
planners: what this machine makes of the options (``-n auto``, ``--ranks`` against the run's size, a
kept world's own settings); ``nbspawn._dispatch.start`` reads it and says so, the same for both doors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._options import OPTIONS, ROW, Settings, ViewChoice
from ._program import ProgramLine
from ._source import CellSource
from .errors import SpawnUsageError


@dataclass(frozen=True)
class Cell:
    """The work is a cell: its source (parsed once, at the door) and the kernel names it shares and
    brings back."""

    source: CellSource
    share: tuple[str, ...] = ()  # Python names, read
    out: tuple[str, ...] = ()


Work = Cell | ProgramLine  # a program: its command line, its form read at the door


@dataclass(frozen=True)
class Fresh:
    """New ranks of this machine, for this run only."""


@dataclass(frozen=True)
class OnWorld:
    """The kept world ``name`` of this machine (started by this cell if new); only its ranks ``on``
    run the cell (None: all)."""

    name: str
    on: frozenset[int] | None = None


@dataclass(frozen=True)
class OnCluster:
    """Fresh ranks on the nodes of ``cluster`` (a kernel variable holding an ipyparallel client):
    its first ``nodes`` nodes (None: all)."""

    cluster: str
    nodes: int | None = None


@dataclass(frozen=True)
class OnClusterWorld:
    """The kept world ``name`` on a cluster: ``cluster`` and ``nodes`` as the cell gave them (None: as
    the world runs, or, for a new world, as it ran before it was lost)."""

    name: str
    on: frozenset[int] | None = None
    cluster: str | None = None
    nodes: int | None = None


Target = Fresh | OnWorld | OnCluster | OnClusterWorld


@dataclass(frozen=True, eq=False)
class RunRequest:
    """One run, as asked: what runs (``work``: a cell or a program) and where (``target``), each a type
    of its own, so the dispatch picks a planner by matching on them and no planner checks that the
    fields it needs are set.  :meth:`of` makes one from the options as read, refusing what no request
    can be (``--on`` without ``--world``, a cell option given to a program)."""

    work: Work
    target: Target = Fresh()
    settings: Settings = field(default_factory=Settings)
    namespace: dict[str, Any] = field(default_factory=dict)  # the kernel's names (fork: the ranks get a copy of this very dict)
    hidden: Mapping[str, Any] | None = None  # IPython's own names, never sent to ranks
    background: bool = ROW["background"].typed_default
    view: ViewChoice = ROW["view"].typed_default  # the magic's --view (launch() is given a RunView instead)
    # its ranks draw like a notebook's (their displays kept as HTML, images): the view's, set as the run
    # starts (nbspawn._dispatch.start), so a planner reads the request alone
    rich: bool = False
    cell_numbers: Mapping[str, int] = field(default_factory=dict)  # IPython's compiled cell files -> In[N]

    @classmethod
    def of(
        cls,
        work: CellSource | ProgramLine,
        *,
        world: str | None = None,
        on: frozenset[int] | None = None,
        cluster: str | None = None,
        nodes: int | None = None,
        share: tuple[str, ...] = (),
        out: tuple[str, ...] = (),
        **rest: Any,
    ) -> RunRequest:
        """The request of these options, read (``nbspawn._door``), as work and target; what cannot be
        combined is refused here, each in one line."""
        settings: Settings = rest.get("settings", Settings())
        if isinstance(work, ProgramLine):
            asked = {
                "start_method": settings.given.start_method,
                "backend": settings.given.backend,
                "pdb": settings.pdb,
                "share": bool(share),
                "out": bool(out),
                "world": world is not None,
                "on": on is not None,
            }
            for option in OPTIONS:
                if option.not_for_programs and asked.get(option.param):
                    raise SpawnUsageError(f"{option.spelled} does not apply to a program: {option.not_for_programs}")
        if on is not None and world is None:
            raise SpawnUsageError(
                "--on needs --world NAME: it picks which ranks of a kept world run the cell; a fresh cell's ranks are "
                "all new, so each runs it (--ranks shows only some ranks' output)"
            )
        if nodes is not None and cluster is None:
            raise SpawnUsageError("--nodes needs --cluster NAME (or %config SpawnMagics.cluster)")
        if world is not None and rest.get("background"):
            raise SpawnUsageError("--bg runs on fresh ranks: a kept world runs one cell at a time (use --fresh with --bg)")
        target: Target = Fresh()
        if world is not None:
            target = OnWorld(world, on) if cluster is None else OnClusterWorld(world, on, cluster, nodes)
        elif cluster is not None:
            target = OnCluster(cluster, nodes)
        return cls(Cell(work, share, out) if isinstance(work, CellSource) else work, target, **rest)

    def placed(self, cluster: str | None, nodes: int | None) -> RunRequest:
        """This request on ``cluster`` (its first ``nodes`` nodes): a world becomes a cluster world."""
        target = self.target
        if isinstance(target, (OnWorld, OnClusterWorld)):
            return replace(self, target=OnClusterWorld(target.name, target.on, cluster, nodes))
        return self if cluster is None else replace(self, target=OnCluster(cluster, nodes))

    # what the request names, for code that only reads it (messages, a lost world's record)
    @property
    def cell(self) -> CellSource | None:
        return self.work.source if isinstance(self.work, Cell) else None

    @property
    def program(self) -> ProgramLine | None:
        return self.work if isinstance(self.work, ProgramLine) else None

    @property
    def share(self) -> tuple[str, ...]:
        return self.work.share if isinstance(self.work, Cell) else ()

    @property
    def out(self) -> tuple[str, ...]:
        return self.work.out if isinstance(self.work, Cell) else ()

    @property
    def world(self) -> str | None:
        return self.target.name if isinstance(self.target, (OnWorld, OnClusterWorld)) else None

    @property
    def on(self) -> frozenset[int] | None:
        return self.target.on if isinstance(self.target, (OnWorld, OnClusterWorld)) else None

    @property
    def cluster(self) -> str | None:
        return self.target.cluster if isinstance(self.target, (OnCluster, OnClusterWorld)) else None

    @property
    def nodes(self) -> int | None:
        return self.target.nodes if isinstance(self.target, (OnCluster, OnClusterWorld)) else None
