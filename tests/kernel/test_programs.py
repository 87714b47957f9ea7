"""Programs and background runs (issue #10) through a real kernel: `%spawn -- train.py` on N ranks
with the cell's environment, logs and failure policy; runs that leave the kernel free."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time

import psutil
import pytest
from kernel_harness import interrupt_later, ok, rank_lines, ready_line, run, run_processes

pytestmark = pytest.mark.timeout(300)

TRAIN = """
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")          # unmodified torchrun code: no arguments
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[sys.argv.index("--lr") + 1]) if "--lr" in sys.argv else 0.1)
for step in range(20):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * 10 + rank))
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
w = model.module.weight.detach().clone()
gathered = [torch.zeros_like(w) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, w)
print(f"rank {rank} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} same={all(torch.equal(g, w) for g in gathered)} args={sys.argv[1:]}")
if "--fail" in sys.argv and rank == 1:
    def load_batch():
        raise ValueError("corrupt batch 7")
    load_batch()
dist.destroy_process_group()
"""


@pytest.fixture
def scripts(kernel, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "hello.py").write_text("import os, sys\nprint('module on rank', os.environ['RANK'], sys.argv[1:])\n")
    (tmp_path / "record.py").write_text(
        textwrap.dedent("""
        from torch.distributed.elastic.multiprocessing.errors import record
        @record
        def main():
            raise KeyError("from a @record main")
        main()
    """)
    )
    (tmp_path / "spawner.py").write_text("import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n")
    cwd = run(kernel, "import os; print(os.getcwd())").stdout.strip()
    ok(kernel, f"os.chdir({str(tmp_path)!r})")
    yield tmp_path
    ok(kernel, f"os.chdir({cwd!r})")


def test_an_unmodified_ddp_script_on_n_ranks(kernel, scripts):
    result = ok(kernel, "%spawn -n 2 -- train.py --lr 0.05")
    for r in range(2):
        assert rank_lines(result.stdout, r) == [f"rank {r} of 2 local {r} same=True args=['--lr', '0.05']"]
    again = ok(kernel, "%spawn -n 2 -- python train.py")  # `python` is the kernel's own interpreter
    assert "same=True args=[]" in rank_lines(again.stdout, 1)[0]


def test_a_module_and_an_executable(kernel, scripts):
    module = ok(kernel, "%spawn -n 2 -- -m pkg.hello --flag 'two words'")
    assert rank_lines(module.stdout, 1) == ["module on rank 1 ['--flag', 'two words']"]
    exe = ok(kernel, "%spawn -n 3 -- sh -c 'echo hello from $RANK of $WORLD_SIZE; echo to stderr >&2'")
    for r in range(3):
        assert rank_lines(exe.stdout, r) == [f"hello from {r} of 3"] and rank_lines(exe.stderr, r) == ["to stderr"]


def test_a_programs_ranks_are_named_in_ps(kernel, scripts):
    """A script's rank in ps says which rank it is and what it runs (an exec-ed program names itself)."""
    (scripts / "name.py").write_text("print(open('/proc/self/cmdline').read().replace(chr(0), ' ').strip())\n")
    result = ok(kernel, "%spawn -n 2 -- name.py --lr 0.1")
    run_id = ok(kernel, "import nbspawn; print(nbspawn.last_run().run_id)").stdout.strip()
    for r in range(2):
        assert rank_lines(result.stdout, r) == [f"nbspawn rank {r} of 2 [run {run_id}]: name.py --lr 0.1"]
    module = ok(kernel, "%spawn -n 2 -- python -c \"print(open('/proc/self/cmdline').read().replace(chr(0), ' ').strip())\"")
    assert re.fullmatch(r"nbspawn rank 1 of 2 \[run [0-9a-f-]+\]: python -c \.\.\.", rank_lines(module.stdout, 1)[0])


def test_python_dash_c_runs_as_python_runs_it(kernel, scripts):
    """``-- python -c CODE ARGS``: the code as __main__, sys.argv as python gives it, its exception the root cause."""
    code = "import os, sys; print(__name__, sys.argv[1:], 'rank', os.environ['RANK'])"
    result = ok(kernel, f'%spawn -n 2 -- python -c "{code}" a b')
    for r in range(2):
        assert rank_lines(result.stdout, r) == [f"__main__ ['a', 'b'] rank {r}"]
    failed = run(kernel, "%spawn -n 2 -- python -c 'import os; 1 / (int(os.environ[\"RANK\"]) - 1)'")
    assert failed.status == "error" and failed.error.ename == "RankRaisedError"
    assert "rank 1" in failed.error.traceback_text and "ZeroDivisionError" in failed.error.traceback_text
    refused = run(kernel, "%spawn -n 2 -- python -c")
    assert refused.error.ename == "UsageError" and "-c needs the code to run" in refused.error.evalue


def test_a_scripts_exception_is_the_root_cause_in_its_own_lines(kernel, scripts):
    result = run(kernel, "%spawn -n 2 -- train.py --fail")
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    text = result.error.traceback_text
    assert "rank 1" in text and "ValueError: corrupt batch 7" in text
    assert 'File "train.py", line 22, in <module>' in text and "line 21, in load_batch" in text, text
    assert "runpy" not in text and "_program_rank" not in text


