"""A rank's children (issue #24) through a real kernel: a Dataset, collate_fn and worker_init_fn, a
``multiprocessing.Pool``, ``ProcessPoolExecutor`` and ``mp.Process`` target defined in the cell work in
fresh ranks under fork, spawn and forkserver and kept-world ranks under fork and forkserver (a world's
children take the same path as a fresh rank's), and in a kernel whose own default start
method is forkserver (as Python 3.14's is); a persistent-worker DataLoader lives across world cells;
nothing is left running."""

from __future__ import annotations

import io
import time

import pytest
from kernel_harness import ok, rank_lines, run, run_processes

import nbspawn
from nbspawn.executors import _supervisor
from nbspawn.views._text import TextView

pytestmark = pytest.mark.timeout(600)

# everyday training code, none of it written for nbspawn: every child is started the rank's default way
CHILDREN = """
import dataclasses, multiprocessing as mp, os, torch
from concurrent.futures import ProcessPoolExecutor
from torch.utils.data import DataLoader, Dataset

@dataclasses.dataclass
class Batch:
    x: torch.Tensor

class Squares(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.tensor(float(i * i))

def collate(items):
    return Batch(torch.stack(items))

def seed(worker_id):
    torch.manual_seed(worker_id)

def double(v):
    return 2 * v

batches = list(DataLoader(Squares(), batch_size=4, num_workers=2, collate_fn=collate, worker_init_fn=seed))
assert all(isinstance(b, Batch) for b in batches), [type(b) for b in batches]  # the cell's own class came back
with mp.Pool(2) as pool:
    pooled = pool.map(double, [1, 2, 3])
with ProcessPoolExecutor(2) as executor:
    executed = list(executor.map(double, [4, 5]))
child = mp.Process(target=double, args=(1,))
child.start()
child.join()
print("children", mp.get_start_method(), sum(float(b.x.sum()) for b in batches), pooled, executed, child.exitcode)
"""


def said(result, method: str) -> None:
    for rank in range(2):
        assert rank_lines(result.stdout, rank) == [f"children {method} 140.0 [2, 4, 6] [8, 10] 0"], result.stdout


def nothing_left(pid: int, timeout: float = 20) -> None:
    """No process of a run is left under the kernel (a child's exit may take a moment to be reaped).
    The kernel's own resource tracker, started with its first spawned rank, is the kernel's, as its
    forkserver is (``run_processes`` leaves that out)."""

    def left() -> list[list[str]]:
        found = [p.cmdline() for p in run_processes(pid)]
        return [c for c in found if "from multiprocessing.resource_tracker import main" not in " ".join(c)]

    deadline = time.monotonic() + timeout
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == []


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_cell_definitions_reach_a_fresh_ranks_children(kernel, method):
    said(ok(kernel, f"%%spawn -n 2 --backend gloo --start-method {method}\n{CHILDREN}", timeout=300), method)
    nothing_left(kernel.pid)


PIDS = """
class Pids(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return os.getpid()

steady = DataLoader(Pids(), batch_size=2, num_workers=2, persistent_workers=True)
first = sorted(int(p) for b in steady for p in b)
"""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_cell_definitions_reach_a_worlds_children_and_persistent_workers_live_across_cells(kernel, world, method):
    said(
        ok(kernel, f"%%spawn --world {world} -n 2 --backend gloo --start-method {method}\n{CHILDREN}{PIDS}", timeout=300), method
    )
    # a later cell: the definitions of the first one still reach new children, and the same workers serve
    again = ok(
        kernel,
        f"%%spawn --world {world}\n{CHILDREN}"
        "print('workers', sorted(int(p) for b in steady for p in b) == first, len(set(first)))",
        timeout=300,
    )
    for rank in range(2):
        assert rank_lines(again.stdout, rank)[-1] == "workers True 2", again.stdout
    said_again = [line for line in again.stdout.splitlines() if "children" in line]
    assert len(said_again) == 2 and all(f"children {method} 140.0" in line for line in said_again), again.stdout
    ok(kernel, f"%spawn stop {world}")
    nothing_left(kernel.pid)


def test_a_kernel_whose_default_start_method_is_forkserver(fresh_kernel):
    """Python 3.14 makes forkserver the default on Linux: set it in the kernel, as a user's code would."""
    ok(fresh_kernel, "import multiprocessing\nmultiprocessing.set_start_method('forkserver', force=True)")
    # a forked rank's children fork (multiprocessing gives a forked process its parent's start method)
    said(ok(fresh_kernel, f"%%spawn -n 2 --backend gloo\n{CHILDREN}", timeout=300), "fork")
    said(
        ok(fresh_kernel, f"%%spawn --world k -n 2 --backend gloo --start-method forkserver\n{CHILDREN}", timeout=300),
        "forkserver",
    )
    ok(fresh_kernel, "%spawn stop k")
    nothing_left(fresh_kernel.pid)


def test_torch_compile_workers_of_a_forkserver_rank_compile_a_cells_module(kernel):
    """Inductor's compile workers are children too (subprocesses of torch's own, sent no cell code)."""
    result = ok(
        kernel,
        "%%spawn -n 1 --start-method forkserver --env TORCHINDUCTOR_COMPILE_THREADS=2\n"
        "import torch\n"
        "from torch._inductor import config\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.l = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        return torch.relu(self.l(x)) * 2\n"
        "net = Net()\n"
        "x = torch.ones(2, 4)\n"
        "print(config.compile_threads, torch.allclose(torch.compile(net)(x), net(x)))",
        timeout=600,
    )
    assert rank_lines(result.stdout, 0) == ["2 True"], result.stdout
    nothing_left(kernel.pid)


