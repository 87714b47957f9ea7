"""What a failed cell says, through a real kernel (issue #17): the prompt a re-run cell ran under,
IPython syntax in a rank (``!cmd``, ``%magic``), and where a rank stopped while importing was."""

from __future__ import annotations

import re
import uuid

import pytest
from kernel_harness import blocked_line, ok, ready_line, run

FAILS = "%%spawn {options}\nx = 1\nraise ValueError('again')\n"


@pytest.mark.parametrize("shape", ["fresh", "world"])
def test_a_re_run_cell_is_named_by_the_prompt_it_ran_under(kernel, shape):
    """IPython caches a cell under a name made from its source alone, so a re-run keeps its old place
    in the cache: the label must come from the cell running now, not from the last cell cached."""
    world = f"rr{uuid.uuid4().hex[:6]}"
    options = "-n 2" if shape == "fresh" else f"--world {world} -n 2"
    try:
        for _ in range(2):
            for code in (FAILS.format(options=options), FAILS.format(options=options)):
                result = run(kernel, code)
                assert result.status == "error"
                labels = set(re.findall(r"Cell In\[(\d+)\]", result.stderr + result.error_text))
                assert labels == {str(result.execution_count)}, (result.execution_count, result.error_text)
            ok(kernel, "y = 2")  # another cell, cached after it
    finally:
        if shape == "world":
            ok(kernel, f"%spawn stop {world}")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("!ls -l /tmp", "Run the command from Python: os.system('ls -l /tmp')"),
        ("files = !ls", "Run the command from Python: os.system('ls')"),
        ("%time f()", "`%time` is IPython syntax, and a rank runs its cell as plain Python"),
    ],
)
def test_ipython_syntax_in_a_rank_says_what_to_write_instead(kernel, line, says):
    result = run(kernel, f"%%spawn -n 2\nimport os\n{line}\nprint('should not run')\n")
    assert result.status == "error"
    said = result.stderr + result.error_text
    assert re.search(r"SyntaxError in Cell In\[\d+\], line 3: invalid syntax", said), said
    assert says in said and "Traceback" not in said, said
    assert "should not run" not in result.stdout


def test_a_rank_stopped_while_importing_shows_its_import_not_importlib(kernel, tmp_path):
    """Rank 1 fails while rank 0 is deep in an import: rank 0's stack is the cell's line, the call into
    the package and where it was, with the count of frames between, and none of importlib's."""
    package = tmp_path / "site-packages" / "slowpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from . import m0\n")
    for i in range(5):
        (package / f"m{i}.py").write_text(f"from . import m{i + 1}\n")
    ready = tmp_path / "ready"
    ready.mkdir()
    # rank 1 fails once rank 0 is blocked in m5's sleep (its ready line, on that line, before it), not 1.5 s
    # after it started, which a loaded machine's rank 0 did not always need to get there
    (package / "m5.py").write_text(f"import time\n{ready_line(ready)}; time.sleep(60)\n")
    code = (
        f"%%spawn -n 2 --grace-period 1\nimport os, sys, time\nsys.path.insert(0, {str(package.parent)!r})\n"
        f"if os.environ['RANK'] == '0':\n    import slowpkg\nelse:\n    {blocked_line(ready, 1)}\n    raise ValueError('boom')\n"
    )
    result = run(kernel, code, timeout=60)
    assert result.status == "error"
    text = result.error_text
    stopped = text[text.index("rank 0 (pid") :]
    frames = [ln.strip() for ln in stopped.splitlines()[2:] if ln.startswith("    ")]
    assert "importlib" not in stopped, stopped
    assert re.fullmatch(r"Cell In\[\d+\], line 5", frames[0]), frames
    assert frames[1] == "import slowpkg", frames
    assert re.fullmatch(r'File ".*/site-packages/slowpkg/__init__\.py", line 1 in <module>', frames[2]), frames
    assert frames[3] == "... 5 frames in slowpkg ...", frames
    assert re.fullmatch(r'File ".*/site-packages/slowpkg/m5\.py", line 2 in <module>', frames[4]), frames


def told_of(result, rank: int) -> str:
    """What a failed cell's error says from rank ``rank``'s entry among the other ranks on."""
    assert result.status == "error", result.stdout
    return result.error_text[result.error_text.index(f"\nrank {rank} (pid") + 1 :]


