"""nbspawn: run a notebook cell on N local PyTorch ranks.

    %load_ext nbspawn

    %%spawn -n 4
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print(dist.get_rank(), "of", dist.get_world_size())

The same launcher is callable from Python: :func:`launch`; the last run is :func:`last_run`.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from ._shell import kernel_of
from ._version import __version__ as __version__
from .errors import (
    RankFailure,
    SpawnError,
    SpawnInterrupted,
    SpawnOutputError,
    SpawnTimeoutError,
    SpawnUsageError,
)

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from ._api import launch, stop, worlds
    from ._runstate import RankState, Run
    from ._torchcall import SpawnContext, route_torch_spawn, spawn, start_processes
    from .errors import RankExitedError, RankRaisedError
    from .executors._registry import last_run


__all__ = [
    "RankExitedError",
    "RankFailure",
    "RankRaisedError",
    "RankState",
    "Run",
    "SpawnContext",
    "SpawnError",
    "SpawnInterrupted",
    "SpawnOutputError",
    "SpawnTimeoutError",
    "SpawnUsageError",
    "last_run",
    "launch",
    "load_ipython_extension",
    "route_torch_spawn",
    "spawn",
    "start_processes",
    "stop",
    "worlds",
]


# the launcher's names, each imported from its module when first asked for (PEP 562): importing
# nbspawn, or one of its pure modules (nbspawn._door, nbspawn.errors), imports neither torch nor IPython
_LAZY = {
    "launch": "._api",
    "stop": "._api",
    "worlds": "._api",
    "Run": "._runstate",
    "RankState": "._runstate",
    "RankRaisedError": ".errors",
    "RankExitedError": ".errors",
    "last_run": ".executors._registry",
    "spawn": "._torchcall",
    "route_torch_spawn": "._torchcall",
    "start_processes": "._torchcall",
    "SpawnContext": "._torchcall",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    found = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = found  # asked once
    return found


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_ipython_extension(ipython: InteractiveShell) -> None:
    from ._magic import SpawnMagics, note_cuda_culprit, report_background_failures
    from ._source import record_cell_files
    from ._torchcall import note_pasted_torch_spawn

    record_cell_files(ipython)  # IPython 7: Cell In[N] in tracebacks needs it
    ipython.register_magics(SpawnMagics(shell=ipython))
    ipython.events.register("pre_run_cell", report_background_failures)
    _tell_hosted_runtime(ipython)
    ipython.events.register("post_run_cell", note_cuda_culprit)
    if note_pasted_torch_spawn not in ipython.events.callbacks["post_run_cell"]:  # %reload_ext: said once
        ipython.events.register("post_run_cell", note_pasted_torch_spawn)
    kernel = kernel_of(ipython)
    if kernel is not None:  # a page opened before the first run asks too
        from . import _shellreplies
        from .views import _active, _busy

        _shellreplies.mend(kernel)  # ipykernel 7.0-7.3 strands a request now and then
        _active.install()
        _busy.watch_statuses()  # from now on a run knows whether the status bar still says Busy


def _tell_hosted_runtime(ipython: InteractiveShell) -> None:
    """On Colab or Kaggle, what differs there: once per kernel (the shell remembers it across a
    ``%reload_ext``), in one line."""
    from ._hosted import hosted_runtime, notice

    line = notice(hosted_runtime())
    if line and not getattr(ipython, "_nbspawn_told_runtime", False):
        ipython._nbspawn_told_runtime = True  # type: ignore[attr-defined]
        print(line, file=sys.stderr)


def _jupyter_labextension_paths() -> list[dict[str, Any]]:
    return [{"src": "labextension", "dest": "nbspawn-labextension"}]
