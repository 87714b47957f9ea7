"""Kept worlds: ranks that live across cells.

    %%spawn --world w -n 4 --backend gloo      # the first cell naming w starts its 4 ranks
    import torch.distributed as dist
    t = torch.ones(1) * dist.get_rank()

    %%spawn --world w                          # the same processes; t is still there
    dist.all_reduce(t); print(t)

    %spawn status                              # the kept worlds
    %spawn stop w                              # nothing of w is left but its logs

A :class:`World` owns its rank processes (started by ``torch.multiprocessing.start_processes`` with
``nbspawn.ranks._world.run_world_rank``) and one pipe per rank.  Each cell on it is an ordinary run
(its own spec, log directory, view and error) whose executor, :class:`WorldCell`, hands the cell to
the ranks instead of starting new ones.  The supervisor applies the same failure policy as to a
fresh run, except that a failed cell *interrupts* the other ranks: if all of them come back within
the grace period the world lives on, else it is torn down the fresh way and the error says so.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from .._run import Run
from .._spec import RunSpec, new_run_id
from ..errors import SpawnUsageError
from ..ranks._world import EXITED, INTERRUPTED, OK, RAISED, STARTED, WorldJob, run_world_rank
from . import _reaper

STOP_WAIT = 5.0  # how long ``stop`` waits for ranks to leave on their own before killing them


@dataclass
class World:
    """A set of rank processes that run cell after cell, until stopped or lost."""

    name: str
    spec: RunSpec  # how it was started: nprocs, start method, backend, env, ports, the between-cells logs
    base_dir: str  # where its cells' <run-id>/ directories go
    processes: list[Any] = field(default_factory=list)
    conns: list[Any] = field(default_factory=list)
    cells: int = 0
    state: str = "starting"  # starting | idle | running | lost | stopped
    started_at: float = field(default_factory=time.time)
    lost_because: str | None = None
    killed: bool = False

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def log_dir(self) -> str:
        """What the ranks print between cells goes to <log_dir>/<rank>/."""
        return self.spec.run_dir

    def settings(self) -> str:
        env = " ".join(f"--env {k}={v}" for k, v in self.spec.env.items())
        return f"-n {self.spec.nprocs} --start-method {self.spec.start_method} --backend {self.spec.backend}" + (
            f" {env}" if env else ""
        )

    def start(self) -> None:
        from torch.multiprocessing import start_processes

        from ._supervisor import _interrupts_deferred, _prepare_forkserver

        spec = self.spec
        os.makedirs(spec.run_dir, exist_ok=True)
        for rank in range(spec.nprocs):
            os.makedirs(spec.rank_dir(rank), exist_ok=True)
        pipes = [multiprocessing.Pipe() for _ in range(spec.nprocs)]
        if spec.start_method == "forkserver":
            _prepare_forkserver()
        with _interrupts_deferred():
            context = start_processes(
                run_world_rank,
                args=(spec, [child for _parent, child in pipes]),
                nprocs=spec.nprocs,
                join=False,
                daemon=False,
                start_method=spec.start_method,
            )
        for _parent, child in pipes:
            child.close()
        self.processes = list(context.processes)
        self.conns = [parent for parent, _child in pipes]
        self.state = "idle"
        _reaper.watch(self.pids)

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Ask every rank to leave (its process group is destroyed), then make sure nothing is left."""
        if self.state in ("stopped",):
            return
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        deadline = time.monotonic() + wait
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self.kill()
        if self.state != "lost":
            self.state = "stopped"

    def kill(self) -> None:
        """Every rank and whatever it started, killed and reaped; pipes closed."""
        from ._supervisor import _signal_group

        if self.killed:
            return
        self.killed = True
        pids = [process.pid for process in self.processes if process.pid is not None]
        for process in self.processes:
            if process.exitcode is None:
                _signal_group(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.join()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(ValueError):
                process.close()
        for conn in self.conns:
            conn.close()
        self.conns = []
        _reaper.forget(pids)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ranks": self.spec.nprocs,
            "pids": self.pids if self.state not in ("stopped", "lost") else [],
            "state": self.state,
            "cells": self.cells,
            "start_method": self.spec.start_method,
            "backend": self.spec.backend,
            "age": time.time() - self.started_at,
            "logs": self.log_dir,
        }


class WorldCell:
    """The executor of one cell on a kept world (see ``nbspawn.executors._supervisor.Executor``)."""

    keeps_ranks = True

    def __init__(self, world: World, job: WorldJob) -> None:
        self.world = world
        self.job = job
        self.started: set[int] = set()  # ranks that said they run the cell (and can be interrupted)
        self.held: dict[int, int] = {}  # rank -> SIGINT held until it has started the cell

    def signal(self, rank: int, sig: int) -> None:
        """A rank that has not begun the cell would ignore SIGINT (idle ranks do): hold it until it has."""
        from ._supervisor import _signal_group

        if sig == signal.SIGINT and rank not in self.started:
            self.held[rank] = sig
            return
        _signal_group(self.world.pids[rank], sig)

    def start(self, run: Run) -> list[int]:
        self.world.state = "running"
        self.world.cells += 1
        run.world, run.world_cell = self.world.name, self.world.cells
        for conn in self.world.conns:
            conn.send(self.job)
        return self.world.pids

    def waitables(self, rank: int) -> list[Any]:
        return [self.world.conns[rank], self.world.processes[rank].sentinel]

    def ended(self, rank: int, ready: Any) -> tuple[int, bool] | None:
        from ..ranks._cell import EXIT_INTERRUPTED, EXIT_RAISED

        conn = self.world.conns[rank]
        if ready is conn:
            try:
                outcome, code = conn.recv()
            except (EOFError, OSError):
                pass  # the rank is gone: its sentinel says how
            else:
                if outcome == STARTED:
                    self.started.add(rank)
                    if rank in self.held:
                        self.signal(rank, self.held.pop(rank))
                    return None
                return {OK: 0, RAISED: EXIT_RAISED, INTERRUPTED: EXIT_INTERRUPTED, EXITED: code}.get(outcome, 1), False
        process = self.world.processes[rank]
        process.join()
        return process.exitcode or 0, True

    def cleanup(self, lose: bool) -> None:
        world = self.world
        if lose:
            world.kill()
            world.state = "lost"
            _worlds.pop(world.name, None)
        else:
            world.state = "idle"


