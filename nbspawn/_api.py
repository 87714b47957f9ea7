"""The launcher from plain Python: what ``%%spawn`` does, for scripts and tests.

>>> run = launch("import os; print(os.environ['RANK'])", nprocs=2, start_method="fork")
>>> [r.status for r in run.ranks]
['done', 'done']
"""

from __future__ import annotations

import inspect
from typing import Any

from ._dispatch import start
from ._door import read_door
from ._options import CALL, OPTIONS, at_door
from ._runstate import Run
from ._source import CellSource
from .errors import SpawnUsageError
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
    namespace: dict[str, Any] | None = None,
    echo: bool = False,
    view: RunView | None = None,
    check: bool = True,
    **options: Any,
) -> Run:
    unknown = sorted(set(options) - set(_CALL_ROWS))
    if unknown:
        raise SpawnUsageError(
            f"launch() got unexpected keyword argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
            f"its options are {', '.join(_CALL_ROWS)}"
        )
    given = {param: options.get(param) for param in _CALL_ROWS}
    names = {} if namespace is None else namespace
    cluster = given["cluster"]
    if cluster is not None and not isinstance(cluster, str):
        names, given["cluster"] = {**names, "<cluster>": cluster}, "<cluster>"
    program = cell if isinstance(cell, list) else None
    request = read_door(given, cell=None if program is not None else CellSource(str(cell)), program=program, namespace=names)
    run = start(request, view or (TextView() if echo else MarimoView() if in_marimo() else None))
    if check and not given["background"]:
        run.raise_for_status()
    return run


# launch()'s options are the table's rows of the call door, in its order: its signature (help(), the
# notebook's Shift-Tab and completion) and its Args: are made from them, so a new row is a keyword of it
_CALL_ROWS = tuple(option.param for option in at_door(CALL))


def _signature() -> inspect.Signature:
    """Each row's keyword with the default a user would write (its type is what its reader returns, not all a
    call may give: ``ranks="0-3"``, ``env=["A=1"]``, ``xray=False``; its ``Args:`` line says what it takes)."""
    own = inspect.signature(launch).parameters
    rows = [inspect.Parameter(option.param, inspect.Parameter.KEYWORD_ONLY, default=option.default) for option in at_door(CALL)]
    return inspect.Signature(
        [own["cell"], *rows, *(own[name] for name in ("namespace", "echo", "view", "check"))],
        return_annotation="Run",
    )


launch.__signature__ = _signature()  # type: ignore[attr-defined]


def _args_doc() -> str:
    """launch()'s ``Args:``, from the same table as ``%%spawn``'s help."""
    described = {option.param: option.help for option in OPTIONS}
    lines = ["Args:"]
    for param in inspect.signature(launch).parameters:
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
