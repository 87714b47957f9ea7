"""``ranks._stackdump``: a rank answers SIGUSR1 with every thread's stack, and lives on however often
it is asked, even while its main thread calls Python from C all the time (torch.compile, DDP hooks),
where faulthandler's own handler crashes from Python 3.11 on (CPython gh-123967)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nbspawn.ranks
from nbspawn.ranks._stackdump import HANDLER_CAN_CRASH

RANKS_DIR = os.path.dirname(nbspawn.ranks.__file__)
CHILD = """
import sys
sys.path.insert(0, {ranks!r})
import _stackdump  # as a program's rank loads it: by path, nothing of nbspawn imported
stacks = open({path!r}, "w")
_stackdump.answer_stack_requests(stacks{choice})
def called_from_c(x):
    return x
def busy_calling_python_from_c():
    print("ready", flush=True)
    while True:
        sorted(range(1000), key=called_from_c)
busy_calling_python_from_c()
"""


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.parametrize(
    "from_a_thread", [None, True, False], ids=["as-on-this-python", "answering-thread", "faulthandler-handler"]
)
def test_a_rank_asked_where_it_is_hundreds_of_times_answers_and_lives_on(tmp_path, from_a_thread):
    """faulthandler's own handler died within 6-226 requests here on 3.11.7, 3.12.1 and 3.13.0 (the
    faulthandler-handler case fails there); the answering thread, what ranks use there, lived
    through 2000."""
    if from_a_thread is False and HANDLER_CAN_CRASH:
        pytest.skip(f"faulthandler's handler crashes on Python {sys.version.split()[0]}: ranks answer from a thread here")
    path = tmp_path / "stacks.log"
    choice = "" if from_a_thread is None else f", from_a_thread={from_a_thread}"
    code = CHILD.format(ranks=RANKS_DIR, path=str(path), choice=choice)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for _ in range(300):
            os.kill(child.pid, signal.SIGUSR1)
            time.sleep(0.002)
        settled, last = time.monotonic(), _size(path)
        while time.monotonic() < settled + 0.3:  # whole dumps: until the file stops growing
            time.sleep(0.05)
            if _size(path) != last:
                settled, last = time.monotonic(), _size(path)
        assert child.poll() is None, f"the rank died of being asked (exit {child.returncode}):\n{path.read_text()[-2000:]}"
        dumps = path.read_text()
        assert "Fatal Python error" not in dumps
        assert dumps.count("in busy_calling_python_from_c") >= 1, dumps[-2000:]
    finally:
        child.kill()
        child.wait()


LEAVING = """
import sys, time
sys.path.insert(0, {ranks!r})
import _stackdump
stacks = open({path!r}, "w")
_stackdump.answer_stack_requests(stacks, from_a_thread=True)
class SlowToGo:
    def __del__(self):
        time.sleep(0.3)  # the interpreter's shutdown takes a while, as with torch loaded
keep = SlowToGo()
print("leaving", flush=True)
"""


def test_a_rank_asked_where_it_is_as_its_interpreter_shuts_down_is_not_killed_by_it(tmp_path):
    """A spawn rank finalizes its interpreter on the way out, which gives a signal with a Python
    handler back to SIG_DFL: the hang watch's look at that moment killed it with SIGUSR1."""
    code = LEAVING.format(ranks=RANKS_DIR, path=str(tmp_path / "stacks.log"))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "leaving\n"
    while child.poll() is None:
        try:
            os.kill(child.pid, signal.SIGUSR1)
        except ProcessLookupError:
            break
        time.sleep(0.001)
    assert child.wait() == 0


TOLD = """
import os, sys, time
sys.path.insert(0, {ranks!r})
import _stackdump
stacks = open({path!r}, "w")
calls = []
def then(handle):
    calls.append(os.fstat(handle.fileno()).st_size)
    with open({told!r}, "w") as fh:
        fh.write(",".join(map(str, calls)))
    if len(calls) == 1:
        raise RuntimeError("a failing follow-up leaves the answering thread alive")
print(_stackdump.answer_stack_requests(stacks, then=then, from_a_thread=True), flush=True)
while True:
    time.sleep(0.01)
"""


