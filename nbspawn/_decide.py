"""What the ranks are, decided from the request's settings and this machine's facts: how many, how
they start, which backend, their OpenMP threads, their accelerators' environments.

:func:`decide_ranks` is the one decision, pure given its :class:`~nbspawn._machine.Machine` (whose facts
it asks only as a decision needs them): a fresh cell, a program, a new world and a cluster node's ranks
take it; a world's ``-n auto`` and ``--backend auto`` are the same rules on the world's machine.  A plan
is then the ranks decided, the names handed over for their start method, and the cell's part
(``nbspawn._spec.build_spec``).
"""

from __future__ import annotations

from . import _capacity, _cuda, _tpu
from ._machine import Machine
from ._options import Backend, StartMethod
from ._program import Program
from ._request import Settings
from ._spec import Ranks


def decide_ranks(settings: Settings, machine: Machine, program: Program | None = None) -> Ranks:
    """The ranks ``settings`` ask for on ``machine``, cheapest check first (``-n 99999`` is refused
    before any GPU is counted).  A program's ranks start with spawn and set up their own group."""
    method, notes = choose_start_method("spawn" if program is not None else settings.start_method, machine)
    tpu: _tpu.TpuPlan | None = None
    if _tpu.tpu_wanted(settings.accelerator, lambda: machine.xla_installed, lambda: machine.tpu_chips):
        up = machine.xla_runtime_up
        _tpu.refuse_runtime_up(up is not None, up or "")
        tpu = machine.tpu_ranks(None if settings.nprocs == "auto" else int(settings.nprocs))
        notes.extend(tpu.notes)
        n = len(tpu.rank_envs)
    else:
        n = resolve_nprocs(settings.nprocs, machine)
    _capacity.refuse_beyond(n, method, machine.room(n))  # -n 99999: one line, before any directory or process is made
    backend = "none"  # a program sets up its own group
    if program is None:
        backend, note = backend_here_noted(settings.backend, n, machine)
        notes.extend([note] if note else [])
    omp = rank_threads(method, n, machine, notes)
    return Ranks(
        nprocs=n,
        start_method=method,
        backend=backend,
        omp_threads=omp,
        # forkserver: the kernel's environment now (nbspawn._spec.RunSpec.kernel_env says why)
        kernel_env=dict(machine.environ) if method == "forkserver" else None,
        accelerator_envs=tpu.rank_envs if tpu else (),
        unset_env=_tpu.LAUNCHER_KEYS if tpu else (),
        launch_env=_cuda.torchrun_env(machine.user_env, machine.environ),
        loopback_env=_cuda.socket_interface_env(machine.loopback, machine.user_env, machine.environ),
        dump_file_keys=_cuda.dump_file_keys(machine.user_env, machine.environ, renamed=machine.recorder_renamed),
        notes=tuple(notes),
    )


def auto_nprocs(gpus: int, cpus: int) -> int:
    """What ``-n auto`` means on a machine: one rank per GPU, else up to 4 CPU ranks (never more than the cores)."""
    return gpus if gpus else max(1, min(4, cpus))


def resolve_nprocs(n: int | str, machine: Machine) -> int:
    """``-n`` (read at the door) on ``machine``: ``auto`` counted there."""
    if n != "auto":
        return int(n)
    return auto_nprocs(machine.gpus, machine.cpus)


def rank_threads(method: str, nprocs: int, machine: Machine, notes: list[str]) -> int | None:
    """OMP_NUM_THREADS for the ranks (None: the user's own stands), cores // ranks as torchrun does."""
    user_value = machine.user_env.get("OMP_NUM_THREADS", machine.environ.get("OMP_NUM_THREADS"))
    if user_value is None:
        wanted = max(1, machine.cpus // nprocs)
        threads: int | None = wanted
    else:
        wanted = int(user_value) if user_value.isdigit() else 1
        threads = None
    if method == "fork" and wanted > 1 and machine.openmp_started:
        if user_value is not None:
            notes.append(
                f"nbspawn: forked ranks run with OMP_NUM_THREADS=1, not {user_value}: this kernel already "
                "started OpenMP threads, and OpenMP is not fork-safe (a forked rank would hang in its first "
                "parallel op). Use --start-method forkserver to keep more threads per rank."
            )
        return 1
    return threads


def choose_start_method(requested: StartMethod, machine: Machine) -> tuple[str, list[str]]:
    """Fork where forked ranks could use everything this machine has (fast, and the cell sees the
    kernel's names), else forkserver; fork's facts are asked only where fork is in question
    (``nbspawn._cuda.decide_start_method``)."""
    available = list(machine.start_methods)
    blocker = machine.fork_blocker if requested in ("auto", "fork") and "fork" in available else None
    return _cuda.decide_start_method(requested, available, blocker)


def backend_here(backend: Backend, nprocs: int, machine: Machine) -> str:
    """The backend for ``nprocs`` ranks on ``machine`` (``nbspawn._cuda.resolve_backend``: the one rule)."""
    return backend_here_noted(backend, nprocs, machine)[0]


def backend_here_noted(backend: Backend, nprocs: int, machine: Machine) -> tuple[str, str | None]:
    """The backend on ``machine``, and a note if ``auto`` passed over the GPUs (``nbspawn._cuda.resolve_backend``),
    the GPUs counted only if the rule needs them."""
    if backend in ("none", "gloo"):
        return backend, None
    return _cuda.resolve_backend(backend, nprocs, machine.gpus)
