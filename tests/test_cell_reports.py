"""What a failed cell says, through a real kernel (issue #17): the prompt a re-run cell ran under,
IPython syntax in a rank (``!cmd``, ``%magic``), and where a rank stopped while importing was."""

from __future__ import annotations

import re
import uuid

import pytest
from kernel_harness import ok, run

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
    (package / "m5.py").write_text("import time\ntime.sleep(60)\n")
    code = (
        f"%%spawn -n 2 --grace-period 1\nimport os, sys, time\nsys.path.insert(0, {str(package.parent)!r})\n"
        "if os.environ['RANK'] == '0':\n    import slowpkg\nelse:\n    time.sleep(1.5)\n    raise ValueError('boom')\n"
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