def test_the_answering_thread_says_after_each_dump_how_far_the_file_got(tmp_path):
    """A rank's collectives are written at once after its stacks (``then``), not a watcher's poll
    later; a ``then`` that raises does not stop the answers."""
    path, told = tmp_path / "stacks.log", tmp_path / "told"
    code = TOLD.format(ranks=RANKS_DIR, path=str(path), told=str(told))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "True\n"
        for asked in (1, 2):
            os.kill(child.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 10
            # the child opens the file before it writes the size: wait for the size itself (ci61 read "" once)
            while time.monotonic() < deadline and (
                not told.exists() or len([v for v in told.read_text().split(",") if v]) < asked
            ):
                time.sleep(0.01)
            sizes = [int(size) for size in told.read_text().split(",")]
            assert len(sizes) == asked and sizes[-1] == _size(path) > 0  # called once the dump was whole
    finally:
        child.kill()
        child.wait()


def test_faulthandlers_own_handler_tells_nobody(tmp_path):
    """Before 3.11 (or with the wakeup descriptor taken) faulthandler answers: the caller is told to
    watch the file itself (``ranks._watch`` then polls)."""
    code = (
        f"import sys; sys.path.insert(0, {RANKS_DIR!r}); import _stackdump\n"
        f"print(_stackdump.answer_stack_requests(open({str(tmp_path / 's')!r}, 'w'), from_a_thread=False))"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_write_beside_puts_the_collectives_next_to_the_stacks_file_it_was_given(tmp_path):
    """The directory comes from the descriptor, which a world rank points at each cell's directory
    with dup2; ``asked`` is the file's size, which the kernel compares with what it saw."""
    import json

    from nbspawn.ranks._watch import write_beside

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    with open(first / "stacks.log", "w") as handle:
        handle.write("dump\n")
        handle.flush()
        target = os.open(second / "stacks.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(target, b"a longer dump\n")
        os.dup2(target, handle.fileno())
        os.close(target)
        write_beside(handle)
    record = json.loads((second / "collectives.json").read_text())
    assert record["asked"] == len("a longer dump\n") and record["entries"] == []
    assert not (first / "collectives.json").exists()


OWN_HANDLER = """
import os, signal, sys, time
sys.path.insert(0, {ranks!r})
import _stackdump
_stackdump.answer_stack_requests(open({path!r}, "w"), from_a_thread=True)
ran = []
signal.signal(signal.SIGUSR1, lambda *_: ran.append(1))  # a cell's own handler, set after nbspawn's
os.kill(os.getpid(), signal.SIGUSR1)
deadline = time.monotonic() + 10
while time.monotonic() < deadline and not (ran and os.path.getsize({path!r})):
    time.sleep(0.01)
print(len(ran), os.path.getsize({path!r}) > 0)
"""


def test_a_cells_own_sigusr1_handler_runs_and_the_rank_still_answers(tmp_path):
    """Python's C-level handler writes to the wakeup descriptor whatever Python handler is set, so the
    answering thread still dumps (docs/guide.md says so); before 3.11 the cell's handler replaces
    faulthandler's."""
    code = OWN_HANDLER.format(ranks=RANKS_DIR, path=str(tmp_path / "stacks.log"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True).stdout
    assert out == "1 True\n", out


def test_a_rank_asked_where_it_is_while_it_sets_up_its_answer_is_not_killed(tmp_path, monkeypatch):
    """The kernel asks a rank whose stacks.log exists (SIGUSR1, whose default is to kill). The file is
    made just before the answer is set up: a look then, as a slow forkserver rank started on Kaggle's
    CI stack, killed rank 0 ("killed by SIGUSR1"). Here that moment is stretched to half a second."""
    import nbspawn.ranks._cell as cell

    answer = cell.answer_where

    def slow_answer(stack_file, *args):
        time.sleep(0.5)
        answer(stack_file, *args)

    monkeypatch.setattr(cell, "answer_where", slow_answer)
    pid = os.fork()
    if pid == 0:  # the rank
        code = 1
        try:
            cell._install_signal_handlers(str(tmp_path))
            time.sleep(0.5)  # asked meanwhile, it lives on
            code = 0
        finally:
            os._exit(code)
    stacks = tmp_path / "stacks.log"
    deadline = time.monotonic() + 10
    while not stacks.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert stacks.exists()
    os.kill(pid, signal.SIGUSR1)  # as events._where.rank_stacks asks: the file exists
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the rank ended with {os.waitstatus_to_exitcode(status)}"
