"""The launcher from plain Python: what ``%%spawn`` does, for scripts and tests.

>>> run = launch("import os; print(os.environ['RANK'])", nprocs=2, start_method="fork")
>>> [r.status for r in run.ranks]
['done', 'done']
"""

from __future__ import annotations

from typing import Any

from ._dispatch import start
from ._door import read_door
from ._options import CALL, OPTIONS, ROW, at_door
from ._runstate import Run
from ._source import CellSource
from .views._marimo import MarimoView, in_marimo
from .views._protocol import RunView
from .views._text import TextView

# launch()'s own parameters, beside those of OPTIONS (its Args: section is made from both)
_API_ONLY = {
    "cell": "the Python source every rank runs; or, as a list, a program and its arguments "
    '(``["train.py", "--lr", "0.1"]``), run on every rank as ``%spawn -- ...`` runs it',
    "namespace": "plays the kernel's part: under fork the ranks get a copy of it, under spawn and forkserver "
    "(and on a kept world) the names the cell uses are pickled to them; ``cluster``, ``share`` and ``out`` name its entries",
    "echo": "print each rank's output as ``[rank{r}]: `` lines (else it is only in the logs)",
    "view": "a ``nbspawn.views._protocol.RunView`` to show the run instead",
    "check": "raise the run's error when it fails (``RankRaisedError``, ``RankExitedError``, ``SpawnTimeoutError``, "
    "``SpawnInterrupted``), whose ``.run`` is the run; otherwise return the run either way",
}


def launch(
    cell: str | list[str],
    *,
    nprocs: int | str | None = None,
    start_method: str | None = None,
    backend: str | None = None,
    accelerator: str | None = None,
    env: dict[str, str] | list[str] | None = None,
    timeout: float | None = None,
    grace_period: float = ROW["grace_period"].default,
    log_dir: str | None = None,
    ranks: str | list[int] | None = None,
    namespace: dict[str, Any] | None = None,
    share: str | list[str] | None = None,
    out: str | list[str] | None = None,
    world: str | None = None,
    on: str | int | list[int] | None = None,
    cluster: Any = None,
    nodes: int | None = None,
    background: bool = False,
    debug_collectives: bool = False,
    pdb: bool = False,
    xray: bool | str = ROW["xray"].default,  # True/False, or "on", "off", "values"
    echo: bool = False,
    view: RunView | None = None,
    check: bool = True,
) -> Run:
    passed = locals()
    given = {option.param: passed[option.param] for option in at_door(CALL)}
    names = {} if namespace is None else namespace
    if cluster is not None and not isinstance(cluster, str):
        names, given["cluster"] = {**names, "<cluster>": cluster}, "<cluster>"
    program = cell if isinstance(cell, list) else None
    request = read_door(given, cell=None if program is not None else CellSource(str(cell)), program=program, namespace=names)
    run = start(request, view or (TextView() if echo else MarimoView() if in_marimo() else None))
    if check and not background:
        run.raise_for_status()
    return run


def _args_doc() -> str:
    """launch()'s ``Args:``, from the same table as ``%%spawn``'s help."""
    described = {option.param: option.help for option in OPTIONS}
    lines = ["Args:"]
    for param in launch.__code__.co_varnames[: launch.__code__.co_argcount + launch.__code__.co_kwonlyargcount]:
        text = _API_ONLY.get(param) or described.get(param)
        assert text is not None, f"launch({param}=) is not described"
        lines.append(f"    {param}: {text}")
    return "\n".join(lines)


launch.__doc__ = f"""Run the Python source ``cell`` on ``nprocs`` ranks and wait for them, as ``%%spawn`` does.

``world`` runs the cell on the kept world of that name (started with these options if new; see
:func:`worlds` and :func:`stop`); ``on`` runs it on some of that world's ranks only (``run.outputs``
then holds None for the others).  ``cluster`` (an ipyparallel ``Client``, ``Cluster`` or
``DirectView``, or the name of one in ``namespace``) runs on its nodes, ``nprocs`` ranks per node.
``background`` returns the run at once: ``run.wait()`` joins it (and raises its error),
``run.stop()`` stops it.  ``out`` values are in ``run.outputs[name]``, a list indexed by rank.

{_args_doc()}
"""


def worlds() -> dict[str, dict[str, Any]]:
    """The kept worlds of this process (on this machine and on clusters): name -> ranks, pids, state,
    cells run, logs."""
    from ._dispatch import kept_worlds

    return {name: world.status() for name, world in kept_worlds().items()}


def stop(*names: str) -> list[str]:
    """Stop these kept worlds (all of them if no name is given); returns the names stopped."""
    from ._dispatch import stop_worlds

    return stop_worlds(list(names) or None)
