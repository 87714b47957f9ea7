"""Kept worlds (issue #9) through a real kernel: state across cells on the same processes, names
from the kernel taken fresh, the process group kept, a failure the world survives, a hung collective
or a dead rank that loses it, interrupt, Stop, %spawn stop, kernel death, and 50 cells leaking nothing."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time

import psutil
import pytest
from kernel_harness import (
    blocked_line,
    dead_to_the_kernel,
    execute,
    interrupt_later,
    ok,
    rank_lines,
    ready_line,
    run,
    run_processes,
    snapshot_back_to,
    start_kernel,
    steady_snapshot,
    stop_kernel,
)
from widget_harness import create_subshell, delete_subshell, send_comm_msg

from nbspawn._options import Given, Settings
from nbspawn.errors import rank_spans

pytestmark = pytest.mark.timeout(300)


def pids_of(result, ranks: int) -> list[int]:
    return [int(re.search(r"pid (\d+)", " ".join(rank_lines(result.stdout, r))).group(1)) for r in range(ranks)]


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_state_names_and_group_are_kept_on_the_same_processes(kernel, world, method):
    ok(kernel, "lr = 0.1")
    first = ok(
        kernel,
        f"%%spawn --world {world} -n 2 --start-method {method} --backend gloo\n"
        "import os, torch, torch.distributed as dist\n"
        "t = torch.ones(2) * (dist.get_rank() + 1)\n"
        "seen = lr\n"
        "print('pid', os.getpid(), 'lr', lr)\n",
    )
    ok(kernel, "lr = 0.5\nt = 'the kernel t'")  # the kernel's names change; the ranks' own do not
    second = ok(
        kernel,
        f"%%spawn --world {world}\n"
        "dist.all_reduce(t)\n"  # the group made by the first cell is still there
        "print('pid', os.getpid(), 'lr', lr, 'seen', seen, 't', t.tolist(), dist.is_initialized())\n",
    )
    assert pids_of(first, 2) == pids_of(second, 2)
    for r in range(2):
        assert rank_lines(first.stdout, r) == [f"pid {pids_of(first, 2)[r]} lr 0.1"]
        assert rank_lines(second.stdout, r) == [f"pid {pids_of(first, 2)[r]} lr 0.5 seen 0.1 t [3.0, 3.0] True"]
    # names the ranks assigned never reach the kernel
    assert ok(kernel, "print(t, 'seen' in dir())").stdout.strip() == "the kernel t False"
    status = ok(kernel, "%spawn status").stdout
    assert re.search(rf"^{world}\s+world {method}/gloo\s+2\s+idle\s+2 cells\s+\d+,\d+", status, re.M), status


def test_world_ranks_are_named_in_ps_with_their_world(kernel, world):
    """ps and top (read here, from outside, as they read it) tell a kept world's ranks apart from a kernel."""
    first = ok(kernel, f"%%spawn --world {world} -n 2\nimport os\nprint('pid', os.getpid())")
    for r, pid in enumerate(pids_of(first, 2)):
        process = psutil.Process(pid)
        assert " ".join(process.cmdline()).strip() == f"nbspawn rank {r} of 2 [world {world}]"
        with open(f"/proc/{pid}/comm") as comm:  # top's name for it: 15 bytes
            assert comm.read().strip() == f"nbspawn rank {r}"