def test_an_error_file_written_by_record_is_honoured(kernel, scripts):
    result = run(kernel, "%spawn -n 1 -- record.py")
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    assert "KeyError" in result.error.traceback_text and "from a @record main" in result.error.traceback_text


def test_exit_codes_and_signals_with_the_last_lines_of_stderr(kernel, scripts):
    code = run(kernel, "%spawn -n 2 -- sh -c 'echo bye >&2; [ $RANK = 1 ] && exit 3; sleep 30'")
    assert code.status == "error" and code.error.ename == "RankExitedError"
    assert "rank 1" in code.error.traceback_text and "exited with code 3" in code.error.traceback_text
    assert "last lines of its stderr" in code.error.traceback_text and "bye" in code.error.traceback_text
    sig = run(kernel, "%spawn -n 2 -- sh -c '[ $RANK = 0 ] && kill -SEGV $$; sleep 30'")
    assert sig.error.ename == "RankExitedError" and "SIGSEGV" in sig.error.traceback_text


def test_bad_input_is_refused_before_anything_starts(kernel, scripts):
    for line, words in [
        ("%spawn -n 2 --", "no program after --"),
        ("%spawn -n 2 -- missing.py", "no such script: missing.py"),
        ("%spawn -n 2 -- -m no.such.module", "no module named 'no.such.module'"),
        ("%spawn -n 2 -- no-such-program-here", "no such program"),
        ("%spawn -n 2 --share x -- train.py", "--share does not apply to a program"),
        ("%spawn -n 2 --out x -- train.py", "--out does not apply to a program"),
    ]:
        result = run(kernel, line)
        assert result.status == "error" and result.error.ename == "UsageError", line
        assert words in result.error.evalue, (line, result.error.evalue)
        assert len(result.error.traceback) <= 2  # one short line, no internal traceback


