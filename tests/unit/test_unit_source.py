"""Unit tests of nbspawn._source: a cell's body compiled in the notebook cell's own line numbers,
its syntax errors, and the rewriting of frames (tracebacks, faulthandler dumps) into ``Cell In[N]``.
No kernel, no processes."""

from __future__ import annotations

import ast
import traceback

import pytest

from nbspawn._source import (
    CELL_ENDED,
    CELL_FILENAME,
    STILL_STARTING,
    CellSource,
    CellSyntaxError,
    fold_library_frames,
    main_thread_stack,
    program_stack,
    rewrite_cell_frames,
    rewrite_notebook_frames,
)

# The body of "%%spawn -n 2\nx = 1\ndef f():\n    return 1/0\nf()\n": line 1 is the magic's line.
CELL = CellSource("x = 1\ndef f():\n    return 1/0\nf()\n", line_offset=1, label="Cell In[5]")


def run_cell(cell: CellSource) -> str:
    """The traceback a rank would format running ``cell``."""
    code, last = cell.compile()
    namespace: dict = {}
    try:
        exec(code, namespace)
        if last is not None:
            eval(last, namespace)
    except Exception:
        return traceback.format_exc()
    raise AssertionError("the cell did not raise")


# -- CellSource -----------------------------------------------------------------------------------


def test_padded_body_puts_line_n_of_the_code_at_line_n_of_the_cell():
    assert CELL.padded == "\nx = 1\ndef f():\n    return 1/0\nf()\n"
    assert [CELL.line(n) for n in range(1, 6)] == ["", "x = 1", "def f():", "return 1/0", "f()"]


@pytest.mark.parametrize("lineno", [0, -1, 6, 100])
def test_a_line_outside_the_cell_is_empty(lineno):
    assert CELL.line(lineno) == ""


def test_defaults_label_cell_and_no_offset():
    cell = CellSource("a = 1")
    assert (cell.label, cell.line_offset, cell.padded, cell.line(1)) == ("Cell", 0, "a = 1", "a = 1")


def test_parse_is_in_the_cells_line_numbers():
    tree = CellSource("a = 1\nb = 2", line_offset=3).parse()
    assert isinstance(tree, ast.Module)
    assert [node.lineno for node in tree.body] == [4, 5]


def test_compile_splits_off_a_trailing_expression_as_ipython_does():
    code, last = CellSource("a = 2\na * 3", line_offset=1).compile()
    assert code.co_filename == CELL_FILENAME and last is not None and last.co_filename == CELL_FILENAME
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["a"] == 2
    assert eval(last, namespace) == 6


@pytest.mark.parametrize("body", ["a = 1", "", "for i in range(2):\n    pass", "x = 1\n# only a comment"])
def test_compile_without_a_trailing_expression(body):
    code, last = CellSource(body).compile()
    assert last is None
    exec(code, {})


def test_compiled_frames_carry_the_cells_line_numbers():
    tb = run_cell(CELL)
    assert f'File "{CELL_FILENAME}", line 5, in <module>' in tb
    assert f'File "{CELL_FILENAME}", line 4, in f' in tb
    assert "    return 1/0" in tb  # linecache knows the cell: the source line is under its frame


def test_cell_source_is_frozen_data():
    with pytest.raises(AttributeError):
        CELL.body = "y = 2"  # type: ignore[misc]
    assert CellSource("a", 1, "Cell In[1]") == CellSource("a", 1, "Cell In[1]")


# -- syntax errors --------------------------------------------------------------------------------


def test_a_syntax_error_is_reported_in_the_cells_line_numbers():
    cell = CellSource("x = (1,\ny = 2\n", line_offset=1, label="Cell In[4]")
    with pytest.raises(CellSyntaxError) as err:
        cell.parse()
    e = err.value
    assert isinstance(e, SyntaxError)
    assert (e.lineno, e.filename, e.label) == (2, "Cell In[4]", "Cell In[4]")
    assert e.report() == "SyntaxError in Cell In[4], line 2: '(' was never closed\n    x = (1,\n        ^"


def test_a_syntax_error_report_has_the_line_and_its_caret():
    cell = CellSource("if True:\npass\n", line_offset=2, label="Cell In[9]")
    with pytest.raises(CellSyntaxError) as err:
        cell.compile()  # compile parses first
    lines = err.value.report().splitlines()
    assert lines[0] == "SyntaxError in Cell In[9], line 4: expected an indented block after 'if' statement on line 3"
    assert lines[1:] == ["    pass", "    ^^^^"]


# -- rewrite_cell_frames --------------------------------------------------------------------------


