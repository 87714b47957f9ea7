"""``%spawn debug``: a kept world's post-mortem and attaching to a background run's rank at a prompt,
driven through a real kernel's stdin channel as a frontend answers it (``converse``, from
test_debugger)."""

from __future__ import annotations

import re
import time

import pytest
from kernel_harness import STOP_LINE_SHIFT, TO_NEXT_LINE, Kernel, converse, ok, rank_lines, run, strip_ansi

from nbspawn.views._widget import widget_available

FAILING = """%%spawn --world w
def f(v):
    bad = v * 3
    raise ValueError(f"bad {v}")
if rank == 1:
    f(rank)
print("fine", rank)
"""


def start_world(kernel: Kernel, method: str, name: str = "w") -> None:
    ok(kernel, f"%%spawn --world {name} -n 2 --backend gloo --start-method {method}\nimport os\nrank = int(os.environ['RANK'])")


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_post_mortem_of_a_worlds_last_failure_at_the_failed_cells_own_lines(fresh_kernel, method):
    start_world(fresh_kernel, method)
    failed = run(fresh_kernel, FAILING)
    assert failed.status == "error" and "bad 1" in strip_ansi(failed.error.traceback_text + failed.error.evalue)
    ok(fresh_kernel, "%%spawn --world w\nlater = 1\nprint('a later cell', rank)\n")  # its lines replace the failed cell's
    talk = converse(fresh_kernel, "%spawn debug w", ["p bad", "l", "w", "up", "p rank", "q"])
    assert talk.result.status == "ok", talk.text
    assert talk.prompts == ["(Pdb rank 1) "] * 6
    text = "\n".join(rank_lines(talk.result.stdout, 1))
    assert "post-mortem of world 'w' rank 1: ValueError: bad 1" in talk.text
    assert "3" in rank_lines(talk.result.stdout, 1)  # p bad: the failed frame's local
    assert '  4  ->\t    raise ValueError(f"bad {v}")' in text, text  # l: the failed cell's lines, not the later cell's
    assert "  3  \t    bad = v * 3" in text
    assert "a later cell" not in text
    failed_cell = f"Cell In[{failed.execution_count}]"
    assert (
        f"> {failed_cell}, line 4, in f" in text and f"  {failed_cell}, line 6\n-> f(rank)" in text
    )  # w, as IPython names cells
    assert "_worldloop.py" not in text and "_cell.py" not in text
    # the world lives on, and keeps the failure: without a rank, the root cause's rank is debugged again
    talk = converse(fresh_kernel, "%spawn debug", ["p v + 100", "c"])
    assert talk.prompts == ["(Pdb rank 1) "] * 2 and "101" in rank_lines(talk.result.stdout, 1)
    result = ok(fresh_kernel, "%%spawn --world w\nprint('alive', rank, later)")
    assert "alive 0 1" in rank_lines(result.stdout, 0) and "alive 1 1" in rank_lines(result.stdout, 1)
    ok(fresh_kernel, "%spawn stop w")


def test_post_mortem_names_a_function_from_a_cell_run_after_the_world_started(kernel):
    """pdb calls the failed cell's functions by the cells IPython numbered as it ran, not only those
    there were when the world started (a kernel's temporary file's name, /tmp/ipykernel_*/*.py)."""
    ok(kernel, "%%spawn --world pmnames -n 1\npass")
    try:
        defined = ok(kernel, "def shaky(v):\n    raise ValueError(v)").execution_count
        failed = run(kernel, "%%spawn --world pmnames\nshaky(7)\n")
        assert failed.status == "error"
        talk = converse(kernel, "%spawn debug pmnames", ["w", "q"])
        assert talk.result.status == "ok", talk.text
        text = "\n".join(rank_lines(talk.result.stdout, 0))
        assert f"> Cell In[{defined}], line 2, in shaky" in text, text
        assert f"  Cell In[{failed.execution_count}], line 2\n-> shaky(7)" in text, text
        assert "ipykernel" not in text
    finally:
        ok(kernel, "%spawn stop pmnames")


def test_post_mortem_opens_at_the_cells_line_not_in_a_library(fresh_kernel):
    """A cell that raised inside torch: ``%spawn debug`` opens where the cell called it, as IPython's
    ``%debug`` does, with the cell's names at hand; ``d`` still goes down into torch's frames."""
    start_world(fresh_kernel, "fork")
    failed = run(
        fresh_kernel, "%%spawn --world w\nimport torch\nlayer = torch.nn.Linear(4, 2)\nx = torch.ones(3, 5)\ny = layer(x)\n"
    )
    assert failed.status == "error"
    talk = converse(fresh_kernel, "%spawn debug w", ["p x.shape", "d", "d", "d", "q"])
    assert talk.result.status == "ok", talk.text
    text = strip_ansi(talk.text)  # the root cause's rank is debugged
    stop = re.search(rf"> Cell In\[{failed.execution_count}\], line 5\n\[rank\d\]: -> y = layer\(x\)", text)
    assert stop, text  # where it opened: the cell's line that raised
    opened = stop.start()
    assert text.index("torch.Size([3, 5])") > opened  # p x.shape: the cell's own frame
    assert "linear.py" not in text[:opened] and "linear.py(" in text[opened:], text  # d: down into torch


