"""What a run leaves behind, whatever its end (--share, --out, an error, a timeout, an interrupt, a rank's
exit): no shared memory segment, descriptor or file.  A module of its own: its three tests take a
third of --share's and --out's time (test_handoff.py), and the phase ends with the longest module."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from kernel_harness import execute, interrupt_later, kernel_segments, loaded_kernel, ok, ready_line, stop_kernel_later

pytestmark = pytest.mark.timeout(240)
METHODS = ["fork", "forkserver"]


def kernel_fds(kernel) -> list[str]:
    """The kernel's descriptors that a run could leak: shared memory, pipes (rank sentinels), logs.

    IPython's history database and ZeroMQ open and close their own descriptors as they please.
    """
    fd_dir = f"/proc/{kernel.pid}/fd"
    targets = []
    for fd in os.listdir(fd_dir):
        try:
            targets.append(os.readlink(f"{fd_dir}/{fd}"))
        except FileNotFoundError:
            pass
    ours = ("memfd:", "/dev/shm", "pipe:", "/tmp/nbspawn", "/tmp/pytest")
    return sorted(t for t in targets if t.startswith(ours))


@pytest.fixture
def kernel_with_its_own_shm():
    """A kernel with nbspawn loaded and a /dev/shm of its own where the machine allows it (as root): every
    segment there is its own or its ranks', whatever other tests run beside it."""
    kernel = loaded_kernel(private_shm=True)
    yield kernel
    stop_kernel_later(kernel)


# alone only where its kernel cannot have a /dev/shm of its own: in the machine's, a segment another
# test's ranks hold meanwhile would count here
@pytest.mark.alone(unless_private_shm=True)
@pytest.mark.parametrize("method", METHODS)
def test_no_segment_descriptor_or_file_outlives_a_run_whatever_its_end(kernel_with_its_own_shm, method, tmp_path):
    kernel = kernel_with_its_own_shm
    logs = tmp_path / "logs"
    ok(kernel, f"%config SpawnMagics.log_dir = {str(logs)!r}\nimport torch\nbuf = torch.zeros(1 << 20)")
    ready = tmp_path / "ready"
    # each cell's end: the run's error, and whether it is interrupted once both ranks made `piece` (their
    # ready line): stopped after making it for certain, not only where its ranks started within a timeout
    # (spawned ranks import torch: on a loaded machine the --timeout 3 cell may stop them before `piece`)
    cells = [
        (f"%%spawn -n 2 --start-method {method} --share buf --out piece\npiece = torch.ones(1 << 18)\nbuf[0] += 1", None),
        (
            f"%%spawn -n 2 --start-method {method} --share buf --out piece\nimport os\npiece = torch.ones(1 << 18)\n"
            "if os.environ['RANK'] == '1':\n    raise ValueError('after making piece')",
            "RankRaisedError",
        ),
        (
            f"%%spawn -n 2 --start-method {method} --share buf --out piece --timeout 3 --grace-period 0.5\nimport time\n"
            "piece = torch.ones(1 << 18)\ntime.sleep(60)",
            "SpawnTimeoutError",
        ),
        (
            f"%%spawn -n 2 --start-method {method} --share buf --out piece\nimport time\npiece = torch.ones(1 << 18)\n"
            f"{ready_line(ready)}; time.sleep(60)",
            "SpawnInterrupted",
        ),
        (
            f"%%spawn -n 2 --start-method {method} --out piece\nimport os, torch\npiece = torch.ones(1 << 18)\n"
            "if os.environ['RANK'] == '0':\n    os._exit(9)",
            "RankExitedError",
        ),
    ]

    def run_cell(cell: str, ending: str | None) -> None:
        thread = None
        if ending == "SpawnInterrupted":
            shutil.rmtree(ready, ignore_errors=True)
            ready.mkdir()
            thread = interrupt_later(kernel, ready, 2)
        result = execute(kernel.client, cell, timeout=120)
        if thread is not None:
            thread.join()
        assert (result.error.ename if result.error else None) == ending, (cell, result.error_text)

    for cell, ending in cells:  # warm up: the forkserver, imports, the first shared storage
        run_cell(cell, ending)
    ok(kernel, "del piece" if "piece" in ok(kernel, "print(list(globals()))").stdout else "pass")

    shm_before, fds_before = kernel_segments(kernel.pid), kernel_fds(kernel)
    for _ in range(2):
        for cell, ending in cells:
            run_cell(cell, ending)
        ok(kernel, "piece = None")
    deadline = time.monotonic() + 10  # what the last run lets go of, it lets go of in its own time
    while (kernel_segments(kernel.pid) != shm_before or kernel_fds(kernel) != fds_before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert kernel_segments(kernel.pid) == shm_before
    assert kernel_fds(kernel) == fds_before
    for run_dir in logs.iterdir():
        for rank_dir in run_dir.iterdir():
            # the logs a rank keeps (collectives.json: where it was in its collectives when it was stopped;
            # xray.json: its collectives, and xray_values.json the calls it made to torch.distributed, for the
            # X-ray; memory_peak.json: its peak resident memory in the cell)
            kept = {"stdout.log", "stderr.log", "error.json", "stacks.log", "collectives.json", "xray.json"}
            kept |= {"xray_values.json", "memory_peak.json"}
            leftovers = {p.name for p in rank_dir.iterdir()} - kept
            assert not leftovers, f"{rank_dir}: {leftovers}"
