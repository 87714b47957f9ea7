"""torch's own call from a notebook: ``nbspawn.spawn(fn, args, nprocs)`` and ``start_processes``.

PyTorch's DDP tutorial, and most code pasted into a notebook, starts ranks with
``torch.multiprocessing.spawn(fn, args=(world_size,), nprocs=world_size)``.  In a notebook that call
fails under spawn and forkserver for a function defined in a cell (pytorch#20375: ``__main__`` cannot
be imported by a fresh interpreter), prints unattributed lines into the kernel's log, and raises a wall
of text.  These two take torch's signatures and semantics (``fn(i, *args)`` on each of ``nprocs``
processes, ``join=False`` returning a context whose ``join()`` polls, torch's exception classes) and
run the call as a ``%%spawn`` cell runs: the request, its checks and every start method are the
magic's, the view is the cell's, the error names the root-cause rank in the cell's own lines.

As torch's pickler does, the tensors ``args`` holds are shared with spawn and forkserver ranks in
place (``handoff._names.shareable_tensors``: a rank's writes are the kernel's).  What torch lacks,
they add: each rank's return value (``spawn`` returns them, a list by rank, where torch returns
None; one that cannot come back is None and a line, never a failed rank), and the other
``%%spawn`` options as keywords (``timeout``, ``share``,
``backend``, ``env``...: the rows of the same table).  The call is a short cell nbspawn writes
(``CALL_SOURCE``); its frame is nbspawn's, not the user's, so tracebacks start at ``fn``, whose cell's
lines a spawned rank has as every cell's callees (``_door``: ``CellSource.kernel_cells``).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from ._dispatch import start
from ._door import read_door
from ._options import CALL, START_METHODS, at_door
from ._runstate import Run
from ._source import CellSource, cell_files
from .errors import SpawnUsageError
from .handoff._names import first_unsendable
from .views._choice import view_for

RETURNED = "returned"  # the --out name each rank's return value comes back under
# the cell every rank runs: its process index, as torch passes it (LOCAL_RANK: nbspawn's env for it)
# and what it returned, if that can come back (else None and a line why: torch discards return values,
# so one that cannot come back must not fail the rank)
CALL_SOURCE = (
    f"import os\n{RETURNED} = fn(int(os.environ['LOCAL_RANK']), *args)\n"
    f"import nbspawn.handoff._names\n{RETURNED} = nbspawn.handoff._names.returnable("
    f"{RETURNED}, f\"what fn returned in process {{os.environ['LOCAL_RANK']}}\")\n"
)
# torch's spawn sets no rendezvous: its users set MASTER_ADDR and MASTER_PORT and pass rank and
# world_size themselves (the DDP tutorial), so rank 0 hosts the store.  nbspawn's own rendezvous
# (the kernel hosts the store, ranks join it as clients) would leave them all waiting as clients on
# a port nobody serves: unless torchrun_env=True, the call's ranks do not have it
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
WITHOUT_RENDEZVOUS = f"import os\nfor name in {RENDEZVOUS!r}:\n    os.environ.pop(name, None)\n"
CALL_LABEL = "nbspawn.spawn"
# the tensors of args shared with the ranks (a --share name of the call's own namespace)
ARGS_SHARED = "_nbspawn_args_tensors"
# what the call decides itself, from its own parameters
_OWN = frozenset({"nprocs", "start_method", "out", "background", "world", "on", "cluster", "nodes"})


class SpawnContext:
    """What ``spawn(..., join=False)`` returns, as torch's ``ProcessContext``: ``join()`` until it is
    True; ``run`` is the nbspawn run (its view, its ranks, ``run.stop()``)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def pids(self) -> list[int]:
        return [r.pid for r in self.run.ranks if r.pid is not None]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (forever if None) for the ranks: True once all of them
        returned, False while some still run; raises the root cause's ``ProcessRaisedException`` /
        ``ProcessExitedException`` (nbspawn's ``RankRaisedError`` / ``RankExitedError``) when one
        failed.  The others are stopped by nbspawn's own fail-fast, within the run's grace period
        (``grace_period`` is taken for torch's signature)."""
        return self.run.wait(timeout)

    @property
    def returned(self) -> list[Any]:
        """Each rank's return value, by rank (once ``join()`` returned True)."""
        return self.run.outputs.get(RETURNED, [])


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    torchrun_env: bool = False,
    **options: Any,
) -> list[Any] | SpawnContext:
    """Run ``fn(i, *args)`` on ``nprocs`` ranks (``i`` from 0), as ``torch.multiprocessing.spawn``
    does, and show them as a ``%%spawn`` cell does.  ``join=True``: wait, raise the root cause's
    error, return the ranks' return values (a list by rank); ``join=False``: return a
    :class:`SpawnContext` at once.  ``fn`` may be defined in a notebook cell, under every start method.
    ``daemon`` is taken for torch's signature (ranks never outlive the kernel).  As under torch, the
    ranks rendezvous as ``fn`` says (``MASTER_ADDR``, ``MASTER_PORT``, ``rank=``, ``world_size=``);
    ``torchrun_env=True`` gives them torchrun's (``init_process_group("gloo")`` with no arguments, the
    store hosted by the kernel), as ``%%spawn`` cells have.  Other keywords are
    ``%%spawn``'s options as :func:`nbspawn.launch` takes them (``timeout``, ``share``, ``backend``,
    ``env``, ``view``...)."""
    view = options.pop("view", None)
    args = _checked_call(fn, args, nprocs, start_method, daemon)
    allowed = {option.param for option in at_door(CALL)} - _OWN
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise SpawnUsageError(
            f"spawn() got unexpected keyword argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
            f"it takes fn, args, nprocs, join, daemon, start_method, torchrun_env, view and {', '.join(sorted(allowed))}"
        )
    shell = _shell()
    numbers = cell_files(shell) if shell is not None else {}
    if start_method != "fork":  # what cannot travel, named as the user wrote it (the door would say "the cell")
        bad = first_unsendable({getattr(fn, "__qualname__", "fn"): fn, **{f"args[{i}]": a for i, a in enumerate(args)}})
        if bad is not None:
            name, kind, err = bad
            raise SpawnUsageError(
                f"cannot send {name} (a {kind}) to ranks started with {start_method!r}: {err}. "
                "Pass what pickles, or start_method='fork' (its ranks inherit the kernel's objects)"
            )
    namespace: dict[str, Any] = {"fn": fn, "args": args}
    given = {**options, "nprocs": nprocs, "start_method": start_method, "out": [RETURNED], "background": not join}
    if start_method != "fork":  # as torch's pickler does: args' tensors shared in place (fork: inherited as they are)
        from .handoff._names import shareable_tensors

        namespace[ARGS_SHARED] = shareable_tensors(args, start_method)
        if namespace[ARGS_SHARED]:
            given["share"] = [*_names_given(options.get("share")), ARGS_SHARED]
    request = read_door(
        given,
        cell=CellSource(
            CALL_SOURCE if torchrun_env else WITHOUT_RENDEZVOUS + CALL_SOURCE, label=CALL_LABEL, written_by_nbspawn=True
        ),
        namespace=namespace,
        hidden=getattr(shell, "user_ns_hidden", None),
        cell_numbers=numbers,
    )
    run = start(request, view or view_for(shell))
    if not join:
        return SpawnContext(run)
    run.ended_within(None)
    if run.error is not None:  # raised from here: the frames below (the run's own) are nbspawn's, not the user's
        raise run.error.with_traceback(None)
    run.wait()  # what a waited run does (it has ended: returns at once)
    return run.outputs[RETURNED]


def start_processes(*args: Any, **kwargs: Any) -> list[Any] | SpawnContext:
    """torch's ``start_processes``: the same call as :func:`spawn` (as in torch, where ``spawn``
    calls it), under its own name."""
    return spawn(*args, **kwargs)


start_processes.__signature__ = inspect.signature(spawn)  # type: ignore[attr-defined]  # help() shows torch's parameters


def route_torch_spawn(on: bool = True) -> None:
    """Route ``torch.multiprocessing.spawn`` and ``start_processes`` through nbspawn in this kernel
    (``on=False``: back to torch's), so pasted code that calls them runs unchanged.  Only calls from
    the notebook's own code (``__main__``) in the kernel are routed: a library's (Lightning's
    ``ddp_spawn``, nbspawn's own executors) and a rank's get torch's."""
    import torch.multiprocessing as tmp

    if not on:
        for name, original in _TORCHS.items():
            setattr(tmp, name, original)
        return
    kernel = os.getpid()
    for name, ours in (("spawn", spawn), ("start_processes", start_processes)):
        original = _TORCHS.setdefault(name, getattr(tmp, name))
        setattr(tmp, name, _routed(ours, original, kernel))


_TORCHS: dict[str, Callable[..., Any]] = {}  # torch's own, while routed


def _routed(ours: Callable[..., Any], original: Callable[..., Any], kernel: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        from_the_notebook = sys._getframe(1).f_globals.get("__name__") == "__main__"
        return (ours if from_the_notebook and os.getpid() == kernel else original)(*args, **kwargs)

    call.__nbspawn_routed__ = True  # type: ignore[attr-defined]
    return call


def note_pasted_torch_spawn(result: Any) -> None:
    """After a cell (IPython's ``post_run_cell``): torch's own ``spawn`` or ``start_processes`` that
    failed because its fresh interpreters cannot import a function defined in the notebook (each
    prints "Can't get attribute 'fn' on <module '__main__'>" into the kernel's log, and torch raises
    "process 0 terminated with exit code 1": pytorch#20375) gets one line saying what works."""
    error = getattr(result, "error_in_exec", None)
    if error is None or type(error).__name__ != "ProcessExitedException":
        return
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "start_processes" and frame.f_globals.get("__name__") == "torch.multiprocessing.spawn":
            fn, method = frame.f_locals.get("fn"), frame.f_locals.get("start_method")
            if method in ("spawn", "forkserver") and getattr(fn, "__module__", None) == "__main__":
                name = getattr(fn, "__qualname__", "fn")
                print(
                    f"nbspawn: torch's {method} ranks start a fresh Python, which cannot import {name} from this "
                    f"notebook (\"Can't get attribute {name!r} on <module '__main__'>\" in the kernel's log): call "
                    "nbspawn.spawn with the same arguments, or run nbspawn.route_torch_spawn() once and this cell again",
                    file=sys.stderr,
                )
            return
        tb = tb.tb_next


def _names_given(value: Any) -> list[str]:
    """A ``share=`` keyword as written: a name, ``"a, b"``, or a list of them (None: none)."""
    if not value:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _checked_call(fn: Any, args: Any, nprocs: Any, start_method: Any, daemon: Any) -> tuple[Any, ...]:
    """torch's parameters, refused in one line before any process starts; ``args`` as a tuple."""
    if not callable(fn):
        raise SpawnUsageError(f"spawn() calls fn(i, *args) on each rank: fn must be callable, not {type(fn).__name__}")
    if isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise SpawnUsageError(f"spawn() takes args as a tuple (fn(i, *args)), not {type(args).__name__}: write args=({args!r},)")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise SpawnUsageError(f"spawn() takes nprocs as a whole number of processes, 1 or more, not {nprocs!r}")
    if start_method not in START_METHODS:
        raise SpawnUsageError(f"spawn() takes start_method {', '.join(START_METHODS)}, not {start_method!r}")
    if not isinstance(daemon, bool):
        raise SpawnUsageError(f"spawn() takes daemon as True or False, not {daemon!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: torch would find out at the call
        return args
    try:
        signature.bind(0, *args)
    except TypeError as err:
        name = getattr(fn, "__qualname__", repr(fn))
        raise SpawnUsageError(
            f"spawn() calls {name}(i, *args) with i the process index and {len(args)} argument"
            f"{'' if len(args) == 1 else 's'} from args, but {name}{signature} cannot take them: {err}"
        ) from None
    return args


def _shell() -> Any:
    """The IPython shell this call runs in, if any (a script, marimo: none)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None