def test_debug_says_what_there_is_not(kernel):
    result = run(kernel, "%spawn debug")
    assert result.status == "error" and "nothing to debug" in strip_ansi(result.error.evalue)
    start_world(kernel, "fork", "v")
    for line, said in [
        ("%spawn debug v", "no failure kept on world 'v': none of its cells has raised"),
        ("%spawn debug nope", "no kept world or background run named 'nope'"),
        ("%spawn debug v 1 2", "one world or run and one rank at most"),
    ]:
        result = run(kernel, line)
        assert result.status == "error" and said in strip_ansi(result.error.evalue), (line, result.error)
    assert run(kernel, "%%spawn --world v\nif rank == 0:\n    raise KeyError('k')\n").status == "error"
    result = run(kernel, "%spawn debug v 1")
    assert "no failure kept on world 'v' rank 1: rank 0 (KeyError: 'k', Cell In[" in strip_ansi(result.error.evalue)
    result = run(kernel, "%spawn debug v 5")
    assert "world 'v' has ranks 0-1, not 5" in strip_ansi(result.error.evalue)
    result = run(kernel, "%spawn debug v")  # the harness sends allow_stdin=False: nothing can answer
    assert "needs a frontend that answers input()" in strip_ansi(result.error.evalue)
    ok(kernel, "%spawn stop v")


def test_interrupting_a_world_post_mortem_leaves_the_world(fresh_kernel):
    start_world(fresh_kernel, "fork")
    run(fresh_kernel, FAILING)
    talk = converse(fresh_kernel, "%spawn debug w", lambda prompt: None, timeout=60)  # interrupt at the prompt
    assert talk.result.status == "error"
    result = ok(fresh_kernel, "%%spawn --world w\nprint('alive', rank)")
    assert "alive 1" in rank_lines(result.stdout, 1)
    talk = converse(fresh_kernel, "%spawn debug w 1", ["c"])  # still kept after the interrupt
    assert talk.prompts == ["(Pdb rank 1) "]
    ok(fresh_kernel, "%spawn stop w")


BACKGROUND = """%%spawn --bg -n 2 --backend gloo
import os, torch.distributed as dist
rank = int(os.environ["RANK"])
x = rank * 10
if rank == 1:
    breakpoint()
    x += 1
dist.barrier()
print("done", rank, x)
"""


