"""%%spawn through a real ipykernel: output, environment, start methods, the failure policy, bad input."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from kernel_harness import blocked_line, ok, rank_lines, ready_line, run

pytestmark = pytest.mark.timeout(180)


def cell_number(kernel) -> int:
    """In[N] of the next cell."""
    return ok(kernel, "pass").execution_count + 1


# -- output ---------------------------------------------------------------------------------------


def test_each_line_is_attributed_to_its_rank(kernel):
    result = ok(kernel, "%%spawn -n 4\nimport os\nprint('hello from', os.environ['RANK'])")
    for rank in range(4):
        assert rank_lines(result.stdout, rank) == [f"hello from {rank}"]


def test_stderr_is_kept_apart_from_stdout(kernel):
    result = ok(kernel, "%%spawn -n 2\nimport sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert rank_lines(result.stdout, 1) == ["out"]
    assert rank_lines(result.stderr, 1) == ["err"]


def test_output_is_captured_at_the_file_descriptor_level(kernel):
    code = "%%spawn -n 2\nimport os\nos.system('echo from-a-child-process')\n_ = os.write(1, b'raw-fd-write\\n')"
    result = ok(kernel, code)
    for rank in range(2):
        assert sorted(rank_lines(result.stdout, rank)) == ["from-a-child-process", "raw-fd-write"]


def test_carriage_return_progress_collapses_to_its_latest_state(kernel):
    code = "%%spawn -n 1\nimport sys\nfor p in (10, 50, 100):\n    sys.stdout.write(f'\\rprogress {p}%')\n    sys.stdout.flush()\nprint()\nprint('next')"
    result = ok(kernel, code)
    assert rank_lines(result.stdout, 0) == ["progress 100%", "next"]


def test_invalid_utf8_shows_replacement_characters(kernel):
    result = ok(kernel, "%%spawn -n 1\nimport os\n_ = os.write(1, b'bad \\xff\\xfe bytes\\n')")
    assert rank_lines(result.stdout, 0) == ["bad \ufffd\ufffd bytes"]


def test_ranks_option_shows_only_those_ranks_but_logs_all(kernel, tmp_path):
    result = ok(kernel, f"%%spawn -n 4 --ranks 0,2 --log-dir {tmp_path}\nimport os\nprint('r', os.environ['RANK'])")
    assert rank_lines(result.stdout, 0) == ["r 0"] and rank_lines(result.stdout, 2) == ["r 2"]
    assert not rank_lines(result.stdout, 1) and not rank_lines(result.stdout, 3)
    (run_dir,) = tmp_path.iterdir()
    for rank in range(4):
        assert (run_dir / str(rank) / "stdout.log").read_text() == f"r {rank}\n"


def test_the_value_of_a_trailing_expression_is_printed(kernel):
    result = ok(kernel, "%%spawn -n 2\nimport os\nint(os.environ['RANK']) * 10")
    assert rank_lines(result.stdout, 1) == ["10"]


def test_input_fails_at_once_instead_of_hanging(kernel):
    result = run(kernel, "%%spawn -n 2\nname = input('name? ')", timeout=30)
    assert result.status == "error"
    assert "input() is not available" in result.error.traceback_text


def test_100k_lines_per_rank_are_logged_losslessly(kernel, tmp_path):
    code = (
        f"%%spawn -n 2 --ranks 0 --log-dir {tmp_path}\n"
        "import os, sys\n"
        "for i in range(100_000):\n"
        "    print(f'line {i} of rank {os.environ[\"RANK\"]}')\n"
        "sys.stdout.flush()\n"
        "_ = os.write(2, b'x' * 300_000)\n"  # more than any pipe buffer, without a newline
    )
    result = ok(kernel, code, timeout=150)
    (run_dir,) = tmp_path.iterdir()
    for rank in range(2):
        lines = (run_dir / str(rank) / "stdout.log").read_text().splitlines()
        assert lines == [f"line {i} of rank {rank}" for i in range(100_000)]
        assert (run_dir / str(rank) / "stderr.log").read_bytes() == b"x" * 300_000
    shown = rank_lines(result.stdout, 0)
    assert len(shown) == 100_000 and shown[-1] == "line 99999 of rank 0"


def test_log_layout_is_torch_elastics_and_runs_never_share_a_directory(kernel, tmp_path):
    code = (
        f"%%spawn -n 2 --log-dir {tmp_path}\nimport os\nprint('x')\nif os.environ['RANK'] == '1':\n    raise ValueError('boom')"
    )
    run(kernel, code)
    run(kernel, code)
    runs = sorted(tmp_path.iterdir())
    assert len(runs) == 2
    for run_dir in runs:
        assert sorted(p.name for p in run_dir.iterdir()) == ["0", "1"]
        record = json.loads((run_dir / "1" / "error.json").read_text())
        assert record["message"]["message"] == "ValueError: boom"
        assert "Cell In[" in record["message"]["extraInfo"]["py_callstack"]
        assert (run_dir / "1" / "stdout.log").read_text() == "x\n"


# -- environment and namespaces -------------------------------------------------------------------


def test_ranks_get_the_torchrun_environment(kernel):
    names = [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "TORCHELASTIC_RUN_ID",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
    ]
    code = f"%%spawn -n 4\nimport os, json\nprint(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    stdout = ok(kernel, code).stdout
    envs = [json.loads(rank_lines(stdout, r)[0]) for r in range(4)]
    cpus = len(os.sched_getaffinity(0))
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
        assert env["GROUP_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
        assert int(env["MASTER_PORT"]) > 0
        assert env["OMP_NUM_THREADS"] == str(max(1, cpus // 4))
    assert len({e["TORCHELASTIC_RUN_ID"] for e in envs}) == 1
    assert len({e["MASTER_PORT"] for e in envs}) == 1


# what ps shows (/proc/<pid>/cmdline) and what top shows (comm, 15 bytes), as the process sees itself
PS_NAME = "open('/proc/self/cmdline').read().replace(chr(0), ' ').strip(), '|', open('/proc/self/comm').read().strip()"


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_ranks_are_named_in_ps(kernel, method):
    """A rank reads as what it is in ps, top and py-spy, not as one more kernel or multiprocessing child."""
    result = ok(kernel, f"%%spawn -n 3 --start-method {method}\nprint({PS_NAME})")
    run_id = ok(kernel, "import nbspawn; print(nbspawn.last_run().run_id)").stdout.strip()
    for r in range(3):
        assert rank_lines(result.stdout, r) == [f"nbspawn rank {r} of 3 [run {run_id}] | nbspawn rank {r}"]


def test_two_runs_ranks_are_told_apart_in_ps(kernel):
    """Two runs of one kernel: ps names each rank's run (its id, as ``%spawn status`` and the logs call it)."""
    code = "%%spawn -n 1\nprint(open('/proc/self/cmdline').read().replace(chr(0), ' ').strip())"
    titles = [rank_lines(ok(kernel, code).stdout, 0)[0] for _ in range(2)]
    assert titles[0] != titles[1], titles
    assert all(re.fullmatch(r"nbspawn rank 0 of 1 \[run \d{8}-\d{6}-[0-9a-f]{6}\]", t) for t in titles), titles


