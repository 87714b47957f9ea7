"""Unit tests of what a failed run says: nbspawn.errors (rank lists, a rank's headline, the report of
each exception, alike ranks grouped, where the logs are). No kernel, no processes."""

from __future__ import annotations

import io
import pickle
import re

import pytest
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from nbspawn.errors import (
    RankExitedError,
    RankFailure,
    RankRaisedError,
    RunFacts,
    SpawnError,
    SpawnInterrupted,
    SpawnOutputError,
    SpawnTimeoutError,
    rank_spans,
)

ANSI_BOLD, ANSI_RESET = "\x1b[1m", "\x1b[0m"

# -- rank_spans -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "spelled"),
    [
        ([0], "0"),
        ([3, 4], "3-4"),
        ([0, 1, 2, 5], "0-2,5"),
        ([0, 2, 4], "0,2,4"),
        ([7, 8, 9, 10, 12, 13], "7-10,12-13"),
        ([1, 3, 4, 5, 63], "1,3-5,63"),
        (list(range(64)), "0-63"),
    ],
)
def test_rank_spans(ranks, spelled):
    assert rank_spans(ranks) == spelled


# -- RankFailure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "summary"),
    [
        (RankFailure(0, 5, exc_type="ValueError", message="bad"), "ValueError: bad"),
        (RankFailure(0, 5, exc_type="KeyboardInterrupt"), "KeyboardInterrupt"),
        (RankFailure(0, 5, exc_type="E", message=""), "E"),
        (RankFailure(0, 5, exit_code=-11, signal_name="SIGSEGV"), "killed by SIGSEGV"),
        (RankFailure(0, 5, exit_code=3), "exited with code 3"),
        (RankFailure(0, 5, exit_code=1, signal_name="SIGTERM", exc_type="X", message="m"), "X: m"),  # exception first
    ],
)
def test_summary(failure, summary):
    assert failure.summary == summary


def test_headline():
    assert RankFailure(1, 101, exit_code=1).headline() == "rank 1 (pid 101) failed: exited with code 1"
    assert RankFailure(2, 7, signal_name="SIGTERM", stopped=True).headline() == "rank 2 (pid 7) was stopped: killed by SIGTERM"
    remote = RankFailure(3, None, exit_code=1, node="node 1 (hostb)")
    assert remote.headline() == "rank 3 on node 1 (hostb) (pid None) failed: exited with code 1"


# -- the exceptions' reports ----------------------------------------------------------------------

TRACEBACK = "Traceback (most recent call last):\n  Cell In[3], line 2\n    1/0\nZeroDivisionError: division by zero\n"
ROOT = RankFailure(1, 101, exit_code=1, exc_type="ZeroDivisionError", message="division by zero", traceback=TRACEBACK)
STACK = "  Cell In[3], line 4\n    dist.barrier()"


def stopped(rank: int, stack: str | None = STACK) -> RankFailure:
    return RankFailure(rank, 100 + rank, exit_code=-15, signal_name="SIGTERM", stopped=True, stack=stack)


def test_a_raised_error_names_the_root_cause_then_groups_the_others():
    error = RankRaisedError([ROOT, stopped(0), stopped(2), stopped(3)])
    assert str(error).splitlines() == [
        "RankRaisedError: rank 1 (pid 101) failed: ZeroDivisionError: division by zero",
        "Traceback (most recent call last):",
        "  Cell In[3], line 2",
        "    1/0",
        "ZeroDivisionError: division by zero",
        "Other ranks:",
        "ranks 0,2-3 were stopped the same way: killed by SIGTERM",
        "  where it was (most recent call last):",
        "    Cell In[3], line 4",
        "      dist.barrier()",
    ]
    assert (error.rank, error.exc_type, error.error_index, error.error_pid) == (1, "ZeroDivisionError", 1, 101)
    assert isinstance(error, ProcessRaisedException) and isinstance(error, SpawnError)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ipython_shows_the_report_in_colour(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdout", _Terminal())  # outside a kernel, only a terminal gets colours
    lines = RankRaisedError([ROOT, stopped(0)])._render_traceback_()
    assert lines[0] == f"{ANSI_BOLD}RankRaisedError: rank 1 (pid 101) failed: ZeroDivisionError: division by zero{ANSI_RESET}"
    assert "\x1b[32m  Cell In[3], line 2\x1b[0m" in lines  # the cell's frames in green
    assert "\x1b[1mOther ranks:\x1b[0m" in lines
    # the same lines as str(), colours aside
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines] == str(RankRaisedError([ROOT, stopped(0)])).splitlines()


