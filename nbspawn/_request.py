"""What the user asked for, as the two doors (``%%spawn`` and ``launch()``) write it down.

A :class:`RunRequest` is frozen and typed: every option was read once, at the door
(``nbspawn._door``), into what it means (a count, a Literal, seconds as a float, sizes as ints, the
environment as a dict, rank lists as sets), a default filled in where the user gave none, and a
malformed one refused there.  What it cannot know yet is left to the planners: whether the options
can be combined and what this machine makes of them (``-n auto``, ``--ranks`` against the run's size,
a kept world's own settings); ``nbspawn._dispatch.start`` reads it and says so, the same for both doors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._options import Accelerator, Backend, StartMethod
from ._source import CellSource


@dataclass(frozen=True)
class Given:
    """Which of the options that say how a world runs the user wrote for this run (not a default): a
    kept world is checked against these, and only these, and a lost world started again keeps its own
    for the others."""

    nprocs: bool = False
    start_method: bool = False
    backend: bool = False
    env: bool = False


@dataclass(frozen=True)
class Settings:
    """The run's options, read and typed at the door (``nbspawn._options`` describes and reads each)."""

    nprocs: int | Literal["auto"] = "auto"
    start_method: StartMethod = "auto"
    backend: Backend = "none"
    accelerator: Accelerator = "auto"  # tpu: a rank per chip (nbspawn._tpu)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None  # seconds
    grace_period: float = 5.0  # seconds
    log_dir: str | None = None
    ranks: frozenset[int] | None = None  # --ranks, read (checked against the run's size by its planner)
    max_saved_kb: int = 256
    max_image_kb: int = 2048
    pdb: bool = False  # --pdb (or %pdb on): the first failing rank stops in post-mortem
    given: Given = Given()


@dataclass(frozen=True, eq=False)
class RunRequest:
    """One run, as asked: a cell (``cell``) or a program (``program``: its command line); on fresh
    ranks of this machine, on the kept world ``world`` (only its ranks ``on``, if given), or on the nodes of ``cluster`` (a kernel
    variable holding an ipyparallel client; its first ``nodes`` nodes)."""

    cell: CellSource | None
    program: tuple[str, ...] | None = None
    world: str | None = None  # a name without spaces
    on: frozenset[int] | None = None  # --on, read: the world's ranks that run the cell (None: all)
    cluster: str | None = None
    nodes: int | None = None
    settings: Settings = field(default_factory=Settings)
    namespace: dict[str, Any] = field(default_factory=dict)  # the kernel's names (fork: the ranks get a copy of this very dict)
    hidden: Mapping[str, Any] | None = None  # IPython's own names, never sent to ranks
    share: tuple[str, ...] = ()  # Python names, read
    out: tuple[str, ...] = ()
    background: bool = False
    cell_numbers: Mapping[str, int] = field(default_factory=dict)  # IPython's compiled cell files -> In[N]