def test_a_tracebacks_cell_frames_read_cell_in_n():
    tb = run_cell(CELL)
    rewritten = rewrite_cell_frames(tb, CELL)
    assert CELL_FILENAME not in rewritten
    # (Python 3.13 puts caret lines under a call that is a whole line too: not what is checked here)
    lines = [line for line in rewritten.splitlines() if line.strip(" ~^")]
    at = lines.index("  Cell In[5], line 5")  # <module>: no ", in"
    # the source line Python printed under each frame is kept, not added again
    assert lines[at : at + 4] == ["  Cell In[5], line 5", "    f()", "  Cell In[5], line 4, in f", "    return 1/0"]
    assert sum("f()" in line for line in lines) == 1
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert rewritten.endswith("\n") == tb.endswith("\n")


def test_a_frame_without_its_source_line_gets_it():
    # faulthandler writes "line N in f" (no comma) and no source line
    assert rewrite_cell_frames(f'  File "{CELL_FILENAME}", line 4 in f\n', CELL) == (
        "  Cell In[5], line 4, in f\n      return 1/0\n"
    )
    # a source line that is not the frame's own is not taken for it
    assert rewrite_cell_frames(f'  File "{CELL_FILENAME}", line 3, in f\n    return 1/0', CELL) == (
        "  Cell In[5], line 3, in f\n      def f():\n    return 1/0"
    )


def test_a_frame_past_the_cells_end_has_no_source_line():
    assert rewrite_cell_frames(f'  File "{CELL_FILENAME}", line 99, in g\n', CELL) == "  Cell In[5], line 99, in g\n"


def test_other_files_are_left_alone():
    text = '  File "/usr/lib/python3.11/threading.py", line 320, in wait\n    waiter.acquire()'
    assert rewrite_cell_frames(text, CELL) == text


# -- main_thread_stack (a faulthandler dump of a cell's rank) -------------------------------------

DUMP = f"""Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/x/nbspawn/ranks/_capture.py", line 10 in pump

Current thread 0x00007f00 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 5 in select
  File "{CELL_FILENAME}", line 4 in f
  File "{CELL_FILENAME}", line 5 in <module>
  File "/x/nbspawn/ranks/_cell.py", line 99 in run_cell
  File "/x/nbspawn/ranks/_cell.py", line 120 in main
"""


def test_the_cells_thread_innermost_last_cut_below_the_cell():
    assert main_thread_stack(DUMP, CELL).splitlines() == [
        "  Cell In[5], line 5",
        "      f()",
        "  Cell In[5], line 4, in f",
        "      return 1/0",
        '  File "/usr/lib/python3.11/selectors.py", line 5 in select',
    ]


def test_the_thread_running_the_cell_is_chosen_whatever_its_place():
    blocks = DUMP.split("\n\n")
    swapped = blocks[1].replace("Current thread", "Thread") + "\n\n" + blocks[0].replace("Thread", "Current thread", 1)
    assert main_thread_stack(swapped, CELL) == main_thread_stack(DUMP, CELL)


def test_a_rank_stopped_before_its_cell_began_is_still_starting():
    dump = 'Current thread 0x1 (most recent call first):\n  File "/x/nbspawn/ranks/_cell.py", line 1 in main\n'
    assert main_thread_stack(dump, CELL) == STILL_STARTING


def test_a_rank_past_its_cells_end_is_not_still_starting():
    """Stopped while it records its cell's error (or asks the kernel about a post-mortem): the cell
    had begun and ended, whatever frames are left."""
    dump = (
        "Current thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.11/json/encoder.py", line 7 in encode\n'
        '  File "/x/nbspawn/ranks/_cell.py", line 390 in write_error\n'
        '  File "/x/nbspawn/ranks/_cell.py", line 228 in execute_cell\n'
        '  File "/x/nbspawn/ranks/_cell.py", line 1 in main\n'
    )
    assert main_thread_stack(dump, CELL) == CELL_ENDED


# The thread that dumps (a rank's answering thread, from Python 3.11) comes first; the main thread is found
# by what it runs, wherever it is in the dump.
ANSWERING = """Current thread 0x00007f02 (most recent call first):
  File "/x/nbspawn/ranks/_stackdump.py", line 80 in _answer

"""
BOOTSTRAP = (
    '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314 in _bootstrap\n'
    '  File "/usr/lib/python3.11/multiprocessing/popen_fork.py", line 71 in _launch\n'
)


def test_a_rank_in_its_entry_point_before_its_cell_is_still_starting():
    main = (
        "Thread 0x00007f00 (most recent call first):\n"
        '  File "/x/nbspawn/ranks/_capture.py", line 140 in capture_output\n'
        '  File "/x/nbspawn/ranks/_cell.py", line 66 in run_rank\n'
        '  File "/x/torch/multiprocessing/spawn.py", line 90 in _wrap\n'
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run\n' + BOOTSTRAP
    )
    assert main_thread_stack(ANSWERING + main, CELL) == STILL_STARTING


