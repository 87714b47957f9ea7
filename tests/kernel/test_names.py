"""Which kernel names a cell is sent (issue #24), through a real kernel: a kept world's names are its
own, a name a cell binds before reading it is never sent, a name that cannot travel is refused before
any rank runs (with its type, the names the cell is sent, and a hint that fits the cell), and a send
that fails at the start says its own error, never one of the run's files."""

from __future__ import annotations

import pytest
from kernel_harness import ok, rank_lines, run, run_processes

pytestmark = pytest.mark.timeout(300)
METHODS = ["fork", "forkserver"]

# what any training cell in the kernel leaves behind: a loss that torch refuses to pickle
TRAINED = "import threading, torch\nw = torch.ones(2, requires_grad=True)\nloss = (w * 2).sum()\nlr = 0.1"


def refused(kernel, code: str) -> str:
    result = run(kernel, code)
    assert result.status == "error" and result.error.ename == "UsageError", (result.stdout, result.error_text)
    assert "Traceback" not in result.stderr + result.error_text and "out.pickle" not in result.error_text
    return result.error.evalue


@pytest.mark.parametrize("method", METHODS)
def test_a_world_cell_reads_the_worlds_names_and_the_kernels_current_others(kernel, world, method):
    ok(kernel, TRAINED)
    first = ok(
        kernel,
        f"%%spawn --world {world} -n 2 --backend gloo --start-method {method} --out seen\n"
        "import os, torch\n"
        "loss = torch.tensor(float(os.environ['RANK']))\n"  # bound here before it is read: the kernel's is not sent
        "seen = (loss.item(), lr)",
    )
    assert ok(kernel, "print(seen)").stdout == "[(0.0, 0.1), (1.0, 0.1)]\n", first.stdout
    ok(kernel, "lr = 0.5\nloss = (w * 3).sum()")  # the kernel trains on; the world's loss is the world's
    ok(kernel, f"%%spawn --world {world} --out seen\nseen = (loss.item(), lr)")
    assert ok(kernel, "print(seen)").stdout == "[(0.0, 0.5), (1.0, 0.5)]\n"


@pytest.mark.parametrize("method", ["forkserver"])
def test_a_fresh_cell_that_binds_a_name_before_reading_it_is_not_sent_the_kernels(kernel, method):
    ok(kernel, TRAINED)
    result = ok(
        kernel,
        f"%%spawn -n 2 --start-method {method} --out seen\n"
        "import torch\n"
        "with torch.no_grad():\n"
        "    loss = torch.ones(1, dtype=torch.float64) * lr\n"
        "seen = loss.item()\n"
        "print(seen)",
    )
    assert rank_lines(result.stdout, 0) == ["0.1"] and ok(kernel, "print(seen)").stdout == "[0.1, 0.1]\n"


LOOP = """
for step in range(3):
    loss = model(x).sum()
    loss.backward()
    seen = loss.item()
"""


@pytest.mark.parametrize("where", ["fresh", "world"])
def test_a_training_loop_is_not_sent_the_kernels_loss_it_binds_before_reading(kernel, world, where):
    """Issue 40: the loop binds ``loss`` before it reads it on every pass, so the kernel's non-leaf
    ``loss`` (which torch refuses to pickle) is not the cell's to send, fresh ranks or a world."""
    ok(
        kernel,
        TRAINED
        + "\nmodel = torch.nn.Linear(4, 1)\ntorch.nn.init.ones_(model.weight)\ntorch.nn.init.zeros_(model.bias)\nx = torch.ones(3, 4)",
    )
    options = "-n 2" if where == "fresh" else f"--world {world} -n 2 --backend gloo"
    result = ok(kernel, f"%%spawn {options} --start-method forkserver --out seen" + LOOP)
    assert ok(kernel, "print(seen)").stdout == "[12.0, 12.0]\n", result.stdout


@pytest.mark.parametrize("method", ["forkserver"])
def test_a_name_that_cannot_travel_to_fresh_ranks_is_refused_with_what_the_cell_is_sent(kernel, method):
    ok(kernel, TRAINED + "\nlock = threading.Lock()")
    message = refused(kernel, f"%%spawn -n 2 --start-method {method}\nprint(lock, lr, w)")
    assert message.startswith("cannot send 'lock' (a _thread.lock) to spawned ranks: cannot pickle '_thread.lock' object")
    assert "this cell is sent (those it reads before binding them): lock, lr, w." in message
    assert "--start-method fork" in message  # fresh ranks can be forked instead
    message = refused(kernel, f"%%spawn -n 2 --start-method {method} --out x\nx = loss.item()")
    assert message.startswith("cannot send 'loss' (a torch.Tensor) to spawned ranks: Cowardly refusing"), message
    assert run_processes(kernel.pid) == []