def test_each_run_gets_its_own_master_port(kernel):
    code = "%%spawn -n 1\nimport os\nprint(os.environ['MASTER_PORT'], os.environ['TORCHELASTIC_RUN_ID'])"
    first, second = (rank_lines(ok(kernel, code).stdout, 0)[0] for _ in range(2))
    assert first.split()[1] != second.split()[1]


def test_env_option_sets_variables_and_overrides_omp_threads(kernel):
    code = "%%spawn -n 2 --env OMP_NUM_THREADS=3 GREETING=hi=there\nimport os, torch\nprint(os.environ['OMP_NUM_THREADS'], torch.get_num_threads(), os.environ['GREETING'])"
    assert rank_lines(ok(kernel, code).stdout, 1) == ["3 3 hi=there"]


def test_gloo_all_reduce_over_4_ranks_needs_no_arguments(kernel):
    code = (
        "%%spawn -n 4\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "print(t.item(), dist.get_world_size())\n"
    )
    result = ok(kernel, code)
    for rank in range(4):
        assert rank_lines(result.stdout, rank) == ["10.0 4"]
    assert "destroy_process_group" not in result.stderr  # nbspawn tears the group down


def test_backend_option_initializes_and_destroys_the_process_group(kernel):
    code = "%%spawn -n 2 --backend gloo\nimport torch.distributed as dist\nprint(dist.is_initialized(), dist.get_backend())"
    assert rank_lines(ok(kernel, code).stdout, 0) == ["True gloo"]
    code = "%%spawn -n 2 --backend auto\nimport torch.distributed as dist\nprint(dist.get_backend())"
    assert rank_lines(ok(kernel, code).stdout, 1) == ["gloo"]  # no GPU in CI


