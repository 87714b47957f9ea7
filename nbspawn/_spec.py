"""What a run is asked to do, validated before any process starts.

The magic and the Python API both build a :class:`RunSpec` through :func:`build_spec`, so bad input
gets the same short error whichever door it came through.  A spec is plain data: under spawn and
forkserver it is pickled into every rank.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from ._source import CellSource
from .errors import SpawnUsageError

START_METHODS = ("fork", "spawn", "forkserver")
BACKENDS = ("none", "gloo", "nccl", "auto")


@dataclass
class RunSpec:
    run_id: str
    nprocs: int
    start_method: str
    backend: str  # resolved: none | gloo | nccl
    cell: CellSource
    run_dir: str  # <log-dir>/<run-id>
    env: dict[str, str] = field(default_factory=dict)  # user's --env
    timeout: float | None = None
    grace_period: float = 5.0
    shown_ranks: frozenset[int] | None = None  # None: all
    master_port: int = 0
    parent_pid: int = 0  # the kernel; a rank whose parent is gone exits at once
    omp_threads: int | None = None  # None: the user set OMP_NUM_THREADS
    # fork: the kernel's namespace itself (the child gets a copy-on-write copy); spawn/forkserver:
    # the names the cell uses, pickled by value.
    namespace: dict[str, Any] | None = None
    namespace_payload: Any = None  # an _shm.Payload, pickled into each rank as it starts
    out_names: tuple[str, ...] = ()  # --out
    shm_prefix: str | None = None  # /dev/shm names of this run's --out tensors, swept after the run
    notes: list[str] = field(default_factory=list)  # said to the user before the run
    # IPython's compiled cell files -> In[N], so frames in functions from earlier cells read
    # "Cell In[3], line 2, in f" wherever a rank's traceback is shown
    cell_numbers: dict[str, int] = field(default_factory=dict)
    # Set by the launcher for fork only, where ranks inherit them instead of redoing the work in
    # every child (each page a child writes to is a copy-on-write fault).
    compiled: tuple[CodeType, CodeType | None] | None = None
    shared_env_inherited: bool = False
    rich: bool = False  # the view draws rich output: ranks look like a notebook (nbspawn.ranks._capture)
    max_image_bytes: int = 2 << 20  # images kept per run, live and saved
    max_saved_bytes: int = 256 << 10  # a saved run's size, images aside
    program: Any = None  # a _program.Program: the ranks run it instead of a cell
    # One node of a cluster run (nbspawn.cluster): this node's ranks are RANK rank_offset.., of
    # world_size in all; node 0's agent hosts the TCPStore at master_addr:master_port.
    rank_offset: int = 0
    world_size: int = 0  # 0: nprocs (one node)
    node_rank: int = 0
    nnodes: int = 1
    master_addr: str = "127.0.0.1"
    agent_store: bool = False  # TORCHELASTIC_USE_AGENT_STORE: ranks join the store, none hosts it
    cluster: Any = None  # in the kernel, a cluster run's nbspawn.cluster._plan.ClusterPlan

    def rank_dir(self, rank: int) -> str:
        """``rank`` is the rank's index on this node; its directory is named by its global rank."""
        return os.path.join(self.run_dir, str(self.rank_offset + rank))

    def rank_env(self, rank: int) -> dict[str, str]:
        """The torchrun environment, so torch.distributed, Lightning and accelerate see launched ranks."""
        return {**self.shared_env(), **self.own_env(rank)}

    def shared_env(self) -> dict[str, str]:
        """The part that is the same on every rank (and the user's ``--env``, which wins)."""
        world = str(self.world_size or self.nprocs)
        env = {
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": str(self.nprocs),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": world,
            "TORCHELASTIC_RUN_ID": self.run_id,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.agent_store:
            env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        env.update(self.env)
        if self.omp_threads is not None:  # after --env: a fork-safety override wins over the user's
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        return env

    def own_env(self, rank: int) -> dict[str, str]:
        env = {
            "RANK": str(self.rank_offset + rank),
            "LOCAL_RANK": str(rank),
            "ROLE_RANK": str(self.rank_offset + rank),
            "TORCHELASTIC_ERROR_FILE": os.path.join(self.rank_dir(rank), "error.json"),
        }
        return {k: v for k, v in env.items() if k not in self.env}


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def free_port() -> int:
    """A port nothing listens on now; rank 0's TCPStore binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_nprocs(value: Any) -> int | str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise SpawnUsageError(f"--nprocs must be a positive integer or 'auto', not {value!r}") from None
    if isinstance(n, bool) or n <= 0:
        raise SpawnUsageError(f"--nprocs must be a positive integer or 'auto', not {value!r}")
    return n


def cuda_device_count() -> int:
    """GPUs visible, asked without poisoning fork.

    ``torch.cuda.device_count()`` asks NVML and leaves CUDA untouched in the kernel;
    ``torch.cuda.is_available()`` would run ``cudaGetDeviceCount`` (cuInit), after which forked
    ranks may be unable to use CUDA at all.
    """
    import torch

    return torch.cuda.device_count()


def auto_nprocs(gpus: int, cpus: int) -> int:
    """What ``-n auto`` means on a machine: one rank per GPU, else up to 4 CPU ranks (never more than the cores)."""
    return gpus if gpus else max(1, min(4, cpus))


def resolve_nprocs(value: Any) -> int:
    n = parse_nprocs(value)
    if n != "auto":
        return int(n)
    return auto_nprocs(cuda_device_count(), usable_cpus())


def parse_env(items: list[str] | dict[str, str] | None) -> dict[str, str]:
    if not items:
        return {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SpawnUsageError(f"--env expects KEY=VALUE, got {item!r}")
            pairs.append((key, value))
    env = {}
    for key, value in pairs:
        if not key.isidentifier() and not all(c.isalnum() or c == "_" for c in key):
            raise SpawnUsageError(f"--env: {key!r} is not a valid environment variable name")
        env[str(key)] = str(value)
    return env


def parse_ranks(value: str | list[int] | None, nprocs: int) -> frozenset[int] | None:
    """``0,2`` or ``0-3,7``: the ranks whose output is shown (all are logged)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        ranks: set[int] = set()
        for part in value.replace(" ", "").split(","):
            lo, dash, hi = part.partition("-")
            try:
                ranks.update(range(int(lo), int(hi) + 1) if dash else [int(lo)])
            except ValueError:
                raise SpawnUsageError(f"--ranks expects a list like 0,2 or 0-3, not {value!r}") from None
    else:
        ranks = {int(r) for r in value}
    bad = sorted(r for r in ranks if not 0 <= r < nprocs)
    if bad:
        raise SpawnUsageError(f"--ranks: rank {bad[0]} does not exist in a run of {nprocs} ranks (0-{nprocs - 1})")
    return frozenset(ranks)


def parse_seconds(value: Any, option: str, *, allow_zero: bool) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SpawnUsageError(f"{option} must be a number of seconds, not {value!r}") from None
    if seconds < 0 or (seconds == 0 and not allow_zero) or math.isnan(seconds):
        raise SpawnUsageError(f"{option} must be {'zero or more' if allow_zero else 'more than zero'} seconds, not {value!r}")
    return seconds


def parse_kb(value: Any, option: str) -> int:
    try:
        kb = int(value)
    except (TypeError, ValueError):
        raise SpawnUsageError(f"{option} must be a whole number of KB, not {value!r}") from None
    if kb < 0 or isinstance(value, bool):
        raise SpawnUsageError(f"{option} must be zero or more KB, not {value!r}")
    return kb


def openmp_pool_started() -> bool:
    """Whether this process has native threads that are neither Python's nor ZeroMQ's.

    torch's CPU ops run on GNU OpenMP, which is not fork-safe: once its thread pool exists, a forked
    child that runs a parallel op with more than one thread hangs forever. Those pool threads are
    invisible to ``threading``; anything unexplained is taken to be one (safe: a false alarm only
    costs forked ranks their intra-op threads).
    """
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:  # not Linux: assume the worst
        return True
    known = {t.native_id for t in threading.enumerate()} | {os.getpid()}
    for tid in tids:
        if int(tid) in known:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:  # exited meanwhile
            continue
        if not name.startswith("ZMQbg"):
            return True
    return False


def rank_threads(method: str, nprocs: int, user_env: dict[str, str], notes: list[str]) -> int | None:
    """OMP_NUM_THREADS for the ranks (None: the user's own stands), cores // ranks as torchrun does."""
    user_value = user_env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
    if user_value is None:
        wanted = max(1, usable_cpus() // nprocs)
        threads: int | None = wanted
    else:
        wanted = int(user_value) if user_value.isdigit() else 1
        threads = None
    if method == "fork" and wanted > 1 and openmp_pool_started():
        if user_value is not None:
            notes.append(
                f"nbspawn: forked ranks run with OMP_NUM_THREADS=1, not {user_value}: this kernel already "
                "started OpenMP threads, and OpenMP is not fork-safe (a forked rank would hang in its first "
                "parallel op). Use --start-method forkserver to keep more threads per rank."
            )
        return 1
    return threads


def cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork())


def parse_start_method(requested: str | None) -> str:
    """The name checked: fork, spawn, forkserver or auto (what this machine offers is not asked)."""
    method = (requested or "auto").strip().lower()
    if method not in (*START_METHODS, "auto"):
        raise SpawnUsageError(f"--start-method must be one of fork, spawn, forkserver, not {requested!r}")
    return method


def parse_backend(backend: str | None) -> str:
    """The name checked: none, gloo, nccl or auto (whether GPUs are there is not asked)."""
    name = (backend or "none").strip().lower()
    if name not in BACKENDS:
        raise SpawnUsageError(f"--backend must be one of none, gloo, nccl, auto, not {backend!r}")
    return name


def choose_start_method(requested: str | None) -> tuple[str, list[str]]:
    """Fork where it is safe (fast, and the cell sees the kernel's names), else forkserver."""
    notes: list[str] = []
    method = parse_start_method(requested)
    available = multiprocessing.get_all_start_methods()
    if method == "auto":
        if "fork" not in available:
            return "spawn", notes
        if cuda_initialized():
            notes.append(
                "nbspawn: CUDA is initialized in this kernel, so this run uses --start-method forkserver "
                "(forked ranks cannot use CUDA). Pass --start-method to choose."
            )
            return "forkserver", notes
        return "fork", notes
    if method not in available:
        raise SpawnUsageError(f"--start-method {method} is not available on this platform ({', '.join(available)} are)")
    if method == "fork" and cuda_initialized():
        raise SpawnUsageError(
            "cannot fork: CUDA is already initialized in this kernel, and forked ranks cannot use it. "
            "Use --start-method forkserver (or spawn), or restart the kernel and run %%spawn before "
            "touching CUDA in the kernel."
        )
    return method, notes


def resolve_backend(backend: str | None, nprocs: int) -> str:
    name = parse_backend(backend)
    if name == "none":
        return name
    gpus = cuda_device_count()
    if name == "auto":
        return "nccl" if gpus else "gloo"
    if name == "nccl":
        if not gpus:
            raise SpawnUsageError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo")
        if nprocs > gpus:
            raise SpawnUsageError(f"--backend nccl needs one GPU per rank: {nprocs} ranks, {gpus} GPUs visible")
    return name


def build_spec(
    cell: CellSource,
    *,
    nprocs: Any = "auto",
    start_method: str | None = None,
    backend: str | None = None,
    env: list[str] | dict[str, str] | None = None,
    timeout: Any = None,
    grace_period: Any = 5.0,
    log_dir: str | None = None,
    ranks: str | list[int] | None = None,
    max_saved_kb: Any = 256,
    max_image_kb: Any = 2048,
) -> RunSpec:
    """Validate everything, cheapest checks first; nothing is created on disk here."""
    parse_nprocs(nprocs)
    method, notes = choose_start_method(start_method)
    user_env = parse_env(env)
    seconds = parse_seconds(timeout, "--timeout", allow_zero=False)
    grace = parse_seconds(grace_period, "--grace-period", allow_zero=True)
    saved_kb = parse_kb(max_saved_kb, "SpawnMagics.max_saved_kb")
    image_kb = parse_kb(max_image_kb, "SpawnMagics.max_image_kb")
    cell.parse()
    n = resolve_nprocs(nprocs)
    shown = parse_ranks(ranks, n)
    resolved_backend = resolve_backend(backend, n)
    run_id = new_run_id()
    base = os.path.abspath(os.path.expanduser(log_dir)) if log_dir else None
    omp = rank_threads(method, n, user_env, notes)
    return RunSpec(
        run_id=run_id,
        nprocs=n,
        start_method=method,
        backend=resolved_backend,
        cell=cell,
        run_dir=os.path.join(base, run_id) if base else "",  # "" : a fresh temporary directory
        env=user_env,
        timeout=seconds,
        grace_period=5.0 if grace is None else grace,
        shown_ranks=shown,
        master_port=free_port(),
        parent_pid=os.getpid(),
        omp_threads=omp,
        notes=notes,
        max_saved_bytes=saved_kb * 1024,
        max_image_bytes=image_kb * 1024,
    )