def test_ranks_that_ended_differently_are_listed_apart():
    others = [RankFailure(0, 1, exit_code=1), RankFailure(2, 3, exit_code=1), RankFailure(3, 4, exit_code=2), stopped(4, None)]
    lines = str(RankExitedError([RankFailure(1, 2, exit_code=1), *others])).splitlines()
    assert lines == [
        "RankExitedError: rank 1 (pid 2) failed: exited with code 1",
        "Other ranks:",
        "ranks 0,2 failed the same way: exited with code 1",
        "rank 3 (pid 4) failed: exited with code 2",
        "rank 4 (pid 104) was stopped: killed by SIGTERM",
    ]


def test_ranks_whose_peers_connections_broke_are_grouped_whatever_port_each_names():
    """Rank 2 raised; the others' barrier broke as it left, each naming its own peer's port (gloo):
    one group, the port left out, not three near-identical tracebacks."""

    def broken(rank: int, port: int, reset: bool = False) -> RankFailure:
        said = (
            f"[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:{port}: Connection reset by peer"
            if reset
            else f"[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:{port}"
        )
        traceback = f"Traceback (most recent call last):\n  Cell In[4], line 5\n    dist.barrier()\n  ... 2 frames in torch ...\nRuntimeError: {said}"
        return RankFailure(rank, 10 + rank, exit_code=1, exc_type="RuntimeError", message=said, traceback=traceback, after=2)

    root = RankFailure(2, 12, exit_code=1, exc_type="ValueError", message="root", traceback="ValueError: root")
    lines = str(RankRaisedError([root, broken(0, 22960), broken(1, 41002), broken(3, 3001), broken(4, 7, True)])).splitlines()
    assert lines[3] == (
        "ranks 0-1,3 failed after rank 2 the same way: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
        "tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:<port>"
    ), lines
    assert lines[4:8] == [
        "  Traceback (most recent call last):",
        "    Cell In[4], line 5",
        "      dist.barrier()",
        "    ... 2 frames in torch ...",
    ]
    assert lines[8].endswith("Connection closed by peer [127.0.0.1]:<port>"), lines
    assert lines[9].startswith("rank 4 (pid 14) failed after rank 2: RuntimeError: [") and lines[9].endswith(
        ":7: Connection reset by peer"
    )
    assert sum(line.startswith(("rank", "ranks")) for line in lines[3:]) == 2, lines


def test_ranks_stopped_in_different_places_are_not_grouped():
    lines = str(SpawnTimeoutError(1.0, [stopped(0), stopped(1, "  Cell In[3], line 9\n    step()")])).splitlines()
    assert lines[1] == "rank 0 (pid 100) was stopped: killed by SIGTERM"
    assert "rank 1 (pid 101) was stopped: killed by SIGTERM" in lines
    assert not any(line.startswith("ranks ") for line in lines)


def test_an_exited_rank_says_where_it_was():
    error = RankExitedError([RankFailure(0, 9, exit_code=-11, signal_name="SIGSEGV", stack="  Cell In[2], line 1\n    crash()")])
    assert str(error).splitlines() == [
        "RankExitedError: rank 0 (pid 9) failed: killed by SIGSEGV",
        "  where it was (most recent call last):",
        "    Cell In[2], line 1",
        "      crash()",
    ]
    assert (error.exit_code, error.signal_name, error.error_pid, error.error_index) == (-11, "SIGSEGV", 9, 0)
    assert isinstance(error, ProcessExitedException)


@pytest.mark.parametrize(
    "error",
    [
        RankRaisedError([ROOT, stopped(0)]),
        RankExitedError([RankFailure(0, 9, exit_code=-11, signal_name="SIGSEGV"), stopped(1)]),
        SpawnInterrupted([stopped(0)], stopped_by="run.stop()"),
    ],
)
def test_errors_survive_pickling(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)


def test_a_timeout_counts_the_ranks_still_running():
    error = SpawnTimeoutError(2.5, [stopped(0), stopped(1)])
    assert str(error).splitlines() == [
        "SpawnTimeoutError: the run timed out after 2.5 s with 2 ranks still running",
        "ranks 0-1 were stopped the same way: killed by SIGTERM",
        "  where it was (most recent call last):",
        "    Cell In[3], line 4",
        "      dist.barrier()",
    ]
    assert isinstance(error, TimeoutError)
    assert str(SpawnTimeoutError(10.0, [RankFailure(0, 1, exit_code=1), stopped(1, None)])).splitlines()[0] == (
        "SpawnTimeoutError: the run timed out after 10 s with 1 rank still running"
    )


