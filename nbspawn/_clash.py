"""The one rule for a cell on a kept world that runs: which of its options the world cannot honour.

A world's ranks, start method, backend and environment were settled by its first cell; a later cell
that names one of them must ask for what the world already is, else it is refused (a world that runs
cannot change).  Kept worlds on this machine (``executors._world``) and on a cluster
(``cluster._clusterworld``) both ask :func:`world_clashes`, with typed values on both sides, so the same cell
gets the same answer on either: ``--backend GLOO`` is ``gloo``, ``-n " 2"`` is 2, and ``-n auto``
(``--backend auto``) is what auto comes to for that world (:class:`Autos`: its planner resolved it, from
the facts it has, this machine's GPUs and cores or the nodes' probed facts, before asking here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._options import ROW, WORLD_DEFINING
from ._request import Settings
from .errors import SpawnUsageError

# the world-defining options decided with the ranks (resolved: a count, a start method, a backend; the
# environment): the rule below knows each one's auto.  Any other row that defines a world is fixed as
# its first cell gave it, and compared as it is written (``others``): its row is all it needs here.
DECIDED = ("nprocs", "start_method", "backend", "env")
OTHERS = tuple(name for name in WORLD_DEFINING if name not in DECIDED)


def fixed_of(settings: Settings) -> dict[str, Any]:
    """The other world-defining options (:data:`OTHERS`) as a world's first cell gave them: how it runs."""
    return {name: getattr(settings, name) for name in OTHERS}


@dataclass(frozen=True)
class Settled:
    """What a running world is: fixed for its life."""

    nprocs: int  # ranks (a cluster world: ranks per node, as -n says)
    start_method: str  # fork | spawn | forkserver (a cluster's nodes may differ: "fork/forkserver")
    backend: str  # resolved: none | gloo | nccl
    env: Mapping[str, str]  # the user's --env
    nodes: int | None = None  # a cluster world's nodes; None on this machine
    others: Mapping[str, Any] = field(default_factory=dict)  # the other world-defining options (fixed_of)

    def text(self) -> str:
        """How the world runs, as the options that start it: one text for worlds here and on clusters."""
        nodes = f"--nodes {self.nodes} " if self.nodes is not None else ""
        env = "".join(f" --env {k}={v}" for k, v in self.env.items())
        others = "".join(
            f" {ROW[name].spelled} {value}" for name, value in self.others.items() if value != ROW[name].typed_default
        )
        return f"{nodes}-n {self.nprocs} --start-method {self.start_method} --backend {self.backend}{env}{others}"


@dataclass(frozen=True)
class Asked:
    """What a cell asks of the world it runs on, parsed and typed; None where the cell did not say."""

    nprocs: int | str | None = None  # a count, or "auto"
    start_method: str | None = None  # fork | spawn | forkserver | auto
    backend: str | None = None  # none | gloo | nccl | auto
    env: Mapping[str, str] | None = None
    nodes: int | None = None
    others: Mapping[str, Any] = field(default_factory=dict)  # the other world-defining options it gave


def asked_of(settings: Settings, nodes: int | None = None) -> Asked:
    """What a cell's settings ask of a world: the options the user gave (``Settings.given``), and
    ``--nodes`` (None: not given)."""
    given = settings.given
    return Asked(
        nprocs=settings.nprocs if given.nprocs else None,
        start_method=settings.start_method if given.start_method else None,
        backend=settings.backend if given.backend else None,
        env=settings.env if given.env else None,
        nodes=nodes,
        others={name: getattr(settings, name) for name in OTHERS if getattr(given, name)},
    )


@dataclass(frozen=True)
class Autos:
    """What ``auto`` comes to for a world, where the cell says auto (resolved by its planner, which
    asks the world's machines only then); None where it cannot be resolved for the world (a clash)."""

    nprocs: int | None = None  # -n auto
    backend: str | None = None  # --backend auto, for the world's ranks


def world_clashes(world: Settled, cell: Asked, autos: Autos = Autos()) -> list[str]:
    """The options of ``cell`` that ``world`` cannot honour, as the user would write them (empty: none).
    An ``auto`` that could not be resolved for the world (``autos``: None) is a clash."""
    clashes = []
    if cell.nodes is not None and world.nodes is not None and cell.nodes != world.nodes:
        clashes.append(f"--nodes {cell.nodes}")
    if cell.nprocs is not None:
        wanted = autos.nprocs if cell.nprocs == "auto" else cell.nprocs
        if wanted != world.nprocs:
            clashes.append(f"-n auto ({wanted})" if cell.nprocs == "auto" and wanted is not None else f"-n {cell.nprocs}")
    if cell.start_method not in (None, "auto", world.start_method):
        clashes.append(f"--start-method {cell.start_method}")
    if cell.backend is not None:
        backend = autos.backend if cell.backend == "auto" else cell.backend
        if backend != world.backend:
            clashes.append(f"--backend auto ({backend})" if cell.backend == "auto" and backend else f"--backend {cell.backend}")
    if cell.env is not None and dict(cell.env) != dict(world.env):
        clashes.append("--env " + (" ".join(f"{k}={v}" for k, v in cell.env.items()) or "(none)"))
    clashes += [f"{ROW[name].spelled} {value}" for name, value in cell.others.items() if value != world.others.get(name)]
    return clashes


def refuse_clashes(name: str, settled: str, clashes: list[str]) -> None:
    """One refusal, worded the same for every world: ``settled`` is how the world runs, as options."""
    if clashes:
        raise SpawnUsageError(
            f"world {name!r} runs with {settled}; this cell asks for {', '.join(clashes)}. "
            f"Leave those options out, or %spawn stop {name} first."
        )
