"""The one dispatch: a :class:`~nbspawn._request.RunRequest` becomes a frozen spec and an executor,
then a run.

    request (the magic, launch())  ->  start()  ->  Plan  ->  carry_out()  ->  (RunSpec, Executor)  ->  execute()  ->  Run
                                         |
                 fresh cell  FreshRanks  |  program  ProgramRanks  |  --world  WorldCell  |  --cluster  ClusterRanks

Everything is checked before anything starts: what cannot be combined, then each option, then the
cell's syntax and the names it sends; only then are the plan's effects done, in one place
(``nbspawn._effects``: a port reserved, a new world started, and the one costly step, moving
``--share`` tensors into shared memory).  A bad request is one :class:`~nbspawn.errors.SpawnUsageError` line, whichever
door it came through.  The notes a spec carries (a start method changed for the user's sake, ...)
and the executor's announcement (a cluster's node order) are said here, once, before the ranks start.
"""

from __future__ import annotations

import dataclasses
import sys

from ._effects import carry_out
from ._program import ProgramLine
from ._request import Cell, Fresh, OnCluster, OnClusterWorld, OnWorld, RunRequest
from ._runstate import Run
from .errors import SpawnUsageError
from .executors import _kept
from .executors._kept import KeptWorld
from .executors._supervisor import execute
from .planning._fresh import plan_fresh_cell, plan_program
from .planning._plans import Plan
from .views._protocol import RunView


def start(request: RunRequest, view: RunView | None = None) -> Run:
    """Check ``request``, start its ranks, and supervise them: to the end, or (``background``) in a
    thread of the run's own.  Raises ``SpawnUsageError`` (nothing started) for a bad request."""
    view = view or RunView()
    request = dataclasses.replace(request, rich=view.rich)  # how its ranks draw: the view's, read once here
    spec, executor = carry_out(plan_run(request))  # the effects, once every check passed
    for note in spec.notes:
        print(note, file=sys.stderr)
    announcement = executor.announcement()
    if announcement:
        print(announcement)
    return execute(spec, view, executor, background=request.background)


def plan_run(request: RunRequest) -> Plan:
    """The plan of ``request``, by what runs where: its spec, its executor's kind and the effects it
    needs (``nbspawn._effects``); reserves, shares and starts nothing."""
    refuse_combinations(request)
    target = request.target
    if isinstance(target, OnWorld) and _on_a_cluster(target.name):  # its later cells need not say --cluster
        request = request.placed(None, None)
    work, target = request.work, request.target
    match work, target:
        case Cell(), Fresh():
            return plan_fresh_cell(request, work)
        case ProgramLine(), Fresh():
            return plan_program(request, work)
        case Cell(), OnWorld():
            from .planning._world import plan_world_cell

            return plan_world_cell(request, work, target)
        case _, OnCluster():
            from .planning._cluster import plan_cluster  # ipyparallel is needed only on a cluster

            return plan_cluster(request, work, target)
        case Cell(), OnClusterWorld():
            from .planning._cluster_world import plan_cluster_world_cell

            return plan_cluster_world_cell(request, work, target)
    raise SpawnUsageError(f"a program runs on fresh ranks, not on world {request.world!r}")  # RunRequest.of refuses it first


def refuse_combinations(request: RunRequest) -> None:
    """What the request asks for together that only this kernel's worlds can refuse (``RunRequest.of``
    refuses what no request can be), said in one line."""
    target = request.target
    if isinstance(target, OnClusterWorld) and target.cluster is not None:
        here = _kept.every_world().get(target.name)
        if here is not None and not here.on_cluster:
            raise SpawnUsageError(
                f"world {target.name!r} is a kept world on this machine, not on --cluster {target.cluster}: "
                f"leave --cluster out, or %spawn stop {target.name} first"
            )


def _on_a_cluster(world: str) -> bool:
    """Whether ``world`` names a kept world on a cluster (its later cells need not say --cluster)."""
    return _kept.on_a_cluster(world)


def kept_worlds() -> dict[str, KeptWorld]:
    """Every kept world of this kernel, on this machine and on clusters, by name."""
    return _kept.every_world()


def stop_worlds(names: list[str] | None) -> list[str]:
    """Stop these kept worlds, wherever they run (all, if None); an unknown name is a usage error."""
    return _kept.stop(names)