_worlds: dict[str, World] = {}


def worlds() -> dict[str, World]:
    """The kept worlds of this process, by name."""
    return dict(_worlds)


def get_or_start(name: str, spec: RunSpec, given: set[str]) -> tuple[World, bool]:
    """The world ``name``, checked against the options the cell gave; started with ``spec`` if new."""
    if not name.strip() or any(c.isspace() for c in name):
        raise SpawnUsageError(f"--world needs a name without spaces, not {name!r}")
    world = _worlds.get(name)
    if world is not None:
        clash = [
            f"{option} {mine}"
            for option, mine, theirs in (
                ("-n", spec.nprocs, world.spec.nprocs),
                ("--start-method", spec.start_method, world.spec.start_method),
                ("--backend", spec.backend, world.spec.backend),
                ("--env", spec.env, world.spec.env),
            )
            if option in given and mine != theirs
        ]
        if clash:
            raise SpawnUsageError(
                f"world {name!r} runs with {world.settings()}; this cell asks for {', '.join(clash)}. "
                f"Leave those options out, or %spawn stop {name} first."
            )
        return world, False
    world_id = f"{spec.run_id}-world-{name}"
    base = os.path.dirname(spec.run_dir) if spec.run_dir else tempfile.mkdtemp(prefix="nbspawn-")
    wspec = _world_spec(spec, world_id, base)
    world = World(name=name, spec=wspec, base_dir=base)
    world.start()
    _worlds[name] = world
    return world, True


def _world_spec(spec: RunSpec, world_id: str, base: str) -> RunSpec:
    from dataclasses import replace

    return replace(spec, run_id=world_id, run_dir=os.path.join(base, world_id), namespace=None, namespace_payload=None)


def cell_spec(world: World, spec: RunSpec) -> RunSpec:
    """The spec of one cell on ``world``: its own run id and logs, the world's processes and settings."""
    from dataclasses import replace

    run_id = new_run_id()
    return replace(
        spec,
        run_id=run_id,
        run_dir=os.path.join(world.base_dir, run_id),
        nprocs=world.spec.nprocs,
        start_method=world.spec.start_method,
        backend=world.spec.backend,
        env=world.spec.env,
        master_port=world.spec.master_port,
        rich=world.spec.rich,
    )


def prepare_cell(
    name: str,
    cell: Any,
    namespace: dict[str, Any],
    *,
    hidden: dict[str, Any] | None,
    share: Any,
    out: Any,
    given: set[str],
    rich: bool,
    **options: Any,
) -> tuple[RunSpec, WorldCell]:
    """Everything checked first (options, names, what the cell uses), then the world found or started."""
    from .._spec import build_spec
    from ..handoff._names import pack_namespace, parse_names, pick_shared
    from ..handoff._shm import new_run_prefix, share_

    share_names, out_names = parse_names(share, "--share"), parse_names(out, "--out")
    existing = _worlds.get(name)
    if existing is not None and "-n" not in given:
        options["nprocs"] = existing.spec.nprocs  # nothing to resolve: the world has its ranks
    spec = build_spec(cell, **options)
    method = existing.spec.start_method if existing is not None else spec.start_method
    shared = pick_shared(share_names, namespace, method)
    payload = pack_namespace(cell.parse(), namespace, hidden, shared)
    spec.rich = rich
    world, _new = get_or_start(name, spec, given)
    cspec = cell_spec(world, spec)
    cspec.out_names = out_names
    cspec.shm_prefix = new_run_prefix() if out_names else None
    share_(list(shared.values()))
    job = WorldJob(cell, cspec.run_dir, cspec.run_id, payload, out_names, cspec.shm_prefix)
    return cspec, WorldCell(world, job)


def stop(names: list[str] | None = None) -> list[str]:
    """Stop these worlds (all, if None); returns the names stopped. An unknown name is a usage error."""
    chosen = names or list(_worlds)
    unknown = [n for n in chosen if n not in _worlds]
    if unknown:
        known = ", ".join(sorted(_worlds)) or "none"
        raise SpawnUsageError(f"no kept world named {unknown[0]!r} (kept worlds: {known})")
    for name in chosen:
        _worlds.pop(name).stop()
    return chosen


@atexit.register
def _stop_all_at_exit() -> None:
    """Kernel shutdown: every world leaves (its ranks would die with the kernel anyway, pdeathsig)."""
    for world in list(_worlds.values()):
        with contextlib.suppress(Exception):
            world.stop(wait=1.0)
    _worlds.clear()
