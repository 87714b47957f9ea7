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
from dataclasses import replace
from typing import cast

from .. import _cuda
from .._clash import Settled, asked_of, refuse_clashes, world_clashes
from .._listen import release
from .._options import Backend, on_within, ranks_within
from .._request import RunRequest, Settings
from .._spec import RunSpec, build_spec, cuda_device_count, new_run_id, resolve_backend, resolve_nprocs
from ..errors import SpawnUsageError, rank_spans
from ..executors import _world
from ..executors._world import Lost, World, WorldCell
from ..handoff._names import names_bound, pack_namespace, pick_shared
from ..handoff._shm import new_run_prefix, share_
from ..ranks._worldloop import WorldJob


def plan_world_cell(request: RunRequest, rich: bool) -> tuple[RunSpec, WorldCell]:
    """A cell on the world ``request.world``: everything checked first (options, names, what the cell
    uses), then the world started if it is new.

    A cell on a world that exists builds no spec of its own: it takes the world's (ranks, start method,
    backend, ports, environment) and checks only what is the cell's (timeout, shown ranks, names).
    """
    assert request.cell is not None and request.world is not None  # the dispatch sends only cells here
    name = request.world
    cell, settings = request.cell, request.settings
    share_names, out_names = request.share, request.out
    world = _world.running(name)
    if world is not None:
        _world.lose_if_a_rank_died(world)
    if world is None:
        again = _world.lost(name)
        if again is not None:
            settings = as_before(settings, again)
        spec = build_spec(cell, settings, rich=rich, cell_numbers=request.cell_numbers)
        method, notes = spec.start_method, spec.notes
        if again is not None:
            notes = (
                *notes,
                f"nbspawn: world {name!r} was lost; this cell starts a new one with its settings "
                f"({_world.settings_text(spec)}), but none of the names its ranks had: run the cells that set them up again.",
            )
        timeout, grace, shown = spec.timeout, spec.grace_period, spec.shown_ranks
        saved, images = spec.max_saved_bytes, spec.max_image_bytes
    else:
        check_settings(world, settings)
        method, notes = world.spec.start_method, ()
        timeout, grace = settings.timeout, settings.grace_period
        shown = ranks_within(settings.ranks, world.spec.nprocs, "--ranks", f"a run of {world.spec.nprocs} ranks")
        saved, images = settings.max_saved_kb * 1024, settings.max_image_kb * 1024
    try:
        on = cell_ranks(request.on, shown, world.spec.nprocs if world is not None else spec.nprocs, name)
        tree = cell.parse()
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
    cspec = replace(
        world.spec,
        run_id=run_id,
        run_dir=os.path.join(world.base_dir, run_id),
        cell=cell,
        timeout=timeout,
        grace_period=grace,
        shown_ranks=shown,
        max_saved_bytes=saved,
        max_image_bytes=images,
        out_names=out_names,
        shm_prefix=new_run_prefix() if out_names else None,
        notes=notes,
        cell_numbers=dict(request.cell_numbers),
        on_ranks=on,
        pdb=settings.pdb,  # --pdb, %pdb on: the cell's own (the world's spec is its first cell's)
    )
    share_(list(shared.values()))
    job = WorldJob(
        cell, cspec.run_dir, cspec.run_id, payload, out_names, cspec.shm_prefix, shared=tuple(shared), grace=grace, on=on
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


def as_before(settings: Settings, lost: Lost) -> Settings:
    """A lost world started again: its settings, except those this cell gave.  Its start method is
    the one the user asked for (auto unless given), resolved again: the lost world's own (fork,
    chosen by auto) would be refused as an explicit fork once CUDA was touched in the kernel (after
    an NCCL failure, say), though the user never chose one."""
    given, spec = settings.given, lost.spec
    return replace(
        settings,
        nprocs=settings.nprocs if given.nprocs else spec.nprocs,
        start_method=settings.start_method if given.start_method else lost.start_method,
        backend=settings.backend if given.backend else cast(Backend, spec.backend),
        env=settings.env if given.env else dict(spec.env),
    )


def check_settings(world: World, settings: Settings) -> None:
    """The options this cell gave must be the world's own: it cannot change a world that runs
    (``nbspawn._clash``: the one rule, for worlds here and on clusters)."""
    spec = world.spec
    settled = Settled(nprocs=spec.nprocs, start_method=spec.start_method, backend=spec.backend, env=spec.env)

    def gpus() -> int:
        return cuda_device_count(spec.env)

    def auto() -> int:  # -n auto on a TPU world: its own count, one rank per chip (nbspawn._tpu), not the GPUs'
        return spec.nprocs if spec.accelerator_envs else resolve_nprocs("auto", gpus)

    clashes = world_clashes(settled, asked_of(settings), auto, lambda n: resolve_backend("auto", n, gpus))
    refuse_clashes(world.name, world.settings(), clashes)
