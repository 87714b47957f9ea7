"""``Run`` is the public result: other modules talk to a run through its methods, never its private
fields (the supervisor keeps its own state), and those methods do what the supervisor relied on."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import nbspawn
from nbspawn._runstate import Run
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec

PACKAGE = Path(nbspawn.__file__).parent
PRIVATE = {f.name for f in dataclasses.fields(Run) if f.name.startswith("_")}


def _run(tmp_path: Path) -> Run:
    spec = RunSpec(run_id="r", nprocs=1, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path))
    return Run(spec, background=True)


def test_no_module_reads_or_writes_a_runs_private_fields():
    touched = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_runstate.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    touched.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert {"_done", "_stop_requested", "_on_wait", "_ask_elsewhere"} <= PRIVATE  # the checker looks for something
    assert not touched, "\n".join(touched)


def test_the_private_fields_are_not_constructor_arguments(tmp_path):
    assert all(not f.init for f in dataclasses.fields(Run) if f.name.startswith("_"))


def test_a_stop_request_says_who_asked(tmp_path):
    run = _run(tmp_path)
    assert run.stop_requested_by is None
    run.stop(by="%spawn stop")
    assert run.stop_requested_by == "%spawn stop"


def test_what_waits_for_the_wait_is_called_once_before_the_error_is_raised(tmp_path):
    run = _run(tmp_path)
    seen: list[str] = []
    run.when_waited(lambda done: seen.append(done.status))
    assert run.wait(timeout=0) is False and seen == []
    run.status, run.error = "failed", KeyError(3)
    run.ended()
    for _ in range(2):
        try:
            run.wait()
        except KeyError:
            pass
    assert seen == ["failed"]


def test_where_is_asked_elsewhere_once_told(tmp_path):
    run = _run(tmp_path)
    assert run.where(wait=0) == ""  # no rank runs here
    run.where_asked_by(lambda wait: f"asked the agents, {wait:g} s")
    assert run.where(wait=1.5) == "asked the agents, 1.5 s"


def test_a_run_on_a_world_knows_which_cell_it_was(tmp_path):
    run = _run(tmp_path)
    run.ran_on_world("w", 3)
    assert (run.world, run.world_cell, run.facts().world_cell) == ("w", 3, 3)


def test_a_run_is_done_only_once_what_waited_for_its_end_has_been_told(tmp_path):
    """``%spawn stop`` returns once the run is done: its ``Out[]`` line must be redrawn by then, inside
    the cell that stopped it (CI saw the redraw come after that cell's end: ``done`` was set first)."""
    import threading
    import time

    run = _run(tmp_path)
    told: list[tuple[str, bool]] = []

    def redraw(done: Run) -> None:
        time.sleep(0.3)  # a redraw that takes its time (a busy kernel)
        told.append(("redraw", done.done))
        done.when_ended(lambda again: told.append(("added meanwhile", again.done)))

    run.when_ended(redraw)
    ending = threading.Thread(target=run.ended)
    ending.start()
    assert run.ended_within(30)  # a hang guard
    assert told == [("redraw", False), ("added meanwhile", False)], told
    ending.join(30)
    run.when_ended(lambda late: told.append(("after", late.done)))  # once done, called at once
    assert told[-1] == ("after", True)
