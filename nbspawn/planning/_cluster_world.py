"""A cell on a cluster world, planned: a new world planned as a cluster run is (``planning._cluster``),
or this cell's own options checked against the world that runs (``nbspawn._clash``, the rule worlds
on this machine follow too) and added to its spec.  Starts nothing."""

from __future__ import annotations

import dataclasses
import os

from .._clash import Settled, asked_of, refuse_clashes, world_clashes
from .._options import on_within, ranks_within
from .._request import RunRequest
from .._spec import RunSpec, new_run_id, run_directory
from ..cluster import _clusterworld, _wire
from ..cluster._clusterworld import ClusterWorld, ClusterWorldCell, LostWorld
from ..cluster._executor import PUBLISH_EVERY
from ..cluster._plan import ranks_per_node, refuse_if_busy, resolve_backend, resolve_client
from ..errors import SpawnUsageError
from ..handoff._names import pickle_names
from ._cluster import plan_cluster


def plan_cluster_world_cell(request: RunRequest, rich: bool) -> tuple[RunSpec, ClusterWorldCell]:
    """A cell on cluster world ``request.world``: the world planned and checked if it is new (as a
    cluster run is), else this cell's own options checked against it.  Starts nothing."""
    assert request.world is not None and request.cell is not None  # the dispatch sends only world cells here
    name, cell = request.world, request.cell
    world = _clusterworld.running(name)
    notes: tuple[str, ...] = ()
    lost = _clusterworld.lost(name) if world is None else None
    if lost is not None:
        request = as_before(request, lost)
        notes = (
            f"nbspawn: world {name!r} was lost ({lost.why}); this cell starts a new one on --cluster {request.cluster} "
            "with its settings, but none of the names its ranks had: run the cells that set them up again.",
        )
    if world is None:
        spec, fresh = plan_cluster(dataclasses.replace(request, on=None), rich)
        on = on_within(request.on, spec.nprocs, name)
        world = ClusterWorld(name, spec, fresh.cluster, request, fresh.job["settings"])
        spec = dataclasses.replace(spec, notes=(*spec.notes, *notes), on_ranks=on)
        job = _wire.Job(**{**fresh.job, "on": sorted(on) if on is not None else None})
        return spec, ClusterWorldCell(spec, fresh.cluster, job, world, first=True)
    check_settings(world, request)
    refuse_if_busy(world.cluster.client)
    settings = request.settings
    if request.share:
        raise SpawnUsageError("--share does not work on a cluster: memory cannot be shared across machines; use --out")
    out_names = request.out
    shown = ranks_within(settings.ranks, world.spec.nprocs, "--ranks", f"a run of {world.spec.nprocs} ranks")
    on = on_within(request.on, world.spec.nprocs, name)
    names = pickle_names(cell.parse(), request.namespace, request.hidden, world=name, owned=world.owned)
    run_id = new_run_id()
    spec = dataclasses.replace(
        world.spec,
        run_id=run_id,
        run_dir=run_directory(None, run_id),
        cell=cell,
        timeout=settings.timeout,
        grace_period=settings.grace_period,
        shown_ranks=shown,
        out_names=out_names,
        cell_numbers=dict(request.cell_numbers),
        rich=rich,
        notes=(),
        on_ranks=on,
        pdb=settings.pdb,  # --pdb, %pdb on: the cell's own (the world's spec is its first cell's)
    )
    job = _wire.Job(
        run_id=run_id,
        cell=cell,
        program=None,
        names=names,
        out_names=list(out_names),
        settings=world.node_settings,
        rich=rich,
        cwd=os.getcwd(),
        publish_every=PUBLISH_EVERY * len(world.cluster.nodes),
        on=sorted(on) if on is not None else None,
    )
    return spec, ClusterWorldCell(spec, world.cluster, job, world, first=False)


def as_before(request: RunRequest, lost: LostWorld) -> RunRequest:
    """A lost world's next cell: where and how it ran, except what this cell gives itself."""
    given, settings, before = request.settings.given, request.settings, lost.settings
    settings = dataclasses.replace(
        settings,
        nprocs=settings.nprocs if given.nprocs else before.nprocs,
        start_method=settings.start_method if given.start_method else before.start_method,
        backend=settings.backend if given.backend else before.backend,
        env=settings.env if given.env else before.env,
    )
    nodes = request.nodes if request.nodes is not None else lost.nodes
    return dataclasses.replace(request, cluster=request.cluster or lost.cluster, nodes=nodes, settings=settings)


def check_settings(world: ClusterWorld, request: RunRequest) -> None:
    """A cell cannot change a world that runs: its controller, nodes, ranks, start method, backend or
    environment (``nbspawn._clash``: the one rule, for worlds here and on clusters)."""
    clash = []
    if request.cluster is not None:
        client, _ids = resolve_client(request.cluster, request.namespace)
        if client is not world.cluster.client:
            clash.append(f"--cluster {request.cluster} (another controller's engines)")
    nodes = world.cluster.nodes
    settled = Settled(
        nprocs=world.cluster.ranks_per_node,
        start_method=world.cluster.start_method,
        backend=world.spec.backend,
        env=world.spec.env,
        nodes=len(nodes),
    )
    clash += world_clashes(
        settled,
        asked_of(request.settings, request.nodes),
        lambda: ranks_per_node(nodes, "auto"),
        lambda n: resolve_backend(nodes, "auto", n),
    )
    refuse_clashes(world.name, world.settings(), clash)
