"""Unit tests of the rule that refuses more ranks than this machine can hold (nbspawn._capacity): each
bound (open files, processes, memory) on made-up machines, the numbers said, and this machine's facts."""

from __future__ import annotations

import pytest

from nbspawn._capacity import FILES_PER_RANK, FILES_SPARE, MEMORY_PER_RANK, MIB, TASKS_PER_RANK, Room, refusal, this_machine

ROOMY = Room(open_files=1 << 20, open_now=50, tasks=1 << 22, tasks_now=500, memory=1 << 40)


def test_a_count_the_machine_holds_is_not_refused():
    assert refusal(4, "fork", ROOMY) is None
    assert refusal(64, "spawn", Room(open_files=1024, open_now=40, tasks=None, tasks_now=0, memory=None)) is None


def test_open_files_bound_the_ranks_and_the_line_says_the_numbers():
    machine = Room(open_files=1024, open_now=64, tasks=None, tasks_now=0, memory=None)
    most = (1024 - 64 - FILES_SPARE) // FILES_PER_RANK
    assert refusal(most, "fork", machine) is None
    said = refusal(most + 1, "fork", machine)
    assert said == (
        f"-n {most + 1}: this machine can hold at most {most} ranks: each takes {FILES_PER_RANK} of the kernel's "
        "open files and it may open 1024 (ulimit -n)"
    )


def test_processes_bound_the_ranks():
    machine = Room(open_files=None, open_now=0, tasks=4096, tasks_now=1000, memory=None)
    most = (4096 - 1000) // TASKS_PER_RANK
    assert refusal(most, "fork", machine) is None
    said = refusal(99999, "fork", machine)
    assert said is not None and said.startswith(f"-n 99999: this machine can hold at most {most} ranks: ")
    assert f"each is about {TASKS_PER_RANK} processes and threads, and 3096 more may start (ulimit -u" in said


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_memory_bounds_the_ranks_by_what_a_rank_of_that_start_method_takes(method):
    machine = Room(open_files=None, open_now=0, tasks=None, tasks_now=0, memory=8 << 30)
    per_rank = MEMORY_PER_RANK[method]
    most = (8 << 30) // per_rank
    assert refusal(most, method, machine) is None
    assert refusal(most + 1, method, machine) == (
        f"-n {most + 1}: this machine can hold at most {most} ranks: each {method} rank takes at least "
        f"{per_rank // MIB} MiB and 8192 MiB is available"
    )


def test_the_tightest_bound_is_the_one_said():
    machine = Room(open_files=20000, open_now=100, tasks=100000, tasks_now=1000, memory=16 << 30)
    said = refusal(99999, "spawn", machine)
    assert said is not None and "MiB is available" in said  # 16 GiB / 155 MiB: 105 ranks, fewer than the files allow


def test_no_bound_known_refuses_nothing():
    assert refusal(10**6, "fork", Room(open_files=None, open_now=0, tasks=None, tasks_now=0, memory=None)) is None


def test_this_machine_can_hold_a_few_ranks_and_not_ninety_nine_thousand():
    assert refusal(4, "fork", this_machine(4)) is None
    assert refusal(99999, "fork", this_machine(99999)) is not None


def test_what_a_failed_start_made_is_removed_unless_a_rank_wrote_something(tmp_path):
    """A start that failed half-way (the kernel out of open files at its 9,967th rank directory) leaves
    nothing; a run directory in which some rank wrote a byte is kept, for its logs."""
    from nbspawn._rankdir import remove_if_empty

    empty = tmp_path / "run-a"
    for rank in range(50):
        (empty / str(rank)).mkdir(parents=True)
        (empty / str(rank) / "stdout.log").touch()
    assert remove_if_empty(str(empty)) and not empty.exists()
    kept = tmp_path / "run-b"
    (kept / "0").mkdir(parents=True)
    (kept / "1").mkdir()
    (kept / "1" / "stderr.log").write_text("Traceback ...")
    assert not remove_if_empty(str(kept)) and (kept / "1" / "stderr.log").read_text() == "Traceback ..."
    assert remove_if_empty(str(tmp_path / "never-made"))
