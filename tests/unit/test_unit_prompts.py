"""The pure parts of a rank's prompts: which prompt is asked next, how it reads, the request's wire,
the FIFO round trip between a rank (nbspawn.ranks._prompt) and the kernel (nbspawn.events._prompts),
and a quit debugger's traceback."""

from __future__ import annotations

import os
import threading

import pytest

from nbspawn._rankdir import RankDir, prompts_path
from nbspawn.events._prompts import PromptChannel, PromptRequest, decorate, leaves, next_prompt
from nbspawn.ranks import _prompt


def req(rank: int, kind: str = "pdb", id: int = 1) -> PromptRequest:
    return PromptRequest(rank, kind, f"(Pdb rank {rank}) ", id)


def test_prompts_are_asked_in_arrival_order():
    assert next_prompt([req(2), req(0), req(1)], None, False) == req(2)
    assert next_prompt([], None, False) is None


def test_a_failing_ranks_question_is_never_a_prompt():
    assert next_prompt([req(1, "failed"), req(3)], None, False) == req(3)
    assert next_prompt([req(1, "failed")], None, False) is None


def test_a_rank_in_a_pdb_session_keeps_the_prompt():
    assert next_prompt([req(2), req(1)], 1, True) == req(1)
    assert next_prompt([req(2)], 1, True) is None  # it has not come back yet: the others wait
    assert next_prompt([req(2)], 1, False) == req(2)  # it let go (or took too long)


@pytest.mark.parametrize(
    ("command", "leaving"),
    [("c", True), ("continue", True), ("q", True), ("EOF", True), ("n", False), ("p x", False), ("", False), ("c;;p x", True)],
)
def test_which_commands_let_a_rank_run_on(command, leaving):
    assert leaves(command) is leaving


def test_a_prompt_names_its_rank_and_those_waiting():
    assert decorate(req(1), []) == "(Pdb rank 1) "
    assert decorate(PromptRequest(2, "input", "lr? ", 1), []) == "[rank 2] lr? "
    assert decorate(req(1), [3]) == "(rank 3 waits: one prompt at a time, in arrival order) (Pdb rank 1) "
    assert decorate(req(1), [3, 2]).startswith("(ranks 2, 3 wait: one prompt at a time")


@pytest.mark.parametrize("line", [b"", b"{", b'{"rank": 1}', b'{"rank": "x", "kind": "pdb", "id": 1}', b"[]"])
def test_a_bad_request_line_is_ignored(line):
    assert PromptRequest.parse(line) is None


def test_a_request_and_its_answer_go_through_the_fifos(tmp_path):
    rank_dir = tmp_path / "0"
    rank_dir.mkdir()
    channel = PromptChannel.open(str(tmp_path), [str(rank_dir)])
    assert channel is not None
    got: list[object] = []
    _prompt.use(prompts_path(str(tmp_path)), RankDir(str(rank_dir)).answers)
    try:
        asker = threading.Thread(target=lambda: got.append(_prompt.ask("name? ")))
        asker.start()
        requests: list[PromptRequest] = []
        while not requests:
            requests = channel.read()
        assert requests[0].rank == _prompt._rank and requests[0].prompt == "name? " and requests[0].kind == "input"
        channel.answer(PromptRequest(0, "input", "", requests[0].id + 100), value="stale")  # another request's answer
        channel.answer(requests[0], value="Ada")
        asker.join(10)
        assert got == ["Ada"]
    finally:
        _prompt.use(None, None)
        channel.close()
    assert sorted(os.listdir(tmp_path)) == ["0"] and os.listdir(rank_dir) == []  # no FIFO left in the logs


def test_without_a_channel_a_prompt_fails_at_once(tmp_path):
    _prompt.use(prompts_path(str(tmp_path)), RankDir(str(tmp_path)).answers)
    try:
        with pytest.raises(_prompt.NoPromptError, match="nothing can answer a prompt here"):
            _prompt.ask("x? ")
    finally:
        _prompt.use(None, None)


def test_a_quit_debuggers_traceback_ends_in_the_users_code():
    import bdb

    def user() -> None:
        debugger_frame()

    def debugger_frame() -> None:
        raise _prompt.DebuggerQuit("debugger quit on rank 0")

    debugger_frame.__code__ = debugger_frame.__code__.replace(co_filename=bdb.__file__)
    try:
        user()
    except _prompt.DebuggerQuit as exc:
        tb = _prompt.cut_debugger_frames(exc.__traceback__)
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert names == ["test_a_quit_debuggers_traceback_ends_in_the_users_code", "user"]


