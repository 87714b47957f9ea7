"""nbspawn: run a notebook cell on N local PyTorch ranks.

    %load_ext nbspawn

    %%spawn -n 4
    import torch.distributed as dist
    dist.init_process_group("gloo")
    print(dist.get_rank(), "of", dist.get_world_size())

The same launcher is callable from Python: :func:`launch`; the last run is :func:`last_run`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ._api import launch, stop, worlds
from ._runstate import RankState, Run
from ._version import __version__ as __version__
from .errors import (
    RankExitedError,
    RankFailure,
    RankRaisedError,
    SpawnError,
    SpawnInterrupted,
    SpawnOutputError,
    SpawnTimeoutError,
    SpawnUsageError,
)
from .executors._registry import last_run

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


__all__ = [
    "RankExitedError",
    "RankFailure",
    "RankRaisedError",
    "RankState",
    "Run",
    "SpawnError",
    "SpawnInterrupted",
    "SpawnOutputError",
    "SpawnTimeoutError",
    "SpawnUsageError",
    "last_run",
    "launch",
    "load_ipython_extension",
    "stop",
    "worlds",
]


def load_ipython_extension(ipython: InteractiveShell) -> None:
    from ._magic import SpawnMagics, note_cuda_culprit, report_background_failures
    from ._source import record_cell_files

    record_cell_files(ipython)  # IPython 7: Cell In[N] in tracebacks needs it
    ipython.register_magics(SpawnMagics(shell=ipython))
    ipython.events.register("pre_run_cell", report_background_failures)
    _tell_hosted_runtime(ipython)
    ipython.events.register("post_run_cell", note_cuda_culprit)
    if getattr(ipython, "kernel", None) is not None:  # a page opened before the first run asks too
        from .views import _active, _busy

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
