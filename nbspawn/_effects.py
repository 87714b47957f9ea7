"""A plan's effects, in one place: what a run needs before its ranks start, done only once every check
has passed (``nbspawn.planning`` decides and changes nothing), in this order:

    a port of this machine reserved  ->  a new kept world started  ->  --share tensors moved into
    shared memory  ->  the executor made

If one fails, those done before it are undone (the port let go), so a refused or failed launch leaves
nothing behind.  A kept world that started is the world's, not the cell's: it stays, as it does when
its first cell fails.  The executor is made here, so the planners import no process code.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from . import _listen
from ._spec import RunSpec
from .executors._base import Executor
from .planning._plans import ClusterRunPlan, ClusterWorldCellPlan, FreshPlan, NewClusterWorld, NewWorld, Plan, WorldCellPlan

if TYPE_CHECKING:
    from .cluster._plan import ClusterPlan
    from .executors._world import World


def carry_out(plan: Plan) -> tuple[RunSpec, Executor]:
    """Do what ``plan`` needs, in order, and give the run's frozen spec and its executor."""
    match plan:
        case FreshPlan():
            return _fresh(plan)
        case WorldCellPlan():
            return _world_cell(plan)
        case ClusterRunPlan():
            return _cluster_run(plan)
        case ClusterWorldCellPlan():
            return _cluster_world_cell(plan)
    raise TypeError(f"not a plan: {plan!r}")


def reserve_port(spec: RunSpec, undo: contextlib.ExitStack) -> RunSpec:
    """``spec`` with a port of its address reserved (held, listening, until its store takes it over:
    ``_listen``), let go again if a later effect fails."""
    port = _listen.reserve(spec.master_addr)
    undo.callback(_listen.release, port)
    return replace(spec, placement=replace(spec.placement, master_port=port))


def share(values: tuple[Any, ...]) -> None:
    """The costly step, last: the ``--share`` values' CPU storages moved into shared memory, in place
    (``handoff._shm.share_``; nothing is left in /dev/shm, and moving them again costs nothing)."""
    from .handoff._shm import share_

    share_(list(values))


def _fresh(plan: FreshPlan) -> tuple[RunSpec, Executor]:
    from .executors._fresh import FreshRanks
    from .executors._program import ProgramRanks

    with contextlib.ExitStack() as undo:
        spec = reserve_port(plan.spec, undo)
        share(plan.share)
        undo.pop_all()
    return spec, ProgramRanks(spec) if spec.program is not None else FreshRanks(spec)


def _world_cell(plan: WorldCellPlan) -> tuple[RunSpec, Executor]:
    from .executors._world import WorldCell, start_world

    world = plan.world
    if isinstance(world, NewWorld):
        with contextlib.ExitStack() as undo:
            spec = reserve_port(world.spec, undo)
            world = start_world(world.name, spec, world.asked_start_method)  # its store holds the port now
            undo.pop_all()
    world = cast("World", world)
    spec = world.spec.with_cell(plan.part)
    share(plan.share)
    return spec, WorldCell(world, plan.job, plan.bound)


def _cluster_run(plan: ClusterRunPlan) -> tuple[RunSpec, Executor]:
    from .cluster._executor import ClusterRanks

    if plan.background:
        # the run's thread talks to the engines through a client of its own: the user's is not
        # thread-safe, and stays the user's (the port book of the engines' facts stays with it)
        return plan.spec, ClusterRanks(plan.spec, _own_client(plan.nodes), plan.job, port_book=plan.nodes.client)
    return plan.spec, ClusterRanks(plan.spec, plan.nodes, plan.job)


def _cluster_world_cell(plan: ClusterWorldCellPlan) -> tuple[RunSpec, Executor]:
    from .cluster._clusterworld import ClusterWorld, ClusterWorldCell

    if isinstance(plan.world, NewClusterWorld):
        new = plan.world
        nodes = _own_client(new.nodes) if new.background else new.nodes
        world = ClusterWorld(new.name, new.spec, nodes, new.asked, new.node_settings)
        return plan.spec, ClusterWorldCell(plan.spec, nodes, plan.job, world, first=True)
    world = cast(ClusterWorld, plan.world)
    return plan.spec, ClusterWorldCell(plan.spec, world.cluster, plan.job, world, first=False)


def _own_client(nodes: ClusterPlan) -> ClusterPlan:
    """The nodes, asked through a companion client (``cluster._plan.companion_client``): a thread of nbspawn's own talks to them."""
    from .cluster._plan import companion_client

    return replace(nodes, client=companion_client(nodes.client))