def test_a_pdb_request_says_where_it_stopped_and_the_chip_says_so():
    line = b'{"rank": 1, "kind": "pdb", "prompt": "(Pdb rank 1) ", "id": 3, "where": "cell line 4"}'
    request = PromptRequest.parse(line)
    assert request == PromptRequest(1, "pdb", "(Pdb rank 1) ", 3, False, "cell line 4")
    assert request.waiting_note == "at a breakpoint (Pdb, cell line 4)"
    assert PromptRequest(1, "pdb", "", 1).waiting_note == "at a breakpoint (Pdb)"
    assert PromptRequest(1, "input", "", 1).waiting_note == "waiting for input (input())"
    assert PromptRequest(1, "input", "", 1, password=True).waiting_note == "waiting for input (getpass)"


@pytest.mark.parametrize(
    ("words", "parsed"),
    [
        ([], (None, None)),
        (["1"], (None, 1)),  # a lone number is a rank, whatever exists
        (["w"], ("w", None)),
        (["w", "2"], ("w", 2)),
        (["7", "0"], ("7", 0)),  # a world named by digits, with its rank
        (["20261123-231500-ab12"], ("20261123-231500-ab12", None)),
    ],
)
def test_debugs_words_a_last_number_is_the_rank(words, parsed):
    from nbspawn.executors._debug import parse_debug_words

    assert parse_debug_words(words) == parsed


@pytest.mark.parametrize("words", [["a", "b"], ["a", "b", "1"], ["1", "2", "3"]])
def test_debugs_words_name_one_thing_at_most(words):
    from nbspawn.errors import SpawnUsageError
    from nbspawn.executors._debug import parse_debug_words

    with pytest.raises(SpawnUsageError, match="one world or run and one rank at most"):
        parse_debug_words(words)


def test_without_a_rank_the_root_cause_of_the_last_failed_cell_is_debugged():
    from nbspawn._source import CellSource
    from nbspawn.executors._debug import default_rank
    from nbspawn.executors._world import KeptFailure, World

    cell = CellSource("x")
    world = World(name="w", spec=None, base_dir="/tmp")  # type: ignore[arg-type]  # only its kept failures are read
    world.kept = {
        0: KeptFailure(0, cell, 2, "ValueError: late", 20.0),
        3: KeptFailure(3, cell, 2, "RuntimeError: first", 10.0),
        1: KeptFailure(1, cell, 1, "KeyError: older cell", 1.0),
    }
    assert default_rank(world) == 3


def test_a_rank_keeps_a_failure_not_an_interrupt_nor_a_quit_debugger():
    from nbspawn._source import CellSource
    from nbspawn.ranks import _worldloop as rank_world

    cell = CellSource("x")
    before = rank_world._kept
    try:
        error = ValueError("bad")
        rank_world.keep_failure(error, cell)
        for other in (KeyboardInterrupt(), _prompt.DebuggerQuit("q"), _prompt.NoPromptError("no stdin")):
            rank_world.keep_failure(other, cell)
        assert rank_world._kept == (error, cell)
    finally:
        rank_world._kept = before


def test_an_attached_cell_shows_where_the_rank_stopped_then_what_it_writes(tmp_path, capsys):
    from nbspawn.executors._prompting import ECHO_LINES, _echo, _tail_offsets

    out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
    out.write_text("".join(f"line {i}\n" for i in range(40)))
    offsets = _tail_offsets(str(out), str(err))  # no stderr.log yet: from its start
    _echo(str(out), str(err), offsets)
    shown = capsys.readouterr().out.splitlines()
    assert shown == [f"line {i}" for i in range(40 - ECHO_LINES, 40)]
    with out.open("a") as fh:
        fh.write("(Pdb) answer\n")
    err.write_text("a warning\n")
    _echo(str(out), str(err), offsets)
    said = capsys.readouterr()
    assert said.out == "(Pdb) answer\n" and said.err == "a warning\n"


def test_an_attached_cell_says_how_a_run_ended_when_the_desk_closes_a_moment_before_it_ends(tmp_path):
    # the run's end closes the desk (ranks reaped), then settles the status (outputs home, the view told)
    # and only then is done: a cell attached in between once said "the run is ending (ended)"
    from nbspawn._runstate import Run
    from nbspawn._source import CellSource
    from nbspawn._spec import RunSpec
    from nbspawn.executors._prompting import PromptDesk

    class Running:
        def __init__(self) -> None:
            self.alive: dict = {}
            self.stop_reason = None
            self.deadline = float("inf")

    spec = RunSpec(run_id="r", nprocs=1, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path))
    run = Run(spec, background=True)
    desk = PromptDesk(run, view=None, loop=Running())  # type: ignore[arg-type]  # no prompt is shown: no view
    desk.close()

    def settles() -> None:
        run.status = "succeeded"
        run.ended()

    threading.Timer(0.2, settles).start()
    assert desk._answer_attached(None, {}) == "the run ended (succeeded)"


