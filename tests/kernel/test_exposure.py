"""What a run exposes: nothing of it listens beyond loopback, and no rank holds the kernel's sockets.

Each shape of work is looked at while it lives (a fresh cell, a background run, a kept world), with
every rank in its process group (``init_process_group`` done: the store and gloo's sockets open):
the kernel and every process below it listen on loopback only, and no rank holds any socket of the
kernel's (its ZMQ shell, iopub, stdin, control and heartbeat ports, the run's store).  Rank
directories are private to the user.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
import time

import psutil
import pytest
from kernel_harness import Kernel, listening, ok, rank_lines, run, run_processes, sockets_of

# a rank says it is in the group, then waits for the test to have looked
CELL = """import os, time
d = {where!r}
with open(os.path.join(d, 'ready' + os.environ['RANK']), 'w') as fh:
    fh.write(str(os.getpid()))
while not os.path.exists(os.path.join(d, 'go')):
    time.sleep(0.05)
print('done', os.environ['RANK'])
"""


def assert_nothing_exposed(kernel: Kernel, ranks: list[psutil.Process]) -> None:
    """The kernel and every process below it listen on loopback only; no rank holds a socket of the kernel's."""
    must_live = {kernel.pid, *(rank.pid for rank in ranks)}
    for pid in [kernel.pid, *(p.pid for p in run_processes(kernel.pid))]:
        try:
            bound = listening(pid).values()
        except FileNotFoundError:  # short-lived: the reaper's starter (executors/_reaper) forks the watcher and exits
            assert pid not in must_live, f"pid {pid} ended while the test looked at it"
            continue
        for address, port in bound:
            who = "the kernel" if pid == kernel.pid else f"pid {pid}"
            assert ipaddress.ip_address(address).is_loopback, f"{who} listens on {address}:{port}"
    kernel_listening = listening(kernel.pid)
    assert len(kernel_listening) >= 5, kernel_listening  # its ZMQ ports: the check below means something
    kernel_sockets = sockets_of(kernel.pid)
    for rank in ranks:
        shared = sockets_of(rank.pid) & kernel_sockets
        listens = [kernel_listening[s] for s in shared if s in kernel_listening]
        assert not shared, f"rank pid {rank.pid} holds {len(shared)} of the kernel's sockets, listening ones: {listens}"


def check_ranks_while_they_wait(kernel: Kernel, where: str) -> None:
    """Two ranks that wrote their pids to ``where``/ready0, ready1 and wait for ``where``/go: nothing of
    theirs is exposed while they wait; then they are let go, whatever the check found."""
    try:
        ranks = [psutil.Process(int(pid)) for pid in wait_for_files(where, ["ready0", "ready1"])]
        assert_nothing_exposed(kernel, ranks)
    finally:
        open(os.path.join(where, "go"), "w").close()


def wait_for_files(directory: str, names: list[str], timeout: float = 60) -> list[str]:
    """What each file says, once all of them are written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        said = []
        for name in names:
            with contextlib.suppress(OSError), open(os.path.join(directory, name)) as fh:
                said.append(fh.read())
        if len(said) == len(names) and all(said):
            return said
        time.sleep(0.05)
    raise AssertionError(f"not all of {names} in {directory}: {os.listdir(directory)}")


@pytest.mark.parametrize(
    ("method", "bg"), [("fork", False), ("fork", True), ("forkserver", False)], ids=["fresh", "background", "forkserver"]
)
def test_a_run_listens_on_loopback_only_and_its_ranks_hold_no_kernel_socket(kernel, tmp_path, method, bg):
    where = str(tmp_path)
    flags = "--bg " if bg else ""
    kernel.client.execute(f"%%spawn {flags}-n 2 --backend gloo --start-method {method}\n" + CELL.format(where=where))
    check_ranks_while_they_wait(kernel, where)
    said = ok(kernel, "r = nbspawn.last_run(); r.wait(); print(r.status, r.run_dir)").stdout
    status, run_dir = said.split()[-2:]
    assert status == "succeeded", said
    for path in (run_dir, os.path.join(run_dir, "0")):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path  # private to the user


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_kept_world_listens_on_loopback_only_and_its_ranks_hold_no_kernel_socket(kernel, method):
    name = f"w{time.monotonic_ns() % 10**8}"
    try:
        first = ok(
            kernel,
            f"%%spawn --world {name} -n 2 --backend gloo --start-method {method}\n"
            "import os, torch.distributed as dist\ndist.barrier()\nprint('pid', os.getpid())",
        )
        ranks = [psutil.Process(int(rank_lines(first.stdout, r)[-1].split()[-1])) for r in range(2)]
        assert_nothing_exposed(kernel, ranks)  # between cells: the world's store and group live on
        again = ok(kernel, f"%%spawn --world {name}\nimport torch\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())")
        assert "sum 2.0" in again.stdout, again.stdout
    finally:
        run(kernel, f"%spawn stop {name}")


def test_a_run_refused_after_its_port_was_chosen_leaves_no_port_held(kernel):
    """A new world's port is reserved (listening) when its spec is made; a cell refused after that
    (--on a rank the world will not have) lets it go."""
    before = listening(kernel.pid)
    name = f"w{time.monotonic_ns() % 10**8}"
    refused = run(kernel, f"%%spawn --world {name} -n 2 --on 7\npass")
    assert refused.status == "error" and "--on: rank 7 does not exist" in refused.error.evalue, refused
    assert listening(kernel.pid) == before


PROGRAM = """import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")  # env://, as a script under torchrun: it joins the kernel's store
d = sys.argv[1]
with open(os.path.join(d, 'ready' + os.environ['RANK']), 'w') as fh:
    fh.write(str(os.getpid()))
while not os.path.exists(os.path.join(d, 'go')):
    time.sleep(0.05)
dist.destroy_process_group()
"""


def test_a_programs_own_process_group_listens_on_loopback_only(kernel, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    where = str(tmp_path)
    kernel.client.execute(f"%spawn --bg -n 2 -- {script} {where}")
    check_ranks_while_they_wait(kernel, where)
    said = ok(kernel, "r = nbspawn.last_run(); r.wait(); print(r.status)").stdout
    assert said.split()[-1] == "succeeded", said
