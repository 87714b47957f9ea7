"""``Run`` is the public result: other modules talk to a run through its methods, never its private
fields (the supervisor keeps its own state), write its public ones only through its methods (issue #58:
17 writes from 6 modules before), and those methods do what the supervisor relied on."""

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
PUBLIC = {f.name for f in dataclasses.fields(Run) if not f.name.startswith("_")}


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


def _assigned(target: ast.expr) -> list[ast.expr]:
    """What an assignment's target writes: each name of a tuple, and what a subscript is taken of
    (``run.node_batches[i] += 1`` writes ``run.node_batches``)."""
    if isinstance(target, ast.Tuple | ast.List):
        return [written for element in target.elts for written in _assigned(element)]
    if isinstance(target, ast.Subscript):
        return _assigned(target.value)
    return [target]


def _run_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """Each write of a Run's public field in ``tree``, by line: to an attribute of something called
    ``run`` (``run.status = ...``, ``self.run.error = ...``, ``r.reported = ...``)."""
    writes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for written in (w for target in targets for w in _assigned(target)):
            if isinstance(written, ast.Attribute) and written.attr in PUBLIC:
                owner = written.value
                if (isinstance(owner, ast.Name) and owner.id in ("run", "r")) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "run"
                ):
                    writes.append((node.lineno, written.attr))
    return writes


def test_no_module_writes_a_runs_fields_but_through_its_methods():
    """``run.status = ...`` outside ``_runstate.py`` is a defect: each write goes through a method of Run's
    (``began``, ``ended_as``, ``warn_memory``, ...), which says what happened rather than what changed."""
    written = [
        f"{path.relative_to(PACKAGE)}:{line} .{field}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "_runstate.py"
        for line, field in _run_writes(ast.parse(path.read_text(), str(path)))
    ]
    assert {"status", "error", "ended_at", "memory_warning", "node_batches", "shown"} <= PUBLIC  # it looks for something
    assert not written, "\n".join(written)


def test_the_checker_finds_each_shape_of_write():
    """The check above is not blind: the writes it must refuse are found, a rank's state is not a run's."""
    source = "run.status = 'x'\nself.run.error = e\nrun.node_batches[0] += 1\nrun.outputs, missing = f()\nstate.status = 'ok'\n"
    assert _run_writes(ast.parse(source)) == [(1, "status"), (2, "error"), (3, "node_batches"), (4, "outputs")]


def test_how_a_run_ended_is_said_once_by_its_supervisor(tmp_path):
    run = _run(tmp_path)
    run.began()
    assert run.status == "running"
    run.stop_began()
    run.ranks_signalled()
    first = run.ranks_signalled_at
    run.ranks_signalled()  # a second signal (SIGKILL after SIGTERM): the first one counts
    assert first is not None and run.ranks_signalled_at == first and run.stop_began_at is not None
    run.close_logs()
    assert run.ended_at is not None and run.duration is not None and run.duration >= 0
    error = KeyError(1)
    run.ended_as("failed", error)
    assert (run.status, run.error, run.ok) == ("failed", error, False)
    assert run.facts().status == "failed" and run.facts("timeout").status == "timeout"


def test_the_first_memory_warning_is_the_one_kept(tmp_path):
    run = _run(tmp_path)
    run.warn_memory("cuda:0 is nearly full")
    run.warn_memory("memory is running out")  # a later sample's: the first is what the user was told
    assert run.memory_warning == "cuda:0 is nearly full"


def test_a_cluster_runs_batches_are_counted_by_node(tmp_path):
    run = _run(tmp_path)
    run.counts_batches(3)
    for node in (0, 2, 2):
        run.batch_from(node)
    assert run.node_batches == [1, 0, 2]


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
    run.ended_as("failed", KeyError(3))
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
