"""The kernel harness itself, on a kernel without nbspawn: if these fail, no other kernel test means anything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
from kernel_harness import (
    descendants,
    execute,
    loaded_kernel,
    ok,
    private_shm_possible,
    shm_entries,
    start_kernel,
    stop_kernel,
)


def test_stdout_comes_back_from_a_real_kernel(plain_kernel):
    result = execute(plain_kernel.client, "print(1+1)")
    assert result.status == "ok" and result.error is None
    assert result.stdout == "2\n" and result.stderr == ""
    assert result.outputs == [{"msg_type": "stream", "name": "stdout", "text": "2\n"}]


def test_the_kernel_runs_this_interpreter(plain_kernel):
    result = execute(plain_kernel.client, "import sys\nprint(sys.executable)")
    assert result.stdout.strip() == sys.executable
    assert psutil.Process(plain_kernel.pid).exe() == psutil.Process().exe()


def test_an_error_cell_reports_its_exception(plain_kernel):
    result = execute(plain_kernel.client, "import sys\nprint('to stderr', file=sys.stderr)\n1/0")
    assert result.status == "error"
    assert result.error.ename == "ZeroDivisionError"
    assert "division by zero" in result.error.evalue
    assert "ZeroDivisionError" in result.error_text and "\x1b[" not in result.error_text
    assert result.stderr == "to stderr\n"
    assert [o["msg_type"] for o in result.outputs] == ["stream", "error"]


def test_display_data_and_execution_counts(plain_kernel):
    first = execute(
        plain_kernel.client, "from IPython.display import display\nh = display('a', display_id=True)\nh.update('b')\n42"
    )
    assert [o["msg_type"] for o in first.outputs] == ["display_data", "update_display_data", "execute_result"]
    assert first.outputs[-1]["data"]["text/plain"] == "42"
    assert execute(plain_kernel.client, "pass").execution_count == first.execution_count + 1


def test_children_of_the_kernel_are_seen(plain_kernel):
    execute(plain_kernel.client, "import subprocess\np = subprocess.Popen(['sleep', '30'])")
    try:
        assert "sleep" in [p.name() for p in descendants(plain_kernel.pid)]
    finally:
        execute(plain_kernel.client, "p.kill(); p.wait()")
    assert descendants(plain_kernel.pid) == []


def test_a_kernel_asked_for_in_another_directory_or_environment_starts_there(tmp_path, monkeypatch):
    """loaded_kernel() hands out the spare started beside the test before only where a kernel started
    now would be the same: the spare made before the chdir and setenv below must not be it."""
    stop_kernel(loaded_kernel())  # a spare is starting now, here, in this environment
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBSPAWN_HARNESS_PROBE", "1")
    kernel = loaded_kernel()
    try:
        said = ok(kernel, "import os\nprint(os.getcwd(), os.environ.get('NBSPAWN_HARNESS_PROBE'))").stdout
        assert said == f"{tmp_path} 1\n"
    finally:
        stop_kernel(kernel)


def test_a_kernel_with_a_private_shm_sees_only_its_own_segments():
    """The leak tests that count /dev/shm run beside other tests only because of this (as root): their
    kernel's segments, and its children's, are in a /dev/shm of its own, which the test reads, and
    nothing any other process makes is there."""
    if not private_shm_possible():
        pytest.skip("a private /dev/shm needs root and unshare")
    outside = f"nbspawn-harness-outside-{os.getpid()}"
    Path("/dev/shm", outside).write_bytes(b"x")
    kernel = start_kernel(private_shm=True)
    try:
        made = (
            "from multiprocessing import shared_memory\nseg = shared_memory.SharedMemory(create=True, size=4096)\nprint(seg.name)"
        )
        name = ok(kernel, made).stdout.strip()
        # and a child of the kernel's makes one in the same /dev/shm
        child = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', \"open('/dev/shm/by-a-child', 'w')\"], check=True)"
        ok(kernel, child)
        assert shm_entries(pid=kernel.pid) == {name, "by-a-child"}
        assert name not in shm_entries() and outside not in shm_entries(pid=kernel.pid)
        assert psutil.Process(kernel.pid).exe() == psutil.Process().exe()  # the kernel itself, not a wrapper
    finally:
        stop_kernel(kernel)
        Path("/dev/shm", outside).unlink()
