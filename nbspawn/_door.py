"""The door's one reading of a run's options: what ``%%spawn`` and ``launch()`` were given becomes a
typed, frozen :class:`~nbspawn._request.RunRequest`.

Both doors call :func:`read_door`, with what the user wrote (and, for the magic, what ``%config
SpawnMagics`` set); it is the only caller of a ``nbspawn._options`` reader.  Each value is read once,
here, by its row of the table (``-n`` a count or ``"auto"``, ``--backend GLOO`` ``"gloo"``, seconds a
float, ``--env`` a dict, rank lists sets), the rules that join options are applied here (``--fresh``
against ``--world``, ``--debug-collectives`` into the environment, a cell option given to a program),
the program's form is read (``_program.read_program_line``) and the cell's syntax checked: a malformed
request is a :class:`~nbspawn.errors.SpawnUsageError` (or a ``CellSyntaxError``) before anything is
planned.  The planners take these values as they are; what only they can check (``--ranks`` against the
run's size, ``-n auto`` on this machine, a kept world's own settings, that a program's file exists
where it runs) they check without reading anything again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from ._options import ROW, ROWS, WORLD_DEFINING, Given, Option, Settings, with_debug_collectives
from ._program import ProgramLine, read_program_line
from ._request import RunRequest
from ._source import CellSource, kernel_cell_sources
from .errors import SpawnUsageError
from .handoff._flow import names_needed

SETTINGS = tuple(f.name for f in fields(Settings) if f.name != "given")
_DOOR_ONLY = ("fresh", "debug_collectives")  # read into others here: --world set aside, --env added to
REQUESTED = tuple(param for param in ROW if param not in SETTINGS and param not in _DOOR_ONLY)


def written(value: Any) -> bool:
    """Whether a door was given this value (None, and a switch left off, are not given)."""
    return value is not None and value is not False


def read_door(
    given: Mapping[str, Any],
    *,
    configured: Mapping[str, Any] | None = None,
    cell: CellSource | None = None,
    program: list[str] | tuple[str, ...] | None = None,
    namespace: dict[str, Any],
    hidden: Mapping[str, Any] | None = None,
    cell_numbers: Mapping[str, int] | None = None,
) -> RunRequest:
    """The one normaliser of both doors.  ``given``: the option values the user wrote (by ``param``;
    None or a switch off: not written); ``configured``: the magic's ``SpawnMagics`` defaults (a cell
    option's only for cells; a configured world only where no cluster is named).  Everything else is
    the row's default."""
    configured = configured or {}
    if written(given.get("fresh")) and written(given.get("world")):
        raise SpawnUsageError("--fresh runs the cell on new ranks, --world on a kept world: give one of them")
    raw = {option.param: _raw(option, given, configured, program is not None) for option in ROWS}
    if (written(raw["cluster"]) and not written(given.get("world"))) or given.get("fresh"):
        raw["world"] = None  # the configured world is for cells on this machine, and --fresh sets it aside
    raw["env"] = with_debug_collectives(raw["env"], bool(raw["debug_collectives"]))
    settings = read_settings(
        given=Given(**{name: written(given.get(name)) for name in WORLD_DEFINING} | {"env": raw["env"] is not None}),
        **{name: raw[name] for name in SETTINGS},
    )
    return read_request(
        cell=cell,
        program=program,
        settings=settings,
        namespace=namespace,
        hidden=hidden,
        cell_numbers=cell_numbers,
        **{name: raw[name] for name in REQUESTED},
    )


def _raw(option: Option, given: Mapping[str, Any], configured: Mapping[str, Any], for_program: bool) -> Any:
    """What the user wrote, else what is configured (a cell option's, for cells only), else None."""
    if written(given.get(option.param)):
        return given[option.param]
    value = configured.get(option.param)
    if value in (None, "") or (for_program and option.group == "cell"):
        return None
    return value


def read_settings(*, given: Given | None = None, **raw: Any) -> Settings:
    """The run's settings, each read once by its row (None, or not passed: the row's default)."""
    unknown = set(raw) - set(SETTINGS)
    assert not unknown, f"not settings: {sorted(unknown)}"
    return Settings(**{name: _read(ROW[name], raw.get(name)) for name in SETTINGS}, given=given or Given())


def read_request(
    *,
    cell: CellSource | None,
    program: list[str] | tuple[str, ...] | ProgramLine | None,
    settings: Settings,
    namespace: dict[str, Any],
    hidden: Mapping[str, Any] | None = None,
    cell_numbers: Mapping[str, int] | None = None,
    **raw: Any,
) -> RunRequest:
    """The request: what runs (the cell, its syntax checked; or the program, its form read), where
    (each of those options read once by its row), and how (``settings``, from :func:`read_settings`);
    what cannot be combined is refused (``RunRequest.of``)."""
    unknown = set(raw) - set(REQUESTED)
    assert not unknown, f"not options of a request: {sorted(unknown)}"
    if cell is not None:
        cell = _with_kernel_cells(cell, namespace, cell_numbers or {})
    line = program if isinstance(program, ProgramLine) or program is None else read_program_line(program)
    work = line if line is not None else cell
    assert work is not None, "a request runs a cell or a program"
    return RunRequest.of(
        work,
        settings=settings,
        namespace=namespace,
        hidden=hidden,
        cell_numbers=cell_numbers or {},
        **{name: _read(ROW[name], raw.get(name)) for name in REQUESTED},
    )


def _with_kernel_cells(cell: CellSource, namespace: Mapping[str, Any], cell_numbers: Mapping[str, int]) -> CellSource:
    """``cell``, parsed here, once (a syntax error is the door's), with the sources of the kernel cells
    that define the functions it calls: a rank in a fresh interpreter (spawn, forkserver, a cluster
    node) shows their lines in its tracebacks, as a forked one does."""
    tree = cell.tree
    if cell.kernel_cells:
        return cell
    used = (namespace[name] for name in sorted(names_needed(tree)) if name in namespace)
    found = kernel_cell_sources(used, cell_numbers)
    if not found:
        return cell
    with_them = replace(cell, kernel_cells=found)
    vars(with_them)["tree"] = tree  # the parse is kept (a cached_property: only read, never changed)
    return with_them


def _read(option: Option, value: Any) -> Any:
    return option.read(option.default if value is None else value)
