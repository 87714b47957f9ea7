"""What a run is asked to do, validated and frozen before any process starts.

A :class:`RunSpec` is made once, by the dispatch (``nbspawn._dispatch``), and never changed after: the
supervisor, the executors, the views and the ranks only read it.  It is plain data: under spawn and
forkserver it is pickled into every rank.  What differs per rank (its directory, its environment) is
computed from it.

The helpers below decide what depends on this machine (the start method once CUDA is initialized,
the backend given the GPUs, OpenMP threads per rank, ``-n auto``); each is asked only when needed.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from . import _capacity, _cuda, _listen, _tpu
from ._options import Backend, StartMethod, ranks_within
from ._program import Program
from ._rankdir import RankDir
from ._request import Settings
from ._source import CellSource
from .errors import rank_spans

if TYPE_CHECKING:
    from .handoff._shm import Payload


@dataclass(frozen=True, kw_only=True)
class CellPart:
    """What one cell brings to the ranks that run it, whatever they are (fresh or a kept world's, here or
    on a cluster), built once (:func:`cell_part`).  A :class:`RunSpec` is one of these and what its ranks
    are; a cell on a world is the world's spec with the cell's part (:meth:`RunSpec.with_cell`).  The
    cell's options travel whole (``asked``), so a new option needs no field here, nor a line in
    :func:`cell_part`, nor a twin in the spec."""

    run_id: str
    run_dir: str  # <log-dir>/<run-id>
    cell: CellSource
    # the cell's options as the door read them (a row each: nbspawn._options.Settings), whole: what a rank,
    # the supervisor or a view reads of them (spec.asked.timeout, .grace_period, .xray, .pdb, the budgets)
    # it reads here, so an option that reaches the ranks is its row and the code that reads it.  What
    # the ranks themselves are (nprocs, start method, backend, environment) is the planner's, settled in
    # RunSpec's own fields below; a world's cell brings its asked, not the world's.
    asked: Settings = field(default_factory=Settings)
    shown_ranks: frozenset[int] | None = None  # None: all
    rich: bool = False  # the view draws rich output: ranks look like a notebook (nbspawn.ranks._capture)
    # IPython's compiled cell files -> In[N], so frames in functions from earlier cells read
    # "Cell In[3], line 2, in f" wherever a rank's traceback is shown
    cell_numbers: dict[str, int] = field(default_factory=dict)
    out_names: tuple[str, ...] = ()  # --out
    shm_prefix: str | None = None  # /dev/shm names of this run's --out tensors, swept after the run
    # --on: the (global) ranks of a kept world that run this cell; None: every rank.  The others are
    # sent the cell only to be told to sit it out (nbspawn.ranks._worldloop), and are not supervised.
    on_ranks: frozenset[int] | None = None
    notes: tuple[str, ...] = ()  # said to the user before the run


@dataclass(frozen=True, kw_only=True)
class RunSpec(CellPart):
    """A run: the cell's part (:class:`CellPart`: its id, source and options) and what its ranks are."""

    nprocs: int  # ranks on this machine (a cluster run's kernel: every node's)
    start_method: str
    backend: str  # resolved: none | gloo | nccl
    env: dict[str, str] = field(default_factory=dict)  # user's --env
    parent_pid: int = 0  # the kernel; a rank whose parent is gone exits at once
    omp_threads: int | None = None  # None: the user set OMP_NUM_THREADS
    # fork: the kernel's namespace itself (the child gets a copy-on-write copy); spawn/forkserver:
    # the names the cell uses, pickled by value.
    namespace: dict[str, object] | None = None
    namespace_payload: Payload | None = None  # pickled into each rank as it starts
    program: Program | None = None  # the ranks run it instead of a cell
    # Where these ranks sit in the world.  The ranks never host the TCPStore: they join it as clients
    # (TORCHELASTIC_USE_AGENT_STORE), at master_addr:master_port, where their launcher hosts it bound
    # to that address only (nbspawn._listen).  One node of a cluster run (nbspawn.cluster): this
    # node's ranks are RANK rank_offset.., of world_size in all; node 0's agent hosts the store.
    master_port: int = 0  # 0: this machine's port, not reserved yet (nbspawn._effects reserves it)
    master_addr: str = _listen.LOOPBACK
    rank_offset: int = 0
    world_size: int = 0  # 0: nprocs (one node)
    node_rank: int = 0
    nnodes: int = 1
    # the executor here hosts the store, once every rank is started (a forked rank would inherit the
    # connections it accepted): a run on this machine alone, or node 0 of a cluster
    hosts_store: bool = False
    # forkserver: the kernel's environment when the run was planned.  The fork server keeps the one the
    # kernel had when it started, so a later os.environ["NCCL_P2P_DISABLE"] = "1" (or CUDA_VISIBLE_DEVICES,
    # PYTORCH_CUDA_ALLOC_CONF) would never reach a rank, while -n auto and the device mapping read the
    # kernel's current values; the rank makes its environment this one first (ranks._cell.apply_kernel_env).
    # None: fork and spawn ranks inherit the kernel's current environment.
    kernel_env: dict[str, str] | None = None
    # TPU ranks (nbspawn._tpu): each local rank's environment from torch_xla's launcher functions, and
    # the launcher's variables no rank may inherit from the kernel (a leftover would win over the topology)
    accelerator_envs: tuple[dict[str, str], ...] = ()
    unset_env: tuple[str, ...] = ()

    def with_cell(self, part: CellPart) -> RunSpec:
        """This (a kept world's) spec, running the cell ``part`` brings: the world's ranks, backend,
        placement and environment, the cell's own options."""
        return replace(self, **vars(part))

    def with_job(self, run_id: str, run_dir: str, **own: Any) -> RunSpec:
        """This (a kept world's) spec, for a job that brings no options of the user's to its ranks:
        ``%spawn show``'s look, ``%spawn debug``'s post-mortem, a cluster node's part of a cell (whose
        options the kernel keeps).  The world's own choices stay (its grace period, output budgets, X-ray,
        how its ranks draw, the ranks it shows, its cell); the job has its own id and directory, and no time
        limit, ``--out``, notes or ``--pdb``, unless ``own`` (fields of :class:`CellPart`) says otherwise."""
        kept = {f.name: getattr(self, f.name) for f in fields(CellPart)}
        quiet = {"asked": replace(self.asked, timeout=None, pdb=False), "out_names": (), "shm_prefix": None, "notes": ()}
        return self.with_cell(CellPart(**{**kept, **quiet, "run_id": run_id, "run_dir": run_dir, **own}))

    @property
    def xrayed(self) -> bool:
        """Whether the ranks record their collectives (``ranks._xray``): ``--xray`` (on by default), in
        the group nbspawn makes (``--backend``) or the ones the cell makes itself; a Python program's
        from the first group it makes (an executable's process is its own: nothing runs in it)."""
        return self.asked.xray != "off" and (self.program is None or self.program.python)

    @property
    def xray_values(self) -> bool:
        """Whether the ranks also write down the values of this cell's small tensors before and after
        each collective (``ranks._xray_values``): ``--xray values``, where the cell is X-rayed (a
        program's X-ray has none: values need torch.distributed's functions wrapped before the code takes
        them, and a program's rank imports no torch before the program does)."""
        return self.asked.xray == "values" and self.xrayed and self.program is None

    def runs(self, rank: int) -> bool:
        """Whether the rank (its index on this node, as in ``rank_dir``) runs the cell (``--on``)."""
        return self.on_ranks is None or self.rank_offset + rank in self.on_ranks

    def sitting_out(self) -> str:
        """What the ranks that do not run the cell are, said where a hang is: ``ranks 1-3 do not run
        this cell (--on 0)``; "" when every rank runs it."""
        if self.on_ranks is None:
            return ""
        out = [r for r in range(self.world_size or self.nprocs) if r not in self.on_ranks]
        if not out:
            return ""
        who = f"rank {out[0]} does" if len(out) == 1 else f"ranks {rank_spans(out)} do"
        return f"{who} not run this cell (--on {rank_spans(sorted(self.on_ranks))})"

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
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
        env.update(_cuda.torchrun_env(self.env, os.environ))  # what torchrun's agent sets for NCCL
        # a store on loopback: every rank is on this machine, so gloo's and NCCL's sockets are on loopback
        # too (NVLink, P2P, SHM are no sockets)
        if self.master_addr == _listen.LOOPBACK:
            env.update(_cuda.socket_interface_env(_listen.loopback_interface(), self.env, os.environ))
        env.update(self.env)
        if self.omp_threads is not None:  # after --env: a fork-safety override wins over the user's
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        return env

    def own_env(self, rank: int) -> dict[str, str]:
        env = {
            "RANK": str(self.rank_offset + rank),
            "LOCAL_RANK": str(rank),
            "ROLE_RANK": str(self.rank_offset + rank),
            "TORCHELASTIC_ERROR_FILE": RankDir(self.rank_dir(rank)).error,
        }
        env.update(_cuda.dump_file_env(RankDir(self.rank_dir(rank)).nccl_trace_prefix, self.env, os.environ))
        if self.accelerator_envs:
            env.update(self.accelerator_envs[rank])
        return {k: v for k, v in env.items() if k not in self.env}

    def dropped_env(self, rank: int) -> list[str]:
        """What the rank must not inherit from the kernel's environment (``unset_env``, unless its own)."""
        own = self.rank_env(rank) if self.unset_env else {}
        return [key for key in self.unset_env if key not in own]

    def apply_env(self, rank: int, environ: MutableMapping[str, str], *, own_only: bool = False) -> None:
        """Make ``environ`` (a rank's) this rank's: its variables set, the kernel's leftovers dropped;
        ``own_only`` where the shared part is inherited already (fork)."""
        environ.update(self.own_env(rank) if own_only else self.rank_env(rank))
        for key in self.dropped_env(rank):
            environ.pop(key, None)