def test_fork_sees_the_kernel_and_names_assigned_by_ranks_never_leak(kernel):
    ok(kernel, "counter = 41\ndef bump(x):\n    return x + 1")
    result = ok(kernel, "%%spawn -n 2 --start-method fork\ncounter = bump(counter)\nfresh_name = 'rank value'\nprint(counter)")
    assert rank_lines(result.stdout, 0) == ["42"]
    assert ok(kernel, "print(counter, 'fresh_name' in globals())").stdout == "41 False\n"


@pytest.mark.parametrize("shape", ["fresh", "world"])
def test_a_kernel_objects_finalizer_runs_in_the_kernel_never_in_a_forked_rank(kernel, world, tmp_path, shape):
    """Cyclic garbage the kernel had not collected yet when it forked is the kernel's: a rank's own
    collection never finalizes its copy (a kernel ``__del__`` or weakref callback would run in the rank,
    in the middle of its cell or of a pdb ``s``tep), and the kernel's next collection does."""
    log = tmp_path / "finalized.log"
    ok(
        kernel,
        "import gc, os\n"
        "class Finalized:\n"
        "    def __del__(self):\n"
        f"        with open({str(log)!r}, 'a') as f:\n"
        "            f.write(f'{os.getpid()}\\n')\n"
        "gc.disable()  # only a collection can finalize a cycle: none runs in the kernel before the fork\n"
        "cycle = Finalized(); cycle.me = cycle; del cycle\n"
        "kernel_pid = os.getpid()",
    )
    try:
        where = f"--world {world} " if shape == "world" else ""
        result = ok(kernel, f"%%spawn -n 2 {where}--start-method fork\nimport gc\ngc.collect()\nprint('pid', os.getpid())")
        assert len(rank_lines(result.stdout, 1)) == 1, result.stdout
        assert not log.exists(), f"finalized in a rank: {log.read_text()}"
    finally:
        ok(kernel, "gc.enable()\ngc.collect()")
    assert log.read_text().split() == ok(kernel, "print(kernel_pid)").stdout.split()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_clean_interpreters_get_notebook_functions_and_classes_by_value(kernel, method):
    ok(
        kernel,
        "import math\nbase = 7\ndef scaled(x):\n    return x * base\nclass Box:\n    def __init__(self, v):\n        self.v = v\n    def twice(self):\n        return Box(self.v * 2)",
    )
    code = f"%%spawn -n 2 --start-method {method}\nimport os\nb = Box(scaled(int(os.environ['RANK']) + 1)).twice()\nprint(b.v, type(b).__name__, math.pi > 3)\nbase = 0"
    result = ok(kernel, code, timeout=120)
    assert rank_lines(result.stdout, 0) == ["14 Box True"]
    assert rank_lines(result.stdout, 1) == ["28 Box True"]
    assert ok(kernel, "print(base)").stdout == "7\n"


