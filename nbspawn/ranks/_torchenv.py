"""What torch reads from the environment once, at ``import torch``, read again in a rank whose
environment has changed since torch was imported.

A forkserver rank is forked from a fork server that imported torch with the environment the kernel had
when the server started (``executors._procs.prepare_forkserver``); the rank then takes the kernel's
environment as it is now (``ranks._cell.apply_kernel_env``) and the run's ``--env``.  A spawn rank
imports torch before its ``--env`` is applied, and a forked one inherits the kernel's torch.  What
torch read at import would stay the old value: ``TORCH_LOGS`` and its companions
(``torch._logging._init_logs``) and ``TORCH_DISTRIBUTED_DEBUG`` (read again at ``import
torch.distributed``, which the fork server has done).  Each is read again only where its value
changed: ``_init_logs`` resets every torch logger and costs about a millisecond.  What C++ read when
libtorch loaded (``TORCH_CPP_LOG_LEVEL``) and what a math library read at its first use
(``MKL_NUM_THREADS``) cannot be read again (docs/guide.md, "CUDA").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# torch._logging._internal's variables (2.4-2.13): what _init_logs reads
LOGS = (
    "TORCH_LOGS",
    "TORCH_LOGS_OUT",
    "TORCH_LOGS_FORMAT",
    "TORCH_LOGS_TRACE_ID_FILTER",
    "TORCH_TRACE",
    "TORCH_DTRACE",
    "TORCH_COMPILE_DEBUG",
)
DEBUG = "TORCH_DISTRIBUTED_DEBUG"


def imported_with(environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """The values torch read at import, as far as this process can tell: its environment before the
    rank's own is applied (torch was imported with it, here or in the process it was forked from)."""
    return {key: environ.get(key) for key in (*LOGS, DEBUG)}


def read_again(before: Mapping[str, str | None], environ: Mapping[str, str] = os.environ) -> list[str]:
    """torch's import-time settings made this environment's where it differs from ``before``; what
    was read again (``logs``, ``distributed debug``)."""
    done: list[str] = []
    torch = sys.modules.get("torch")
    if torch is None:  # imported later, from this environment
        return done
    if any(environ.get(key) != before.get(key) for key in LOGS):
        try:
            torch._logging._init_logs()
            done.append("logs")
        except Exception as err:  # a private API of torch: say so, and go on with the old settings
            print(f"nbspawn: TORCH_LOGS could not be applied in this rank: {err}", file=sys.stderr)
    dist = sys.modules.get("torch.distributed")
    if environ.get(DEBUG) != before.get(DEBUG) and dist is not None and dist.is_available():
        dist.set_debug_level_from_env()
        done.append("distributed debug")
    return done
