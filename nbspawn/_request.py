"""What the user asked for, as the two doors (``%%spawn`` and ``launch()``) write it down.

A :class:`RunRequest` is frozen and unchecked: the options as given (a default filled in where the
user gave none), the work (a cell or a program's command line), where it runs (this machine, a kept
world, a cluster), and whether the kernel waits.  ``nbspawn._launch.start`` is the only thing that
reads one: it checks everything, then builds the run's spec and executor; a request can hold what
cannot be done (``--bg`` on a world, say), and it is there that this is said, the same for both doors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._source import CellSource


@dataclass(frozen=True)
class Settings:
    """The run's options, unchecked (``nbspawn._options`` describes and checks each)."""

    nprocs: int | str = "auto"
    start_method: str | None = None
    backend: str | None = None
    accelerator: str | None = None  # auto | tpu | none (nbspawn._tpu)
    env: tuple[str, ...] | Mapping[str, str] | None = None
    timeout: float | str | None = None
    grace_period: float | str | None = 5.0
    log_dir: str | None = None
    ranks: str | tuple[int, ...] | None = None
    max_saved_kb: int = 256
    max_image_kb: int = 2048
    pdb: bool = False  # --pdb (or %pdb on): the first failing rank stops in post-mortem
    # options the user gave for this run (a kept world's own settings are checked against them)
    given: frozenset[str] = frozenset()


def given_options(nprocs: object, start_method: object, backend: object, env: object) -> frozenset[str]:
    """The options that say how a world runs which the user gave (None: not given): an existing world
    is checked against these, and only these."""
    pairs = (("-n", nprocs), ("--start-method", start_method), ("--backend", backend), ("--env", env))
    return frozenset(flag for flag, value in pairs if value is not None)


@dataclass(frozen=True, eq=False)
class RunRequest:
    """One run, as asked: a cell (``cell``) or a program (``program``: its command line); on fresh
    ranks of this machine, on the kept world ``world`` (only its ranks ``on``, if given), or on the nodes of ``cluster`` (a kernel
    variable holding an ipyparallel client; its first ``nodes`` nodes)."""

    cell: CellSource | None
    program: tuple[str, ...] | None = None
    world: str | None = None
    on: str | int | tuple[int, ...] | None = None  # --on: the world's ranks that run the cell (None: all)
    cluster: str | None = None
    nodes: int | str | None = None
    settings: Settings = field(default_factory=Settings)
    namespace: dict[str, Any] = field(default_factory=dict)  # the kernel's names (fork: the ranks get a copy of this very dict)
    hidden: Mapping[str, Any] | None = None  # IPython's own names, never sent to ranks
    share: str | tuple[str, ...] | None = None
    out: str | tuple[str, ...] | None = None
    background: bool = False
    cell_numbers: Mapping[str, int] = field(default_factory=dict)  # IPython's compiled cell files -> In[N]