_issued: tuple[str, set[str]] = ("", set())  # this second's stamp, and the ids given out in it


def new_run_id() -> str:
    """``20261126-035250-3f9a1c``: when, to the second, and 24 random bits, never the same twice in
    this process (a kept world's cells share one directory, and quick cells share a second; 16 bits
    once gave two cells of one world the same directory).  Kernels that share a ``--log-dir`` may
    still meet by chance: 1 in 16.7 million per pair of runs in the same second."""
    global _issued
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if _issued[0] != stamp:
        _issued = (stamp, set())
    taken = _issued[1]
    while (run_id := f"{stamp}-{secrets.token_hex(3)}") in taken:
        pass
    taken.add(run_id)
    return run_id


def usable_cpus(cgroup_file: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process may use: those it may run on (``sched_getaffinity``), no more than its
    cgroup's CPU quota allows (docker ``--cpus``, hosted notebook runtimes), rounded up, at least 1.
    A quota of 1.5 CPUs on a 64-core host is 2, not 64: ranks sized for the host's cores would
    oversubscribe the quota and be throttled.  The paths are arguments for tests."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_file, cgroup_root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cgroup_cpu_quota(cgroup_file: str = "/proc/self/cgroup", cgroup_root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of time per period this process's cgroups allow (quota / period), the tightest of
    its cgroup and every cgroup above it, in cgroup v2 (``cpu.max``) and v1 (``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``); None where there is no quota (or no cgroup file to read)."""
    try:
        with open(cgroup_file) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not controllers:  # v2: one hierarchy, at the root or, beside v1 (hybrid), at unified/
            root = (
                cgroup_root
                if os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
                else os.path.join(cgroup_root, "unified")
            )
            limits += _along(root, path, _v2_limit)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own mount
            for mount in dict.fromkeys((controllers, "cpu,cpuacct", "cpuacct,cpu", "cpu")):
                root = os.path.join(cgroup_root, mount)
                if os.path.isdir(root):
                    limits += _along(root, path, _v1_limit)
                    break
    return min(limits) if limits else None


def _along(root: str, path: str, limit_of: Callable[[str], float | None]) -> list[float]:
    """The limits of the cgroup at ``root/path`` and of each one above it, up to ``root`` itself (in a
    container, ``path`` may name a cgroup outside its view: ``root`` is then its own cgroup)."""
    limits = []
    parts = [p for p in path.split("/") if p and p != ".."]
    for depth in range(len(parts), -1, -1):
        limit = limit_of(os.path.join(root, *parts[:depth]))
        if limit is not None:
            limits.append(limit)
    return limits


def _v2_limit(directory: str) -> float | None:
    """``cpu.max``: ``"$QUOTA $PERIOD"``, the quota ``max`` when there is none."""
    try:
        with open(os.path.join(directory, "cpu.max")) as fh:
            quota, _, period = fh.read().strip().partition(" ")
        return int(quota) / int(period or 100000) if quota != "max" and int(quota) > 0 else None
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_limit(directory: str) -> float | None:
    """``cpu.cfs_quota_us`` (-1 when there is none) over ``cpu.cfs_period_us``."""
    try:
        with open(os.path.join(directory, "cpu.cfs_quota_us")) as fh:
            quota = int(fh.read().strip())
        with open(os.path.join(directory, "cpu.cfs_period_us")) as fh:
            period = int(fh.read().strip())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def cuda_device_count(user_env: Mapping[str, str] | None = None) -> int:
    """GPUs the ranks will see (their ``CUDA_VISIBLE_DEVICES``: the user's ``--env``, else the
    kernel's), counted without poisoning fork (``nbspawn._cuda.gpu_count``: never the CUDA runtime
    in the kernel; ``torch.cuda.device_count()`` falls back on it where NVML cannot answer)."""
    return _cuda.gpu_count(_cuda.ranks_visible(user_env or {}, os.environ))


def auto_nprocs(gpus: int, cpus: int) -> int:
    """What ``-n auto`` means on a machine: one rank per GPU, else up to 4 CPU ranks (never more than the cores)."""
    return gpus if gpus else max(1, min(4, cpus))


def resolve_nprocs(n: int | str, gpus: Callable[[], int] | None = None) -> int:
    """``-n`` (read at the door) on this machine: ``auto`` counted here."""
    if n != "auto":
        return int(n)
    return auto_nprocs((gpus or cuda_device_count)(), usable_cpus())


def openmp_pool_started() -> bool:
    """Whether this process has native threads that are neither Python's, ZeroMQ's nor a TCPStore's.

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
        if not name.startswith(("ZMQbg", "pt_tcpstore")):  # a kept world's store (nbspawn._listen) is no OpenMP
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
    if torch is None or not _cuda.compiled_with_cuda(torch):
        return False
    return bool(torch.cuda.is_initialized() or torch.cuda._is_in_bad_fork())


def choose_start_method(requested: StartMethod, gpus: Callable[[], int] | None = None) -> tuple[str, list[str]]:
    """Fork where forked ranks could use everything this machine has (fast, and the cell sees the
    kernel's names), else forkserver; the facts are gathered only where fork is in question
    (``nbspawn._cuda.fork_facts``, ``decide_start_method``)."""
    method = requested
    available = multiprocessing.get_all_start_methods()
    blocker = None
    if method in ("auto", "fork") and "fork" in available:
        blocker = _cuda.fork_blocker(_cuda.fork_facts((gpus or cuda_device_count)()))
    return _cuda.decide_start_method(method, available, blocker)


def backend_here(backend: Backend, nprocs: int, gpus: Callable[[], int] | None = None) -> str:
    """The backend for ``nprocs`` ranks on this machine (``nbspawn._cuda.resolve_backend``: the one rule)."""
    return backend_here_noted(backend, nprocs, gpus)[0]


def backend_here_noted(backend: Backend, nprocs: int, gpus: Callable[[], int] | None = None) -> tuple[str, str | None]:
    """The backend on this machine, and a note if ``auto`` passed over the GPUs (``nbspawn._cuda.resolve_backend``),
    the GPUs counted only if the rule needs them."""
    if backend in ("none", "gloo"):
        return backend, None
    return _cuda.resolve_backend(backend, nprocs, (gpus or cuda_device_count)())


class _GpuCount:
    """The ranks' GPU count, asked once per spec and only if something needs it."""

    def __init__(self, user_env: Mapping[str, str]) -> None:
        self.user_env = user_env
        self.value: int | None = None

    def __call__(self) -> int:
        if self.value is None:
            self.value = cuda_device_count(self.user_env)
        return self.value


def cell_part(
    settings: Settings,
    cell: CellSource,
    *,
    run_id: str,
    run_dir: str,
    shown: frozenset[int] | None,
    rich: bool,
    cell_numbers: Mapping[str, int] | None,
    debuggable: bool = True,
    out_names: tuple[str, ...] = (),
    shm_prefix: str | None = None,
    on: frozenset[int] | None = None,
    notes: tuple[str, ...] = (),
) -> CellPart:
    """The cell's part of its spec, from its settings (read at the door) and what its planner decided:
    its id and directory, the ranks it shows (checked against the run's size), ``--on``, ``--out``."""
    return CellPart(
        run_id=run_id,
        run_dir=run_dir,
        cell=cell,
        asked=settings if debuggable else replace(settings, pdb=False),  # a program's failure is reported, not debugged
        shown_ranks=shown,
        rich=rich,
        cell_numbers=dict(cell_numbers or {}),
        out_names=out_names,
        shm_prefix=shm_prefix,
        on_ranks=on,
        notes=notes,
    )


@dataclass(frozen=True)
class Handoff:
    """What a rank gets of the kernel's names, and where its ``--out`` values go (``nbspawn.handoff``)."""

    namespace: dict[str, object] | None = None  # fork: the kernel's own namespace
    namespace_payload: Payload | None = None  # spawn, forkserver, a world: the names the cell uses
    out_names: tuple[str, ...] = ()
    shm_prefix: str | None = None


@dataclass(frozen=True)
class Placement:
    """Where one machine's ranks sit in a world of several nodes (a cluster run's node)."""

    master_addr: str
    master_port: int
    rank_offset: int
    world_size: int
    node_rank: int
    nnodes: int


def build_spec(
    cell: CellSource,
    settings: Settings,
    *,
    rich: bool,
    handoff: Callable[[str], Handoff] | None = None,
    program: Program | None = None,
    cell_numbers: Mapping[str, int] | None = None,
    run_id: str | None = None,
    placement: Placement | None = None,
) -> RunSpec:
    """Decide what depends on this machine (the settings were read at the door), cheapest first; the one way a
    spec of ranks on this machine is made (a fresh cell, a program, a new world, a cluster node's ranks).

    ``handoff(start_method)`` gives the ranks the kernel's names, once everything else is known to be
    right.  Nothing is created on disk here but the temporary log directory, made last; a run on this
    machine alone gets its port when its plan is carried out (``nbspawn._effects.reserve_port``).
    """
    user_env = dict(settings.env)
    gpus = _GpuCount(user_env)
    method, notes = choose_start_method("spawn" if program is not None else settings.start_method, gpus)
    tpu: _tpu.TpuPlan | None = None
    if _tpu.wants_tpu(settings.accelerator, os.environ):
        _tpu.refuse_if_runtime_up(_tpu.culprit())
        tpu = _tpu.plan_tpu(os.environ, user_env, None if settings.nprocs == "auto" else int(settings.nprocs))
        notes.extend(tpu.notes)
        n = len(tpu.rank_envs)
    else:
        n = resolve_nprocs(settings.nprocs, gpus)
    _capacity.refuse_beyond(n, method)  # -n 99999: one line, before any directory or process is made
    shown = ranks_within(settings.ranks, n, "--ranks", f"a run of {n} ranks")
    backend = "none"  # a program sets up its own group
    if program is None:
        backend, note = backend_here_noted(settings.backend, n, gpus)
        notes.extend([note] if note else [])
    omp = rank_threads(method, n, user_env, notes)
    handed = handoff(method) if handoff is not None else Handoff()
    if handed.namespace_payload is not None:
        from .handoff._names import check_shared_devices

        check_shared_devices(handed.namespace_payload.shared or [], _cuda.ranks_visible(user_env, os.environ))
    run_id = run_id or new_run_id()
    part = cell_part(
        settings,
        cell,
        run_id=run_id,
        run_dir=run_directory(settings.log_dir, run_id),
        shown=shown,
        rich=rich,
        cell_numbers=cell_numbers,
        debuggable=program is None,
        out_names=handed.out_names,
        shm_prefix=handed.shm_prefix,
        notes=tuple(notes),
    )
    return RunSpec(
        **vars(part),
        nprocs=n,
        start_method=method,
        backend=backend,
        env=user_env,
        parent_pid=os.getpid(),
        omp_threads=omp,
        namespace=handed.namespace,
        namespace_payload=handed.namespace_payload,
        program=program,
        # one machine: a port of 127.0.0.1, reserved when the plan is carried out (nbspawn._effects)
        master_port=placement.master_port if placement else 0,
        master_addr=placement.master_addr if placement else _listen.LOOPBACK,
        rank_offset=placement.rank_offset if placement else 0,
        world_size=placement.world_size if placement else 0,
        node_rank=placement.node_rank if placement else 0,
        nnodes=placement.nnodes if placement else 1,
        kernel_env=dict(os.environ) if method == "forkserver" else None,
        hosts_store=placement is None or placement.node_rank == 0,
        accelerator_envs=tpu.rank_envs if tpu else (),
        unset_env=_tpu.LAUNCHER_KEYS if tpu else (),
    )


def run_directory(log_dir: str | None, run_id: str) -> str:
    """``<log-dir>/<run-id>``: under the user's directory, else under a new temporary one."""
    base = os.path.abspath(os.path.expanduser(log_dir)) if log_dir else tempfile.mkdtemp(prefix="nbspawn-")
    return os.path.join(base, run_id)
