"""The pure parts of what a rank costs (``nbspawn.events._resources``), and the few that read this
machine's own ``/proc`` (real processes, no fakes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from nbspawn.events import _resources as res
from nbspawn.events._resources import CLOCK_TICKS, PAGE_BYTES, ProcStat


def test_a_stat_line_is_read_whatever_the_process_calls_itself():
    # its name holds spaces and parentheses: only the last ')' ends it
    line = f"42 (rank 1 (x) y) S 7 42 42 0 -1 4194560 1 0 0 0 {3 * CLOCK_TICKS} {CLOCK_TICKS} 0 0 20 0 1 0 9 1000 250 18446744073709551615"
    assert res.parse_stat(line) == ProcStat(42, 7, 4.0, 250 * PAGE_BYTES)
    assert res.parse_stat("garbage") is None
    assert res.parse_stat("") is None


def test_a_ranks_figures_are_its_own_and_its_descendants():
    processes = {
        10: ProcStat(10, 1, 1.0, 100),  # rank 0
        11: ProcStat(11, 10, 2.0, 10),  # its DataLoader worker
        12: ProcStat(12, 11, 0.5, 1),  # that worker's own child
        20: ProcStat(20, 1, 3.0, 300),  # rank 1
        30: ProcStat(30, 1, 9.0, 900),  # someone else's
    }
    totals = res.tree_totals(processes, {0: 10, 1: 20, 2: 99}, proc="/nonexistent")  # no statm there: RSS
    assert totals == {0: (3.5, 111), 1: (3.0, 300)}  # rank 2's process is gone: left out


def test_this_machines_processes_are_read_and_a_live_process_holds_what_it_wrote():
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; b = bytearray(b'x' * 200_000_000); print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        processes = res.read_processes()
        assert os.getpid() in processes and processes[child.pid].ppid == os.getpid()
        _, held = res.tree_totals(processes, {0: child.pid})[0]
        assert 200_000_000 <= held <= 260_000_000, held  # its own bytes, not the interpreter's shared libraries
        # only the processes asked for (the sample as ranks start); one that is not there is left out
        assert set(res.read_processes(only=[child.pid, os.getpid(), 2**22 + 1])) == {child.pid, os.getpid()}
        # raised above this process's own oom_score_adj, as a rank is above the kernel's
        assert res.raise_oom_score(child.pid)
        with open(f"/proc/{child.pid}/oom_score_adj") as fh, open("/proc/self/oom_score_adj") as mine:
            assert int(fh.read()) == min(1000, int(mine.read()) + 500)
    finally:
        child.kill()
        child.wait()
    assert not res.raise_oom_score(child.pid)  # gone: said, not raised


def test_a_ranks_every_thread_runs_below_the_kernels_cpu_priority_and_what_it_starts_inherits_it():
    """A rank with a thread of its own already running, and a process it starts afterwards: all of them
    get the kernel's nice value plus the given amount (Linux keeps one per thread)."""
    script = (
        "import subprocess, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "sys.stdin.readline()\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    started = 0
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{rank.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        kernels = os.getpriority(os.PRIO_PROCESS, 0)
        assert res.lower_cpu_priority(rank.pid, 3)
        assert rank.stdin is not None and rank.stdout is not None
        rank.stdin.write("\n")
        rank.stdin.flush()
        started = int(rank.stdout.readline())
        threads = os.listdir(f"/proc/{rank.pid}/task")
        assert len(threads) >= 2
        assert {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in threads} == {min(19, kernels + 3)}
        assert os.getpriority(os.PRIO_PROCESS, started) == min(19, kernels + 3)
        assert not res.lower_cpu_priority(rank.pid, 0)  # 0: left at the kernel's
    finally:
        rank.kill()
        rank.wait()
        if started:
            os.kill(started, signal.SIGKILL)
    assert not res.lower_cpu_priority(rank.pid, 3)  # gone: said, not set


def test_meminfo_and_the_tightest_control_group(tmp_path):
    assert res.meminfo("MemTotal:  1000 kB\nMemFree: 10 kB\nMemAvailable:  600 kB\n") == (1_024_000, 614_400)
    # v1: the kernel's group and its ancestors, nearest first; the tightest limit wins
    text = "4:memory:/a/b\n1:cpu:/\n0::/"
    dirs = res.cgroup_dirs(text, str(tmp_path))
    assert [d for d, v in dirs if v == 1] == [f"{tmp_path}/memory/a/b", f"{tmp_path}/memory/a", f"{tmp_path}/memory"]
    (tmp_path / "memory/a/b").mkdir(parents=True)
    (tmp_path / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    (tmp_path / "memory/a/memory.limit_in_bytes").write_text("3000\n")
    (tmp_path / "memory/a/memory.usage_in_bytes").write_text("1000\n")
    (tmp_path / "memory/a/b/memory.limit_in_bytes").write_text("5000\n")
    assert res.cgroup_limit(dirs) == (3000, 1000)
    # v2 alone ("0::/path" with cgroup.controllers at the root): memory.max, "max" is none
    v2 = tmp_path / "v2"
    (v2 / "k").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory\n")
    (v2 / "k/memory.max").write_text("max\n")
    assert res.cgroup_limit(res.cgroup_dirs("0::/k", str(v2))) is None
    (v2 / "k/memory.max").write_text("2048\n")
    (v2 / "k/memory.current").write_text("1024\n")
    assert res.cgroup_limit(res.cgroup_dirs("0::/k", str(v2))) == (2048, 1024)


def test_this_machines_memory_and_its_out_of_memory_count_are_read():
    limit = res.memory_limit()
    assert limit is not None and 0 < limit.used < limit.total and limit.source in ("machine", "container")
    assert res.oom_kills() >= 0
    assert res.memory_limit(proc="/nonexistent") is None


def test_bytes_in_words():
    assert res.gigabytes(5_140_000_000) == "5.1 GB"
    assert res.gigabytes(849_600_000) == "850 MB"
    assert res.gigabytes(0) == "0 MB"


def test_out_of_memory_kills_are_counted_in_the_kernels_own_group_first(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "vmstat").write_text("nr_free_pages 10\noom_kill 7\n")
    (proc / "self/cgroup").write_text("4:memory:/k\n0::/\n")
    group = tmp_path / "cg/memory/k"
    group.mkdir(parents=True)
    assert res.oom_kills(str(proc), str(tmp_path / "cg")) == 7  # the group says nothing: the machine's count
    (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert res.oom_kills(str(proc), str(tmp_path / "cg")) == 2  # a kill elsewhere on the machine is not the ranks'
    (proc / "self/cgroup").write_text("0::/k\n")
    v2 = tmp_path / "v2"
    (v2 / "k").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory\n")
    (v2 / "k/memory.events.local").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert res.oom_kills(str(proc), str(v2)) == 1


def test_a_ranks_cpu_counts_from_its_mark_and_a_mark_of_its_process_alone_against_its_process_alone():
    """The sample as ranks start reads each rank's own process (``read_processes(only=...)``); the next,
    a second later, its descendants too. A kept world's rank whose DataLoader workers ran 100 s of CPU in
    earlier cells would read 10000 % if that sample's whole tree were counted from the first's mark."""
    assert res.cpu_percent(None, tree_cpu=5.0, own_cpu=5.0, now=11.0) is None  # nothing to count from
    assert res.cpu_percent(res.CpuMark(2.0, 11.0), tree_cpu=5.0, own_cpu=5.0, now=11.0) is None  # no time passed
    # a mark of the whole tree: the tree's seconds since, over the wall seconds since
    assert res.cpu_percent(res.CpuMark(102.0, 10.0), tree_cpu=103.5, own_cpu=2.5, now=11.0) == 150.0
    # a mark of the rank's process alone: its own seconds since, not its workers' lifetimes
    assert res.cpu_percent(res.CpuMark(2.0, 10.0, alone=True), tree_cpu=103.5, own_cpu=2.5, now=11.0) == 50.0
    assert res.cpu_percent(res.CpuMark(9.0, 10.0), tree_cpu=8.0, own_cpu=8.0, now=11.0) == 0.0  # a worker gone: never below 0
