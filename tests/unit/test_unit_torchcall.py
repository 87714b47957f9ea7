"""nbspawn.spawn's pure parts: torch's parameters checked before any process starts, and which kernel
cells' sources a spawned rank needs for its tracebacks."""

from __future__ import annotations

import linecache

import pytest

from nbspawn._source import kernel_cell_sources
from nbspawn._torchcall import _checked_call
from nbspawn.errors import SpawnUsageError


def _f(i, n, scale=1.0):
    return i * n * scale


@pytest.mark.parametrize(
    "args, nprocs, method, said",
    [
        ((1,), 0, "spawn", "nprocs as a whole number"),
        ((1,), True, "spawn", "nprocs as a whole number"),
        ((1,), 2.0, "spawn", "nprocs as a whole number"),
        ("ab", 2, "spawn", "args as a tuple"),
        ((1, 2, 3, 4), 2, "spawn", "cannot take them"),
        ((), 2, "spawn", "cannot take them"),
        ((1,), 2, "threads", "start_method fork, spawn, forkserver"),
    ],
)
def test_torchs_parameters_are_refused_in_one_line(args, nprocs, method, said):
    with pytest.raises(SpawnUsageError, match=None) as caught:
        _checked_call(_f, args, nprocs, method, False)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_what_torch_takes_is_taken():
    assert _checked_call(_f, [2], 2, "fork", False) == (2,)
    assert _checked_call(_f, (2, 0.5), 1, "forkserver", True) == (2, 0.5)
    assert _checked_call(print, (), 1, "spawn", False) == ()  # a builtin: torch finds out at the call
    with pytest.raises(SpawnUsageError, match="fn must be callable"):
        _checked_call(3, (), 1, "spawn", False)


def test_a_spawned_rank_gets_the_cells_of_the_function_and_of_what_it_calls():
    helper_file, main_file, other_file = (
        "/nonexistent/ipykernel_1/11.py",
        "/nonexistent/ipykernel_1/22.py",
        "/nonexistent/ipykernel_1/33.py",
    )
    namespace: dict = {"__name__": "__main__"}
    for filename, source in [
        (helper_file, "def helper(x):\n    return x + 1\n"),
        (main_file, "def main(i):\n    def inner():\n        return helper(i)\n    return inner()\n"),
        (other_file, "def unrelated():\n    pass\n"),
    ]:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
    numbers = {helper_file: 1, main_file: 2, other_file: 3}
    sent = dict(kernel_cell_sources([namespace["main"]], numbers))
    assert sorted(sent) == [helper_file, main_file]  # inner() calls helper: followed through the nested code
    assert sent[main_file].startswith("def main(i):")
    # a cell only the kernel's linecache has is sent without IPython's numbers too (marimo's cells)
    assert sorted(dict(kernel_cell_sources([namespace["main"]], {}))) == [helper_file, main_file]
    assert kernel_cell_sources([_f, 3, "x"], numbers) == ()  # not __main__'s


def test_a_function_from_a_file_on_disk_is_read_there(tmp_path):
    on_disk = tmp_path / "helpers.py"
    on_disk.write_text("def f(i):\n    return i\n")
    namespace: dict = {"__name__": "__main__"}
    exec(compile(on_disk.read_text(), str(on_disk), "exec"), namespace)
    linecache.getlines(str(on_disk))  # in the linecache too: the rank reads it from the disk all the same
    assert kernel_cell_sources([namespace["f"]], {}) == ()