def test_a_world_cell_leaves_no_garbage_cycle_in_its_ranks(kernel, world):
    """What nbspawn does around a cell leaves no reference cycle in a rank, so a rank's collections
    are the user's own: none runs a callback in the middle of a pdb step, and a world that runs
    thousands of cells frees their leftovers by reference counting."""
    first = "import gc\ngc.collect()\ngc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds stays in gc.garbage"
    ok(kernel, f"%%spawn --world {world} -n 2\n{first}")
    ok(kernel, f"%%spawn --world {world}\nx = 1")
    result = ok(kernel, f"%%spawn --world {world}\ngc.collect()\nprint([type(o).__qualname__ for o in gc.garbage])")
    for r in range(2):
        assert rank_lines(result.stdout, r) == ["[]"], result.stdout


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_failed_cell_interrupts_the_others_and_the_world_survives(kernel, world, method, tmp_path):
    first = ok(
        kernel,
        f"%%spawn --world {world} -n 3 --start-method {method}\nimport os, time\nmodel = 'loaded'\nprint('pid', os.getpid())",
    )
    result = run(
        kernel,
        # rank 1 fails once the others are in their sleep (their ready line, on its line, before it); a
        # grace no interrupted rank needs to come back in: its end is an event, not a race with 5 s
        f"%%spawn --world {world} --grace-period 120\nif os.environ['RANK'] == '1':\n"
        f"    {blocked_line(tmp_path, 2)}; undefined_name\n{ready_line(tmp_path)}; time.sleep(300)\n",
    )
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    text = result.error.traceback_text
    assert "NameError: name 'undefined_name' is not defined" in text and re.search(r"Cell In\[\d+\], line 3", text)
    assert "ranks 0,2 were stopped the same way: KeyboardInterrupt" in text, text
    assert "time.sleep(300)" in text  # where the stopped ranks were
    assert "was lost" not in text
    assert f"World {world!r} is intact: its ranks are back at the prompt" in text  # its fate, said either way
    # the rank that raised lives on, as the ones interrupted do: no process ended, so none has an exit code
    # to show (it read "failed · exit code 1" beside live ranks' "exit code 0": issue #57, item 7)
    saved = ok(
        kernel,
        "import json, nbspawn\nfrom nbspawn.views._bundle import FrozenRun\n"
        "print(json.dumps(FrozenRun(nbspawn.last_run(), {}).record['ranks']))",
    ).stdout
    ranks = {r["rank"]: r for r in json.loads(saved)}
    assert ranks[1]["status"] == "failed" and [ranks[r]["exit_code"] for r in range(3)] == [None] * 3, ranks
    after = ok(kernel, f"%%spawn --world {world}\nprint('pid', os.getpid(), model)")
    assert pids_of(after, 3) == pids_of(first, 3)
    assert all(rank_lines(after.stdout, r)[0].endswith("loaded") for r in range(3))


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_bug_on_every_rank_reads_failed_after_the_first_and_no_interrupt_reaches_the_next_cell(kernel, world, method, tmp_path):
    """The commonest world failure: the cell's bug raises on every rank.  The first to fail makes the
    kernel interrupt the others, which are then writing their own error down: that interrupt must not
    replace it ("was stopped: KeyboardInterrupt" with traceback.py's frames under "During handling of
    the above exception"), nor land in the next cell.  The bug's message is made only once every rank
    is making its own (each says so in a file, and waits for the others'; gloo's barrier lets one rank
    out before the others), then takes 0.5 s more, as a long one does on a loaded machine: every rank is
    writing its error when the first one's arrives."""
    ok(
        kernel,
        f"%%spawn --world {world} -n 4 --backend gloo --start-method {method}\nimport os, time, torch.distributed as dist\n"
        "class SameBug(Exception):\n    def __str__(self):\n"
        "        open(os.path.join(WRITING, str(dist.get_rank())), 'w').close()\n"
        "        while len(os.listdir(WRITING)) < 4:\n            time.sleep(0.01)\n"
        "        time.sleep(0.5)\n        return 'same bug'\n",
    )
    for attempt in range(5):
        writing = tmp_path / str(attempt)
        writing.mkdir()
        failed = run(
            # a grace no interrupted rank needs: the next cell's dist needs the world whole
            kernel,
            f"%%spawn --world {world} --grace-period 120\nWRITING = {str(writing)!r}\ndist.barrier()\nraise SameBug()\n",
        )
        text = failed.error_text
        head = re.match(r"RankRaisedError: rank (\d) \(pid \d+\) failed: SameBug: same bug", text)
        assert head, text
        others = rank_spans([r for r in range(4) if r != int(head.group(1))])
        assert f"ranks {others} failed after rank {head.group(1)} the same way: SameBug: same bug" in text, (attempt, text)
        assert "KeyboardInterrupt" not in text and "traceback.py" not in text and "nbspawn/" not in text, (attempt, text)
        after = run(kernel, f"%%spawn --world {world}\nprint('next', dist.get_rank())")
        assert after.status == "ok", (attempt, after.error_text)
        assert all(rank_lines(after.stdout, r) == [f"next {r}"] for r in range(4)), after.stdout


