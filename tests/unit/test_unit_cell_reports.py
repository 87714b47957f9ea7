"""IPython syntax in a rank's cell, and the stacks of stopped ranks cut to the user's code (issue #17),
without a kernel (nbspawn._source)."""

from __future__ import annotations

import pytest

from nbspawn._source import CELL_FILENAME, CellSource, CellSyntaxError, ipython_syntax_hint, main_thread_stack

CELL = CellSource("import os\nimport lightning\nmain()\n", line_offset=1, label="Cell In[5]")
SITE = "/venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("line", "start"),
    [
        ("!nvidia-smi", "`!nvidia-smi` is IPython syntax"),
        ("  !ls -l", "`!ls -l` is IPython syntax"),
        ("out = !git status", "`!git status` is IPython syntax"),
        ("a, b = !ls", "`!ls` is IPython syntax"),
        ("%time train()", "`%time` is IPython syntax"),
        ("x = %timeit -o f()", "`%timeit` is IPython syntax"),
        ("%%bash", "`%%bash` is IPython syntax"),
        ("%", "`%magic` is IPython syntax"),
    ],
)
def test_ipython_lines_get_a_hint(line, start):
    hint = ipython_syntax_hint(line)
    assert hint.startswith(start), hint
    assert "a rank runs its cell as plain Python" in hint


@pytest.mark.parametrize("line", ["x = (1,", "a = 5 % 3 %", "print('!')", "if x != y", "", "d['k'] = 1 +"])
def test_other_lines_get_none(line):
    assert ipython_syntax_hint(line) == ""


def test_a_shell_escape_says_how_to_run_the_command_from_python():
    with pytest.raises(CellSyntaxError) as err:
        CellSource("import os\n!pip list | grep torch\n", line_offset=1, label="Cell In[7]").parse()
    assert err.value.report().splitlines() == [
        "SyntaxError in Cell In[7], line 3: invalid syntax",
        "    !pip list | grep torch",
        "    ^",
        "`!pip list | grep torch` is IPython syntax, and a rank runs its cell as plain Python, so shell escapes "
        "are not run there. Run the command from Python: os.system('pip list | grep torch'), or "
        "subprocess.run('pip list | grep torch', shell=True, check=True) to fail the rank when it fails.",
    ]


def test_a_plain_syntax_error_has_no_hint():
    with pytest.raises(CellSyntaxError) as err:
        CellSource("x = (1,\n", line_offset=1, label="Cell In[4]").parse()
    assert err.value.hint == "" and "IPython" not in err.value.report()


# -- stacks of stopped ranks: importlib gone, libraries cut ----------------------------------------


def _dump(frames: list[str]) -> str:
    """A faulthandler dump of the main thread, from frames given outermost first."""
    return "Current thread 0x1 (most recent call first):\n" + "\n".join(f"  {f}" for f in reversed(frames))


def _importing(depth: int) -> list[str]:
    frames = ['File "/x/nbspawn/ranks/_cell.py", line 120 in main', f'File "{CELL_FILENAME}", line 3 in <module>']
    frames.append(f'File "{SITE}/lightning/__init__.py", line 19 in <module>')
    for i in range(depth):
        frames += [
            'File "<frozen importlib._bootstrap>", line 1176 in _find_and_load',
            'File "<frozen importlib._bootstrap>", line 690 in _load_unlocked',
            'File "<frozen importlib._bootstrap_external>", line 940 in exec_module',
            'File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed',
            f'File "{SITE}/{"torch" if i >= depth - 2 else "lightning"}/m{i}.py", line {i + 1} in <module>',
        ]
    return frames


def test_a_rank_stopped_in_an_import_shows_the_cell_line_the_call_and_where_it_was():
    assert main_thread_stack(_dump(_importing(6)), CELL).splitlines() == [
        "  Cell In[5], line 3",
        "      import lightning",
        f'  File "{SITE}/lightning/__init__.py", line 19 in <module>',
        "  ... 5 frames in lightning, torch ...",
        f'  File "{SITE}/torch/m5.py", line 6 in <module>',
    ]


def test_a_short_library_tail_is_kept_whole_without_importlib():
    stack = main_thread_stack(_dump(_importing(2)), CELL)
    assert "importlib" not in stack
    assert stack.splitlines()[2:] == [
        f'  File "{SITE}/lightning/__init__.py", line 19 in <module>',
        f'  File "{SITE}/torch/m0.py", line 1 in <module>',
        f'  File "{SITE}/torch/m1.py", line 2 in <module>',
    ]


def test_the_users_own_modules_are_kept_and_the_library_below_them_cut():
    frames = [
        f'File "{CELL_FILENAME}", line 4 in <module>',
        'File "/home/me/project/train.py", line 10 in main',
        'File "/home/me/project/model.py", line 3 in step',
        *(f'File "{SITE}/torch/nn/m{i}.py", line {i} in f{i}' for i in range(5)),
        'File "/usr/lib/python3.11/threading.py", line 320 in wait',
    ]
    assert main_thread_stack(_dump(frames), CELL).splitlines() == [
        "  Cell In[5], line 4",
        "      main()",
        '  File "/home/me/project/train.py", line 10 in main',
        '  File "/home/me/project/model.py", line 3 in step',
        f'  File "{SITE}/torch/nn/m0.py", line 0 in f0',
        "  ... 4 frames in torch ...",
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
    ]
