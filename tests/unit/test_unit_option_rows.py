"""One option, one row: the table (``nbspawn._options``) is the source of truth, and both doors are
made from it.  Every row reaches each door it names (``launch()``'s keywords, ``%%spawn``'s flags,
``SpawnMagics``' traitlets) and ends up in the request; each default is written once, in its row; the
door reads what joins options (``--fresh``, ``--debug-collectives``, ``--view``), the program's form and
the cell's syntax.  No processes: the request is caught on its way to the dispatch."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbspawn._api
import nbspawn._magic
from nbspawn._api import _API_ONLY, launch
from nbspawn._door import read_door
from nbspawn._magic import SpawnMagics
from nbspawn._options import CALL, CONFIG, FLAG, ROW, ROWS, at_door
from nbspawn._program import ProgramLine
from nbspawn._request import RunRequest, Settings
from nbspawn._source import CellSource, CellSyntaxError
from nbspawn.errors import SpawnUsageError

PACKAGE = Path(__file__).resolve().parents[2] / "nbspawn"


class Caught(Exception):
    """The request a door handed to the dispatch (nothing is started)."""

    def __init__(self, request: RunRequest) -> None:
        super().__init__("caught")
        self.request = request


def catch(request: RunRequest, *_args: Any, **_kwargs: Any) -> Any:
    raise Caught(request)


# a value for every option launch() takes, not its default, and where it shows in the request
CALLED: dict[str, tuple[Any, Any]] = {
    "nprocs": (3, lambda r: r.settings.nprocs == 3 and r.settings.given.nprocs),
    "env": ({"A": "1"}, lambda r: r.settings.env == {"A": "1"} and r.settings.given.env),
    "accelerator": ("none", lambda r: r.settings.accelerator == "none"),
    "timeout": ("7", lambda r: r.settings.timeout == 7.0),
    "grace_period": (1, lambda r: r.settings.grace_period == 1.0),
    "log_dir": ("/tmp/x", lambda r: r.settings.log_dir == "/tmp/x"),
    "ranks": ("0,1", lambda r: r.settings.ranks == {0, 1}),
    "cluster": ("rc", lambda r: r.cluster == "rc"),
    "nodes": (2, lambda r: r.nodes == 2),
    "background": (True, lambda r: r.background),
    "debug_collectives": (True, lambda r: r.settings.env == {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"} and r.settings.given.env),
    "start_method": ("Spawn", lambda r: r.settings.start_method == "spawn" and r.settings.given.start_method),
    "backend": ("GLOO", lambda r: r.settings.backend == "gloo" and r.settings.given.backend),
    "share": ("a, b", lambda r: r.share == ("a", "b")),
    "out": (["y"], lambda r: r.out == ("y",)),
    "world": ("w", lambda r: r.world == "w"),
    "on": (0, lambda r: r.on == {0}),
    "pdb": (True, lambda r: r.settings.pdb),
    "xray": ("Values", lambda r: r.settings.xray == "values"),
}

# the same, as the magic's line spells them
FLAGGED: dict[str, tuple[str, Any]] = {
    "nprocs": ("-n 3", CALLED["nprocs"][1]),
    "env": ("--env A=1", CALLED["env"][1]),
    "accelerator": ("--accelerator none", CALLED["accelerator"][1]),
    "timeout": ("--timeout 7", CALLED["timeout"][1]),
    "grace_period": ("--grace-period 1", CALLED["grace_period"][1]),
    "log_dir": ("--log-dir /tmp/x", CALLED["log_dir"][1]),
    "ranks": ("--ranks 0,1", CALLED["ranks"][1]),
    "cluster": ("--cluster rc", CALLED["cluster"][1]),
    "nodes": ("--cluster rc --nodes 2", CALLED["nodes"][1]),
    "background": ("--bg", CALLED["background"][1]),
    "debug_collectives": ("--debug-collectives", CALLED["debug_collectives"][1]),
    "start_method": ("--start-method Spawn", CALLED["start_method"][1]),
    "backend": ("--backend GLOO", CALLED["backend"][1]),
    "share": ("--share 'a, b'", CALLED["share"][1]),
    "out": ("--out y", CALLED["out"][1]),
    "world": ("--world w", CALLED["world"][1]),
    "on": ("--world w --on 0", CALLED["on"][1]),
    "fresh": ("--fresh", lambda r: r.world is None),  # with SpawnMagics.world set (below)
    "pdb": ("--pdb", CALLED["pdb"][1]),
    "view": ("--view TEXT", lambda r: r.view == "text"),
    "xray": ("--xray values", CALLED["xray"][1]),
}

# the same, as %config SpawnMagics sets them
CONFIGURED: dict[str, tuple[Any, Any]] = {
    "nprocs": (3, lambda r: r.settings.nprocs == 3 and not r.settings.given.nprocs),
    "timeout": (7.0, CALLED["timeout"][1]),
    "grace_period": (1.0, CALLED["grace_period"][1]),
    "log_dir": ("/tmp/x", CALLED["log_dir"][1]),
    "cluster": ("rc", CALLED["cluster"][1]),
    "start_method": ("spawn", lambda r: r.settings.start_method == "spawn" and not r.settings.given.start_method),
    "backend": ("gloo", lambda r: r.settings.backend == "gloo" and not r.settings.given.backend),
    "world": ("w", CALLED["world"][1]),
    "view": ("text", FLAGGED["view"][1]),
    "max_saved_kb": (1, lambda r: r.settings.max_saved_kb == 1),
    "max_image_kb": (2, lambda r: r.settings.max_image_kb == 2),
    "rank_niceness": (3, lambda r: r.settings.rank_niceness == 3),
    "xray": ("values", CALLED["xray"][1]),
}


def params(door: str) -> set[str]:
    return {option.param for option in at_door(door)}


def test_every_row_has_a_sample_at_each_of_its_doors():
    """A new row needs its samples here: then the tests below show that it reaches each of its doors."""
    assert set(CALLED) == params(CALL)
    assert set(FLAGGED) == params(FLAG)
    assert set(CONFIGURED) == params(CONFIG)


def test_launch_takes_every_row_of_the_call_door_and_nothing_else():
    keywords = set(inspect.signature(launch).parameters) - {"cell"}
    assert keywords - set(_API_ONLY) == params(CALL)


def test_launch_refuses_a_keyword_no_row_has_in_one_line_naming_its_options(monkeypatch):
    monkeypatch.setattr(nbspawn._api, "start", catch)
    with pytest.raises(SpawnUsageError) as info:
        launch("pass", nprocess=2)
    said = str(info.value)
    assert "\n" not in said and "nprocess" in said
    assert all(param in said for param in params(CALL)), said


def test_launchs_signature_shows_each_rows_default():
    shown = inspect.signature(launch).parameters
    assert all(shown[param].default == ROW[param].default for param in params(CALL))


def test_the_magic_parses_every_row_of_the_flag_door():
    dests = {action.dest for action in SpawnMagics.spawn.parser._actions} - {"help"}  # type: ignore[attr-defined]
    assert dests == params(FLAG)


def test_every_traitlet_is_a_row_of_the_config_door_with_the_rows_default():
    traits = SpawnMagics.class_traits(config=True)
    assert set(traits) - {"live_after"} == params(CONFIG)
    for param in params(CONFIG):
        default = traits[param].default_value
        assert default == (ROW[param].default if ROW[param].trait != "name" else ""), param


@pytest.mark.parametrize("param", sorted(CALLED))
def test_every_row_reaches_launch(param, monkeypatch):
    monkeypatch.setattr(nbspawn._api, "start", catch)
    value, where = CALLED[param]
    needs = {"nodes": {"cluster": "rc"}, "on": {"world": "w"}}.get(param, {})  # --nodes needs --cluster, --on --world
    with pytest.raises(Caught) as caught:
        launch("pass", **{param: value}, **needs)
    assert where(caught.value.request), param


@pytest.fixture
def magics(monkeypatch):
    monkeypatch.setattr(nbspawn._magic, "start", catch)
    return SpawnMagics(InteractiveShell.instance())


def spawned(magics: SpawnMagics, line: str, cell: str = "pass") -> RunRequest:
    with pytest.raises(Caught) as caught:
        magics.spawn(line, cell)
    return caught.value.request


@pytest.mark.parametrize("param", sorted(FLAGGED))
def test_every_row_reaches_the_magics_line(param, magics):
    line, where = FLAGGED[param]
    if param == "fresh":
        magics.world = "w"
    assert where(spawned(magics, line)), param


@pytest.mark.parametrize("param", sorted(CONFIGURED))
def test_every_row_reaches_the_magics_config(param, magics):
    value, where = CONFIGURED[param]
    setattr(magics, param, value)
    assert where(spawned(magics, "")), param


def test_a_cell_option_configured_is_for_cells_only(magics):
    magics.start_method, magics.backend, magics.world = "fork", "gloo", "w"
    request = read_door({}, configured=magics.configured(), program=["x.py"], namespace={})
    assert (request.settings.start_method, request.settings.backend, request.world) == ("auto", "none", None)


def test_a_configured_world_is_for_cells_on_this_machine(magics):
    magics.world, magics.cluster = "w", "rc"
    assert spawned(magics, "").world is None
    assert spawned(magics, "--world v").world == "v"


def test_no_door_writes_a_default_of_its_own():
    """A row's default is written once, in its row: no parameter, field or traitlet elsewhere repeats it,
    under the row's name or one of its own (a `grace_period: float = 5.0` beside the row's 5.0 once
    drifted apart unseen; a `WorldJob.grace = 5.0` stood beside it under another name)."""
    repeated = []
    for path in PACKAGE.rglob("*.py"):
        if path.name != "_options.py":
            repeated += repeated_defaults(path.read_text(), str(path.relative_to(PACKAGE)))
    assert not repeated, repeated


def test_the_check_sees_a_default_copied_under_another_name():
    """The check above can fail: a field named like a row (a word of its name) with the row's default is
    found; an unrelated name with the same value is not."""
    source = (
        "class Job:\n    grace: float = 5.0\n    wait: float = 5.0\n    background: bool = False\n    seen: bool = False\n"
        "\ndef look(*, saved_kb=256, n=256, start_method='auto', x='auto'): ...\n"
    )
    assert repeated_defaults(source, "job.py") == [
        "job.py:2 grace = 5.0 (grace_period's row)",
        "job.py:4 background = False (background's row)",
        "job.py:7 saved_kb = 256 (max_saved_kb's row)",
        "job.py:7 start_method = 'auto' (start_method's row)",
    ]


_GENERIC_WORDS = {"max", "kb"}  # shared by rows and by too many names to say which row a name stands for


def repeated_defaults(source: str, where: str) -> list[str]:
    """Each parameter, field or traitlet in ``source`` whose literal default is a row's default, and whose
    name is the row's or shares a word with it (``grace`` for ``grace_period``)."""
    defaults = {option.param: option.default for option in ROWS if option.default is not None}
    repeated = []
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[str, ast.AST | None]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs += list(zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults, strict=True))
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
        elif isinstance(node, ast.ClassDef):  # a field's or a traitlet's default
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    pairs.append((item.target.id, item.value))
                elif isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
                    value = item.value
                    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                        value = value.func.value  # Float(5.0, help=...).tag(config=True)
                    if isinstance(value, ast.Call):
                        keywords = {k.arg: k.value for k in value.keywords}
                        value = value.args[0] if value.args else keywords.get("default_value")
                    pairs.append((item.targets[0].id, value))
        for name, value in pairs:
            if not isinstance(value, ast.Constant):
                continue
            words = set(name.lower().strip("_").split("_")) - _GENERIC_WORDS
            for param, default in defaults.items():
                if (
                    value.value == default
                    and type(value.value) is type(default)
                    and (name == param or words & (set(param.split("_")) - _GENERIC_WORDS))
                ):
                    repeated.append(f"{where}:{value.lineno} {name} = {value.value!r} ({param}'s row)")
    return repeated


