"""TPU ranks: one rank per local chip, each with the environment torch_xla's own launcher gives it.

``xmp.spawn`` (torch_xla 2.9, ``_internal/pjrt.py``) starts ``tpu.num_local_processes()`` workers and
runs ``initialize_multiprocess(local_rank, local_world_size)`` in each: ``PJRT_LOCAL_PROCESS_RANK`` and
``PJRT_LOCAL_PROCESS_COUNT``, then ``tpu.configure_topology``, which sets ``TPU_VISIBLE_CHIPS``,
``TPU_PROCESS_BOUNDS``, ``TPU_CHIPS_PER_PROCESS_BOUNDS``, ``TPU_PROCESS_ADDRESSES``, ``TPU_PROCESS_PORT``
and ``CLOUD_TPU_TASK_ID`` from the TPU metadata (or the ``TPU_SKIP_MDS_QUERY=1`` variables).  Every
one of them is a ``setdefault`` on the process's ``os.environ``, so a value left in the parent wins:
after a one-process run (``TPU_PROCESS_BOUNDS=1,1,1``) the next launch would quietly start one process.

nbspawn asks torch_xla's own functions, never a copy of their arithmetic, but with the launcher's
variables taken out of the environment they read (``launch_environ``): the kernel's leftovers never
reach a rank, and the kernel's ``os.environ`` is the same after as before (``_scoped_environ``
swaps it for the call and puts it back).  The user's ``--env`` is the one way to set them.

The kernel must not hold the TPU: a chip is opened by one process, so a kernel whose XLA runtime is
up (``torch_xla._XLAC._xla_runtime_is_initialized()``, what ``xmp.spawn`` refuses on) is refused
before any rank starts.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from ._hosted import tpu_named
from .errors import SpawnUsageError

# what torch_xla's launcher sets in each worker (pjrt.initialize_multiprocess, tpu.configure_topology)
LAUNCHER_KEYS = (
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
    "TPU_VISIBLE_CHIPS",
    "TPU_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_PROCESS_ADDRESSES",
    "TPU_PROCESS_PORT",
    "CLOUD_TPU_TASK_ID",
)


@dataclass(frozen=True)
class TpuPlan:
    """A TPU run's ranks: how many this host starts, and each one's environment (by local rank)."""

    local_processes: int  # tpu.num_local_processes(): what -n auto means here
    rank_envs: tuple[dict[str, str], ...] = ()
    notes: tuple[str, ...] = ()


def launch_environ(environ: Mapping[str, str], user_env: Mapping[str, str]) -> dict[str, str]:
    """The environment torch_xla's functions read for a launch: the kernel's without the launcher's
    own variables (a leftover would win over the topology), the user's ``--env`` on top."""
    base = {key: value for key, value in environ.items() if key not in LAUNCHER_KEYS}
    base.update(user_env)
    return base


def leftovers(environ: Mapping[str, str], user_env: Mapping[str, str]) -> list[str]:
    """The launcher's variables the kernel holds and the ranks will not get (``--env`` sets them)."""
    return [f"{key}={environ[key]}" for key in LAUNCHER_KEYS if key in environ and key not in user_env]


_environ_lock = threading.Lock()


