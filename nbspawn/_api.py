"""The launcher from plain Python: what ``%%spawn`` does, for scripts and tests.

>>> run = launch("import os; print(os.environ['RANK'])", nprocs=2, start_method="fork")
>>> [r.status for r in run.ranks]
['done', 'done']
"""

from __future__ import annotations

from typing import Any

from ._run import Run
from ._source import CellSource
from ._spec import RunSpec, build_spec
from .errors import SpawnUsageError
from .executors._supervisor import RunView, execute
from .handoff._names import pack_namespace, parse_names, pick_shared
from .handoff._shm import new_run_prefix, share_
from .views._text import TextView


def prepare(
    cell: CellSource,
    namespace: dict[str, Any],
    *,
    hidden: dict[str, Any] | None = None,
    share: str | list[str] | None = None,
    out: str | list[str] | None = None,
    **options: Any,
) -> RunSpec:
    """Validate everything, then give the ranks the kernel names they need; starts nothing.

    The only costly step, moving ``--share`` tensors into shared memory, comes after every check.
    """
    share_names, out_names = parse_names(share, "--share"), parse_names(out, "--out")
    spec = build_spec(cell, **options)
    shared = pick_shared(share_names, namespace, spec.start_method)
    if spec.start_method == "fork":
        spec.namespace = namespace
    else:
        spec.namespace_payload = pack_namespace(cell.parse(), namespace, hidden, shared)
    spec.out_names = out_names
    spec.shm_prefix = new_run_prefix() if out_names else None
    share_(list(shared.values()))
    return spec


def launch(
    cell: str | list[str],
    *,
    nprocs: int | str | None = None,
    start_method: str | None = None,
    backend: str | None = None,
    env: dict[str, str] | list[str] | None = None,
    timeout: float | None = None,
    grace_period: float = 5.0,
    log_dir: str | None = None,
    ranks: str | list[int] | None = None,
    namespace: dict[str, Any] | None = None,
    share: str | list[str] | None = None,
    out: str | list[str] | None = None,
    world: str | None = None,
    cluster: Any = None,
    nodes: int | None = None,
    background: bool = False,
    echo: bool = False,
    view: RunView | None = None,
    check: bool = True,
) -> Run:
    """Run the Python source ``cell`` on ``nprocs`` ranks and wait for them, as ``%%spawn`` does.

    ``namespace`` plays the kernel's part: under fork the ranks get a copy of it, under spawn and
    forkserver (and on a kept world) the names the cell uses are pickled to them.  With ``check``
    (the default) a failed run raises its error (``RankRaisedError``, ``RankExitedError``,
    ``SpawnTimeoutError`` or ``SpawnInterrupted``), whose ``.run`` is the run; otherwise the run is
    returned either way.  ``share`` names objects of ``namespace`` whose tensors every rank sees in
    the same memory; ``out`` names values to bring back: ``run.outputs[name]`` is a list indexed by
    rank.  ``world`` runs the cell on the kept world of that name (started with these options if
    new; see :func:`worlds` and :func:`stop`).  A list instead of source is a program and its
    arguments (``["train.py", "--lr", "0.1"]``), run on every rank as ``%spawn -- ...`` runs it.
    ``cluster`` (an ipyparallel ``Client``, ``Cluster`` or ``DirectView``, or the name of one in
    ``namespace``) runs on its nodes, ``nprocs`` ranks per node, on the first ``nodes`` of them.
    ``background`` returns the run at once: ``run.wait()`` joins it (and raises its error),
    ``run.stop()`` stops it.  ``echo`` prints each rank's output as ``[rank{r}]: `` lines.
    """
    view = view or (TextView() if echo else None)
    options: dict[str, Any] = {
        "nprocs": "auto" if nprocs is None else nprocs,
        "start_method": start_method,
        "backend": backend,
        "env": env,
        "timeout": timeout,
        "grace_period": grace_period,
        "log_dir": log_dir,
        "ranks": ranks,
    }
    if cluster is not None:
        from .executors._cluster import prepare_cluster

        if world is not None or background:
            raise SpawnUsageError("world and background do not work with a cluster yet")
        names = {} if namespace is None else namespace
        if not isinstance(cluster, str):
            names, cluster = {**names, "<cluster>": cluster}, "<cluster>"
        words = cell if isinstance(cell, list) else None
        source = None if words is not None else CellSource(str(cell))
        rich = bool(getattr(view, "rich", False))
        spec, remote = prepare_cluster(
            cluster, names, source, program=words, nodes=nodes, share=share, out=out, rich=rich, **options
        )
        run = execute(spec, view, remote)
        if check:
            run.raise_for_status()
        return run
    if isinstance(cell, list):
        from .executors._program import ProgramRanks, parse_program

        if share or out or world is not None:
            raise SpawnUsageError("share, out and world apply to cells, not programs")
        program = parse_program(cell)
        spec = build_spec(CellSource("", label=str(program)), **{**options, "start_method": "spawn"})
        spec.program = program
        run = execute(spec, view, ProgramRanks(spec, program), background=background)
        if check and not background:
            run.raise_for_status()
        return run
    source = CellSource(cell)
    names = {} if namespace is None else namespace
    if world is not None:
        from .executors._world import prepare_cell

        given = {
            o
            for o, v in (("-n", nprocs), ("--start-method", start_method), ("--backend", backend), ("--env", env))
            if v is not None
        }
        spec, executor = prepare_cell(
            world,
            source,
            names,
            hidden=None,
            share=share,
            out=out,
            given=given,
            rich=bool(getattr(view, "rich", False)),
            **options,
        )
        run = execute(spec, view, executor)
    else:
        run = execute(prepare(source, names, share=share, out=out, **options), view, background=background)
    if check and not background:
        run.raise_for_status()
    return run


def worlds() -> dict[str, dict[str, Any]]:
    """The kept worlds of this process: name -> ranks, pids, state, cells run, logs."""
    from .executors._world import worlds as _worlds

    return {name: world.status() for name, world in _worlds().items()}


def stop(*names: str) -> list[str]:
    """Stop these kept worlds (all of them if no name is given); returns the names stopped."""
    from .executors._world import stop as _stop

    return _stop(list(names) or None)
