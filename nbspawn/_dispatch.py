"""The one dispatch: a :class:`~nbspawn._request.RunRequest` becomes a frozen spec and an executor,
then a run.

    request (the magic, launch())  ->  start()  ->  (RunSpec, Executor)  ->  execute()  ->  Run
                                         |
                 fresh cell  FreshRanks  |  program  ProgramRanks  |  --world  WorldCell  |  --cluster  ClusterRanks

Everything is checked before anything starts: what cannot be combined, then each option, then the
cell's syntax and the names it sends, and only then the one costly step (moving ``--share`` tensors
into shared memory).  A bad request is one :class:`~nbspawn.errors.SpawnUsageError` line, whichever
door it came through.  The notes a spec carries (a start method changed for the user's sake, ...)
and the executor's announcement (a cluster's node order) are said here, once, before the ranks start.
"""

from __future__ import annotations

import sys

from ._options import OPTIONS
from ._request import RunRequest
from ._runstate import Run
from ._spec import RunSpec
from .errors import SpawnUsageError
from .executors._base import Executor, KeptWorld
from .executors._supervisor import execute
from .planning._fresh import plan_fresh_cell, plan_program
from .views._protocol import RunView


def start(request: RunRequest, view: RunView | None = None) -> Run:
    """Check ``request``, start its ranks, and supervise them: to the end, or (``background``) in a
    thread of the run's own.  Raises ``SpawnUsageError`` (nothing started) for a bad request."""
    view = view or RunView()
    spec, executor = plan_run(request, view.rich)
    for note in spec.notes:
        print(note, file=sys.stderr)
    announcement = executor.announcement()
    if announcement:
        print(announcement)
    return execute(spec, view, executor, background=request.background)


def plan_run(request: RunRequest, rich: bool) -> tuple[RunSpec, Executor]:
    """The spec and executor of ``request``; starts nothing (but a kept world that is new)."""
    refuse_combinations(request)
    if request.world is not None and (request.cluster is not None or _on_a_cluster(request.world)):
        from .planning._cluster_world import plan_cluster_world_cell  # ipyparallel is needed only on a cluster

        return plan_cluster_world_cell(request, rich)
    if request.cluster is not None:
        from .planning._cluster import plan_cluster  # ipyparallel is needed only here

        return plan_cluster(request, rich)
    if request.program is not None:
        return plan_program(request, rich)
    if request.world is not None:
        from .planning._world import plan_world_cell

        return plan_world_cell(request, rich)
    return plan_fresh_cell(request, rich)


def refuse_combinations(request: RunRequest) -> None:
    """What the request asks for together that cannot be done, each said in one line."""
    if request.program is not None:
        given = {
            "start_method": request.settings.given.start_method,
            "backend": request.settings.given.backend,
            "share": bool(request.share),
            "out": bool(request.out),
            "world": request.world is not None,
            "on": request.on is not None,
        }
        for option in OPTIONS:
            if option.not_for_programs and given.get(option.param):
                raise SpawnUsageError(f"{option.flags[-1]} does not apply to a program: {option.not_for_programs}")
    if request.on is not None and request.world is None:
        raise SpawnUsageError(
            "--on needs --world NAME: it picks which ranks of a kept world run the cell; a fresh cell's ranks are "
            "all new, so each runs it (--ranks shows only some ranks' output)"
        )
    if request.nodes is not None and request.cluster is None:
        raise SpawnUsageError("--nodes needs --cluster NAME (or %config SpawnMagics.cluster)")
    if request.cluster is not None and request.world is not None and request.program is None:
        from .executors._world import worlds

        if request.world in worlds():
            raise SpawnUsageError(
                f"world {request.world!r} is a kept world on this machine, not on --cluster {request.cluster}: "
                f"leave --cluster out, or %spawn stop {request.world} first"
            )
    if request.world is not None and request.background:
        raise SpawnUsageError("--bg runs on fresh ranks: a kept world runs one cell at a time (use --fresh with --bg)")


def _on_a_cluster(world: str) -> bool:
    """Whether ``world`` names a kept world on a cluster (its later cells need not say --cluster)."""
    from .executors._world import held_elsewhere

    return held_elsewhere(world)


def kept_worlds() -> dict[str, KeptWorld]:
    """Every kept world of this kernel, on this machine and on clusters, by name."""
    from .executors._world import every_world

    return every_world()


def stop_worlds(names: list[str] | None) -> list[str]:
    """Stop these kept worlds, wherever they run (all, if None); an unknown name is a usage error."""
    from .executors._world import stop_anywhere

    return stop_anywhere(names)