def test_a_first_cell_that_fails_at_once_leaves_every_rank_with_the_group(kernel, world):
    """Rank 0 raises on the cell's first line while its peers may still be inside
    ``init_process_group``: the kernel's interrupt must not leave one of them with half a group (the
    next cell then hung in a second init, or failed "initialize the default process group twice")."""
    for attempt in range(4):
        name = f"{world}x{attempt}"
        failed = run(
            kernel,
            f"%%spawn --world {name} -n 4 --backend gloo\nimport torch, torch.distributed as dist\n"
            "if dist.get_rank() == 0:\n    raise ValueError('at once')",
        )
        assert failed.status == "error" and "ValueError: at once" in failed.error_text, failed.error_text
        after = ok(
            kernel,
            f"%%spawn --world {name} --timeout 60\nimport torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())",
        )
        assert all(rank_lines(after.stdout, r) == ["sum 4.0"] for r in range(4)), after.stdout
        ok(kernel, f"%spawn stop {name}")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_hung_collective_loses_the_world_within_the_grace_period(kernel, world, method, tmp_path):
    first = ok(
        kernel,
        f"%%spawn --world {world} -n 2 --start-method {method} --backend gloo --grace-period 1\n"
        "import os, torch, torch.distributed as dist\nprint('pid', os.getpid())",
    )
    started = time.monotonic()
    result = run(
        kernel,
        f"%%spawn --world {world} --grace-period 1\n"
        "if os.environ['RANK'] == '0':\n"
        f"    {blocked_line(tmp_path, 1)}\n"  # rank 1 is blocked in the collective, in C
        "    raise RuntimeError('rank 0 gives up')\n"
        f"{ready_line(tmp_path)}\n"
        "dist.all_reduce(torch.ones(1))\n",  # rank 1 waits in C for rank 0, forever
    )
    took = time.monotonic() - started
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    text = result.error.traceback_text
    assert "RuntimeError: rank 0 gives up" in text
    assert f"The world '{world}' was lost: rank 1 did not come back within 1 s of the interrupt" in text, text
    assert "all_reduce" in text  # where rank 1 was stuck
    assert took < 60, took  # a hang guard (the grace is 1 s; the message above says it was the grace)
    assert not [p for p in pids_of(first, 2) if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert world not in ok(kernel, "%spawn status").stdout
    again = ok(kernel, f"%%spawn --world {world} -n 2\nimport os\nprint('pid', os.getpid())")  # a new world
    assert set(pids_of(again, 2)).isdisjoint(pids_of(first, 2))


def test_a_rank_that_dies_loses_the_world_and_is_named(kernel, world):
    ok(kernel, f"%%spawn --world {world} -n 2\nimport os, time")
    result = run(kernel, f"%%spawn --world {world}\nif os.environ['RANK'] == '1':\n    os._exit(3)\ntime.sleep(30)\n")
    assert result.status == "error" and result.error.ename == "RankExitedError"
    text = result.error.traceback_text
    assert "rank 1" in text and "exit code 3" in text
    assert f"The world '{world}' was lost: rank 1 died (exit code 3)" in text, text
    assert world not in ok(kernel, "%spawn status").stdout


def test_a_rank_killed_between_cells_loses_the_world_at_the_next_cell(kernel, world):
    """The OOM killer or NCCL's watchdog between cells: the next cell says the world was lost, naming
    the rank and its signal, runs nowhere, and leaves nothing running; the one after starts a new world
    with the old settings and says so."""
    first = ok(
        kernel,
        f"%%spawn --world {world} -n 3 --backend gloo\nimport os, torch.distributed as dist\nx = 'old'\nprint('pid', os.getpid())",
    )
    pids = pids_of(first, 3)
    os.kill(pids[1], signal.SIGKILL)
    dead_to_the_kernel(kernel, world, 1)  # the next cell finds it dead, not dying
    lost = run(kernel, f"%%spawn --world {world}\nprint('ran', x)")
    assert lost.status == "error" and lost.error.ename == "UsageError", lost.error_text
    assert f"world '{world}' was lost between cells: rank 1 died (SIGKILL)" in lost.error.evalue
    assert "BrokenPipe" not in lost.error_text and "ran" not in lost.stdout  # no rank ran the cell
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    again = run(kernel, f"%%spawn --world {world}\nprint('new', dist.get_world_size(), 'x' in dir())")
    assert again.status == "error"  # the old names are gone: said plainly, before it ran
    assert (
        f"world '{world}' was lost (rank 1 died (SIGKILL)); this cell starts a new one with its settings (-n 3 --start-method"
        in again.stderr
    )
    assert "--backend gloo" in again.stderr and "none of the names its ranks had" in again.stderr
    assert "NameError: name 'dist' is not defined" in again.error.traceback_text  # its cells must run again
    new = ok(kernel, f"%%spawn --world {world}\nimport torch.distributed as dist\nprint('new', dist.get_world_size())")
    assert all(rank_lines(new.stdout, r) == ["new 3"] for r in range(3))  # 3 ranks, gloo: the old settings
    assert "was lost" not in new.stderr


def test_interrupt_stops_the_cell_and_keeps_the_world(fresh_kernel, tmp_path):
    pid = fresh_kernel.pid
    first = ok(fresh_kernel, "%%spawn --world w -n 2\nimport os, time\nx = 41\nprint('pid', os.getpid())")
    # the world's ranks already exist: the interrupt waits for them to be in the cell's sleep, and the
    # grace is one no interrupted rank needs to come back in
    thread = interrupt_later(fresh_kernel, tmp_path, 2)
    result = run(
        fresh_kernel, f"%%spawn --world w --grace-period 120\ndef train():\n    {ready_line(tmp_path)}; time.sleep(100)\ntrain()"
    )
    thread.join()
    assert result.status == "error" and result.error.ename == "SpawnInterrupted"
    assert "time.sleep(100)" in result.error.traceback_text and "was lost" not in result.error.traceback_text
    after = ok(fresh_kernel, "%%spawn --world w\nprint('pid', os.getpid(), x + 1)")
    assert pids_of(after, 2) == pids_of(first, 2) and rank_lines(after.stdout, 0)[0].endswith(" 42")
    ok(fresh_kernel, "%spawn stop w")
    assert run_processes(pid) == []


def test_options_that_contradict_the_world_are_refused_before_anything_runs(kernel, world):
    ok(kernel, f"%%spawn --world {world} -n 2\nimport os")
    result = run(kernel, f"%%spawn --world {world} -n 3 --backend gloo\nprint('never')")
    assert result.status == "error" and result.error.ename == "UsageError"
    assert f"world '{world}' runs with -n 2" in result.error.evalue and "-n 3" in result.error.evalue
    assert f"%spawn stop {world}" in result.error.evalue and "never" not in result.stdout


# What a rank was given for the cell it runs: the WorldJob that ranks/_worldloop._serve serves, read from
# its frame (the object the rank received, not a copy the test makes), each Settings field as its repr.
ASKED_AS_JSON = (
    "import dataclasses, json\nprint(json.dumps({f.name: repr(getattr(asked, f.name)) for f in dataclasses.fields(asked)}))"
)
THE_JOB_ASKED = f"""\
import sys
frame = sys._getframe()
while frame.f_code.co_name != "_serve":
    frame = frame.f_back
asked = frame.f_locals["job"].asked
{ASKED_AS_JSON}
"""


def test_every_setting_given_on_a_worlds_later_cell_reaches_its_ranks(kernel, world, tmp_path):
    """The twin of test_unit_planning's cluster test: every option a world's later cell gives reaches
    its ranks as that cell's (a kept world's 2nd and 3rd cells once got the 1st cell's value of a new
    option, every unit test green), and the kernel plans the cell with the same. The options that say
    how the world runs are given as the world has them (another value is refused: test above); every
    other option differs from both its default and the first cell's. A new Settings field fails here
    until it is given a value below."""
    world_defining = f"-n 2 --start-method fork --backend gloo --env NBSPAWN_GUARD=1 --accelerator none --log-dir {tmp_path}"
    configured = {"rank_niceness": 3, "max_saved_kb": 7, "max_image_kb": 100}
    ok(kernel, f"%%spawn --world {world} {world_defining} --timeout 50 --grace-period 9 --xray off\nimport os")
    ok(kernel, "\n".join(f"%config SpawnMagics.{name} = {value!r}" for name, value in configured.items()))
    try:
        line = f"%%spawn --world {world} {world_defining} --timeout 77 --grace-period 7 --ranks 0,1 --xray values --pdb"
        text = ok(kernel, f"{line}\n{THE_JOB_ASKED}").stdout
        planned = ok(kernel, f"import nbspawn\nasked = nbspawn.last_run().spec.asked\n{ASKED_AS_JSON}").stdout
    finally:  # the module's kernel goes on with each row's own default
        ok(kernel, "\n".join(f"%config SpawnMagics.{name} = {getattr(Settings(), name)!r}" for name in configured))
    given = Settings(
        nprocs=2,
        start_method="fork",
        backend="gloo",
        env={"NBSPAWN_GUARD": "1"},
        accelerator="none",
        log_dir=str(tmp_path),
        timeout=77.0,
        grace_period=7.0,
        ranks=frozenset({0, 1}),
        xray="values",
        pdb=True,
        given=Given(nprocs=True, start_method=True, backend=True, env=True),
        **configured,
    )
    unset = [f.name for f in dataclasses.fields(Settings) if getattr(given, f.name) == getattr(Settings(), f.name)]
    assert not unset, f"give {unset} a value of their own here, so the test sees them reach the ranks"
    expected = {f.name: repr(getattr(given, f.name)) for f in dataclasses.fields(Settings)}
    for rank in (0, 1):
        (reached,) = [json.loads(ln) for ln in rank_lines(text, rank) if ln.startswith("{")]
        assert reached == expected, (rank, reached)
    assert json.loads(planned) == expected, planned


def test_a_configured_world_and_a_fresh_cell(kernel, world):
    ok(kernel, f"%config SpawnMagics.world = {world!r}")
    try:
        a = ok(kernel, "%%spawn -n 2\nimport os\nprint('pid', os.getpid())")
        b = ok(kernel, "%%spawn\nprint('pid', os.getpid())")
        fresh = ok(kernel, "%%spawn --fresh -n 2\nimport os\nprint('pid', os.getpid())")
    finally:
        ok(kernel, "%config SpawnMagics.world = ''")
    assert pids_of(a, 2) == pids_of(b, 2) and set(pids_of(fresh, 2)).isdisjoint(pids_of(a, 2))


def test_share_and_out_work_per_cell_on_a_world(kernel, world):
    ok(kernel, "import torch\ncanvas = torch.zeros(2, 3)")
    ok(kernel, f"%%spawn --world {world} -n 2 --share canvas --out r\nimport os\nr = int(os.environ['RANK'])\ncanvas[r] = r + 1")
    assert ok(kernel, "print(canvas[:, 0].tolist(), r)").stdout.strip() == "[1.0, 2.0] [0, 1]"
    ok(kernel, f"%%spawn --world {world} --out r2\nr2 = r * 10")
    assert ok(kernel, "print(r2)").stdout.strip() == "[0, 10]"


def test_output_between_cells_goes_to_the_worlds_logs(kernel, world, tmp_path):
    ok(
        kernel,
        f"%%spawn --world {world} -n 1 --log-dir {tmp_path}\n"
        "import threading, time\n"
        "def chatter():\n"
        "    for i in range(10):\n"
        "        time.sleep(0.1)\n"
        "        print('between', i, flush=True)\n"
        "threading.Thread(target=chatter, daemon=True).start()\n",
    )
    (world_dir,) = [p for p in tmp_path.iterdir() if p.name.endswith(f"-world-{world}")]
    deadline = time.monotonic() + 30  # the chatter is over, between the cells (a hang guard)
    log = world_dir / "0" / "stdout.log"
    while not (log.exists() and "between 9\n" in log.read_text()):
        assert time.monotonic() < deadline, "the chatter between cells never ended"
        time.sleep(0.05)
    second = ok(kernel, f"%%spawn --world {world}\nprint('second cell')")
    assert rank_lines(second.stdout, 0) == ["second cell"]
    assert [f"between {i}" for i in range(10)] == (world_dir / "0" / "stdout.log").read_text().split("\n")[:10]


def test_ranks_die_with_the_kernel(fresh_kernel):
    first = ok(fresh_kernel, "%%spawn --world w -n 2\nimport os\nprint('pid', os.getpid())")
    pids = pids_of(first, 2)
    os.kill(fresh_kernel.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    assert not alive


# alone only where its kernel cannot have a /dev/shm of its own: in the machine's, a segment another test's
# ranks hold meanwhile would count here
@pytest.mark.alone(unless_private_shm=True)
def test_fifty_cells_on_a_world_and_its_stop_leave_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    kernel = start_kernel(env={"TMPDIR": str(tmp)}, private_shm=True)
    try:
        ok(
            kernel,
            f"%load_ext nbspawn\n%config SpawnMagics.view = 'text'\n%config SpawnMagics.log_dir = {str(tmp_path / 'logs')!r}",
        )
        cells = [
            "%%spawn --world w -n 2 --backend gloo\nimport torch, torch.distributed as dist\ndist.all_reduce(torch.ones(2))",
            "%%spawn --world w\nimport os\nif os.environ['RANK'] == '1':\n    raise ValueError('x')",
            "%%spawn --world w --out v\nv = torch.ones(3)",
            "%%spawn --world w\nprint('ok')",
        ]

        endings = [None, "RankRaisedError", None, None]  # each cell ends as it is meant to, or this tests nothing

        def a_world_of(n: int) -> None:
            for i in range(n):
                result = execute(kernel.client, cells[i % len(cells)], timeout=60)
                assert (result.error.ename if result.error else None) == endings[i % len(cells)], (i, result.error_text)
            ok(kernel, "%spawn stop w\ndel v")  # v: the kernel's own (mapped) --out tensors

        a_world_of(len(cells))  # warm up: imports, thread pools, the first gloo group
        before = steady_snapshot(kernel.pid, str(tmp))
        a_world_of(50)
        after = snapshot_back_to(kernel.pid, str(tmp), before)
        assert after == before
        assert after["children"] == []
        assert len(list((tmp_path / "logs").iterdir())) == 4 + 1 + 50 + 1  # a directory per cell and per world
    finally:
        stop_kernel(kernel)


def test_the_views_stop_interrupts_a_world_cell_and_keeps_the_world(kernel, world):
    """Stop in the live view (a comm message on a subshell, as JupyterLab sends it) acts as an interrupt."""
    import queue

    client = kernel.client
    if "kernel subshells" not in client.kernel_info(reply=True, timeout=30)["content"].get("supported_features", []):
        pytest.skip("this ipykernel has no subshells (ipykernel >= 7 has)")
    first = ok(kernel, f"%%spawn --world {world} -n 2\nimport os, time\nprint('pid', os.getpid())")
    subshell = create_subshell(client)
    # a grace no interrupted rank needs: a rank SIGTERMed at its end would lose the world, checked below
    msg_id = client.execute(
        f"%%spawn --world {world} --view widget --grace-period 120\nprint('up', flush=True)\ntime.sleep(300)\n"
    )
    comm_id, sent, error, started = None, None, None, time.monotonic()
    try:
        while time.monotonic() - started < 60:
            try:
                msg = client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            content = msg["content"]
            if msg["msg_type"] == "comm_open" and content["data"].get("state", {}).get("_anywidget_id"):
                comm_id = content["comm_id"]
            elif msg["msg_type"] == "comm_msg" and comm_id and sent is None and "up" in str(content["data"]):
                send_comm_msg(client, comm_id, {"type": "stop"}, subshell)
                sent = time.monotonic()
            elif msg["msg_type"] == "error" and msg["parent_header"].get("msg_id") == msg_id:
                error = content
            elif (
                msg["msg_type"] == "status"
                and msg["parent_header"].get("msg_id") == msg_id
                and content["execution_state"] == "idle"
            ):
                break
    finally:
        delete_subshell(client, subshell)
    assert sent is not None and error is not None and error["ename"] == "SpawnInterrupted", error
    assert time.monotonic() - sent < 60  # a hang guard: SIGINT stops it; the grace alone is 120 s
    after = ok(kernel, f"%%spawn --world {world}\nprint('pid', os.getpid())")
    assert pids_of(after, 2) == pids_of(first, 2)