def test_a_rank_stopped_on_its_way_out_is_not_told_as_still_starting(kernel, tmp_path):
    """Rank 1's cell ends, but its process waits at exit for a thread it started; rank 0 then fails.
    Stopped there, rank 1 is past its cell (its stack is in Python's exit, not in the rank's entry
    point): it once read "still starting: the cell had not begun" after printing from the cell."""
    # rank 0 fails once rank 1's main thread is in Python's exit (threading._shutdown, waiting for the
    # thread), as the thread itself sees and says in a file: not 1.5 s after it started.  The thread's code
    # is compiled apart from the cell (a thread in a function of the cell's own is taken for the main one)
    at_exit = tmp_path / "at-exit"
    linger = (
        "import sys, threading, time\n"
        "def exiting():\n    frame = sys._current_frames().get(threading.main_thread().ident)\n"
        "    while frame is not None and frame.f_code.co_name != '_shutdown':\n        frame = frame.f_back\n"
        "    return frame is not None\n"
        "def linger():\n    while not exiting():\n        time.sleep(0.01)\n"
        f"    open({str(at_exit)!r}, 'w').close()\n    time.sleep(60)\n"
    )
    code = (
        "%%spawn -n 2 --view text\nimport os, threading, time\nprint('began', flush=True)\n"
        f"if os.environ['RANK'] == '1':\n    exec(compile({linger!r}, '<linger>', 'exec'), lingering := {{}})\n"
        "    threading.Thread(target=lingering['linger']).start()\n"
        f"else:\n    while not os.path.exists({str(at_exit)!r}):\n        time.sleep(0.01)\n    raise ValueError('boom')\n"
    )
    stopped = told_of(run(kernel, code, timeout=60), 1)
    assert "was stopped" in stopped.splitlines()[0], stopped
    assert "its cell had ended" in stopped and "still starting" not in stopped, stopped


def test_a_rank_that_exited_with_its_own_code_as_the_run_stopped_is_told_as_failed(kernel, tmp_path):
    """Rank 0 fails once rank 1 is in its cell; the kernel then asks rank 1 where it is (SIGUSR1), which
    its own handler answers with ``os._exit(3)``, before the kernel's SIGTERM: rank 1 ended as it chose,
    so it failed (exited with code 3). It once read "was stopped", as if the SIGTERM had ended it."""
    ready = tmp_path / "rank1-ready"
    code = (
        "%%spawn -n 2 --view text\nimport os, signal, time\n"
        f"if os.environ['RANK'] == '0':\n    while not os.path.exists({str(ready)!r}):\n        time.sleep(0.01)\n"
        "    raise ValueError('boom')\n"
        f"signal.signal(signal.SIGUSR1, lambda *_: os._exit(3))\nopen({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    result = run(kernel, code, timeout=60)
    assert result.status == "error" and result.error.ename == "RankRaisedError", result.error_text
    assert "\nrank 1 (pid" in result.error_text, result.error_text
    line = next(ln for ln in result.error_text.splitlines() if ln.startswith("rank 1 (pid"))
    assert line.endswith("failed: exited with code 3"), result.error_text


def test_where_a_rank_was_ends_at_the_cells_line_not_in_nbspawn(kernel, tmp_path):
    """Rank 1 is stopped while it prints (in nbspawn's capture of its output, under the cell's print):
    where it was is the cell's line, with none of nbspawn's own frames under it."""
    printing = tmp_path / "printing"  # rank 0 fails once rank 1 is at its loop, not 1.5 s after it started
    code = (
        "%%spawn -n 2 --view text\nimport os, time\n"
        f"if os.environ['RANK'] == '0':\n    while not os.path.exists({str(printing)!r}): time.sleep(0.01)\n"
        f"    raise ValueError('boom')\nopen({str(printing)!r}, 'w').close()\n"
        "while True:\n    print('x' * 100)\n"
    )
    stopped = told_of(run(kernel, code, timeout=60), 1)
    where = [ln.strip() for ln in stopped.splitlines()[2:] if ln.startswith("    ")]
    assert re.fullmatch(r"Cell In\[\d+\], line 8", where[-2]) and where[-1] == "print('x' * 100)", stopped
    assert "nbspawn/" not in stopped.split("Logs:")[0], stopped


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("import threading\ng = threading.Lock()", "RuntimeError: --out: cannot send 'g' (a _thread.lock) back to the kernel"),
        ("g = 1\nname = input('your name? ')", "\nNoPromptError: input() is not available on rank 0"),
    ],
    ids=["out", "input"],
)
def test_an_error_nbspawn_raises_for_the_cells_own_call_is_told_at_the_cells_line(kernel, body, says):
    """``--out`` of a value that cannot be sent, ``input()`` where nothing can answer (nbclient, this
    harness): the error is the message, at the cell's line if it has one, with none of nbspawn's frames
    under it (they once showed ``nbspawn/handoff/_names.py`` and two ``nbspawn/ranks/_prompt.py``)."""
    result = run(kernel, f"%%spawn -n 1 --out g --view text\n{body}")
    assert result.status == "error"
    text = result.error_text.split("Logs:")[0]
    assert says in text and "nbspawn/" not in text and "nbspawn." not in text, text


