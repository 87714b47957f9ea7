"""``%spawn where``: every rank's stack right now, of background runs and kept worlds, through a real
kernel.  A rank blocked in C (a gloo barrier) still answers: faulthandler writes its dump from the
signal handler, without the interpreter's help."""

from __future__ import annotations

import re
import time

from kernel_harness import ok, run

HANG = (
    "%%spawn --bg -n 4 --backend gloo\n"
    "import time, torch.distributed as dist\n"
    "if dist.get_rank() != 2:\n"
    "    dist.barrier()\n"
    "else:\n"
    "    time.sleep(300)\n"
)


def wait_for(kernel, code: str, seconds: float = 30) -> None:
    until = time.monotonic() + seconds
    while ok(kernel, f"print({code})").stdout.strip() != "True":
        assert time.monotonic() < until, code
        time.sleep(0.2)


def test_where_groups_the_ranks_of_a_hung_background_run(kernel):
    ok(kernel, HANG)
    ok(kernel, "import nbspawn\nhung = nbspawn.last_run()")
    try:
        wait_for(kernel, "all(r.status == 'running' for r in hung.ranks)")
        time.sleep(2)  # every rank past init_process_group and into its place
        text = ok(kernel, "%spawn where").stdout
        head = re.search(r"run \S+ \(background, \d+ s\):", text)
        assert head, text
        assert re.search(
            r"^ranks 0-1,3: Cell In\[\d+\], line 4: dist\.barrier\(\)  \(in barrier, distributed_c10d\.py\)$", text, re.M
        ), text
        assert re.search(r"^rank 2: Cell In\[\d+\], line 6: time\.sleep\(300\)$", text, re.M), text
        by_id = ok(kernel, "%spawn where {hung.run_id}").stdout
        assert "ranks 0-1,3:" in by_id and "rank 2:" in by_id
    finally:
        ok(kernel, "hung.stop(); hung._done.wait(30)")
    assert ok(kernel, "print(hung.status)").stdout.strip() == "stopped"


def test_where_on_an_idle_world_and_a_program(kernel):
    ok(kernel, "%%spawn --world wh -n 2\nx = 1")
    ok(kernel, "prog = %spawn --bg -n 2 -- python -c 'import time; time.sleep(300)'")
    try:
        wait_for(kernel, "all(r.status == 'running' for r in prog.ranks)")
        time.sleep(1)
        text = ok(kernel, "%spawn where wh {prog.run_id}").stdout
        assert "world 'wh' (idle, 1 cells):\nranks 0-1: idle: waiting for the next cell" in text, text
        assert re.search(r'^ranks 0-1: File "<string>", line 1 in <module>', text, re.M), text
    finally:
        ok(kernel, "%spawn stop wh {prog.run_id}")


def test_where_names_what_it_does_not_know(kernel):
    result = run(kernel, "%spawn where nosuch")
    assert result.status == "error" and result.error.ename == "UsageError"
    assert "no background run or kept world named 'nosuch'" in result.error.evalue
    assert ok(kernel, "%spawn where").stdout.strip().startswith(("nothing is running", "run ", "world "))
