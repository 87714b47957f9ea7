"""Kept worlds, wherever their ranks live: the one world concept, its lost record and its registry.

A kept world is a set of ranks that run cell after cell.  Its ranks are *here* (``executors._world.World``:
this machine's processes) or on *a cluster's nodes* (``cluster._clusterworld.ClusterWorld``: a local
world on each node); everything else is the same, and written once here:

- :class:`KeptWorld`: its name, spec, state, cells and owned names; how it runs (:meth:`KeptWorld.settled`,
  the one settings text, the one check's facts); its ``%spawn status`` row; how it is lost.
- :class:`Lost`: a world that was lost, as its next cell starts it again (where, and with what).
- The registry: the worlds of this process by name, and those lost.  A world joins it when its first
  cell starts it (:func:`keep`), and nothing joins it by being imported: ipyparallel is loaded only
  for a cluster, and a kernel with no cluster world never imports ``cluster``.
"""

from __future__ import annotations

import atexit
import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

from .._clash import Settled, fixed_of
from .._machine import Machine
from .._request import RunRequest, Settings
from .._spec import RunSpec
from ..errors import SpawnUsageError

WorldState = Literal["starting", "idle", "running", "lost", "stopped"]


@dataclass(frozen=True)
class Lost:
    """A kept world that was lost: why, and how its next cell starts it again (with whatever options
    that cell gives itself, ``planning._kept_cell.as_before``)."""

    why: str | None
    settings: Settings  # what it ran with, as its next cell asks for it again
    cluster: str | None = None  # the kernel variable holding the cluster's client; None: this machine
    nodes: int | None = None  # --nodes as it was asked (None: every node)


@dataclass
class KeptWorld(ABC):
    """What every kept world is, here or on a cluster's nodes; its subclass says where its ranks are."""

    on_cluster: ClassVar[bool] = False  # where its ranks are: here, or on a cluster's nodes
    stop_wait: ClassVar[float] = 5.0  # how long its ranks may take to leave when it is stopped
    exit_wait: ClassVar[float] = 1.0  # and when the kernel shuts down

    name: str
    spec: RunSpec  # how it was started (its first cell's): ranks, start method, backend, environment
    state: WorldState = field(default="starting", kw_only=True)
    cells: int = field(default=0, kw_only=True)
    started_at: float = field(default_factory=time.time, kw_only=True)
    lost_because: str | None = field(default=None, kw_only=True)
    # names its cells bind (at their top level, whether they ran to the end or not): the world's own,
    # which the kernel never sends it again (``handoff._names``)
    owned: set[str] = field(default_factory=set, kw_only=True)

    # -- where its ranks are: each place says ---------------------------------------------------------

    @abstractmethod
    def settled(self) -> Settled:
        """How it runs, fixed for its life (``nbspawn._clash``): what a cell may not change."""

    @abstractmethod
    def auto_nprocs(self, here: Machine) -> int:
        """What ``-n auto`` comes to on its machines (``here``: this machine's facts, as the planner has
        them; a world on a cluster's nodes answers from the facts its nodes reported)."""

    @abstractmethod
    def auto_backend(self, nprocs: int, here: Machine) -> str:
        """What ``--backend auto`` comes to for ``nprocs`` ranks on its machines (``here``: as above)."""

    def refuse_if_lost(self) -> None:
        """Before a cell is planned on it: a world whose ranks died since its last cell is lost now, and
        the cell refused in one line (here: a rank process that died; a cluster's nodes are heard by
        their heartbeat)."""
        return

    def place_clashes(self, request: RunRequest) -> list[str]:
        """The options of a cell that name another place than the world's (none, here)."""
        return []

    @abstractmethod
    def lost_record(self, why: str | None) -> Lost:
        """How its next cell starts it again, once it is lost."""

    @abstractmethod
    def pids_now(self) -> list[int]:
        """Its ranks' process ids, those it knows."""

    @abstractmethod
    def logs(self) -> str:
        """Where its ranks' logs are, as ``%spawn status`` shows it."""

    @abstractmethod
    def where(self) -> str:
        """Where its ranks are now, titled with the world's name (``%spawn where``)."""

    @abstractmethod
    def leave(self, wait: float) -> None:
        """Every rank leaves, given up to ``wait`` seconds to do so on its own; nothing of it is left."""

    @abstractmethod
    def end(self) -> None:
        """Nothing of it is left running, at once: it was lost."""

    # -- the same everywhere ---------------------------------------------------------------------

    def settings(self) -> str:
        """How it runs, as the options that would start it again (one text for every world)."""
        return self.settled().text()

    def status(self) -> dict[str, Any]:
        """Its row of ``%spawn status`` and ``nbspawn.worlds()``."""
        return {
            "name": self.name,
            "ranks": self.spec.nprocs,
            "pids": self.pids_now() if self.state not in ("stopped", "lost") else [],
            "state": self.state,
            "cells": self.cells,
            "start_method": self.settled().start_method,
            "backend": self.spec.backend,
            "age": time.time() - self.started_at,
            "logs": self.logs(),
        }

    def stop(self, wait: float | None = None) -> None:
        """It is stopped: its ranks leave (within ``wait`` seconds, its place's own if None)."""
        if self.state == "stopped":
            return
        self.leave(self.stop_wait if wait is None else wait)
        if self.state != "lost":
            self.state = "stopped"

    def lose(self, why: str | None) -> None:
        """It is lost: out of the registry, remembered as its next cell starts it again, and ended."""
        self.state, self.lost_because = "lost", why
        _worlds.pop(self.name, None)
        _lost[self.name] = self.lost_record(why)
        self.end()


