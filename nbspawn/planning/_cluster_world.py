"""A cell on a cluster world, planned: a new world planned as a cluster run is (``planning._cluster``),
or this cell's own options checked against the world that runs (``nbspawn._clash``, the rule worlds
on this machine follow too) and added to its spec: a ``planning._plans.ClusterWorldCellPlan``.  Starts nothing."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, cast

from .._machine import Machine
from .._request import Cell, OnCluster, OnClusterWorld, RunRequest
from .._runsize import on_within, ranks_within
from .._spec import cell_part, new_run_id, run_directory
from ..cluster import _wire
from ..errors import SpawnUsageError
from ..executors import _kept
from ._cluster import nodes_job, plan_cluster, refuse_share, settled_for_nodes
from ._kept_cell import as_before, check_settings, started_again
from ._plans import ClusterRunPlan, ClusterWorldCellPlan, NewClusterWorld

if TYPE_CHECKING:
    from ..cluster._clusterworld import ClusterWorld


def plan_cluster_world_cell(request: RunRequest, work: Cell, target: OnClusterWorld) -> ClusterWorldCellPlan:
    """A cell on cluster world ``target.name``, planned on what is known now: the world that runs (its
    engines free), else a new world planned as a cluster run is (its nodes asked; as it ran, if it was
    lost).  Asks, then leaves deciding to :func:`new_cluster_world` and :func:`cluster_world_cell`."""
    from ..cluster._plan import refuse_if_busy  # ipyparallel is needed only on a cluster

    name = target.name
    world = cast("ClusterWorld | None", _kept.running_on_a_cluster(name))
    if world is not None:
        refuse_if_busy(world.cluster.client)
        return cluster_world_cell(request, work, target, world, Machine.here(), cwd=os.getcwd())
    lost = _kept.lost(name, on_cluster=True)
    notes: tuple[str, ...] = ()
    if lost is not None:
        request = as_before(request, lost)
        notes = (started_again(name, lost, f"on --cluster {request.cluster} with its settings"),)
    if request.cluster is None:  # the dispatch sends a world here only once it ran on a cluster, or with --cluster
        raise SpawnUsageError(f"world {name!r} is not running: give --cluster NAME to start it on a cluster")
    fresh = plan_cluster(request, work, OnCluster(request.cluster, request.nodes))
    return new_cluster_world(name, fresh, request, target.on, notes)


def new_cluster_world(
    name: str, fresh: ClusterRunPlan, request: RunRequest, on: frozenset[int] | None, notes: tuple[str, ...]
) -> ClusterWorldCellPlan:
    """The first cell of a cluster world: the cluster run ``fresh`` (planned from its nodes' facts) kept
    as world ``name``, running its first cell on the ranks ``--on`` names."""
    spec = fresh.spec
    ranks = on_within(on, spec.nprocs, name)
    new = NewClusterWorld(name, spec, fresh.nodes, request, fresh.job["settings"], background=fresh.background)
    spec = dataclasses.replace(spec, notes=(*spec.notes, *notes), on_ranks=ranks)
    job = _wire.Job(**{**fresh.job, "on": sorted(ranks) if ranks is not None else None})
    return ClusterWorldCellPlan(spec, job, new)


def cluster_world_cell(
    request: RunRequest, work: Cell, target: OnClusterWorld, world: ClusterWorld, here: Machine, *, cwd: str
) -> ClusterWorldCellPlan:
    """A later cell on cluster world ``world``: its options checked against the world's (the one rule),
    the world's spec with the cell's part, and the job its nodes are sent (``cwd``: the kernel's
    directory, where the nodes run it).  Asks nothing: unit-tested on a world made as data."""
    from ..handoff._names import pickle_names  # the kernel's names (torch's objects) are needed only to be sent

    name, cell, settings = target.name, work.source, request.settings
    check_settings(world, request, here)
    refuse_share(work)
    out_names = work.out
    shown = ranks_within(settings.ranks, world.spec.nprocs, "--ranks", f"a run of {world.spec.nprocs} ranks")
    on = on_within(target.on, world.spec.nprocs, name)
    names = pickle_names(cell.tree, request.namespace, request.hidden, world=name, owned=world.owned)
    run_id = new_run_id()
    part = cell_part(
        settings,
        cell,
        run_id=run_id,
        run_dir=run_directory(None, run_id),
        shown=shown,
        rich=request.rich,
        cell_numbers=request.cell_numbers,
        out_names=out_names,
        on=on,
    )
    spec = world.spec.with_cell(part)  # --pdb, --timeout, ...: the cell's own (the world's spec is its first cell's)
    # the cell's own options (its X-ray, grace period, budgets), settled as the world's nodes run, as a
    # cell on a world here brings its own
    node_settings = settled_for_nodes(
        settings,
        ranks_per_node=cast(int, world.node_settings.nprocs),
        start_method=world.node_settings.start_method,
        backend=world.node_settings.backend,
        nodes=len(world.cluster.nodes),
    )
    job = nodes_job(part, names, node_settings, len(world.cluster.nodes), cwd=cwd)
    return ClusterWorldCellPlan(spec, job, world)
