"""A cell on a kept world of this machine, planned: the request (read at the door) and the world
(``executors._kept``: the registry) become the cell's plan (``planning._plans.WorldCellPlan``).

A cell on a world that runs builds no spec of its own: it takes the world's (ranks, start method,
backend, ports, environment), checks that the options it gave are the world's own (``nbspawn._clash``),
and adds what is the cell's (timeout, shown ranks, ``--on``, names).  A new world (or one lost, started
again with its settings) is planned as a fresh run is (``_spec.build_spec``), and started when the plan is
carried out (``nbspawn._effects``), once everything is checked.
"""

from __future__ import annotations

import os

from .. import _cuda
from .._decide import decide_ranks
from .._machine import Machine
from .._request import Cell, OnWorld, RunRequest
from .._runsize import on_within, ranks_within
from .._spec import build_spec, cell_part, new_run_id
from ..errors import SpawnUsageError, rank_spans
from ..executors import _kept
from ..executors._kept import KeptWorld, Lost
from ..ranks._worldloop import WorldJob
from ._kept_cell import as_before, check_settings, started_again
from ._plans import NewWorld, WorldCellPlan


def plan_world_cell(request: RunRequest, work: Cell, target: OnWorld) -> WorldCellPlan:
    """A cell on the world ``target.name``, planned on what is known now: the world that runs (a rank
    that died since its last cell loses it, said now), else how it ran if it was lost, and this
    machine's facts (:func:`plan_world_cell_on` decides; this function only asks)."""
    world = _kept.running_here(target.name)
    if world is not None:
        world.refuse_if_lost()
    lost = _kept.lost(target.name, on_cluster=False) if world is None else None
    return plan_world_cell_on(request, work, target, world, lost, Machine.here())


def plan_world_cell_on(
    request: RunRequest, work: Cell, target: OnWorld, world: KeptWorld | None, lost: Lost | None, here: Machine
) -> WorldCellPlan:
    """A cell on ``world`` (None: a new world, started again as ``lost`` ran if it was lost), on this
    machine's facts ``here`` (the kernel's environment; no ``--env``): everything checked (options, names,
    what the cell uses); a world that is new is started when the plan is carried out
    (``nbspawn._effects``).  Asks nothing, so it is unit-tested on fake facts and data worlds.

    A cell on a world that exists builds no spec of its own: it takes the world's (ranks, start method,
    backend, ports, environment) and checks only what is the cell's (timeout, shown ranks, names).
    """
    # the kernel's names are torch's objects: handing them over needs torch, imported when a cell is planned
    from ..handoff._names import names_bound, pack_namespace, pick_shared
    from ..handoff._shm import new_run_prefix

    name, cell, settings = target.name, work.source, request.settings
    share_names, out_names = work.share, work.out
    if world is None:
        if lost is not None:
            settings = as_before(request, lost).settings
        ranks = decide_ranks(settings, here.with_user_env(settings.env))
        spec = build_spec(cell, settings, ranks, rich=request.rich, cell_numbers=request.cell_numbers)
        notes = spec.notes
        if lost is not None:
            notes = (*notes, started_again(name, lost, f"with its settings ({_kept.settled_here(spec).text()})"))
        place: KeptWorld | NewWorld = NewWorld(name, spec, settings.start_method)
        shown = spec.shown_ranks
    else:
        check_settings(world, request, here)
        place, spec, notes = world, world.spec, ()
        shown = ranks_within(settings.ranks, spec.nprocs, "--ranks", f"a run of {spec.nprocs} ranks")
    on = cell_ranks(target.on, shown, spec.nprocs, name)
    ranks_visible = _cuda.ranks_visible(spec.env, here.environ)
    # a kept world's ranks were started before this kernel could poison fork (fork is refused or
    # avoided then), so CUDA IPC reaches them whatever their start method
    shared = pick_shared(
        share_names, request.namespace, spec.start_method, ranks_started=world is not None, ranks_visible=ranks_visible
    )
    owned = world.owned if world is not None else set()
    payload = pack_namespace(cell.tree, request.namespace, request.hidden, shared, world=name, owned=owned)
    run_id = new_run_id()
    part = cell_part(  # --pdb, --timeout, ...: the cell's own (the world's spec is its first cell's)
        settings,
        cell,
        run_id=run_id,
        run_dir=os.path.join(os.path.dirname(spec.run_dir), run_id),  # beside the world's own (executors._world.start_world)
        shown=shown,
        rich=spec.rich,  # how its ranks draw was settled when they started
        cell_numbers=request.cell_numbers,
        out_names=out_names,
        shm_prefix=new_run_prefix() if out_names else None,
        on=on,
        notes=notes,
    )
    job = WorldJob(
        cell,
        part.run_dir,
        run_id,
        payload,
        out_names,
        part.shm_prefix,
        shared=tuple(shared),
        asked=part.asked,
        on=on,
        cell_numbers=part.cell_numbers,
    )
    return WorldCellPlan(place, part, job, names_bound(cell.tree), share=tuple(shared.values()))


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