def test_a_name_that_cannot_be_shipped_is_named_before_any_rank_starts(kernel):
    ok(kernel, "import threading, nbspawn\nguard = threading.Lock()\nbefore = nbspawn.last_run()")
    result = run(kernel, "%%spawn -n 2 --start-method spawn\nprint(guard)")
    assert result.status == "error"
    assert "cannot send 'guard' (a _thread.lock)" in result.stderr + result.error_text
    assert "Traceback" not in result.stderr + result.error_text
    assert ok(kernel, "print(nbspawn.last_run() is before)").stdout == "True\n"


def test_fork_is_refused_with_a_way_out_when_cuda_is_initialized(kernel):
    """The decision, driven through the kernel; a real CUDA kernel is tested in test_cuda.py."""
    ok(kernel, "import torch\n_real_is_initialized = torch.cuda.is_initialized\ntorch.cuda.is_initialized = lambda: True")
    try:
        refused = run(kernel, "%%spawn -n 2 --start-method fork\npass")
        assert refused.status == "error"
        message = refused.stderr + refused.error_text
        assert "CUDA is already initialized" in message and "forkserver" in message
        chosen = ok(
            kernel, "%%spawn -n 1\nimport multiprocessing as mp\nprint(mp.current_process().name != 'MainProcess')", timeout=120
        )
        assert "uses --start-method forkserver" in chosen.stderr
    finally:
        ok(kernel, "torch.cuda.is_initialized = _real_is_initialized")


def test_nprocs_auto_uses_a_safe_cpu_default(kernel):
    result = ok(kernel, "%%spawn -n auto\nimport os\nprint(os.environ['WORLD_SIZE'])")
    expected = max(1, min(4, len(os.sched_getaffinity(0))))
    assert rank_lines(result.stdout, 0) == [str(expected)]


def test_configuration_sets_defaults_and_the_help_documents_every_option(kernel):
    ok(kernel, "%config SpawnMagics.nprocs = 3")
    try:
        assert rank_lines(ok(kernel, "%%spawn\nimport os\nprint(os.environ['WORLD_SIZE'])").stdout, 2) == ["3"]
    finally:
        ok(kernel, "%config SpawnMagics.nprocs = 'auto'")
    doc = ok(kernel, "print(get_ipython().find_cell_magic('spawn').__doc__)").stdout
    for option in ["--nprocs", "--start-method", "--backend", "--env", "--timeout", "--grace-period", "--log-dir", "--ranks"]:
        assert option in doc
    config_help = ok(kernel, "%config SpawnMagics").stdout
    for trait in ["nprocs", "start_method", "backend", "timeout", "grace_period", "log_dir"]:
        assert f"SpawnMagics.{trait}" in config_help


# ranks 0 and 1 sleep 30 s, so they are surely still running when rank 2's exit stops them (with a
# 0.2 s sleep, beside other tests' ranks on the same cores, they finished first: load average 13-20)
def test_the_last_run_is_inspectable(kernel):
    run(kernel, "%%spawn -n 3\nimport os, time\nif os.environ['RANK'] == '2':\n    os._exit(5)\ntime.sleep(30)")
    code = (
        "import nbspawn\nr = nbspawn.last_run()\n"
        "print(r.status, [s.status for s in r.ranks], r.ranks[2].exit_code, all(s.duration is not None for s in r.ranks),"
        " os.path.exists(r.ranks[0].stdout_path), type(r.error).__name__)"
    )
    assert ok(kernel, "import os\n" + code).stdout == "failed ['stopped', 'stopped', 'failed'] 5 True True RankExitedError\n"


def test_the_python_api_runs_the_same_launcher(kernel):
    code = (
        "import nbspawn, torch.multiprocessing as tmp\n"
        "run = nbspawn.launch('import os\\nprint(os.environ[\"RANK\"])', nprocs=2, start_method='fork')\n"
        "print(run.status, open(run.ranks[1].stdout_path).read().strip())\n"
        "try:\n"
        "    nbspawn.launch('raise KeyError(3)', nprocs=2, start_method='fork')\n"
        "except tmp.ProcessRaisedException as e:\n"
        "    print(type(e).__name__, e.error_index in (0, 1), e.error_pid > 0, e.run.status)\n"
    )
    assert ok(kernel, code).stdout == "succeeded 1\nRankRaisedError True True failed\n"