def test_a_choices_reader_has_no_default_of_its_own():
    """The door gives a reader its row's default when no value was given (``nbspawn._door``): a reader
    that fell back to one for None (``(requested or "auto")``) would be a second place it is written."""
    for option in ROWS:
        if isinstance(option.default, str):
            with pytest.raises(SpawnUsageError):
                option.read(None)


def test_settings_defaults_are_the_rows():
    for name, value in vars(Settings()).items():
        if name != "given":
            assert value == ROW[name].read(ROW[name].default), name


def test_fresh_and_world_together_are_refused_at_the_door(magics):
    with pytest.raises(UsageError, match="--fresh runs the cell on new ranks, --world on a kept world: give one of them"):
        magics.spawn("--fresh --world w", "pass")


def test_a_bad_view_is_a_usage_error_at_the_door(magics):
    with pytest.raises(UsageError, match="--view must be auto, widget or text, not 'tv'"):
        magics.spawn("--view tv", "pass")


def test_a_cell_option_given_to_a_program_through_launch_is_refused():
    with pytest.raises(SpawnUsageError, match="--pdb does not apply to a program"):
        launch(["x.py"], pdb=True)


def test_a_syntax_error_is_the_doors():
    with pytest.raises(CellSyntaxError, match="was never closed"):
        read_door({}, cell=CellSource("print(("), namespace={})