def waiting(kernel: Kernel, timeout: float = 60) -> str:
    """%spawn status once a background run's rank waits at a prompt."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = ok(kernel, "%spawn status").stdout
        if "to attach" in status:
            return status
        time.sleep(0.3)
    raise AssertionError(f"no rank waits: {status}")


def background(kernel: Kernel, code: str) -> str:
    """Start a background run from a cell sent with stdin (a notebook's): its prompts wait for an attach."""
    assert converse(kernel, code, []).result.status == "ok"
    # one write, bracketed: the run's own lines come between two writes (print writes its end apart),
    # or right after this one ("RUN-ID 2026...-2b6ca8[rank1]: ..." once on CI)
    said = ok(kernel, "import sys; bg = nbspawn.last_run(); sys.stdout.write(f'RUN-ID <{bg.run_id}>\\n');").stdout
    found = re.search(r"RUN-ID <([^<>]+)>", said)
    assert found, said
    return found.group(1)


@pytest.mark.parametrize(
    ("method", "view"),
    [
        ("fork", "text"),
        pytest.param("forkserver", "widget", marks=pytest.mark.skipif(not widget_available(), reason="widget.js is not built")),
    ],
)
def test_attach_to_a_background_runs_breakpoint(fresh_kernel, method, view):
    run_id = background(fresh_kernel, BACKGROUND.replace("--bg", f"--bg --start-method {method} --view {view}"))
    status = waiting(fresh_kernel)
    line = 7 + STOP_LINE_SHIFT
    assert f"rank 1 of {run_id} is at a breakpoint (Pdb, cell line {line}): run `%spawn debug {run_id}` to attach" in status, (
        status
    )
    note = ok(fresh_kernel, "print(bg.ranks[1].note)").stdout
    assert note.startswith(f"at a breakpoint (Pdb, cell line {line}); run %spawn debug"), note  # the chip's note
    record = ok(fresh_kernel, "from nbspawn.views._record import rank_record\nprint(rank_record(bg.ranks[1])['prompt'])")
    assert record.stdout.strip().splitlines()[-1] == "pdb"  # the widget's rank record: the chip is drawn at a prompt
    answers = [*TO_NEXT_LINE, "p x", "n", "p x", "c"]
    talk = converse(fresh_kernel, f"%spawn debug {run_id}", answers)
    assert talk.result.status == "ok", talk.text
    assert talk.prompts == ["(Pdb rank 1) "] * len(answers)
    # a text view's lines come to this cell; a widget's pane is in the earlier cell, so they are shown here too
    out = rank_lines(talk.result.stdout, 1) if view == "text" else talk.result.stdout.splitlines()
    assert "-> x += 1" in talk.result.stdout  # where it stopped, shown when the cell attached
    assert "10" in out and "11" in out, talk.result.stdout  # p x, before and after n, shown in this cell
    assert re.search(
        f"run {run_id}: rank 1 went on(; the run goes on in the background|; the run ended \\(succeeded\\)| and ended \\(done\\))",
        talk.result.stdout,
    )
    done = ok(fresh_kernel, "bg.wait(60); print('END', bg.status, bg.ranks[1].note, bg.ranks[1].prompt)").stdout
    assert "END succeeded None None" in done
    logs = ok(fresh_kernel, "print(open(bg.ranks[1].stdout_path).read())").stdout
    assert "done 1 11" in logs
    assert "to attach" not in ok(fresh_kernel, "%spawn status").stdout


def test_attach_answers_input_and_a_rank_that_is_not_waiting_is_refused(fresh_kernel):
    code = "%%spawn --bg -n 2\nimport os\nif os.environ['RANK'] == '1':\n    name = input('name? ')\n    print('hello', name)\n"
    run_id = background(fresh_kernel, code)
    assert f"rank 1 of {run_id} is waiting for input (input())" in waiting(fresh_kernel)
    result = run(fresh_kernel, f"%spawn debug {run_id} 0")
    assert f"rank 0 of run {run_id} is not waiting at a prompt (waiting: rank 1)" in strip_ansi(result.error.evalue)
    result = run(fresh_kernel, f"%spawn debug {run_id}")  # the harness sends allow_stdin=False
    assert "needs a frontend that answers input()" in strip_ansi(result.error.evalue)
    talk = converse(fresh_kernel, "%spawn debug 1", ["Ada"])  # the one run waiting, rank 1
    assert talk.prompts == ["[rank 1] name? "], talk.text
    ok(fresh_kernel, "bg.wait(60)")
    assert "hello Ada" in ok(fresh_kernel, "print(open(bg.ranks[1].stdout_path).read())").stdout


def test_interrupt_detaches_and_the_rank_waits_again(fresh_kernel):
    run_id = background(fresh_kernel, BACKGROUND)
    waiting(fresh_kernel)
    talk = converse(fresh_kernel, f"%spawn debug {run_id}", lambda prompt: None, timeout=60)
    assert "detached (interrupted): it waits at its prompt again" in talk.result.stdout, talk.text
    assert "rank 1 waits" in talk.result.stdout
    waiting(fresh_kernel)
    talk = converse(fresh_kernel, f"%spawn debug {run_id} 1", ["c"])
    assert talk.prompts == ["(Pdb rank 1) "]
    assert ok(fresh_kernel, "bg.wait(60); print(bg.status)").stdout.strip() == "succeeded"


def test_an_unattached_prompt_ends_with_stop_and_timeout(fresh_kernel):
    background(fresh_kernel, BACKGROUND)
    waiting(fresh_kernel)
    start = time.monotonic()
    result = ok(fresh_kernel, "bg.stop(); bg._done.wait(60); print(bg.status)")
    assert result.stdout.strip() == "stopped" and time.monotonic() - start < 30
    background(fresh_kernel, "%%spawn --bg -n 1 --timeout 3\ninput('never? ')\n")
    result = ok(fresh_kernel, "bg._done.wait(60); print(bg.status)")
    assert result.stdout.strip() == "timeout"
    # nothing is left running: each background run still listed is told as it ended, stopped or timed out
    status = ok(fresh_kernel, "%spawn status").stdout
    rows = [line.split() for line in status.splitlines()]
    states = [row[4] for row in rows if row[1:3] == ["background", "cell"]]
    assert all(state in ("stopped", "timeout") for state in states) and "running" not in status, status
    assert states or status.startswith("no kept worlds or background runs"), status


def test_attach_to_a_background_programs_breakpoint(fresh_kernel, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os\nstep = 3\nif os.environ['RANK'] == '1':\n    breakpoint()\nprint('loss', step * 2)\n")
    run_id = background(fresh_kernel, f"%spawn --bg -n 2 -- {script}")
    assert f"rank 1 of {run_id} is at a breakpoint (Pdb, train.py line {5 + STOP_LINE_SHIFT})" in waiting(fresh_kernel)
    talk = converse(fresh_kernel, "%spawn debug", ["p step", "c"])
    assert talk.prompts == ["(Pdb rank 1) "] * 2, talk.text
    assert ok(fresh_kernel, "bg.wait(60); print('END', bg.status)").stdout.strip().endswith("END succeeded")


def test_a_background_run_started_without_stdin_fails_its_prompt_at_once(kernel):
    ok(kernel, "%%spawn --bg -n 1\ninput('x? ')\n")  # the harness sends allow_stdin=False, as nbclient does
    start = time.monotonic()
    result = run(kernel, "bg = nbspawn.last_run(); bg.wait(60)")
    assert result.status == "error" and "nothing can answer a prompt here" in strip_ansi(result.error.evalue)
    assert time.monotonic() - start < 30
    assert "to attach" not in ok(kernel, "%spawn status").stdout