W = TypeVar("W", bound=KeptWorld)

_worlds: dict[str, KeptWorld] = {}
# Worlds lost (a rank or node died, a cell could not be interrupted): the next cell naming one starts
# it again with the same settings, and says that it is a new world.
_lost: dict[str, Lost] = {}
_at_exit: list[bool] = []  # whether the kernel's shutdown stops the worlds (registered with the first)


def keep(world: KeptWorld) -> None:
    """A world that starts now: kept by name until it is stopped or lost."""
    if not _at_exit:
        atexit.register(_stop_all_at_exit)
        _at_exit.append(True)
    _worlds[world.name] = world
    _lost.pop(world.name, None)


def every_world() -> dict[str, KeptWorld]:
    """Every kept world of this process, here and on clusters, by name."""
    return dict(_worlds)


def worlds(kind: type[W]) -> dict[str, W]:
    """The kept worlds of this process of this kind (``executors._world.World``: here), by name."""
    return {name: world for name, world in _worlds.items() if isinstance(world, kind)}


def running(name: str, kind: type[W]) -> W | None:
    """The kept world ``name``, if one of this kind runs (idle between cells, or running one)."""
    world = _worlds.get(name)
    return world if isinstance(world, kind) else None


def running_here(name: str) -> KeptWorld | None:
    """The kept world ``name`` of this machine (``executors._world.World``), if one runs."""
    world = _worlds.get(name)
    return world if world is not None and not world.on_cluster else None


def running_on_a_cluster(name: str) -> KeptWorld | None:
    """The kept world ``name`` on a cluster's nodes (``cluster._clusterworld.ClusterWorld``), if one runs."""
    world = _worlds.get(name)
    return world if world is not None and world.on_cluster else None


def settled_here(spec: RunSpec) -> Settled:
    """How a world here started with ``spec`` runs (its settings text, what a cell may not change)."""
    return Settled(
        nprocs=spec.nprocs, start_method=spec.start_method, backend=spec.backend, env=spec.env, others=fixed_of(spec.asked)
    )


def lost(name: str, on_cluster: bool | None = None) -> Lost | None:
    """How the world ``name`` ran, if it was lost (here, or on a cluster: anywhere if None): its next
    cell starts it again so."""
    record = _lost.get(name)
    if record is None or on_cluster is None:
        return record
    return record if (record.cluster is not None) == on_cluster else None


def on_a_cluster(name: str) -> bool:
    """Whether world ``name`` is (or was, lost) a cluster's: its later cells need not say --cluster."""
    world, record = _worlds.get(name), _lost.get(name)
    return world.on_cluster if world is not None else record is not None and record.cluster is not None


def stop(names: list[str] | None = None) -> list[str]:
    """Stop these worlds, wherever they run (all, if None); returns the names stopped. An unknown
    name is a usage error."""
    chosen = names or list(_worlds)
    unknown = [n for n in chosen if n not in _worlds and n not in _lost]
    if unknown:
        known = ", ".join(sorted(_worlds)) or "none"
        raise SpawnUsageError(f"no kept world named {unknown[0]!r} (kept worlds: {known})")
    for name in chosen:
        _lost.pop(name, None)  # a lost world stopped: the next cell naming it starts afresh, with its own options
        if name in _worlds:
            _worlds.pop(name).stop()
    if names is None:
        _lost.clear()
    return chosen


def _stop_all_at_exit() -> None:
    """Kernel shutdown: every world leaves now (ranks here would die with the kernel anyway, pdeathsig;
    a cluster's agents, hearing no more heartbeats, would stop theirs a few seconds later)."""
    for world in list(_worlds.values()):
        with contextlib.suppress(Exception):
            world.stop(wait=world.exit_wait)
    _worlds.clear()
