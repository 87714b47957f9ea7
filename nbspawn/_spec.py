"""What a run is asked to do, validated and frozen before any process starts.

A :class:`RunSpec` is made once, by the dispatch (``nbspawn._dispatch``), and never changed after: the
supervisor, the executors, the views and the ranks only read it.  It is plain data: under spawn and
forkserver it is pickled into every rank.  What differs per rank (its directory, its environment) is
computed from it.

What the ranks are is decided before a spec is made (``nbspawn._decide``, from this machine's facts:
``nbspawn._machine``); :func:`build_spec` puts the decided parts together.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from . import _listen
from ._program import Program
from ._rankdir import RankDir
from ._request import Settings
from ._runsize import ranks_within
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
class Ranks:
    """What the ranks on this machine are, as decided (``nbspawn._decide.decide_ranks``) from the settings
    and this machine's facts: a :class:`RunSpec` is a cell's part, these, and where they sit."""

    nprocs: int  # ranks on this machine (a cluster run's kernel: every node's)
    start_method: str
    backend: str  # resolved: none | gloo | nccl
    omp_threads: int | None = None  # None: the user set OMP_NUM_THREADS
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
    # what a launcher adds to every rank's environment, decided with the ranks from the kernel's environment
    # and the user's --env (nbspawn._decide), so a rank computes its environment from the spec alone:
    # torchrun's (TORCH_NCCL_ASYNC_ERROR_HANDLING), the loopback interface for gloo's and NCCL's sockets
    # (used where the store is on loopback: every rank on this machine), and the names of NCCL's
    # flight-recorder dump file this torch reads, set to each rank's directory (none where the user named one)
    launch_env: dict[str, str] = field(default_factory=dict)
    loopback_env: dict[str, str] = field(default_factory=dict)
    dump_file_keys: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what deciding found worth saying (fork passed over, a backend's choice)


@dataclass(frozen=True)
class Placement:
    """Where ranks sit in a world of several nodes: one node's (its agent hosts the store on node 0), or
    the kernel's view of a whole cluster run (it starts no rank and hosts nothing)."""

    master_addr: str
    master_port: int
    rank_offset: int
    world_size: int
    node_rank: int
    nnodes: int
    # the executor here hosts the store, once every rank is started (a forked rank would inherit the
    # connections it accepted): a run on this machine alone, or node 0 of a cluster
    hosts_store: bool

    @classmethod
    def alone(cls) -> Placement:
        """Ranks of this machine alone: the store on loopback, hosted here, its port reserved when the
        plan is carried out (0 until then: ``nbspawn._effects``)."""
        return cls(_listen.LOOPBACK, 0, 0, 0, 0, 1, hosts_store=True)


@dataclass(frozen=True, kw_only=True)
class RunSpec(CellPart, Ranks):
    """A run: the cell's part (:class:`CellPart`: its id, source and options), what its ranks are
    (:class:`Ranks`), the names handed to them and where they sit."""

    env: dict[str, str] = field(default_factory=dict)  # user's --env
    parent_pid: int = 0  # the kernel; a rank whose parent is gone exits at once
    # fork: the kernel's namespace itself (the child gets a copy-on-write copy); spawn/forkserver:
    # the names the cell uses, pickled by value.
    namespace: dict[str, object] | None = None
    namespace_payload: Payload | None = None  # pickled into each rank as it starts
    program: Program | None = None  # the ranks run it instead of a cell
    # Where these ranks sit in the world (read through the properties below).  The ranks never host the
    # TCPStore: they join it as clients (TORCHELASTIC_USE_AGENT_STORE), at master_addr:master_port, where
    # their launcher hosts it bound to that address only (nbspawn._listen).  One node of a cluster run
    # (nbspawn.cluster): this node's ranks are RANK rank_offset.., of world_size in all; node 0's agent
    # hosts the store.
    placement: Placement = field(default_factory=Placement.alone)

    @property
    def master_port(self) -> int:
        """0: this machine's port, not reserved yet (``nbspawn._effects`` reserves it)."""
        return self.placement.master_port

    @property
    def master_addr(self) -> str:
        return self.placement.master_addr

    @property
    def rank_offset(self) -> int:
        return self.placement.rank_offset

    @property
    def world_size(self) -> int:
        """0: nprocs (one node)."""
        return self.placement.world_size

    @property
    def node_rank(self) -> int:
        return self.placement.node_rank

    @property
    def nnodes(self) -> int:
        return self.placement.nnodes

    @property
    def hosts_store(self) -> bool:
        return self.placement.hosts_store

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
        """Whether the ranks record their collectives (:func:`cell_xray`)."""
        return cell_xray(self.asked, self.program)[0]

    @property
    def xray_values(self) -> bool:
        """Whether the ranks also write down the values of its small tensors (:func:`cell_xray`)."""
        return cell_xray(self.asked, self.program)[1]

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
        env.update(self.launch_env)  # what torchrun's agent sets for NCCL
        # a store on loopback: every rank is on this machine, so gloo's and NCCL's sockets are on loopback
        # too (NVLink, P2P, SHM are no sockets)
        if self.master_addr == _listen.LOOPBACK:
            env.update(self.loopback_env)
        env.update(self.env)
        if self.omp_threads is not None:  # after --env: a fork-safety override wins over the user's
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        return env

    def own_env(self, rank: int) -> dict[str, str]:
        env = {
            "RANK": str(self.rank_offset + rank),
            "LOCAL_RANK": str(rank),
            "ROLE_RANK": str(self.rank_offset + rank),
        }
        if self.program is not None:  # a program's rank begins no cell (ranks._cell.begin_cell): it starts with its variables
            env.update(cell_env(self.asked, self.rank_dir(rank)))
        env.update(dict.fromkeys(self.dump_file_keys, RankDir(self.rank_dir(rank)).nccl_trace_prefix))
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