def test_input_at_a_rank_gives_its_process_groups_an_hour_as_the_debugger_does(tmp_path, monkeypatch):
    """docs/guide.md (CUDA): a prompt (pdb, input(), getpass()) raises this rank's groups' timeouts to an
    hour, as torch.distributed.breakpoint does.  input() did not (issue 41, M4).  torch.distributed
    is stood in for by what extend_timeouts asks of it: its groups, and _set_pg_timeout's calls."""
    import sys
    import types
    from datetime import timedelta

    calls: list[tuple[timedelta, object]] = []
    c10d = types.SimpleNamespace(_pg_map={"default": None, "sub": None}, _set_pg_timeout=lambda t, g: calls.append((t, g)))
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, distributed_c10d=c10d)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setitem(sys.modules, "torch.distributed.distributed_c10d", c10d)
    rank_dir = tmp_path / "0"
    rank_dir.mkdir()
    channel = PromptChannel.open(str(tmp_path), [str(rank_dir)])
    assert channel is not None
    _prompt.use(prompts_path(str(tmp_path)), RankDir(str(rank_dir)).answers)
    try:
        asker = threading.Thread(target=lambda: _prompt.ask("name? "))
        asker.start()
        requests: list[PromptRequest] = []
        while not requests:
            requests = channel.read()
        channel.answer(requests[0], value="Ada")
        asker.join(10)
    finally:
        _prompt.use(None, None)
        channel.close()
    assert calls == [(timedelta(seconds=_prompt.LONG_TIMEOUT_S), "default"), (timedelta(seconds=_prompt.LONG_TIMEOUT_S), "sub")]


def test_a_kept_failure_that_reaches_a_shared_tensor_through_any_object_keeps_only_a_note():
    """A world rank keeps a failed cell's frames for ``%spawn debug``, unless they reach memory the
    kernel sent with ``--share`` (they would pin it while the world lives: a CUDA tensor's GPU memory
    stays allocated after the kernel's ``del``).  Reached as the garbage collector sees it: a local,
    an attribute of ``self``, a dataclass's field, a closure's cell, a module's parameter (the fourth
    GPU review's C3: only locals that were tensors, modules or containers were seen).  A frame that
    reaches no shared memory keeps its frames."""
    import dataclasses
    import functools

    import torch

    from nbspawn._source import CellSource
    from nbspawn.ranks import _worldloop as rank_world

    g = torch.zeros(4)
    g_view = g[1:]

    class Step:
        def __init__(self, t):
            self.t = t

        def __call__(self):
            raise ValueError("inside the step")

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor

    def takes(batch):
        raise ValueError("inside takes")

    def closing_over(t):
        def inner():
            return t.sum()

        def fails(fn):
            raise ValueError("inside fails")

        return functools.partial(fails, inner)

    def failure(call) -> BaseException:
        """What ``call()`` raised, its traceback from the call on (a rank's begins at the cell's top level,
        which is not looked at: the names --share sent are popped from there)."""
        try:
            call()
        except ValueError as exc:
            return exc.with_traceback(exc.__traceback__.tb_next)
        raise AssertionError("no failure")

    model = torch.nn.Linear(2, 2)  # shared as a module: its parameters' memory
    cases = {
        "self in __call__()": (failure(Step(g_view)), [g]),
        "batch in takes()": (failure(functools.partial(takes, Batch(g))), [g]),
        "fn in fails()": (failure(closing_over(g)), [g]),
        "self in __call__() ": (failure(Step({"layers": [model]})), [model]),
    }
    for where, (exc, shared) in cases.items():
        assert rank_world._holding(exc, shared) == where.strip(), where
    unrelated = failure(Step(torch.ones(2)))
    assert rank_world._holding(unrelated, [g]) is None
    before = rank_world._kept
    try:
        rank_world.keep_failure(cases["self in __call__()"][0], CellSource("x"), [g])
        assert isinstance(rank_world._kept[0], str) and "self in __call__()" in rank_world._kept[0]
        rank_world.keep_failure(unrelated, CellSource("x"), [g])
        assert rank_world._kept[0] is unrelated
    finally:
        rank_world._kept = before
