"""What a planner decides, as data: the frozen spec, what its executor is, and the effects the run
needs before its ranks start (a port of this machine reserved, a kept world started, ``--share``
tensors moved into shared memory).  A planner only returns one of these; ``nbspawn._effects.carry_out``
does the effects, in one place and in order, once every check has passed, and undoes those done when a
later one fails.  So planning a run, and refusing it, leaves nothing behind: no port held, no
process, nothing in shared memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._options import StartMethod
from .._request import RunRequest, Settings
from .._spec import CellPart, RunSpec
from ..cluster import _wire
from ..executors._kept import KeptWorld
from ..ranks._worldloop import WorldJob

if TYPE_CHECKING:
    from ..cluster._plan import ClusterPlan


@dataclass(frozen=True)
class FreshPlan:
    """New ranks of this machine for one cell, or a program (``spec.program``): ``FreshRanks`` or
    ``ProgramRanks``.  The spec's port is reserved when the plan is carried out (0 until then)."""

    spec: RunSpec
    share: tuple[Any, ...] = ()  # the --share values, moved into shared memory last


@dataclass(frozen=True)
class NewWorld:
    """A kept world of this machine to start before its first cell: its name, the spec its ranks start
    with (its port reserved when it starts) and ``--start-method`` as the user gave it."""

    name: str
    spec: RunSpec
    asked_start_method: StartMethod


@dataclass(frozen=True)
class WorldCellPlan:
    """A cell on a kept world of this machine (``WorldCell``): the world that runs, or one to start; the
    cell's part of its spec (the world's spec with it, :meth:`RunSpec.with_cell`); the job its ranks
    are sent; the names the cell binds at its top level."""

    world: KeptWorld | NewWorld
    part: CellPart
    job: WorldJob
    bound: set[str]
    share: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ClusterRunPlan:
    """A run on a cluster's nodes (``ClusterRanks``): the kernel's spec, the nodes asked, every node's
    job.  A background run's thread talks to the engines through a client of its own, made when the
    plan is carried out (the user's is not thread-safe, and stays the user's)."""

    spec: RunSpec
    nodes: ClusterPlan
    job: _wire.Job
    background: bool


@dataclass(frozen=True)
class NewClusterWorld:
    """A kept world on a cluster's nodes, made when its first cell is carried out: how it was asked
    for (to start it again if it is lost), its spec, the nodes asked (a background cell's own client
    made then, as a background run's is) and each node's settled settings."""

    name: str
    spec: RunSpec
    nodes: ClusterPlan
    asked: RunRequest
    node_settings: Settings
    background: bool


@dataclass(frozen=True)
class ClusterWorldCellPlan:
    """A cell on a cluster world (``ClusterWorldCell``): the world that runs, or the one its first
    cell makes (its nodes started by that cell, as a cluster run's are)."""

    spec: RunSpec
    job: _wire.Job
    world: KeptWorld | NewClusterWorld


Plan = FreshPlan | WorldCellPlan | ClusterRunPlan | ClusterWorldCellPlan
