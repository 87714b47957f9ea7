"""This machine's facts, as the ranks it starts would meet them: its CPUs (affinity and cgroup quota), the
GPUs the ranks would see, the start methods it offers and whether fork is safe now, its TPU chips and
their topology (and whether the kernel's XLA runtime holds them), the kernel's environment.  The
planners decide from these (``nbspawn._decide``) and probe nothing themselves.

A :class:`Machine` is made once per plan (``Machine.here``) and is frozen; each fact is probed the first
time a decision asks for it and only then (counting GPUs may ask NVML; fork's facts matter only where
fork is in question), or given instead (``told``): a test's fake machine, a cluster node's own report.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypedDict

from . import _capacity, _cuda, _listen, _tpu


class Told(TypedDict, total=False):
    """Facts known already, used instead of a probe (each may be left out: then it is probed)."""

    cpus: int
    gpus: int
    start_methods: tuple[str, ...]
    fork_blocker: str | None  # why fork would be unsafe now (None: it is safe)
    openmp_started: bool
    room: _capacity.Room  # what bounds how many ranks it holds (open files, tasks, memory)
    loopback: str | None  # the loopback interface's name (lo)
    recorder_renamed: bool  # the torch here has the generic FlightRecorder (TORCH_FR_* names)
    xla_installed: bool  # torch_xla can be imported here
    tpu_chips: int  # the TPU chips --accelerator auto would use (nbspawn._tpu.auto_chips)
    xla_runtime_up: str | None  # the kernel's XLA runtime is up (holding the TPU): where it came up ("" unknown); None: not up
    tpu_plan: _tpu.TpuPlan  # the TPU ranks' topology, whatever -n (a test's host)


@dataclass(frozen=True)
class Machine:
    """This machine's facts for one plan, each probed once, when first asked (or ``told``)."""

    user_env: Mapping[str, str] = field(default_factory=dict)  # the cell's --env: what the ranks see over the kernel's
    environ: Mapping[str, str] = field(default_factory=dict)  # the kernel's environment as the plan was made
    told: Told = field(default_factory=Told)

    @classmethod
    def here(cls, user_env: Mapping[str, str] | None = None) -> Machine:
        """This machine now, for ranks given ``user_env``: every fact probed when first asked."""
        return cls(dict(user_env or {}), dict(os.environ))

    def with_user_env(self, user_env: Mapping[str, str]) -> Machine:
        """The same machine for ranks given another ``--env`` (a kept world's own, a lost world's as it
        starts again): the same kernel environment and told facts, the rest probed when asked."""
        return Machine(dict(user_env), self.environ, self.told)

    @cached_property
    def cpus(self) -> int:
        """The CPUs this process may use (:func:`usable_cpus`)."""
        return self.told["cpus"] if "cpus" in self.told else usable_cpus()

    @cached_property
    def gpus(self) -> int:
        """GPUs the ranks will see (their ``CUDA_VISIBLE_DEVICES``: the user's ``--env``, else the
        kernel's), counted without poisoning fork (``nbspawn._cuda.gpu_count``: never the CUDA runtime
        in the kernel; ``torch.cuda.device_count()`` falls back on it where NVML cannot answer)."""
        if "gpus" in self.told:
            return self.told["gpus"]
        return _cuda.gpu_count(self.visible_devices)

    @cached_property
    def start_methods(self) -> tuple[str, ...]:
        """The start methods Python offers here."""
        if "start_methods" in self.told:
            return self.told["start_methods"]
        return tuple(multiprocessing.get_all_start_methods())

    @cached_property
    def fork_blocker(self) -> str | None:
        """Why forked ranks could not use everything this machine has now (CUDA initialized in the
        kernel, ...), or None; asked only where fork is in question (``nbspawn._cuda.fork_facts``)."""
        if "fork_blocker" in self.told:
            return self.told["fork_blocker"]
        return _cuda.fork_blocker(_cuda.fork_facts(self.gpus))

    @cached_property
    def openmp_started(self) -> bool:
        """Whether this kernel started OpenMP's thread pool (:func:`openmp_pool_started`)."""
        if "openmp_started" in self.told:
            return self.told["openmp_started"]
        return openmp_pool_started()

    @cached_property
    def loopback(self) -> str | None:
        """This machine's loopback interface (``lo``): where gloo's and NCCL's sockets go on one machine."""
        return self.told["loopback"] if "loopback" in self.told else _listen.loopback_interface()

    @cached_property
    def recorder_renamed(self) -> bool:
        """Whether the torch imported here names its flight recorder's variables ``TORCH_FR_*``
        (``nbspawn._cuda.recorder_renamed``): its ranks run the same torch."""
        return self.told["recorder_renamed"] if "recorder_renamed" in self.told else _cuda.recorder_renamed()

    @cached_property
    def xla_installed(self) -> bool:
        """Whether torch_xla could be imported here (asked without importing it)."""
        return self.told["xla_installed"] if "xla_installed" in self.told else _tpu.installed()

    @cached_property
    def tpu_chips(self) -> int:
        """The chips ``--accelerator auto`` would use (``nbspawn._tpu.auto_chips``: 0 off a TPU host,
        where torch_xla is not even imported to look)."""
        return self.told["tpu_chips"] if "tpu_chips" in self.told else _tpu.auto_chips(self.environ)

    @cached_property
    def xla_runtime_up(self) -> str | None:
        """Whether the kernel's XLA runtime is up (then it holds the TPU): the cell where it came up
        ("" when unknown), or None."""
        if "xla_runtime_up" in self.told:
            return self.told["xla_runtime_up"]
        return _tpu.culprit() if _tpu.runtime_initialized() else None

    def tpu_ranks(self, nprocs: int | None) -> _tpu.TpuPlan:
        """``nprocs`` TPU ranks' environments (None: one per chip), as torch_xla's launcher gives them
        from this host's topology (``nbspawn._tpu.plan_tpu``)."""
        if "tpu_plan" in self.told:
            return self.told["tpu_plan"]
        return _tpu.plan_tpu(self.environ, self.user_env, nprocs)

    def room(self, nprocs: int) -> _capacity.Room:
        """What bounds ``nprocs`` ranks here (``nbspawn._capacity.this_machine``: what takes more than a
        few system calls is asked only when ``nprocs`` could come near its bound)."""
        return self.told["room"] if "room" in self.told else _capacity.this_machine(nprocs)

    @property
    def visible_devices(self) -> str | None:
        """The ranks' ``CUDA_VISIBLE_DEVICES``: the user's ``--env``, else the kernel's."""
        return _cuda.ranks_visible(self.user_env, self.environ)


# -- the probes ---------------------------------------------------------------------------------------


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
