"""A cluster run, planned: the request (read at the door) and the nodes' facts (one round trip, asked
in ``cluster._plan``) become the kernel's frozen spec and the job every node's agent gets (with the
node's settled settings: it reads nothing again), a ``planning._plans.ClusterRunPlan``.

:func:`plan_cluster` asks (the controller, the engines); :func:`plan_cluster_on` decides from what they
said and asks nothing, so it is unit-tested on fake engines' facts (``test_unit_cluster_plan.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, cast

from .._options import Backend, StartMethod
from .._program import ProgramLine
from .._request import Cell, OnCluster, RunRequest, Settings, Work
from .._runsize import ranks_within
from .._source import CellSource
from .._spec import CellPart, Placement, Ranks, cell_part, new_run_id, run_directory, spec_of
from ..cluster import _wire
from ..errors import SpawnUsageError
from ._plans import ClusterRunPlan

if TYPE_CHECKING:
    from ..cluster._plan import Kernel


def plan_cluster(request: RunRequest, work: Work, target: OnCluster) -> ClusterRunPlan:
    """Everything checked, cheapest first, then the nodes asked (one round trip); starts nothing."""
    # ipyparallel and torch are needed only on a cluster
    from ..cluster._plan import Kernel, engine_facts, refuse_if_busy, resolve_client

    refuse_share(work)
    program = work if isinstance(work, ProgramLine) else None
    client, ids = resolve_client(target.cluster, request.namespace)
    refuse_if_busy(client)
    facts = engine_facts(client, ids, program, request.settings.start_method)
    return plan_cluster_on(request, work, target, client, facts, Kernel.here())


def plan_cluster_on(
    request: RunRequest, work: Work, target: OnCluster, client: object, facts: dict[int, dict], kernel: Kernel
) -> ClusterRunPlan:
    """The run on the nodes the engines' ``facts`` describe (``cluster._agent.probe``'s answers, by engine),
    from this ``kernel``: the spec, the nodes and the job each node's agent gets.  Asks nothing."""
    # the kernel's names (torch's objects) are needed only to be sent
    from ..cluster._plan import plan_nodes
    from ..handoff._names import pickle_names

    settings = request.settings
    out_names = work.out if isinstance(work, Cell) else ()
    program = work if isinstance(work, ProgramLine) else None  # read at the door; each node finds it where it runs
    cell = work.source if isinstance(work, Cell) else CellSource("", label=str(work))
    names = b""
    if program is None:
        names = pickle_names(cell.tree, request.namespace, request.hidden)
    found, chosen_backend = plan_nodes(
        client, facts, kernel, nodes=target.nodes, nprocs=settings.nprocs, backend=settings.backend
    )
    world = found.world_size
    run_id = new_run_id()
    part = cell_part(
        settings,
        cell,
        run_id=run_id,
        run_dir=run_directory(None, run_id),  # the kernel's copy of what the agents report
        shown=ranks_within(settings.ranks, world, "--ranks", f"a run of {world} ranks"),
        rich=request.rich,
        cell_numbers=request.cell_numbers,
        debuggable=False,  # a node's ranks cannot reach this kernel's stdin
        out_names=out_names,
        notes=found.notes,
    )
    # the kernel's view of the whole run: every node's ranks, started by the nodes' agents (each decides
    # its own threads and environment), the store hosted by node 0's
    ranks = Ranks(nprocs=world, start_method=found.start_method, backend=chosen_backend)
    placement = Placement(found.master_addr, found.master_port, 0, world, 0, len(found.nodes), hosts_store=False)
    spec = spec_of(part, ranks, settings.env, placement=placement)
    node_settings = settled_for_nodes(
        settings,
        ranks_per_node=found.ranks_per_node,
        start_method="spawn" if program is not None else settings.start_method,  # auto: each node chooses
        backend=cast(Backend, chosen_backend),
        nodes=len(found.nodes),
    )
    job = nodes_job(part, names, node_settings, len(found.nodes), cwd=kernel.cwd, program=program)
    return ClusterRunPlan(spec, found, job, background=request.background)


def nodes_job(
    part: CellPart, names: bytes, settings: Settings, nodes: int, *, cwd: str, program: ProgramLine | None = None
) -> _wire.Job:
    """The job each of ``nodes`` agents is sent for a cell's ``part`` (a run's, or a cluster world's
    cell): its source or ``program``, the kernel's ``names`` it uses, pickled, and the ``settings`` the
    node's ranks start with (:func:`settled_for_nodes`); ``cwd``: where the kernel runs."""
    return _wire.Job(
        run_id=part.run_id,
        cell=part.cell,
        program=program,
        names=names,
        out_names=list(part.out_names),
        settings=settings,
        rich=part.rich,
        cwd=cwd,
        publish_every=_wire.PUBLISH_EVERY * nodes,
        on=sorted(part.on_ranks) if part.on_ranks is not None else None,
    )


def refuse_share(work: Work) -> None:
    """``--share`` on a cluster, refused in the same words for a run and for a world's cell."""
    if isinstance(work, Cell) and work.share:
        raise SpawnUsageError(
            "--share does not work on a cluster: memory cannot be shared across machines. "
            "The names the cell uses are sent to every node by value; use --out to bring values back."
        )


def settled_for_nodes(
    settings: Settings, *, ranks_per_node: int, start_method: StartMethod, backend: Backend, nodes: int
) -> Settings:
    """What each node's ranks are started with: the kernel's settings, checked and settled, so the node
    reads nothing again, and every option (``--xray``, ``--grace-period``, ``--log-dir``, the next one)
    reaches the nodes as it was given.  Only what the kernel decided for the nodes, or keeps for itself,
    differs: the ranks per node, the start method and backend chosen over the nodes, each node's share of
    the image budget, and no time limit, ``--ranks`` or ``--pdb`` there (the kernel keeps the time and
    stops every node at once, shows the ranks, and a node's ranks cannot reach this kernel's stdin)."""
    return replace(
        settings,
        nprocs=ranks_per_node,
        start_method=start_method,
        backend=backend,
        max_image_kb=settings.max_image_kb // nodes,  # the run's image budget, shared by its nodes
        timeout=None,
        ranks=None,
        pdb=False,
    )
