"""A cell on a kept world of this machine, planned: the request (read at the door) and the world
(``executors._world``: its processes and registry) become the cell's frozen spec and executor.

A cell on a world that runs builds no spec of its own: it takes the world's (ranks, start method,
backend, ports, environment), checks that the options it gave are the world's own (``nbspawn._clash``),
and adds what is the cell's (timeout, shown ranks, ``--on``, names).  A new world (or one lost, started
again with its settings) is planned as a fresh run is (``_spec.build_spec``), then started: the one
thing here that starts processes, once everything is checked.
"""

from __future__ import annotations

import os

from .. import _cuda
from .._listen import release
from .._options import on_within, ranks_within
from .._request import Cell, OnWorld, RunRequest
from .._spec import RunSpec, build_spec, cell_part, new_run_id
from ..errors import SpawnUsageError, rank_spans
from ..executors import _kept, _world
from ..executors._world import World, WorldCell, settled_here
from ..handoff._names import names_bound, pack_namespace, pick_shared
from ..handoff._shm import new_run_prefix, share_
from ..ranks._worldloop import WorldJob
from ._kept_cell import as_before, check_settings


def plan_world_cell(request: RunRequest, work: Cell, target: OnWorld, rich: bool) -> tuple[RunSpec, WorldCell]:
    """A cell on the world ``target.name``: everything checked first (options, names, what the cell
    uses), then the world started if it is new.

    A cell on a world that exists builds no spec of its own: it takes the world's (ranks, start method,
    backend, ports, environment) and checks only what is the cell's (timeout, shown ranks, names).
    """
    name, cell, settings = target.name, work.source, request.settings
    share_names, out_names = work.share, work.out
    world = _kept.running(name, World)
    if world is not None:
        _world.lose_if_a_rank_died(world)
    if world is None:
        again = _kept.lost(name, on_cluster=False)
        if again is not None:
            settings = as_before(request, again).settings
        spec = build_spec(cell, settings, rich=rich, cell_numbers=request.cell_numbers)
        method, notes = spec.start_method, spec.notes
        if again is not None:
            notes = (
                *notes,
                f"nbspawn: world {name!r} was lost; this cell starts a new one with its settings "
                f"({settled_here(spec).text()}), but none of the names its ranks had: run the cells that set them up again.",
            )
        shown = spec.shown_ranks
    else:
        check_settings(world, request)
        method, notes = world.spec.start_method, ()
        shown = ranks_within(settings.ranks, world.spec.nprocs, "--ranks", f"a run of {world.spec.nprocs} ranks")
    try:
        on = cell_ranks(target.on, shown, world.spec.nprocs if world is not None else spec.nprocs, name)
        tree = cell.tree
        ranks_visible = _cuda.ranks_visible(world.spec.env if world is not None else spec.env, os.environ)
        # a kept world's ranks were started before this kernel could poison fork (fork is refused or
        # avoided then), so CUDA IPC reaches them whatever their start method
        shared = pick_shared(share_names, request.namespace, method, ranks_started=world is not None, ranks_visible=ranks_visible)
        owned = world.owned if world is not None else set()
        payload = pack_namespace(tree, request.namespace, request.hidden, shared, world=name, owned=owned)
        if world is None:
            world = _world.start_world(name, spec, settings.start_method)
    except BaseException:
        if world is None:
            release(spec.master_port)  # the new world's port, reserved by build_spec
        raise
    run_id = new_run_id()
    cspec = world.spec.with_cell(  # --pdb, --timeout, ...: the cell's own (the world's spec is its first cell's)
        cell_part(
            settings,
            cell,
            run_id=run_id,
            run_dir=os.path.join(world.base_dir, run_id),
            shown=shown,
            rich=world.spec.rich,  # how its ranks draw was settled when they started
            cell_numbers=request.cell_numbers,
            out_names=out_names,
            shm_prefix=new_run_prefix() if out_names else None,
            on=on,
            notes=notes,
        )
    )
    share_(list(shared.values()))
    job = WorldJob(
        cell,
        cspec.run_dir,
        cspec.run_id,
        payload,
        out_names,
        cspec.shm_prefix,
        shared=tuple(shared),
        grace=cspec.grace_period,
        on=on,
        xray=cspec.xrayed,
        xray_values=cspec.xray_values,
    )
    return cspec, WorldCell(world, job, names_bound(tree))


def cell_ranks(on: frozenset[int] | None, shown: frozenset[int] | None, nprocs: int, name: str) -> frozenset[int] | None:
    """``--on``: the ranks of the world that run the cell (None: all), checked against its size; the
    ranks ``--ranks`` shows must be among them."""
    ranks = on_within(on, nprocs, name)
    if ranks is not None and shown is not None and not shown <= ranks:
        extra = sorted(shown - ranks)
        raise SpawnUsageError(
            f"--ranks {rank_spans(extra)}: {'rank' if len(extra) == 1 else 'ranks'} {rank_spans(extra)} "
            f"{'does' if len(extra) == 1 else 'do'} not run this cell (--on {rank_spans(sorted(ranks))}); --ranks picks among those that do"
        )
    return ranks