# -- failures -------------------------------------------------------------------------------------


def test_a_failing_rank_raises_in_the_kernel_with_the_cells_own_lines(kernel):
    n = cell_number(kernel)
    code = "%%spawn -n 2\nimport os\n\nif os.environ['RANK'] == '1':\n    raise ValueError('rank one broke')\nprint('fine')"
    result = run(kernel, code)
    assert result.status == "error"
    assert result.error.ename == "RankRaisedError"
    text = result.error.traceback_text
    assert re.search(r"rank 1 \(pid \d+\) failed: ValueError: rank one broke", text)
    assert f"Cell In[{n}], line 5" in text and "raise ValueError('rank one broke')" in text
    assert "_rank.py" not in text and "multiprocessing" not in text


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_frames_in_functions_from_earlier_cells_name_those_cells(kernel, method):
    """Sent by value (spawn, forkserver), a function keeps its cell's file: never ``<dynamic-code>``."""
    n = cell_number(kernel)
    ok(kernel, "def divide(a, b):\n    return a / b")
    result = run(kernel, f"%%spawn -n 1 --start-method {method}\ndivide(1, 0)")
    assert f"Cell In[{n}], line 2, in divide" in result.error.traceback_text
    assert "dynamic-code" not in result.error.traceback_text


def test_the_first_failure_stops_the_others_and_says_where_they_were(kernel, tmp_path):
    # rank 0 fails once the others are in their sleep (their ready line, on its line, before it), not a
    # second after it started, which a loaded machine's ranks did not always need to get there
    code = (
        f"%%spawn -n 3 --grace-period 2\nimport os, time\ndef wait():\n    {ready_line(tmp_path)}; time.sleep(300)\n"
        f"if os.environ['RANK'] == '0':\n    {blocked_line(tmp_path, 2)}\n    raise RuntimeError('early')\nwait()"
    )
    result = run(kernel, code, timeout=120)
    text = result.error.traceback_text
    assert "rank 0" in text and "RuntimeError: early" in text
    assert "ranks 1-2 were stopped the same way" in text
    assert "time.sleep(300)" in text