def cell_env(asked: Settings, rank_dir: str) -> dict[str, str]:
    """What a cell puts in its rank's environment for itself alone, set as the cell begins on a fresh
    rank and on a kept world's rank alike (``ranks._cell.begin_cell``), so a world's later cell has its
    own and not its first cell's: where torch and the rank write its failure (``TORCHELASTIC_ERROR_FILE``,
    in the rank's directory of this cell).  A cell option its ranks should see as a variable is a line
    here, from ``asked`` (the cell's options as the door read them), and reaches every kind of rank."""
    del asked  # no cell option is a variable of the ranks' yet
    return {"TORCHELASTIC_ERROR_FILE": RankDir(rank_dir).error}


def cell_xray(asked: Settings, program: Program | None = None) -> tuple[bool, bool]:
    """Whether a cell's ranks record its collectives (``ranks._xray``), and whether they also write down
    the values of its small tensors before and after each (``ranks._xray_values``): the one rule for a
    fresh cell, a program and a kept world's cell.  ``--xray`` (on by default) records the group nbspawn
    makes (``--backend``) or the ones the cell makes itself, and a Python program's from the first group
    it makes (an executable's process is its own: nothing of nbspawn's runs in it).  ``values`` is for
    cells only: it needs torch.distributed's functions wrapped before the code takes them, and a
    program's rank imports no torch before the program does."""
    on = asked.xray != "off" and (program is None or program.python)
    return on, on and asked.xray == "values" and program is None


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


def build_spec(
    cell: CellSource,
    settings: Settings,
    ranks: Ranks,
    *,
    rich: bool,
    handed: Handoff | None = None,
    program: Program | None = None,
    cell_numbers: Mapping[str, int] | None = None,
    run_id: str | None = None,
    placement: Placement | None = None,
) -> RunSpec:
    """The spec of ranks on this machine, made of what was decided: the ranks (``nbspawn._decide``), the
    kernel's names handed over for their start method (``handed``), the cell's part, and where they sit
    (``placement``: a cluster node's; else this machine alone).  The one way such a spec is made (a fresh
    cell, a program, a new world, a cluster node's ranks); it decides nothing and probes nothing.

    Nothing is created on disk here but the temporary log directory; a run on this machine alone gets
    its port when its plan is carried out (``nbspawn._effects.reserve_port``).
    """
    handed = handed or Handoff()
    shown = ranks_within(settings.ranks, ranks.nprocs, "--ranks", f"a run of {ranks.nprocs} ranks")
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
        notes=ranks.notes,
    )
    return spec_of(part, ranks, settings.env, handed=handed, program=program, placement=placement)


def spec_of(
    part: CellPart,
    ranks: Ranks,
    env: Mapping[str, str],
    *,
    handed: Handoff | None = None,
    program: Program | None = None,
    placement: Placement | None = None,
) -> RunSpec:
    """The one constructor of a :class:`RunSpec`: a cell's part, its ranks (``env``: the user's ``--env``),
    the names handed to them and where they sit (``placement``; None: this machine alone, whose port is
    reserved when the plan is carried out, ``nbspawn._effects``).  :func:`build_spec` makes the part for
    ranks of this machine; a cluster run's kernel (``planning._cluster``) makes its own."""
    handed = handed or Handoff()
    return RunSpec(
        **{**vars(ranks), **vars(part)},  # the cell's notes are the ranks' (cell_part above)
        env=dict(env),
        parent_pid=os.getpid(),
        namespace=handed.namespace,
        namespace_payload=handed.namespace_payload,
        program=program,
        placement=placement or Placement.alone(),
    )


def run_directory(log_dir: str | None, run_id: str) -> str:
    """``<log-dir>/<run-id>``: under the user's directory, else under a new temporary one."""
    base = os.path.abspath(os.path.expanduser(log_dir)) if log_dir else tempfile.mkdtemp(prefix="nbspawn-")
    return os.path.join(base, run_id)