def test_an_interrupt_and_a_stop():
    interrupted = SpawnInterrupted([RankFailure(0, 1, stopped=True, exc_type="KeyboardInterrupt", stack="  Cell In[1], line 2")])
    assert isinstance(interrupted, KeyboardInterrupt)
    assert interrupted.stopped_by is None and interrupted.args == ("the run was interrupted",)
    assert str(interrupted).splitlines() == [
        "KeyboardInterrupt: %%spawn was interrupted; the ranks were stopped",
        "rank 0 (pid 1) was stopped: KeyboardInterrupt",
        "  where it was (most recent call last):",
        "    Cell In[1], line 2",
    ]
    by_api = SpawnInterrupted([], stopped_by="run.stop()")
    assert by_api.args == ("the run was stopped (run.stop())",)
    assert str(by_api) == "SpawnInterrupted: the run was stopped (run.stop())"
    # not said: a run whose status is "stopped" was stopped by its Stop button
    by_button = SpawnInterrupted([], facts=RunFacts(status="stopped"))
    assert by_button.stopped_by == "Stop button"
    assert SpawnInterrupted([], facts=RunFacts(status="failed")).stopped_by is None


def test_a_missing_out_name_is_reported_per_name():
    error = SpawnOutputError([(0, "x"), (2, "x"), (1, "y")])
    assert str(error).splitlines() == [
        "SpawnOutputError: --out 'x' is not defined on ranks 0, 2",
        "SpawnOutputError: --out 'y' is not defined on rank 1",
    ]
    assert isinstance(error, LookupError) and error.failures == []


def run_stub(run_dir: str = "/logs/20260101-000000-abcd", nodes: dict | None = None, lost: str | None = None) -> RunFacts:
    """What the reports say of a run: its log directory, its nodes' log directories, a kept world lost."""
    return RunFacts(run_dir=run_dir, status="failed", world="w", world_lost=lost, node_log_dirs=nodes or {})


def test_the_logs_line_names_where_each_ranks_logs_are():
    error = RankExitedError([RankFailure(0, 9, exit_code=1)], facts=run_stub())
    assert str(error).splitlines()[-1] == "Logs: /logs/20260101-000000-abcd/<rank>/{stdout.log,stderr.log,error.json}"
    assert (
        error._report(color=True)[-1]  # as a terminal or a notebook shows it
        == "\x1b[2mLogs: /logs/20260101-000000-abcd/<rank>/{stdout.log,stderr.log,error.json}\x1b[0m"
    )
    assert "Logs" not in str(RankExitedError([RankFailure(0, 9, exit_code=1)], facts=run_stub(run_dir="")))


def test_a_cluster_runs_logs_are_on_each_node():
    run = run_stub(nodes={"node 0 (hosta)": "hosta:/l/r", "node 1 (hostb)": "hostb:/l/r"})
    assert str(SpawnTimeoutError(1.0, [], facts=run)).splitlines()[-1] == (
        "Logs, on each node: node 0 (hosta) hosta:/l/r/<rank>/; node 1 (hostb) hostb:/l/r/<rank>/"
    )


@pytest.mark.parametrize(("cell", "said"), [(1, "."), (2, ", with the names they had."), (None, ".")])
def test_an_intact_world_claims_its_names_only_after_its_first_cell(cell, said):
    """The cell that started a world (a new one, or one lost and started again) leaves its ranks with no
    names from before: the report once said "with the names they had" under "none of the names"."""
    facts = RunFacts(run_dir="/logs/r", status="failed", world="w", world_cell=cell)
    lines = str(RankExitedError([RankFailure(0, 9, exit_code=1)], facts=facts)).splitlines()
    assert lines[-2] == f"World 'w' is intact: its ranks are back at the prompt{said}"


def test_a_lost_world_is_said_before_the_logs():
    run = run_stub(lost="rank 1 died")
    lines = str(SpawnInterrupted([], facts=run)).splitlines()
    assert lines[-2] == "The world 'w' was lost: rank 1 died; the next cell that names it starts a new one."
    assert lines[-1].startswith("Logs: ")
