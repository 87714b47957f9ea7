"""A cell on a kept world, wherever its ranks are (``executors._kept``): the one check of its options
against the world that runs, and the one rule for starting a lost world again.

Both ask the world for its facts (how it runs, what auto comes to on its machines, where it is), so
the same cell gets the same answer, in the same words, on a world here and on a cluster's nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from .._clash import Asked, Autos, asked_of, refuse_clashes, world_clashes
from .._machine import Machine
from .._options import WORLD_DEFINING
from .._request import RunRequest
from ..errors import SpawnUsageError
from ..executors._kept import KeptWorld, Lost

T = TypeVar("T")


def check_settings(world: KeptWorld, request: RunRequest, here: Machine) -> None:
    """The options this cell gave must be the world's own: a cell cannot change a world that runs
    (its place, nodes, ranks, start method, backend or environment; ``nbspawn._clash``: the one rule).
    ``here``: this machine's facts, where the cell's ``auto`` is counted on a world here."""
    asked, settled = asked_of(request.settings, request.nodes), world.settled()
    autos = autos_for(asked, lambda: world.auto_nprocs(here), lambda: world.auto_backend(settled.nprocs, here))
    clashes = [*world.place_clashes(request), *world_clashes(settled, asked, autos)]
    refuse_clashes(world.name, world.settings(), clashes)


def autos_for(asked: Asked, nprocs: Callable[[], int], backend: Callable[[], str]) -> Autos:
    """What the cell's ``auto``s come to for the world: each asked of the world only where the cell says
    auto (it may probe a machine or the nodes), None where the world cannot resolve it."""
    return Autos(
        nprocs=_resolved(nprocs) if asked.nprocs == "auto" else None,
        backend=_resolved(backend) if asked.backend == "auto" else None,
    )


def _resolved(resolve: Callable[[], T]) -> T | None:
    try:
        return resolve()
    except SpawnUsageError:
        return None


def as_before(request: RunRequest, lost: Lost) -> RunRequest:
    """A lost world's next cell: where and how it ran, except what this cell gives itself."""
    given, settings, before = request.settings.given, request.settings, lost.settings
    settings = dataclasses.replace(
        settings, **{name: getattr(before, name) for name in WORLD_DEFINING if not getattr(given, name)}
    )
    cluster = request.cluster or lost.cluster
    placed = request if cluster is None else request.placed(cluster, request.nodes if request.nodes is not None else lost.nodes)
    return dataclasses.replace(placed, settings=settings)


def started_again(name: str, lost: Lost, how: str) -> str:
    """The note of a lost world's next cell, which starts a new one (``how``: with which settings, where)."""
    why = f" ({lost.why})" if lost.why else ""
    return (
        f"nbspawn: world {name!r} was lost{why}; this cell starts a new one {how}, but none of the names its ranks "
        "had: run the cells that set them up again."
    )