@pytest.mark.parametrize("method", METHODS)
def test_a_name_that_cannot_travel_to_a_world_is_refused_and_the_world_is_untouched(kernel, world, method):
    ok(kernel, TRAINED + "\nlock = threading.Lock()")
    # a new world: refused before it is started
    message = refused(kernel, f"%%spawn --world {world} -n 2 --backend gloo --start-method {method}\nprint(lock)")
    assert message.startswith(f"cannot send 'lock' (a _thread.lock) to world '{world}'")
    assert "--start-method" not in message and "the world is as it was" in message  # its ranks run already
    assert ok(kernel, f"import nbspawn\nprint({world!r} in nbspawn.worlds())").stdout == "False\n"
    ok(kernel, f"%%spawn --world {world} -n 2 --backend gloo --start-method {method}\nimport os\nmine = os.getpid()")
    # a world that runs: a kernel tensor torch refuses to pickle (read, never bound by the world) is refused
    message = refused(kernel, f"%%spawn --world {world} --out x\nx = loss.item() + mine")
    assert message.startswith(f"cannot send 'loss' (a torch.Tensor) to world '{world}': Cowardly refusing"), message
    assert "this cell is sent (those it reads before binding them): loss." in message
    after = ok(kernel, f"%%spawn --world {world}\nprint(mine == os.getpid(), lr)")
    assert [rank_lines(after.stdout, r) for r in range(2)] == [["True 0.1"], ["True 0.1"]]
    assert "2 cells" in ok(kernel, "%spawn status").stdout  # the refused cells never ran on it


ONCE = """
class Once:
    '''Pickles once (the check before the start), then refuses (the start itself).'''
    sent = 0
    def __reduce__(self):
        Once.sent += 1
        if Once.sent > 1:
            raise RuntimeError("changed its mind")
        return (Once, ())
fickle = Once()
"""


@pytest.mark.parametrize("where", ["fresh", "world"])
def test_a_send_that_fails_at_the_start_says_its_own_error_not_the_runs_files(kernel, world, where):
    options = (
        "-n 2 --start-method forkserver" if where == "fresh" else f"--world {world} -n 2 --backend gloo --start-method forkserver"
    )
    ok(kernel, ONCE)
    result = run(kernel, f"%%spawn {options} --out x\nx = repr(fickle)")
    text = result.stderr + result.error_text
    assert result.status == "error" and "changed its mind" in text, text
    assert "out.pickle" not in text and "FileNotFoundError" not in text and "error.json" not in text
    if where == "world":  # nothing reached its ranks: the world goes on
        ok(kernel, f"%%spawn --world {world} --out y\ny = 1")
        assert ok(kernel, "print(y)").stdout == "[1, 1]\n"


BOMB = """
def explode():
    raise ValueError("cannot be rebuilt in a rank")
class Bomb:
    '''Pickles in the kernel; unpickling it raises, in the rank.'''
    def __reduce__(self):
        return (explode, ())
bomb = Bomb()
"""


@pytest.mark.parametrize("where", ["fresh", "world"])
def test_a_name_that_cannot_be_rebuilt_in_a_rank_is_the_ranks_error_with_the_names_it_was_sent(kernel, world, where):
    options = (
        "-n 2 --start-method forkserver" if where == "fresh" else f"--world {world} -n 2 --backend gloo --start-method forkserver"
    )
    ok(kernel, BOMB + "lr = 0.1")
    result = run(kernel, f"%%spawn {options} --out x\nx = (bomb, lr)")
    text = result.stderr + result.error_text
    assert result.status == "error" and result.error.ename == "RankRaisedError", text
    assert "ValueError: cannot be rebuilt in a rank" in text
    assert "nbspawn: this happened receiving the kernel's names the cell is sent: bomb, lr" in text
    assert "out.pickle" not in text and "FileNotFoundError" not in text


@pytest.mark.parametrize(
    "options", ["-n 2 --start-method forkserver", "-n 2 --start-method fork", "--world {world} -n 2 --backend gloo"]
)
def test_a_rank_that_leaves_before_sending_its_out_values_is_said_so_not_the_runs_files(kernel, world, options):
    result = run(kernel, f"%%spawn {options.format(world=world)} --out x\nimport sys\nsys.exit(0)\nx = 1")
    text = result.stderr + result.error_text
    assert result.status == "error" and result.error.ename == "SpawnOutputError", text
    assert "--out 'x' is not defined on ranks 0, 1" in text and "out.pickle" not in text
