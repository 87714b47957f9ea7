"""The door reads every option once (``nbspawn._door``), and the planners read none again: on one fresh
launch each ``nbspawn._options`` parser is entered at most once per option, and only from the door.
No kernel, no processes (a fresh cell is planned, not started)."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from nbspawn import _listen, _options
from nbspawn._dispatch import plan_run
from nbspawn._door import read_request, read_settings
from nbspawn._effects import carry_out
from nbspawn._options import Given
from nbspawn._request import Settings
from nbspawn._source import CellSource
from nbspawn.errors import SpawnUsageError

PACKAGE = Path(__file__).resolve().parents[2] / "nbspawn"
PARSERS = sorted(name for name in vars(_options) if name.startswith("parse_"))
OPTIONS_FILE = _options.__file__


def entered_parsers(action: Any) -> list[tuple[str, str, str]]:
    """(parser, the option it read, the module that called it) for every entry into a parser of
    ``nbspawn._options`` while ``action()`` runs, however the caller imported it."""
    seen: list[tuple[str, str, str]] = []

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename == OPTIONS_FILE and code.co_name in PARSERS:
            caller = frame.f_back
            module = caller.f_globals.get("__name__", "?") if caller is not None else "?"
            seen.append((code.co_name, str(frame.f_locals.get("option", "")), module))

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return seen


def door_and_plan(tmp_path: Path) -> None:
    """What ``%%spawn -n 2 --env A=1 --timeout 30 --ranks 0 --out y`` does, to its spec: read, then planned."""
    settings = read_settings(
        nprocs="2",
        start_method="fork",
        backend="GLOO",
        env=["A=1"],
        timeout="30",
        grace_period=5.0,
        log_dir=str(tmp_path),
        ranks="0",
        max_saved_kb=256,
        max_image_kb=2048,
        given=Given(nprocs=True, env=True, backend=True),
    )
    request = read_request(cell=CellSource("y = 1"), program=None, settings=settings, namespace={}, out="y")
    spec, _executor = carry_out(plan_run(request))
    _listen.release(spec.master_port)
    assert (spec.nprocs, spec.backend, spec.env, spec.asked.timeout, spec.shown_ranks) == (2, "gloo", {"A": "1"}, 30.0, {0})


def test_on_one_launch_each_parser_is_entered_once_per_option_and_only_from_the_door(tmp_path):
    seen = entered_parsers(lambda: door_and_plan(tmp_path))
    assert {module for _parser, _option, module in seen} == {"nbspawn._door"}, seen
    per_option = Counter((parser, option) for parser, option, _module in seen)
    assert all(count == 1 for count in per_option.values()), per_option
    # every option the request carries was read: none was left for a planner to read
    assert {parser for parser, _option, _module in seen} >= {
        "parse_nprocs",
        "parse_env",
        "parse_start_method",
        "parse_backend",
        "parse_seconds",
        "parse_kb",
        "parse_ranks",
        "parse_on",
        "parse_nodes",
    }


def test_the_counter_sees_a_planner_that_reads_again(tmp_path):
    """The check itself can fail: a parser entered from elsewhere than the door is seen, and named."""
    seen = entered_parsers(lambda: _options.parse_seconds("3", "--timeout", allow_zero=False))
    assert seen == [("parse_seconds", "--timeout", __name__)]


PLANNERS = [
    "_spec.py",
    "_dispatch.py",
    "planning/_fresh.py",
    "planning/_world.py",
    "planning/_cluster.py",
    "planning/_cluster_world.py",
    "planning/_kept_cell.py",
    "executors/_kept.py",
    "executors/_world.py",
    "cluster/_executor.py",
    "cluster/_clusterworld.py",
    "cluster/_agent.py",
]


@pytest.mark.parametrize("path", PLANNERS)
def test_no_planner_imports_a_parser(path):
    """The cluster planners are not run in a unit test (they need engines): their imports say it."""
    tree = ast.parse((PACKAGE / path).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("_options")
        for alias in node.names
    }
    assert not {name for name in imported if name.startswith("parse_")}, imported


def test_settings_are_typed_at_the_door():
    settings = read_settings(
        nprocs=" 3 ",
        start_method="Spawn",
        backend="AUTO",
        env={"K": 1},
        timeout=None,
        grace_period="0",
        log_dir="",
        ranks=[2, 0],
        given=Given(),
    )
    assert settings == Settings(
        nprocs=3,
        start_method="spawn",
        backend="auto",
        env={"K": "1"},
        timeout=None,
        grace_period=0.0,
        log_dir=None,
        ranks=frozenset({0, 2}),
    )
    request = read_request(
        cell=CellSource("pass"),
        program=None,
        settings=settings,
        namespace={},
        world="w",
        on="0,2-3",
        cluster="rc",  # --nodes needs --cluster
        nodes="2",
        share="a, b",
    )
    assert (request.world, request.on, request.nodes, request.share, request.out) == (
        "w",
        frozenset({0, 2, 3}),
        2,
        ("a", "b"),
        (),
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("world", "a b", "--world needs a name without spaces"),
        ("on", "", "--on needs the ranks that run the cell"),
        ("nodes", 0, "--nodes must be a positive integer"),
        ("out", "1x", "--out: '1x' is not a Python name"),
    ],
)
def test_a_malformed_request_is_refused_at_the_door(field, value, message):
    with pytest.raises(SpawnUsageError, match=message):
        read_request(cell=CellSource("pass"), program=None, settings=Settings(), namespace={}, **{field: value})
