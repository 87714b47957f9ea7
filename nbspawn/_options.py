"""Every option a run takes, described once: one row each in :data:`OPTIONS` (and, for those only
``%config`` sets, :data:`CONFIGURED`).  A row says how the option is spelled, its help, which shapes
of work take it, where it can be given (its *doors*), its default and the function that reads it.
The rows are declared as the fields of :class:`Settings` (how a run runs) and :class:`RequestOptions`
(where it goes), so a row's type is its field's annotation and its default the field's.  ``%%spawn``'s
arguments and ``%%spawn?``, ``SpawnMagics``' traitlets, ``launch()``'s keywords and ``Args:`` are all
made from the rows, and the door
(``nbspawn._door``) reads every value through its row, so no door can miss one.

An option belongs to a *group*, as ipyparallel's magics share argument groups:

* ``common``: cells and programs alike (``-n``, ``--env``, ``--timeout``, ...);
* ``cell``: only a cell can use it (``--share``, ``--out``, ``--world``, ...); given to a program, the
  door refuses it, saying why (the magic's parser for programs already does);
* ``magic``: only the magic has it (``--view``).

Its *doors*: ``flag`` (``%%spawn --x``), ``call`` (``launch(x=)``), ``config`` (``%config
SpawnMagics.x``, the default of every later cell; a cell option's configured value applies to cells only).

The ``parse_*`` functions check one value each and raise :class:`~nbspawn.errors.SpawnUsageError`
with a one-line message; they are pure, cheap, and run before anything starts.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, Literal, cast

from .errors import SpawnUsageError

START_METHODS = ("fork", "spawn", "forkserver")
BACKENDS = ("none", "gloo", "nccl", "auto")
ACCELERATORS = ("auto", "tpu", "none")
VIEWS = ("auto", "widget", "text")
StartMethod = Literal["fork", "spawn", "forkserver", "auto"]  # auto: this machine decides (nbspawn._cuda)
Backend = Literal["none", "gloo", "nccl", "auto"]  # auto: nccl where every rank has a GPU
Accelerator = Literal["auto", "tpu", "none"]  # auto: tpu where torch_xla finds chips (nbspawn._tpu)
ViewChoice = Literal["auto", "widget", "text"]  # auto: the widget in a Jupyter kernel, else text
XrayMode = Literal["on", "off", "values"]  # values: on, and the values of small tensors too (ranks._xray_values)

FLAG, CALL, CONFIG = "flag", "call", "config"
EVERY_DOOR = frozenset({FLAG, CALL, CONFIG})
FLAG_OR_CALL = frozenset({FLAG, CALL})


@dataclass(frozen=True)
class Option:
    """One row: declared as a field of :class:`Settings` or :class:`RequestOptions` (:func:`row`), whose
    name is its ``param`` and whose annotation its ``type``."""

    param: str  # launch()'s keyword, the magic's dest, the traitlet, the field of Settings or RequestOptions
    flags: tuple[str, ...]  # the magic's spelling (none: set by %config only)
    metavar: str | None  # None: a switch
    help: str
    group: str  # common | cell | magic
    not_for_programs: str = ""  # cell options: why a program cannot take it
    # what it is when no door gives it, before it is read (read(default) is the typed default)
    default: Any = None
    # the one reader of its value (a SpawnUsageError for a malformed one); it is given the default when
    # no door gave one, so it takes that too
    read: Callable[[Any], Any] = bool
    doors: frozenset[str] = FLAG_OR_CALL
    trait: str = ""  # with the config door: the SpawnMagics traitlet's kind (nbspawn._magic)
    trait_help: str = ""  # with the config door: %config SpawnMagics' line for it
    # it says how a kept world runs, fixed by its first cell: a later cell that gives it must give the
    # world's own value (nbspawn._clash), and a lost world starts again with it (planning._kept_cell)
    defines_world: bool = False
    type: str = ""  # what its reader returns: the field's annotation

    @property
    def spelled(self) -> str:
        """How a message names it: its long flag, else its traitlet."""
        return self.flags[-1] if self.flags else f"SpawnMagics.{self.param}"

    @property
    def typed_default(self) -> Any:
        """Its value when nobody gives one, read as a given one is."""
        return self.read(self.default)


_ROW = "nbspawn.option"  # where a field keeps its row


def row(
    flags: tuple[str, ...],
    metavar: str | None,
    help: str,
    group: str,
    not_for_programs: str = "",
    *,
    default: Any = None,
    read: Callable[[Any], Any] = bool,
    doors: frozenset[str] = FLAG_OR_CALL,
    trait: str = "",
    trait_help: str = "",
    defines_world: bool = False,
) -> Any:
    """A row of the table, as the field of :class:`Settings` (or :class:`RequestOptions`) it fills: the
    field's default is the row's, read (a dict's made anew each time); ``{default}`` in ``help`` is the
    default as a user writes it."""
    help = help.replace("{default}", f"{default:g}" if isinstance(default, float) else str(default))
    option = Option("", flags, metavar, help, group, not_for_programs, default, read, doors, trait, trait_help, defines_world)
    typed = read(default)
    if isinstance(typed, (dict, list, set)):
        return field(default_factory=partial(copy.deepcopy, typed), metadata={_ROW: option})
    return field(default=typed, metadata={_ROW: option})


def options_in(*groups: str) -> tuple[Option, ...]:
    return tuple(option for option in OPTIONS if option.group in groups)


DEBUG_COLLECTIVES = "TORCH_DISTRIBUTED_DEBUG=DETAIL"


def with_debug_collectives(
    env: list[str] | tuple[str, ...] | Mapping[str, str] | None, on: bool
) -> tuple[str, ...] | Mapping[str, str] | None:
    """``--debug-collectives`` is torch's own check, set in the ranks' environment (a user's
    TORCH_DISTRIBUTED_DEBUG wins); a kept world's environment is its own, so it is an ``--env``."""
    if not on:
        return tuple(env) if isinstance(env, list) else env
    if isinstance(env, Mapping):
        return {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", **env}
    given = list(env or ())
    if not any(item.startswith("TORCH_DISTRIBUTED_DEBUG=") for item in given):
        given.insert(0, DEBUG_COLLECTIVES)
    return tuple(given)


def parse_nprocs(value: Any) -> int | Literal["auto"]:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        n = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise SpawnUsageError(f"--nprocs must be a positive integer or 'auto', not {value!r}") from None
    if isinstance(n, bool) or n <= 0:
        raise SpawnUsageError(f"--nprocs must be a positive integer or 'auto', not {value!r}")
    return n


def parse_env(items: list[str] | tuple[str, ...] | Mapping[str, str] | None) -> dict[str, str]:
    if not items:
        return {}
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SpawnUsageError(f"--env expects KEY=VALUE, got {item!r}")
            pairs.append((key, value))
    env = {}
    for key, value in pairs:
        if not key.isidentifier() and not all(c.isalnum() or c == "_" for c in key):
            raise SpawnUsageError(f"--env: {key!r} is not a valid environment variable name")
        env[str(key)] = str(value)
    return env


def parse_ranks(value: str | list[int] | tuple[int, ...] | None) -> frozenset[int] | None:
    """``0,2`` or ``0-3,7``: the ranks whose output is shown (all are logged).  Only the list is read:
    how many ranks there are is decided later, where ``nbspawn._runsize.ranks_within`` checks it."""
    if value is None or value == "":
        return None
    return _rank_list(value, "--ranks")


def parse_on(value: str | int | list[int] | tuple[int, ...] | None) -> frozenset[int] | None:
    """``--on 0`` or ``0,2-3``: the ranks of a kept world that run the cell; None when not given.  Only
    the list is read: the world's size is its own, and ``nbspawn._runsize.on_within`` checks it there
    (naming every rank is then None too)."""
    if value is None:
        return None
    if isinstance(value, int):  # launch(on=0)
        value = (value,)
    if (isinstance(value, str) and not value.strip()) or (not isinstance(value, str) and not list(value)):
        raise SpawnUsageError(f"--on needs the ranks that run the cell, like 0 or 0,2-3, not {value!r}")
    return _rank_list(value, "--on")


def _rank_list(value: str | list[int] | tuple[int, ...], option: str) -> frozenset[int]:
    """``0,2`` or ``0-3,7`` (or the ranks themselves), read (not yet checked against a run)."""
    if isinstance(value, str):
        ranks: set[int] = set()
        for part in value.replace(" ", "").split(","):
            lo, dash, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi) if dash else int(lo)
            except ValueError:
                raise SpawnUsageError(f"{option} expects a list like 0,2 or 0-3, not {value!r}") from None
            if last < first:
                raise SpawnUsageError(f"{option}: {part} counts down; write {last}-{first}")
            ranks.update(range(first, last + 1))
    else:
        try:
            ranks = {int(r) for r in value}
        except (TypeError, ValueError):
            raise SpawnUsageError(f"{option} expects a list of ranks like [0, 2], not {value!r}") from None
    return frozenset(ranks)


def parse_seconds(value: Any, option: str, *, allow_zero: bool) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SpawnUsageError(f"{option} must be a number of seconds, not {value!r}") from None
    if seconds < 0 or (seconds == 0 and not allow_zero) or math.isnan(seconds):
        raise SpawnUsageError(f"{option} must be {'zero or more' if allow_zero else 'more than zero'} seconds, not {value!r}")
    return seconds


def parse_kb(value: Any, option: str) -> int:
    try:
        kb = int(value)
    except (TypeError, ValueError):
        raise SpawnUsageError(f"{option} must be a whole number of KB, not {value!r}") from None
    if kb < 0 or isinstance(value, bool):
        raise SpawnUsageError(f"{option} must be zero or more KB, not {value!r}")
    return kb


def parse_niceness(value: Any, option: str) -> int:
    """A nice value to add to the kernel's: 0 (the kernel's own) to 19 (Linux's lowest priority)."""
    try:
        niceness = int(value)
    except (TypeError, ValueError):
        niceness = -1
    if isinstance(value, (bool, float)) or not 0 <= niceness <= 19:
        raise SpawnUsageError(f"{option} must be a whole number from 0 to 19, not {value!r}")
    return niceness


def parse_nodes(value: Any) -> int | None:
    if value is None:
        return None
    try:
        nodes = int(value)
    except (TypeError, ValueError):
        nodes = 0
    if nodes <= 0 or isinstance(value, bool):
        raise SpawnUsageError(f"--nodes must be a positive integer, not {value!r}")
    return nodes


def _choice(value: Any, choices: tuple[str, ...], option: str, which: str) -> str:
    """One of ``choices``, in any case and spacing.  No fallback: the door gives a reader its row's
    default when nobody gave a value (``nbspawn._door``), so a default is written only in its row."""
    if not isinstance(value, str) or (name := value.strip().lower()) not in choices:
        raise SpawnUsageError(f"{option} must be {which}, not {value!r}")
    return name


def parse_start_method(requested: str) -> StartMethod:
    """The name checked: fork, spawn, forkserver or auto (what this machine offers is not asked)."""
    return cast(StartMethod, _choice(requested, (*START_METHODS, "auto"), "--start-method", "one of fork, spawn, forkserver"))


def parse_accelerator(accelerator: str) -> Accelerator:
    """The name checked: auto, tpu or none (whether this host has a TPU is not asked)."""
    return cast(Accelerator, _choice(accelerator, ACCELERATORS, "--accelerator", f"one of {', '.join(ACCELERATORS)}"))


def parse_backend(backend: str) -> Backend:
    """The name checked: none, gloo, nccl or auto (whether GPUs are there is not asked)."""
    return cast(Backend, _choice(backend, BACKENDS, "--backend", "one of none, gloo, nccl, auto"))


XRAY_CHOICES = ("on", "off", "values")


def parse_xray(value: str | bool) -> XrayMode:
    """``--xray``: on, off, or values (on, and each rank's small tensors before and after each
    collective, for teaching); ``launch(xray=True/False)`` too (on and off)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return cast(XrayMode, _choice(value, XRAY_CHOICES, "--xray", "on, off or values"))


def parse_world_name(name: str | None) -> str | None:
    """A kept world's name (None: fresh ranks)."""
    if name is None:
        return None
    if not name.strip() or any(c.isspace() for c in name):
        raise SpawnUsageError(f"--world needs a name without spaces, not {name!r}")
    return name


def parse_cluster_name(name: str | None) -> str | None:
    """The kernel variable that holds the cluster's client (None, or blank: this machine)."""
    return (name or "").strip() or None


def parse_log_dir(path: str | None) -> str | None:
    return path or None


def parse_names(value: str | list[str] | tuple[str, ...] | None, option: str) -> tuple[str, ...]:
    """``a, b`` (or a list of them): Python names, in order, each once."""
    if not value:
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    for name in names:
        if not name.isidentifier():
            raise SpawnUsageError(f"{option}: {name!r} is not a Python name")
    return tuple(dict.fromkeys(names))


def parse_view(choice: str) -> ViewChoice:
    """How the magic shows a run: auto, widget or text."""
    return cast(ViewChoice, _choice(choice, VIEWS, "--view", "auto, widget or text"))


class Given:
    """Which of the options that say how a world runs (its rows' ``defines_world``) the user wrote for
    this run, not a default: a kept world is checked against these, and only these, and a lost world
    started again keeps its own for the others.  ``Given(nprocs=True)``; ``given.nprocs`` is whether
    ``-n`` was written (any world-defining row's param is such an attribute)."""

    __slots__ = ("names",)
    names: frozenset[str]  # the world-defining rows' params the user wrote

    def __init__(self, **written: bool) -> None:
        object.__setattr__(self, "names", frozenset(name for name, was in written.items() if was))

    def __getattr__(self, name: str) -> bool:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in WORLD_DEFINING:
            raise AttributeError(f"{name!r} is not an option that defines a world ({', '.join(WORLD_DEFINING)})")
        return name in self.names

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Given is frozen")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Given) and other.names == self.names

    def __hash__(self) -> int:
        return hash(self.names)

    def __repr__(self) -> str:
        return f"Given({', '.join(f'{name}=True' for name in sorted(self.names))})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled into ranks with the spec, and copied
        return (_given, (tuple(sorted(self.names)),))


def _given(names: tuple[str, ...]) -> Given:
    return Given(**dict.fromkeys(names, True))


@dataclass(frozen=True)
class Settings:
    """The run's options, read and typed at the door (``nbspawn._door``): each field is a row of the
    table (:func:`row`), its annotation the type its reader returns, its default the row's read.  A
    planner passes them to the spec (``RunSpec.asked``) whole, so an option that reaches the ranks is its
    row here and the code that reads it there."""

    nprocs: int | Literal["auto"] = row(
        ("-n", "--nprocs"),
        "N|auto",
        "number of ranks (per node with a cluster); auto: one per TPU chip (--accelerator) or GPU the ranks see, else up to 4 CPU ranks (default: SpawnMagics.nprocs)",
        "common",
        default="auto",
        read=parse_nprocs,
        doors=EVERY_DOOR,
        trait="count",
        trait_help="Ranks per cell: a number, or 'auto' (one per GPU, else up to 4 CPU ranks).",
        defines_world=True,
    )
    env: Mapping[str, str] = row(
        ("--env",), "KEY=VALUE", "extra environment variables for every rank", "common", read=parse_env, defines_world=True
    )
    accelerator: Accelerator = row(
        ("--accelerator",),
        "auto|tpu|none",
        "tpu: one rank per TPU chip, each with the environment torch_xla's launcher (xmp.spawn) gives it; auto: "
        "tpu where torch_xla finds TPU chips, else none (CPU or CUDA ranks, as the GPUs decide)",
        "common",
        default="auto",
        read=parse_accelerator,
    )
    timeout: float | None = row(
        ("--timeout",),
        "SECONDS",
        "stop every rank after this long, showing each one's stack",
        "common",
        read=partial(parse_seconds, option="--timeout", allow_zero=False),
        doors=EVERY_DOOR,
        trait="seconds",
        trait_help="Seconds before every rank is stopped (None: no limit).",
    )
    grace_period: float = row(
        ("--grace-period",),
        "SECONDS",
        "time between SIGTERM and SIGKILL when ranks are stopped (default {default})",
        "common",
        default=5.0,
        read=partial(parse_seconds, option="--grace-period", allow_zero=True),
        doors=EVERY_DOOR,
        trait="seconds",
        trait_help="Seconds between SIGTERM and SIGKILL when ranks are stopped.",
    )
    rank_niceness: int = row(
        (),
        "N",
        "how far below the kernel's the ranks' CPU priority is, as a nice value added to the kernel's "
        "(0 to 19, default {default}): when ranks outnumber the cores, the kernel that shows their output "
        "and answers Stop, and the notebook, get a core first",
        "common",
        default=19,
        read=partial(parse_niceness, option="SpawnMagics.rank_niceness"),
        doors=frozenset({CONFIG}),
        trait="whole",
        trait_help="How far below the kernel's the ranks' CPU priority is: a nice value added to the kernel's, "
        "0 to 19 (0: the kernel's own). Ranks that outnumber the cores leave one to the kernel, which shows "
        "their output and answers Stop, and to the notebook.",
    )
    log_dir: str | None = row(
        ("--log-dir",),
        "DIR",
        "keep logs in DIR/<run-id>/<rank>/ (default: a new temporary directory)",
        "common",
        read=parse_log_dir,
        doors=EVERY_DOOR,
        trait="path",
        trait_help="Where <run-id>/<rank>/{stdout,stderr}.log go (None: a new temporary directory).",
    )
    ranks: frozenset[int] | None = row(
        ("--ranks",),
        "LIST",
        "show only these ranks' output, e.g. 0 or 0,2 or 0-3 (all are logged)",
        "common",
        read=parse_ranks,
    )
    xray: XrayMode = row(
        ("--xray",),
        "on|off|values",
        "the collectives X-ray: each rank's collectives (op, group, sequence number, shapes, bytes) read from torch's "
        "flight recorder, lined up across ranks beside the rank tabs, with who arrived last, mismatched calls and "
        "collectives a rank never entered, for a cell run with --backend or a Python program that makes a process group "
        "(default {default}; off: no recorder thread in the ranks; values, in cells: on, and each rank's input and output of its "
        "first 200 collectives, for tensors of 64 elements or fewer)",
        "common",
        default="on",
        read=parse_xray,
        doors=EVERY_DOOR,
        trait="choice",
        trait_help="The collectives X-ray of every run with a process group: on, off or values.",
    )
    start_method: StartMethod = row(
        ("--start-method",),
        "fork|spawn|forkserver",
        "how ranks start; fork sees the kernel's names as they are, spawn and forkserver get the names the cell uses pickled by value (default: fork, unless a forked rank could not use CUDA: then forkserver)",
        "cell",
        "a program is always started as a new process",
        default="auto",
        read=parse_start_method,
        doors=EVERY_DOOR,
        trait="choice",
        trait_help="fork, spawn, forkserver, or auto (fork unless CUDA is initialized in the kernel).",
        defines_world=True,
    )
    backend: Backend = row(
        ("--backend",),
        "none|gloo|nccl|auto",
        "initialize the default process group before the cell and destroy it after",
        "cell",
        "a program sets up its own process group (init_process_group())",
        default="none",
        read=parse_backend,
        doors=EVERY_DOOR,
        trait="choice",
        trait_help="Process group set up around the cell: none, gloo, nccl, or auto (nccl with GPUs).",
        defines_world=True,
    )
    pdb: bool = row(
        ("--pdb",),
        None,
        "the first rank whose cell raises stops in post-mortem pdb at its exception, before anything is torn down, "
        "prompting through this cell's input box; leaving it ends the run as it would have (also on when IPython's automatic pdb is: the pdb magic)",
        "cell",
        "a program's failure is reported, not debugged; use breakpoint() in the program",
        default=False,
    )
    max_saved_kb: int = row(
        (),
        "KB",
        "most KB a finished run's saved output takes in the notebook, images aside (the logs keep all)",
        "magic",
        default=256,
        read=partial(parse_kb, option="SpawnMagics.max_saved_kb"),
        doors=frozenset({CONFIG}),
        trait="whole",
        trait_help="Most KB a finished run's saved output takes in the notebook, images aside (the logs keep all).",
    )
    max_image_kb: int = row(
        (),
        "KB",
        "most KB of images a run shows and saves; past it an image is named, not shown",
        "magic",
        default=2048,
        read=partial(parse_kb, option="SpawnMagics.max_image_kb"),
        doors=frozenset({CONFIG}),
        trait="whole",
        trait_help="Most KB of images a run shows and saves; past it an image is named, not shown (its rank's display.jsonl has it).",
    )
    given: Given = field(default_factory=Given)  # not a row: which world-defining options the user wrote


@dataclass(frozen=True)
class RequestOptions:
    """The options that say what runs where, and how it is shown: rows as :class:`Settings`' are, read
    at the door, which makes them the request's work and target (``nbspawn._request.RunRequest.of``)."""

    cluster: str | None = row(
        ("--cluster",),
        "NAME",
        "run on several nodes: NAME is a kernel variable holding a connected ipyparallel Client, Cluster or DirectView; one engine per node starts that node's ranks (-n is then ranks per node)",
        "common",
        read=parse_cluster_name,
        doors=EVERY_DOOR,
        trait="name",
        trait_help="Run every %%spawn cell on this kernel variable's ipyparallel Client or Cluster ('' : this machine).",
    )
    nodes: int | None = row(
        ("--nodes",),
        "N",
        "with --cluster: use the first N nodes (default: all)",
        "common",
        read=parse_nodes,
    )
    background: bool = row(
        ("--bg",),
        None,
        "run in the background: the kernel is free at once; the run is returned (also nbspawn.last_run()), run.wait() joins it and raises its error, run.stop() stops it",
        "common",
        default=False,
    )
    debug_collectives: bool = row(
        ("--debug-collectives",),
        None,
        "check every collective across ranks before it runs (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL): a mismatched "
        "op or shape fails at once, on the rank that found it, with torch's message, instead of hanging",
        "common",
        default=False,
    )
    share: tuple[str, ...] = row(
        ("--share",),
        "NAMES",
        "comma-separated kernel tensors, nn.Modules or dicts/lists/tuples of tensors that every rank sees in the same (shared) memory; in-place writes by ranks are seen by the kernel",
        "cell",
        "a program's ranks cannot map the kernel's tensors; pass it files, or run a cell",
        read=partial(parse_names, option="--share"),
    )
    out: tuple[str, ...] = row(
        ("--out",),
        "NAMES",
        "comma-separated names each rank defines; after the cell each is bound in the kernel as a list indexed by rank (tensors come back through shared memory)",
        "cell",
        "a program has no names to bring back; have it write files, or run a cell",
        read=partial(parse_names, option="--out"),
    )
    world: str | None = row(
        ("--world",),
        "NAME",
        "run on the kept world NAME (ranks that live across cells), started with this cell's options if new",
        "cell",
        "a kept world runs cells; a program starts and ends its own processes",
        read=parse_world_name,
        doors=EVERY_DOOR,
        trait="name",
        trait_help="Run every %%spawn cell on the kept world of this name ('' : fresh ranks per cell; --fresh for one cell).",
    )
    on: frozenset[int] | None = row(
        ("--on",),
        "RANKS",
        "with --world: only these ranks run the cell, e.g. 0 or 0,2-3; the others are untouched (their names "
        "stay as they were, they show nothing) and idle; --out gives None for them",
        "cell",
        "a program runs on every rank it starts",
        read=parse_on,
    )
    fresh: bool = row(
        ("--fresh",),
        None,
        "fresh ranks for this cell, even if SpawnMagics.world names a world",
        "cell",
        "a program always gets fresh ranks",
        default=False,
        doors=frozenset({FLAG}),  # it overrides SpawnMagics.world, which launch() does not read
    )
    view: ViewChoice = row(
        ("--view",),
        "auto|widget|text",
        "live widget or [rank{r}]: text lines (default: SpawnMagics.view)",
        "magic",
        default="auto",
        read=parse_view,
        doors=frozenset({FLAG, CONFIG}),  # launch() takes a RunView object under this name instead
        trait="choice",
        trait_help="How a run is shown: widget (live panes, frozen into a static view at the end), text "
        "([rank{r}]: lines), or auto (widget in a Jupyter kernel, text in a terminal).",
    )


def _rows(table: type) -> tuple[Option, ...]:
    """The rows declared as ``table``'s fields, each named by its field and typed by its annotation."""
    return tuple(replace(f.metadata[_ROW], param=f.name, type=str(f.type)) for f in fields(table) if _ROW in f.metadata)


ROWS: tuple[Option, ...] = (*_rows(Settings), *_rows(RequestOptions))
OPTIONS: tuple[Option, ...] = tuple(option for option in ROWS if option.flags)  # the magic's, %%spawn? lists them
CONFIGURED: tuple[Option, ...] = tuple(option for option in ROWS if not option.flags)  # %config only: the notebook's budgets
ROW = {option.param: option for option in ROWS}
# the options that say how a kept world runs, fixed by its first cell (Option.defines_world)
WORLD_DEFINING: tuple[str, ...] = tuple(option.param for option in ROWS if option.defines_world)


def at_door(door: str) -> tuple[Option, ...]:
    """The rows that can be given at ``door`` (flag, call or config)."""
    return tuple(option for option in ROWS if door in option.doors)