def test_interrupt_and_timeout_leave_no_process_children_included(fresh_kernel, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()
    (tmp_path / "spawner.py").write_text(
        f"import subprocess, time\nsubprocess.Popen(['sleep', '300'])\n{ready_line(ready)}; time.sleep(300)\n"
    )
    ok(fresh_kernel, f"import os; os.chdir({str(tmp_path)!r})")
    pid = fresh_kernel.pid
    thread = interrupt_later(fresh_kernel, ready, 2)  # both ranks in their sleep, their children started
    result = run(fresh_kernel, "%spawn -n 2 -- spawner.py")
    thread.join()
    assert result.error.ename == "SpawnInterrupted" and "time.sleep(300)" in result.error.traceback_text
    assert run_processes(pid) == []
    timed = run(fresh_kernel, "%spawn -n 2 --timeout 2 --grace-period 1 -- spawner.py")
    assert timed.error.ename == "SpawnTimeoutError"
    assert run_processes(pid) == []


def test_program_ranks_die_with_the_kernel(fresh_kernel, tmp_path):
    (tmp_path / "spawner.py").write_text("import subprocess, time\nsubprocess.Popen(['sleep', '300'])\ntime.sleep(300)\n")
    ok(fresh_kernel, f"import os; os.chdir({str(tmp_path)!r})")
    ok(fresh_kernel, "run = %spawn --bg -n 2 -- spawner.py")
    deadline = time.monotonic() + 30
    while len(run_processes(fresh_kernel.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks = [p for p in run_processes(fresh_kernel.pid) if "spawner.py" in " ".join(p.cmdline())]
    assert len(ranks) == 2
    os.kill(fresh_kernel.pid, signal.SIGKILL)
    _gone, alive = psutil.wait_procs(ranks, timeout=30)  # a hang guard: death comes at once
    assert alive == []


def test_background_cells_and_programs_leave_the_kernel_free(kernel, scripts, tmp_path):
    # both runs go on until the test has looked (a flag file), not for a fixed 2 s it had to look within
    go = tmp_path / "go"
    ok(kernel, f"cell_run = %spawn --bg -n 2 -- sh -c 'while [ ! -e {go} ]; do sleep 0.05; done; echo program done'")
    ok(
        kernel,
        "%%spawn --bg -n 2 --out r\nimport os, time\n"
        f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\nr = int(os.environ['RANK']) * 7",
    )
    ok(kernel, "import nbspawn\nbg_cell = nbspawn.last_run()")
    busy = ok(kernel, "print(cell_run.done, bg_cell.done, 6 * 7)")
    assert busy.stdout.split() == ["False", "False", "42"]  # the kernel runs other cells meanwhile
    status = ok(kernel, "%spawn status").stdout
    assert "background program" in status and "background cell" in status
    go.touch()
    ok(kernel, "cell_run.wait(); bg_cell.wait(); print(r)")
    assert ok(kernel, "print(cell_run.status, bg_cell.status, r)").stdout.split() == ["succeeded", "succeeded", "[0,", "7]"]
    assert cell_run_ports_differ(kernel)


def cell_run_ports_differ(kernel) -> bool:
    out = ok(kernel, "print(cell_run.spec.master_port != bg_cell.spec.master_port, cell_run.run_dir != bg_cell.run_dir)")
    return out.stdout.split() == ["True", "True"]


def test_wait_raises_the_runs_error_and_a_failure_is_told_once(kernel, scripts):
    ok(kernel, "failing = %spawn --bg -n 2 -- train.py --fail")
    ok(kernel, "import time\nwhile not failing.done:\n    time.sleep(0.1)")
    told = ok(kernel, "1 + 1")
    notes = [o["data"]["text/plain"] for o in told.outputs if o["msg_type"] == "display_data"]
    assert len(notes) == 1 and "background run of train.py --fail" in notes[0] and "failed" in notes[0], told.outputs
    assert "run.wait()" in notes[0] and told.stderr == "" and told.stdout == "", told
    again = ok(kernel, "2 + 2")
    assert not [o for o in again.outputs if o["msg_type"] == "display_data"], again.outputs  # once
    waited = run(kernel, "failing.wait()")
    assert waited.status == "error" and waited.error.ename == "RankRaisedError"
    assert "ValueError: corrupt batch 7" in waited.error.traceback_text


def test_stop_a_background_run(kernel, scripts):
    ok(kernel, "long = %spawn --bg -n 2 -- sh -c 'sleep 300'")
    assert ok(kernel, "print(long.done)").stdout.strip() == "False"
    pids = [int(p) for p in ok(kernel, "print(*[r.pid for r in long.ranks])").stdout.split()]
    ok(
        kernel,
        "long.stop()\nimport time\nt = time.monotonic()\nwhile not long.done and time.monotonic() - t < 20:\n    time.sleep(0.05)",
    )
    assert ok(kernel, "print(long.status)").stdout.strip() == "stopped"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    again = ok(kernel, "again = %spawn --bg -n 1 -- sh -c 'sleep 300'\n%spawn stop " + "{again.run_id}")
    assert "stopped" in again.stdout
    assert ok(kernel, "print(again.done, again.status)").stdout.split() == ["True", "stopped"]
    assert ok(kernel, "print(again.error.stopped_by)").stdout.strip() == "%spawn stop"  # said as it was asked


def test_a_stopped_background_run_is_stopped_everywhere_at_once(kernel):
    """``%spawn stop``: the run's Out[] line is redrawn "stopped" within that cell, %spawn status and
    the run say so, and the next cell has no failure notice (nobody failed: the user stopped it)."""
    started = ok(kernel, "%%spawn --bg -n 2\nimport time\ntime.sleep(300)")
    (shown,) = [o for o in started.outputs if o["msg_type"] == "display_data" and "nbspawn Run" in str(o["data"])]
    display_id = shown["transient"]["display_id"]
    assert " running " in shown["data"]["text/plain"]
    stop = ok(kernel, "%spawn stop")
    (redrawn,) = [
        o for o in stop.outputs if o["msg_type"] == "update_display_data" and o["transient"]["display_id"] == display_id
    ]
    assert " stopped in " in redrawn["data"]["text/plain"] and "running" not in redrawn["data"]["text/plain"]
    assert re.search(r"background cell\s+2\s+stopped", ok(kernel, "%spawn status").stdout)
    after = ok(kernel, "import nbspawn\nprint(nbspawn.last_run().status)")
    assert after.stdout.strip() == "stopped" and not after.stderr, after.stderr  # no red notice
    # its view's record says what stopped it: the banner reads "stopped by you (%spawn stop)", not "(Stop)"
    said = ok(
        kernel, "from nbspawn.views._record import run_record\nprint(run_record(nbspawn.last_run())['error']['stopped_by'])"
    )
    assert said.stdout.strip() == "%spawn stop"


def test_what_a_rank_started_dies_with_a_sigkilled_kernel(fresh_kernel, tmp_path):
    """A program's children (and a cell's) have no pdeathsig of their own: the kernel's watcher kills
    the ranks' process groups when the kernel is gone, however it ended."""
    (tmp_path / "spawner.py").write_text("import subprocess, time\nsubprocess.Popen(['sleep', '301'])\ntime.sleep(300)\n")
    ok(fresh_kernel, f"import os; os.chdir({str(tmp_path)!r})")
    ok(fresh_kernel, "run = %spawn --bg -n 2 -- spawner.py")
    ok(fresh_kernel, "%%spawn --bg -n 1\nimport subprocess, time\nsubprocess.Popen(['sleep', '302'])\ntime.sleep(300)")
    deadline = time.monotonic() + 60
    kids: list[psutil.Process] = []
    while time.monotonic() < deadline:
        kids = [p for p in run_processes(fresh_kernel.pid) if p.name() == "sleep"]
        if len(kids) == 3:
            break
        time.sleep(0.1)
    assert len(kids) == 3, kids
    os.kill(fresh_kernel.pid, signal.SIGKILL)
    _gone, alive = psutil.wait_procs(kids, timeout=30)  # a hang guard: death comes at once
    assert alive == []