def test_a_rank_that_failed_after_the_first_failure_is_told_so(kernel):
    """Rank 2 raises first; ranks 0 and 1 fail after it, as peers in a collective do once it has left
    ("Connection closed by peer"): they read "failed after rank 2", not as failures of their own. (They
    ignore SIGTERM here, so the kernel's stop cannot end them before they fail.)"""
    code = (
        "%%spawn -n 3 --view text\nimport os, signal, time\n"
        "if os.environ['RANK'] == '2':\n    raise ValueError('first')\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "theirs = os.environ['TORCHELASTIC_ERROR_FILE'].replace(f\"/{os.environ['RANK']}/error.json\", '/2/error.json')\n"
        "while not os.path.exists(theirs):\n    time.sleep(0.001)\n"
        "raise RuntimeError('peer gone')\n"
    )
    result = run(kernel, code, timeout=60)
    assert result.status == "error"
    lines = result.error_text.splitlines()
    assert re.match(r"RankRaisedError: rank 2 \(pid \d+\) failed: ValueError: first", lines[0]), result.error_text
    assert "ranks 0-1 failed after rank 2 the same way: RuntimeError: peer gone" in lines, result.error_text


def test_a_failed_runs_report_has_no_colour_codes_under_no_color_or_nocolor(kernel):
    """The report a failed run raises is coloured in a notebook, but not once the user asked for none:
    ``NO_COLOR`` (any value), or IPython's ``%colors nocolor`` (``--colors=nocolor``)."""
    fails = FAILS.format(options="-n 1")
    coloured = run(kernel, fails)
    assert coloured.status == "error" and "\x1b[" in "\n".join(coloured.error.traceback)
    try:
        ok(kernel, "import os; os.environ['NO_COLOR'] = '1'")
        plain = run(kernel, fails)
        assert plain.error.traceback and not any("\x1b[" in line for line in plain.error.traceback), plain.error.traceback
    finally:
        ok(kernel, "del os.environ['NO_COLOR']")
    before = ok(kernel, "print(get_ipython().colors)").stdout.strip()
    try:
        ok(kernel, "%colors nocolor")
        plain = run(kernel, fails)
        assert plain.error.traceback and not any("\x1b[" in line for line in plain.error.traceback), plain.error.traceback
    finally:
        ok(kernel, f"%colors {before}")


@pytest.mark.parametrize("method", ["forkserver"])
def test_a_function_from_an_earlier_cell_shows_its_line_in_a_spawned_ranks_traceback(kernel, method):
    """A rank that was not forked (spawn, forkserver: nbspawn's "spawned ranks") has none of the kernel's
    cells in its linecache: the door sends the sources of those that define what the cell calls, so the
    traceback reads as a forked rank's does."""
    ok(kernel, "def helper_of_a_spawned_cell(x):\n    y = x + 1\n    raise ValueError(f'bad {y}')\n")
    ok(kernel, "def step_of_a_spawned_cell(x):\n    return helper_of_a_spawned_cell(x * 2)\n")
    failed = run(kernel, f"%%spawn -n 2 --start-method {method}\nimport os\nstep_of_a_spawned_cell(int(os.environ['RANK']))\n")
    text = failed.error_text
    assert "in step_of_a_spawned_cell\n    return helper_of_a_spawned_cell(x * 2)" in text, text
    assert "in helper_of_a_spawned_cell\n    raise ValueError(f'bad {y}')" in text, text