@pytest.mark.parametrize(
    ("words", "line"),
    [
        (["train.py", "--lr", "0.1"], ("script", "train.py", ("--lr", "0.1"))),
        (["python", "-m", "pkg.train", "x"], ("module", "pkg.train", ("x",))),
        (["python3", "-c", "print(1)", "a"], ("code", "print(1)", ("a",))),
        (["nvidia-smi", "-L"], ("exec", "nvidia-smi", ("-L",))),
    ],
)
def test_a_programs_form_is_read_at_the_door_and_nothing_is_asked_of_the_machine(words, line):
    """``train.py`` need not exist to be read: whether it does is asked where it runs (the planner, or a node)."""
    program = read_door({}, program=words, namespace={}).program
    assert isinstance(program, ProgramLine)
    assert (program.form, program.target, program.args, program.words) == (*line, tuple(words))


@pytest.mark.parametrize(
    ("words", "message"),
    [([], "no program after --"), (["python"], "python needs a script"), (["-m"], "-m needs a module name")],
)
def test_a_program_line_that_names_nothing_is_refused_at_the_door(words, message):
    with pytest.raises(SpawnUsageError, match=message):
        read_door({}, program=words, namespace={})


def test_a_cell_on_a_world_is_the_worlds_spec_with_the_cells_part(tmp_path):
    """What is fixed when ranks start (ranks, backend, placement, environment) is the world's; what the
    cell brings is its part, built once (``_spec.cell_part``) for every planner."""
    from dataclasses import fields, replace

    from nbspawn._spec import CellPart, Placement, RunSpec, cell_part

    world = RunSpec(
        run_id="w",
        nprocs=2,
        start_method="fork",
        backend="gloo",
        cell=CellSource("pass"),
        run_dir=str(tmp_path),
        env={"A": "1"},
        placement=replace(Placement.alone(), master_port=1234),
    )
    settings = Settings(timeout=3.0, grace_period=1.0, pdb=True, max_saved_kb=1, max_image_kb=2)
    part = cell_part(
        settings,
        CellSource("x = 1"),
        run_id="c",
        run_dir=str(tmp_path / "c"),
        shown=frozenset({1}),
        rich=True,
        cell_numbers={},
        on=frozenset({1}),
    )
    spec = world.with_cell(part)
    assert (spec.nprocs, spec.start_method, spec.backend, spec.env, spec.master_port) == (2, "fork", "gloo", {"A": "1"}, 1234)
    asked = spec.asked
    assert (spec.run_id, asked.timeout, asked.grace_period, asked.pdb, asked.max_saved_kb, asked.max_image_kb) == (
        "c",
        3.0,
        1.0,
        True,
        1,
        2,
    )
    assert (spec.shown_ranks, spec.on_ranks, spec.cell.body) == ({1}, {1}, "x = 1")
    assert {f.name for f in fields(CellPart)} <= {f.name for f in fields(RunSpec)}


