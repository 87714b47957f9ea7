"""What a run leaves behind after interrupts, kernel death and many cells: nothing but its logs."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from kernel_harness import (
    execute,
    interrupt_later,
    ok,
    ready_line,
    run_processes,
    snapshot_back_to,
    start_kernel,
    steady_snapshot,
    stop_kernel,
    wait_for_ranks,
)

pytestmark = pytest.mark.timeout(300)


def test_interrupt_reaches_every_rank_first_and_the_cell_raises_keyboardinterrupt(fresh_kernel, tmp_path):
    pid = fresh_kernel.pid
    # a grace no interrupted rank needs: were one SIGTERMed, the text would say "killed by SIGTERM"
    code = f"%%spawn -n 3 --grace-period 120\nimport time\ndef train():\n    {ready_line(tmp_path)}; time.sleep(100)\ntrain()"
    thread = interrupt_later(fresh_kernel, tmp_path, 3)
    started = time.monotonic()
    result = execute(fresh_kernel.client, code, timeout=60)
    thread.join()
    assert result.status == "error" and result.error.ename == "SpawnInterrupted"
    text = result.error.traceback_text
    assert "KeyboardInterrupt" in text
    assert "ranks 0-2 were stopped the same way: KeyboardInterrupt" in text
    assert "in train" in text and "time.sleep(100)" in text  # where each rank was
    assert "SIGTERM" not in text and "SIGKILL" not in text  # each came back by its KeyboardInterrupt
    assert time.monotonic() - started < 60  # a hang guard: the grace alone would be 120 s
    assert run_processes(pid) == []
    assert (
        ok(fresh_kernel, "import nbspawn\nprint(isinstance(nbspawn.last_run().error, KeyboardInterrupt))", timeout=30).stdout
        == "True\n"
    )


def test_interrupt_escalates_to_sigterm_when_a_rank_ignores_sigint(fresh_kernel, tmp_path):
    pid = fresh_kernel.pid
    code = (
        "%%spawn -n 2 --grace-period 1\nimport signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        f"{ready_line(tmp_path)}; time.sleep(100)"
    )
    thread = interrupt_later(fresh_kernel, tmp_path, 2)
    result = execute(fresh_kernel.client, code, timeout=60)
    thread.join()
    assert result.error.ename == "SpawnInterrupted"
    assert "killed by SIGTERM" in result.error.traceback_text
    assert "time.sleep(100)" in result.error.traceback_text
    assert run_processes(pid) == []


def test_ranks_die_with_the_kernel_even_when_it_is_sigkilled(fresh_kernel):
    pid = fresh_kernel.pid
    fresh_kernel.client.execute("%%spawn -n 3\nimport subprocess, time\ntime.sleep(300)")
    ranks = wait_for_ranks(pid, 3)
    os.kill(pid, signal.SIGKILL)
    _gone, alive = psutil.wait_procs(ranks, timeout=30)  # a hang guard: death comes at once
    assert alive == [], f"ranks outlived the kernel: {alive}"


def test_processes_a_rank_started_are_stopped_with_it(kernel):
    code = (
        "%%spawn -n 2\nimport subprocess, os\n"
        "p = subprocess.Popen(['sleep', '300'])\n"
        "open(os.path.join(os.environ['NBSPAWN_TEST_DIR'], os.environ['RANK']), 'w').write(str(p.pid))\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        ok(kernel, code.replace("%%spawn -n 2", f"%%spawn -n 2 --env NBSPAWN_TEST_DIR={tmp}"))
        pids = [int(Path(tmp, str(r)).read_text()) for r in range(2)]
    # gone, or a zombie (its reaper's to collect): waited for, 30 s at most (a hang guard)
    children = []
    for p in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            children.append(psutil.Process(p))
    deadline = time.monotonic() + 30
    while (left := [c for c in children if _alive(c)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, left


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def private_tmp_kernel(tmp_path):
    """A kernel whose temporary files (and its ranks') all go to a directory of the test's own, and whose
    shared memory segments to a /dev/shm of its own where the machine allows it (as root)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    k = start_kernel(env={"TMPDIR": str(tmp)}, private_shm=True)
    assert execute(k.client, "%load_ext nbspawn", timeout=120).status == "ok"
    yield k, str(tmp)
    stop_kernel(k)


# alone only where its kernel cannot have a /dev/shm of its own: in the machine's, a segment another test's
# ranks hold meanwhile would count here
@pytest.mark.alone(unless_private_shm=True)
def test_fifty_cells_leave_no_process_fd_thread_segment_or_file_behind(private_tmp_kernel, tmp_path):
    fresh_kernel, tmp = private_tmp_kernel
    logs = tmp_path / "logs"
    pid = fresh_kernel.pid
    ok(fresh_kernel, f"%config SpawnMagics.log_dir = {str(logs)!r}")
    cells = [
        "%%spawn -n 4\nprint('ok')",
        "%%spawn -n 2\nimport os\nif os.environ['RANK'] == '1':\n    raise ValueError('x')",
        "%%spawn -n 3 --timeout 1 --grace-period 0.5\nimport time\ntime.sleep(10)",
        "%%spawn -n 2 --backend gloo\nimport torch, torch.distributed as dist\ndist.all_reduce(torch.ones(2))",
        "%%spawn -n 2\nimport ctypes\nctypes.string_at(0)",
    ]
    # each cell ends the way it is meant to (a leak test whose cells all failed early would test nothing)
    endings = [None, "RankRaisedError", "SpawnTimeoutError", None, "RankExitedError"]

    def run_cell(i: int) -> None:
        result = execute(fresh_kernel.client, cells[i % len(cells)], timeout=60)
        assert (result.error.ename if result.error else None) == endings[i % len(cells)], (i, result.error_text)

    for i in range(len(cells)):  # warm up: imports, thread pools, the first gloo group
        run_cell(i)
    before = steady_snapshot(pid, tmp)
    for i in range(50):
        run_cell(i)
    after = snapshot_back_to(pid, tmp, before)
    assert after == before
    assert len(list(logs.iterdir())) == 55  # one log directory per run, nothing else
