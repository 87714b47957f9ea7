"""A marimo notebook run as a script (``python notebook.py``, issue #46): nbspawn.spawn's ranks print
``[rank{r}]:`` lines, return their values, and a failing rank is named with its line in the marimo
cell, under every start method.  The notebook in the browser is tests/browser/test_marimo.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("marimo", reason="marimo is not installed (pip install -e '.[marimo]')")
# Once alone beside the cluster tests (marimo scripts start their own interpreters and ranks, too much
# beside those tests' timed waits on 2 cores); the cluster tests now wait for what they assert, so these
# run in the parallel phase
pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]

FAILING = """
import marimo

app = marimo.App()


@app.cell
def _():
    import nbspawn
    return (nbspawn,)


@app.cell
def _():
    def load(rank):
        print("loading on", rank, flush=True)
        if rank == 1:
            raise KeyError("shard 1")
        return rank
    return (load,)


@app.cell
def _(load, nbspawn):
    nbspawn.spawn(load, nprocs=2, start_method="{method}")
    return


if __name__ == "__main__":
    app.run()
"""


def test_the_marimo_example_runs_as_a_script():
    done = subprocess.run(
        [sys.executable, str(REPO / "notebooks" / "torch_spawn_marimo.py")], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"[rank{rank}]: step 2: loss" in done.stdout, done.stdout
    assert "each rank's last loss: [" in done.stdout, done.stdout


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_failing_rank_in_a_marimo_script_is_named_at_its_line(tmp_path, method):
    path = tmp_path / "failing.py"
    path.write_text(FAILING.replace("{method}", method))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=240)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    assert "[rank1]: loading on 1" in done.stdout, text
    assert "RankRaisedError: rank 1" in text and "KeyError: 'shard 1'" in text, text
    assert 'raise KeyError("shard 1")' in text, text  # the marimo cell's line, in a rank that has not its linecache