def test_a_job_that_brings_no_options_keeps_the_worlds_own(tmp_path):
    """``%spawn show``'s look, ``%spawn debug``'s post-mortem and a cluster node's part of a cell are the
    world's spec with a job of their own (``RunSpec.with_job``): the world's grace period, budgets, X-ray,
    drawing and shown ranks stay; no time limit, --out, notes or --pdb, unless the caller says."""
    from dataclasses import asdict, replace

    from nbspawn._spec import Placement, RunSpec

    world = RunSpec(
        run_id="w", nprocs=2, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path),
        env={"A": "1"}, asked=Settings(timeout=3.0, grace_period=0.5, max_saved_kb=10, max_image_kb=20, pdb=True, xray="values"),
        shown_ranks=frozenset({1}), rich=True,
        cell_numbers={"f": 1}, out_names=("y",), shm_prefix="p", notes=("n",), on_ranks=frozenset({1}), placement=replace(Placement.alone(), master_port=1234),
    )  # fmt: skip
    look = world.with_job("c", str(tmp_path / "c"))
    reset = {
        "run_id": "c",
        "run_dir": str(tmp_path / "c"),
        "asked": asdict(replace(world.asked, timeout=None, pdb=False)),
        "out_names": (),
        "shm_prefix": None,
        "notes": (),
    }
    assert asdict(look) == {**asdict(world), **reset}
    debugged = world.with_job("d", str(tmp_path / "d"), cell=CellSource("x = 1"), shown_ranks=frozenset({0}))
    assert (debugged.cell.body, debugged.shown_ranks, debugged.asked.timeout, debugged.asked.grace_period) == (
        "x = 1",
        {0},
        None,
        0.5,
    )
    with pytest.raises(TypeError):
        world.with_job("e", str(tmp_path / "e"), nprocs=4)  # the world's ranks are not a job's to change