def test_a_hung_collective_after_one_rank_fails_does_not_hang_the_cell(kernel):
    code = (
        "%%spawn -n 4 --backend gloo --grace-period 2\n"
        "import torch, torch.distributed as dist\n"
        "if dist.get_rank() == 3:\n"
        "    raise RuntimeError('rank 3 never joins the all_reduce')\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    result = run(kernel, code, timeout=60)
    text = result.error.traceback_text
    assert result.error.ename == "RankRaisedError"
    assert "rank 3" in text.splitlines()[0] and "never joins" in text
    assert "dist.all_reduce(torch.ones(1))" in text  # where the others were stuck


def test_a_segfault_is_reported_with_its_signal_and_stack(kernel):
    result = run(kernel, "%%spawn -n 2\nimport ctypes, os\nif os.environ['RANK'] == '1':\n    ctypes.string_at(0)")
    assert result.error.ename == "RankExitedError"
    assert "rank 1" in result.error.traceback_text and "SIGSEGV" in result.error.traceback_text
    assert "ctypes.string_at(0)" in result.error.traceback_text


@pytest.mark.parametrize(("exit_line", "code"), [("os._exit(3)", 3), ("sys.exit(4)", 4)])
def test_a_nonzero_exit_code_is_a_failure(kernel, exit_line, code):
    result = run(kernel, f"%%spawn -n 2\nimport os, sys\nif os.environ['RANK'] == '0':\n    {exit_line}")
    assert result.error.ename == "RankExitedError"
    assert f"exited with code {code}" in result.error.traceback_text


def test_sys_exit_zero_is_success(kernel):
    ok(kernel, "%%spawn -n 2\nimport sys\nsys.exit(0)")


def test_a_rank_raising_keyboardinterrupt_is_never_success(kernel):
    result = run(kernel, "%%spawn -n 2\nimport os\nif os.environ['RANK'] == '1':\n    raise KeyboardInterrupt")
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    assert "KeyboardInterrupt" in result.error.traceback_text


def test_timeout_stops_every_rank_and_shows_where_each_was(kernel):
    n = cell_number(kernel)
    # the timeout counts from the ranks' start: long enough that only a hang would leave one short of stuck()
    code = "%%spawn -n 2 --timeout 10 --grace-period 1\nimport os, time\ndef stuck(rank):\n    time.sleep(100)\nstuck(os.environ['RANK'])"
    result = run(kernel, code, timeout=60)
    assert result.error.ename == "SpawnTimeoutError"
    text = result.error.traceback_text
    assert "timed out after 10 s with 2 ranks still running" in text
    assert f"Cell In[{n}], line 4, in stuck" in text and "time.sleep(100)" in text


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("-n 0", "--nprocs must be a positive integer"),
        ("-n -2", "--nprocs must be a positive integer"),
        ("-n many", "--nprocs must be a positive integer"),
        ("--start-method thread", "--start-method must be one of"),
        ("--backend mpi", "--backend must be one of"),
        ("--backend nccl", "--backend nccl needs CUDA GPUs"),
        ("--timeout -1", "--timeout must be more than zero"),
        ("--timeout soon", "--timeout must be a number"),
        ("--grace-period -3", "--grace-period must be zero or more"),
        ("--env NOVALUE", "--env expects KEY=VALUE"),
        ("--ranks 7", "--ranks: rank 7 does not exist"),
        ("--frobnicate", "unrecognized arguments: --frobnicate"),
        ('--env MSG="no end', "cannot read this line: No closing quotation"),
        ('--world ""', "--world needs a name without spaces, not ''"),
        ("--world w --fresh", "--fresh runs the cell on new ranks, --world on a kept world: give one of them"),
        ("--log-dir /proc/nbspawn-cannot-be-here", "cannot write logs to /proc/nbspawn-cannot-be-here/"),
    ],
)
def test_bad_input_gets_a_short_error_before_any_process_starts(kernel, options, message):
    ok(kernel, "import nbspawn\nbefore = nbspawn.last_run()")
    result = run(
        kernel,
        f"%%spawn -n 2 {options}\nprint('should not run')"
        if not options.startswith("-n")
        else f"%%spawn {options}\nprint('should not run')",
    )
    assert result.status == "error"
    said = result.stderr + result.error_text
    assert message in said
    assert "Traceback" not in said and "nbspawn/" not in said
    assert "should not run" not in result.stdout
    assert ok(kernel, "print(nbspawn.last_run() is before)").stdout == "True\n"


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_more_ranks_than_the_machine_holds_are_refused_in_one_line_and_leave_nothing(kernel, tmp_path, method):
    """``-n 99999`` once answered "Too many open files" after it had made ~10,000 empty log directories:
    it is refused before anything is made, with the bound and its numbers."""
    result = run(kernel, f"%%spawn -n 99999 --start-method {method} --log-dir {tmp_path}\nprint('should not run')")
    assert result.status == "error" and result.error.ename == "UsageError", result.error_text
    said = result.error.evalue
    assert re.fullmatch(r"-n 99999: this machine can hold at most \d+ ranks: each [^\n]+", said), said
    assert "Traceback" not in result.stderr + result.error_text and "should not run" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_quoted_values_reach_the_ranks_as_a_shell_would_give_them(kernel, tmp_path):
    """Quotes group a value and are removed, as in a shell: IPython's own reading of a magic's line kept
    them (``NCCL_DEBUG='INFO'`` reached the ranks quoted) and split a quoted value at its spaces."""
    logs = tmp_path / "my logs"
    line = f"--env MSG=\"hello world\" LEVEL='INFO' --log-dir '{logs}' --view text"
    result = ok(kernel, f"%%spawn -n 2 {line}\nimport os\nprint(repr(os.environ['MSG']), repr(os.environ['LEVEL']))")
    for rank in (0, 1):
        assert rank_lines(result.stdout, rank) == ["'hello world' 'INFO'"]
    assert ok(kernel, "import nbspawn\nprint(nbspawn.last_run().run_dir)").stdout.startswith(f"{logs}/")
    program = (
        f'%spawn -n 1 --env MSG="hello world" --view text -- {sys.executable} -c "import os; print(repr(os.environ[\'MSG\']))"'
    )
    assert rank_lines(ok(kernel, program).stdout, 0) == ["'hello world'"]


