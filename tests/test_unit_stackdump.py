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