# a rank that dies while a child it forked lives on: the child holds copies of the rank's pipes to the
# kernel (its sentinel, a kept world's connection), which therefore never say the rank is gone
DIES_LEAVING_A_CHILD = """
import os, time
if int(os.environ["RANK"]) == 1:
    if os.fork() == 0:
        time.sleep(120)
        os._exit(0)
    os._exit(3)
time.sleep(120)
"""


@pytest.mark.parametrize("world", [False, True], ids=["fresh", "world"])
def test_a_rank_that_dies_while_its_child_lives_is_reaped_not_waited_for(kernel, world):
    """Before: the cell waited for the child (120 s here; forever for a Pool worker whose pool died with
    its rank: the hang CI met).  Now the rank's end is seen from its process within a second."""
    where = f"--world dies{int(time.time())} " if world else ""
    began = time.monotonic()
    result = run(kernel, f"%%spawn {where}-n 2 --start-method fork\n{DIES_LEAVING_A_CHILD}", timeout=90)
    took = time.monotonic() - began
    assert result.status == "error", result.stdout
    text = result.error_text + result.stderr
    assert "rank 1" in text and "code 3" in text, text  # "exited with code 3"; a world: "died (exit code 3)"
    assert took < 60, took  # the others were stopped as after any failure, not after the child's 120 s
    nothing_left(kernel.pid)


# a child with a SIGTERM handler of its own (a library's worker that cleans up), terminated by its rank:
# Python writes each signal it handles to the wakeup pipe the child shares with the rank, whose reading
# thread took the child's SIGTERM for the rank's own and stopped the rank
CHILD_HANDLES_SIGTERM = """
import multiprocessing as mp, os, signal, sys, time

def worker(ready):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ready.set()
    time.sleep(60)

ready = mp.Event()
child = mp.Process(target=worker, args=(ready,))
child.start()
ready.wait(30)
child.terminate()
child.join()
time.sleep(1.5)  # the rank was stopped 0.2 s after its child's SIGTERM
print("rank lives on", child.exitcode)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_childs_own_sigterm_is_not_taken_for_its_ranks(kernel, method):
    result = ok(kernel, f"%%spawn -n 2 --start-method {method}\n{CHILD_HANDLES_SIGTERM}", timeout=120)
    for rank in range(2):
        assert rank_lines(result.stdout, rank) == ["rank lives on 0"], result.stdout


# a Pool whose map ends before its last worker has finished starting, terminated at once by `with`: the
# worker took its SIGTERM before it let go of the rank's handler and wakeup pipe, the rank's reading
# thread heard it as the rank's own, and the rank died of SIGTERM (ci60, ci64; 6 of 10 fork cells of 20
# pools each, here, before the rank held SIGTERM across its forks)
SHORT_LIVED_POOLS = """
import multiprocessing as mp
for _ in range(40):
    with mp.Pool(2) as pool:
        pool.map(abs, range(8))
print("rank lives on")
"""


def test_short_lived_pools_in_fork_ranks_never_stop_their_rank(kernel, world):
    for cell in (f"%%spawn --world {world} -n 2 --backend gloo --start-method fork", "%%spawn -n 2 --start-method fork"):
        result = ok(kernel, f"{cell}\n{SHORT_LIVED_POOLS}", timeout=120)
        for rank in range(2):
            assert rank_lines(result.stdout, rank) == ["rank lives on"], result.stdout
    ok(kernel, f"%spawn stop {world}")
    nothing_left(kernel.pid)


class _Ordered(TextView):
    """A text view that notes when each rank's output and end reach it, and is slow to take output in
    (as a view redrawing a terminal's footer can be): the window in which a rank can end unseen."""

    def __init__(self):
        super().__init__(io.StringIO(), io.StringIO(), live=False)
        self.events: list[tuple[str, int]] = []

    def output(self, rank, stream, text):
        self.events.append(("output", rank))
        time.sleep(0.02)
        super().output(rank, stream, text)

    def rank_ended(self, run, state):
        self.events.append(("ended", state.rank))
        super().rank_ended(run, state)


def test_a_ranks_last_output_comes_before_its_end_when_its_process_is_looked_at_each_turn(monkeypatch, tmp_path):
    """The look for silently dead ranks (every turn here) must not tell a rank's end before the loop has
    read what it wrote last: reaped at its first look, a bar's last states came after the rank's end
    and the terminal view printed a stale bar as a line (CI, Colab's stack)."""
    monkeypatch.setattr(_supervisor, "LIVENESS_EVERY", 0.0)
    cell = "import sys, time\nfor i in range(200):\n    print(i, flush=True)\n    time.sleep(0.002)\n"
    for attempt in range(4):
        view = _Ordered()
        nbspawn.launch(cell, nprocs=2, start_method="fork", view=view, log_dir=str(tmp_path / str(attempt)))
        for rank in range(2):
            mine = [kind for kind, r in view.events if r == rank]
            assert mine[-1] == "ended" and mine.count("ended") == 1, (attempt, rank, mine[-5:])