def test_a_rank_that_left_its_entry_point_is_past_its_cell():
    """Its cell raised SystemExit, say, and Python's exit waits for a thread: the process's main thread
    is no longer in the rank's entry point, where the answer to a stack request is set up."""
    main = (
        "Thread 0x00007f00 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 1590 in _shutdown\n' + BOOTSTRAP
    )
    assert main_thread_stack(ANSWERING + main, CELL) == CELL_ENDED


def test_nbspawns_own_frames_under_the_cells_line_are_cut():
    """A rank stopped inside a print is at the print: nbspawn's capture of the output is not the user's."""
    main = (
        "Thread 0x00007f00 (most recent call first):\n"
        '  File "/x/site-packages/nbspawn/ranks/_capture.py", line 73 in write\n'
        '  File "/x/site-packages/nbspawn/ranks/_capture.py", line 107 in write\n'
        f'  File "{CELL_FILENAME}", line 5 in <module>\n'
        '  File "/x/nbspawn/ranks/_cell.py", line 80 in run_rank\n' + BOOTSTRAP
    )
    assert main_thread_stack(ANSWERING + main, CELL).splitlines() == ["  Cell In[5], line 5", "      f()"]


@pytest.mark.parametrize("dump", ["", "\n", "Current thread 0x1 (most recent call first):\n"])
def test_no_frames_no_stack(dump):
    assert main_thread_stack(dump, CELL) == ""


# -- rewrite_notebook_frames (functions from earlier cells) ---------------------------------------


def test_frames_in_earlier_cells_read_cell_in_their_number():
    text = (
        '  File "/tmp/ipykernel_1/123.py", line 2, in f\n    return 1/0\n'
        '  File "/other.py", line 3, in g\n'
        '  File "/tmp/ipykernel_1/456.py", line 7, in <module>'
    )
    numbers = {"/tmp/ipykernel_1/123.py": 3, "/tmp/ipykernel_1/456.py": 8}
    assert rewrite_notebook_frames(text, numbers) == (
        '  Cell In[3], line 2, in f\n    return 1/0\n  File "/other.py", line 3, in g\n  Cell In[8], line 7'
    )


def test_no_cell_numbers_changes_nothing():
    text = '  File "/tmp/ipykernel_1/123.py", line 2, in f'
    assert rewrite_notebook_frames(text, {}) == text
    assert rewrite_notebook_frames(text, {"/tmp/ipykernel_1/999.py": 1}) == text


# -- program_stack (a faulthandler dump of a program's rank) --------------------------------------

PROGRAM_DUMP = """Thread 0x2 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x1 (most recent call first):
  File "/home/u/train.py", line 12 in step
  File "/home/u/train.py", line 30 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/usr/lib/python3.11/runpy.py", line 291 in run_path
  File "/x/nbspawn/ranks/_program.py", line 50 in main
"""


def test_a_programs_stack_is_its_own_frames_innermost_last():
    assert (
        program_stack(PROGRAM_DUMP)
        == '  File "/home/u/train.py", line 30 in <module>\n  File "/home/u/train.py", line 12 in step'
    )


def test_a_program_stack_of_nothing_is_empty():
    assert program_stack("") == ""


TORCH = "/x/.venv/lib/python3.11/site-packages/torch/distributed"
BROKEN_BARRIER = f"""Traceback (most recent call last):
  Cell In[15], line 5
    dist.barrier()
  File "{TORCH}/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "{TORCH}/distributed_c10d.py", line 5356, in barrier
    work.wait()
RuntimeError: Connection closed by peer [127.0.0.1]:2284
"""


def test_torchs_frames_under_the_cells_line_fold_to_a_count():
    assert fold_library_frames(BROKEN_BARRIER) == (
        "Traceback (most recent call last):\n  Cell In[15], line 5\n    dist.barrier()\n  ... 2 frames in torch ...\n"
        "RuntimeError: Connection closed by peer [127.0.0.1]:2284\n"
    )


def test_only_frames_under_the_users_last_one_fold_in_each_traceback_of_a_chain():
    own = 'File "/home/me/train.py", line 3, in step\n    dist.barrier()'
    between = BROKEN_BARRIER.replace(
        "  Cell In[15], line 5\n    dist.barrier()\n", f"  Cell In[15], line 5\n    step()\n  {own}\n"
    )
    chain = between + "\nDuring handling of the above exception, another exception occurred:\n\n" + between
    folded = fold_library_frames(chain)
    assert folded.count("  ... 2 frames in torch ...") == 2 and folded.count("/home/me/train.py") == 2, folded
    assert "c10d_logger" not in folded and "During handling" in folded
    library_only = f'Traceback (most recent call last):\n  File "{TORCH}/c10d_logger.py", line 83, in wrapper\nRuntimeError: x\n'
    assert fold_library_frames(library_only) == library_only  # nothing of the user's to fold under