def test_a_syntax_error_is_reported_in_the_cells_lines_before_anything_starts(kernel):
    n = cell_number(kernel)
    result = run(kernel, "%%spawn -n 2\nx = 1\ny = (x +\n")
    assert result.status == "error"
    said = result.stderr + result.error_text
    assert f"SyntaxError in Cell In[{n}], line 3" in said and "Traceback" not in said


def test_a_body_of_only_comments_runs_nothing_and_succeeds(kernel):
    result = ok(kernel, "%%spawn -n 2\n# nothing to do yet\n")
    assert [rank_lines(result.stdout, r) for r in range(2)] == [[], []], result.stdout  # nothing said, nothing run
    ended = ok(kernel, "import nbspawn\nprint(nbspawn.last_run().status, *[r.status for r in nbspawn.last_run().ranks])")
    assert ended.stdout.split() == ["succeeded", "done", "done"], ended.stdout


def test_forked_ranks_do_not_hang_after_the_kernel_used_openmp(kernel):
    """GNU OpenMP is not fork-safe: after the kernel's pool exists, a forked rank must run one thread."""
    ok(kernel, "import torch\n_ = torch.randn(600, 600) @ torch.randn(600, 600)")  # starts the kernel's pool
    code = (
        "%%spawn -n 1 --start-method fork --timeout 60 --env OMP_NUM_THREADS=2\n"
        "import torch\nx = torch.randn(800, 800)\nprint(torch.get_num_threads(), bool((x @ x).isfinite().all()))"
    )
    result = ok(kernel, code, timeout=90)
    assert rank_lines(result.stdout, 0) == ["1 True"]
    assert "OpenMP is not fork-safe" in result.stderr


def test_a_background_runs_failure_is_news_of_its_own_cell_not_an_error_of_the_next(kernel):
    """Issue #57, item 9: a background run that timed out was told in red (stderr) at the top of whatever
    cell ran next.  Now the widget, which draws the run's end in its own cell, leaves the next cell alone;
    a text view's run (its cell long ended) is told once, as a grey note of its own above the cell's output
    (not in its stdout), naming the cell it came from."""
    for view in ("widget", "text"):
        ok(kernel, f"%%spawn --bg -n 2 --timeout 2 --view {view}\nimport time\ntime.sleep(60)")
        label = ok(kernel, "import nbspawn\nbg = nbspawn.last_run()\nprint(bg.spec.cell.label)").stdout.strip()
        ok(kernel, "assert bg.ended_within(60), bg")
        later = run(kernel, "print('unrelated')")
        assert later.status == "ok" and later.stderr == "" and later.stdout == "unrelated\n", later
        notes = [o["data"] for o in later.outputs if o["msg_type"] == "display_data"]
        if view == "widget":
            assert notes == [], notes
        else:
            (note,) = notes
            told = note["text/plain"]
            assert told.startswith(f"nbspawn: the background run of {label} (") and "timed out: SpawnTimeoutError" in told, told
            assert '<pre style="color:var(--jp-ui-font-color2' in note["text/html"], note
            again = run(kernel, "print(1)")
            assert not [o for o in again.outputs if o["msg_type"] == "display_data"]  # told once