@contextmanager
def _scoped_environ(environ: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` is ``environ`` inside, and exactly what it was again after (torch_xla's
    functions read and ``setdefault`` the process's own environment).  Only the variables that differ
    are touched (in the kernel: the launcher's and ``--env``'s), so another thread of the kernel sees
    the rest of its environment as it was, for the moment this takes."""
    with _environ_lock:
        saved = dict(os.environ)
        try:
            for key in [key for key in saved if key not in environ]:
                del os.environ[key]
            for key, value in environ.items():
                if saved.get(key) != value:
                    os.environ[key] = value
            yield
        finally:
            for key in [key for key in os.environ if key not in saved]:
                del os.environ[key]
            for key, value in saved.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value


def _tpu_module() -> ModuleType:
    from torch_xla._internal import tpu  # type: ignore[import-not-found,unused-ignore]

    return tpu


def installed() -> bool:
    """Whether torch_xla could be imported (asked without importing it)."""
    if "torch_xla" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def runtime_initialized() -> bool:
    """Whether this process's XLA runtime is up (never when torch_xla was not imported)."""
    torch_xla = sys.modules.get("torch_xla")
    if torch_xla is None:
        return False
    try:
        return bool(torch_xla._XLAC._xla_runtime_is_initialized())
    except AttributeError:
        return False


def local_chips(environ: Mapping[str, str]) -> int:
    """The chips torch_xla counts on this host (``tpu.num_available_chips``: its PCI devices)."""
    tpu = _tpu_module()
    with _scoped_environ(environ):
        return int(tpu.num_available_chips())


def hinted(environ: Mapping[str, str], modules: Mapping[str, object] = sys.modules) -> bool:
    """Whether ``auto`` should ask torch_xla at all: it is imported in the kernel already, or the
    environment names a TPU.  Importing torch_xla only to look would cost seconds on every machine
    that has it, and its import writes the kernel's environment (``PJRT_DEVICE=CPU`` without libtpu)."""
    return "torch_xla" in modules or environ.get("PJRT_DEVICE", "").upper() == "TPU" or tpu_named(environ)


def tpu_wanted(accelerator: str, installed: Callable[[], bool], chips: Callable[[], int]) -> bool:
    """``--accelerator``: tpu asks for it (refused clearly where torch_xla is not installed); auto takes
    a TPU host (``chips``: :func:`auto_chips`); none never.  A pure rule: each fact is asked only where
    it decides (a machine's, ``nbspawn._machine.Machine``, or a test's)."""
    if accelerator == "none":
        return False
    if accelerator == "tpu":
        if not installed():
            raise SpawnUsageError("--accelerator tpu needs torch_xla (pip install torch_xla[tpu]); it is not installed")
        return True
    return chips() > 0


def wants_tpu(accelerator: str, environ: Mapping[str, str]) -> bool:
    """:func:`tpu_wanted`, with this host's facts probed."""
    return tpu_wanted(accelerator, installed, lambda: auto_chips(environ))


def auto_chips(environ: Mapping[str, str]) -> int:
    """The chips ``--accelerator auto`` would use here: torch_xla's count on a host that looks like a TPU
    host (torch_xla imported or a TPU named in the environment, ``PJRT_DEVICE`` unset or TPU), else 0,
    without importing torch_xla anywhere else (:func:`hinted`)."""
    if not hinted(environ) or not installed() or environ.get("PJRT_DEVICE", "TPU").upper() != "TPU":
        return 0
    try:
        return local_chips(environ)
    except Exception:  # a torch_xla that cannot be imported here (built for another torch): no TPU ranks
        return 0


def refuse_runtime_up(up: bool, culprit: str = "") -> None:
    """The kernel holds the TPU once its XLA runtime is up (``up``: :func:`runtime_initialized`, asked by
    ``nbspawn._machine.Machine``): no rank could open a chip; ``culprit``: the cell that brought it up."""
    if up:
        at = f" (first at {culprit})" if culprit else ""
        raise SpawnUsageError(
            f"the XLA runtime is already up in this kernel{at}, so it holds the TPU and no rank could use it: "
            "restart the kernel and run %%spawn before using an XLA device in the kernel itself"
        )


def plan_tpu(environ: Mapping[str, str], user_env: Mapping[str, str], nprocs: int | None) -> TpuPlan:
    """Each rank's environment, as torch_xla's launcher would set it in a worker of a launch of
    ``nprocs`` processes (None: ``tpu.num_local_processes()``, as ``xmp.spawn`` starts)."""
    tpu = _tpu_module()
    base = launch_environ(environ, user_env)
    with _scoped_environ(base):
        count = int(tpu.num_local_processes())
    if count <= 0:
        raise SpawnUsageError("--accelerator tpu: torch_xla finds no TPU chip on this host (tpu.num_available_chips() is 0)")
    n = count if nprocs is None else nprocs
    if n not in (1, count):
        # xmp.spawn's own rule: the topology is the host's, so a launch uses one chip or all of them
        raise SpawnUsageError(
            f"-n {n} on a TPU host: torch_xla runs one process per chip ({count} here) or one process on one chip; "
            f"use -n auto (or -n {count}), or -n 1"
        )
    envs = []
    for local_rank in range(n):
        with _scoped_environ(base):
            os.environ.setdefault("PJRT_LOCAL_PROCESS_COUNT", str(n))
            try:
                if n == 1 and count > 1:  # xmp.spawn(nprocs=1): pjrt.initialize_singleprocess
                    tpu.configure_one_chip_topology()
                else:  # pjrt.initialize_multiprocess
                    os.environ.setdefault("PJRT_LOCAL_PROCESS_RANK", str(local_rank))
                    tpu.configure_topology(local_rank, n)
            except Exception as err:  # no metadata server, no TPU_* variables: say which
                raise SpawnUsageError(
                    f"--accelerator tpu: torch_xla cannot read this host's TPU topology ({type(err).__name__}: {err}); "
                    "off a TPU VM set TPU_SKIP_MDS_QUERY=1 with TPU_ACCELERATOR_TYPE, TPU_HOST_BOUNDS, "
                    "TPU_CHIPS_PER_HOST_BOUNDS and TPU_WORKER_ID"
                ) from None
            after = dict(os.environ)
        envs.append({key: value for key, value in after.items() if base.get(key) != value})
    notes = []
    stale = leftovers(environ, user_env)
    if stale:
        notes.append(
            f"nbspawn: the kernel's {', '.join(stale)} (left by an earlier XLA launch?) is not given to the ranks: "
            "each gets the topology torch_xla computes for this launch (--env sets one on purpose)"
        )
    return TpuPlan(local_processes=count, rank_envs=tuple(envs), notes=tuple(notes))


# a line that brings the kernel's XLA runtime up
_TOUCHES_XLA = re.compile(r"xla_device\s*\(|torch_xla\.device\s*\(|[\"']xla[\"':]|xm\.\w+\s*\(|xr\.\w+\s*\(")


def culprit_line(label: str, source: str) -> str:
    """The cell line most likely to have started the kernel's XLA runtime, else the cell alone."""
    for number, line in enumerate(source.splitlines(), 1):
        code = line.strip()
        if code and not code.startswith("#") and _TOUCHES_XLA.search(code):
            return f"{label}, line {number}: {code}"
    return label


_culprit: str | None = None


def note_cell(label: str, source: str) -> None:
    """After each of the kernel's cells: the first one after which the XLA runtime is up is kept, so
    the refusal names it.  Free until torch_xla is imported."""
    global _culprit
    if _culprit is None and runtime_initialized():
        _culprit = culprit_line(label, source)


def culprit() -> str:
    return _culprit or ""
