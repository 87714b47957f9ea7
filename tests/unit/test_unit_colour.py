"""When nbspawn's own text carries colour codes (``_shell.wants_colour``): never under ``NO_COLOR``,
never into a stream that is no terminal outside a kernel; a run's report and the text view agree."""

from __future__ import annotations

import io

import pytest

from nbspawn._runstate import Run
from nbspawn._shell import wants_colour
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec
from nbspawn.errors import RankFailure, RankRaisedError
from nbspawn.views._text import TextView


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _colour_asked_for(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_a_terminal_gets_colour_and_a_file_none():
    assert wants_colour(_Terminal()) is True
    assert wants_colour(io.StringIO()) is False


@pytest.mark.parametrize("value", ["1", "0", "yes", "false"])
def test_no_color_with_any_value_means_none(monkeypatch, value):
    monkeypatch.setenv("NO_COLOR", value)
    assert wants_colour(_Terminal()) is False


def test_an_empty_no_color_is_not_set(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "")
    assert wants_colour(_Terminal()) is True


def _failure() -> RankRaisedError:
    return RankRaisedError(
        [RankFailure(0, 11, exc_type="ValueError", message="bad", traceback="Cell In[1], line 1\nValueError: bad")]
    )


def test_a_reports_colours_follow_the_terminal(monkeypatch):
    """IPython prints ``_render_traceback_`` to stdout: coloured on a terminal, plain into a file or under NO_COLOR."""
    monkeypatch.setattr("sys.stdout", _Terminal())
    assert any("\x1b[" in line for line in _failure()._render_traceback_())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not any("\x1b[" in line for line in _failure()._render_traceback_())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setattr("sys.stdout", io.StringIO())
    assert not any("\x1b[" in line for line in _failure()._render_traceback_())


def _shown(out: io.StringIO) -> str:
    view = TextView(stdout=out, stderr=out, live=False)
    view.started(Run(RunSpec(run_id="r", nprocs=1, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir="")))
    view.output(0, "stdout", "\x1b[1;31mred\x1b[0m plain\n")
    view.output(0, "stderr", "\x1b[33mwarned\x1b[0m\n")
    view._busy.close()
    return out.getvalue()


def test_the_text_view_keeps_a_ranks_colours_only_for_a_terminal(monkeypatch):
    assert _shown(_Terminal()) == "[rank0]: \x1b[1;31mred\x1b[0m plain\n[rank0]: \x1b[33mwarned\x1b[0m\n"
    assert _shown(io.StringIO()) == "[rank0]: red plain\n[rank0]: warned\n"
    monkeypatch.setenv("NO_COLOR", "1")
    assert _shown(_Terminal()) == "[rank0]: red plain\n[rank0]: warned\n"
