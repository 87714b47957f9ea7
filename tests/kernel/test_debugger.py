"""Debugging a rank from the notebook: input(), getpass(), breakpoint(), pdb and post-mortem in a rank,
answered through the kernel's own stdin channel (the ``input_request`` every frontend answers), driven
here with jupyter_client as a frontend does: ``execute(allow_stdin=True)``, then ``kc.input(...)`` for
each ``input_request`` on the stdin channel."""

from __future__ import annotations

import re
import time

import pytest
from bundle_reader import rank_outputs
from kernel_harness import TO_NEXT_LINE, converse, ok, rank_lines, run, strip_ansi
from widget_harness import live_at_once, sort_out

from nbspawn.views._widget import widget_available

METHODS = ["fork", "forkserver"]


@pytest.mark.parametrize("method", METHODS)
def test_breakpoint_lists_the_cell_prints_steps_and_continues(kernel, method):
    code = f"""%%spawn -n 2 --start-method {method}
import os
rank = int(os.environ["RANK"])
x = rank * 10
if rank == 1:
    breakpoint()
    y = x + 1
    z = y * 2
print("done", rank, x)
"""
    answers = [*TO_NEXT_LINE, "l", "p x", "n", "n", "p y", "w", "c"]
    talk = converse(kernel, code, answers)
    assert talk.result.status == "ok", talk.text
    assert talk.prompts == ["(Pdb rank 1) "] * len(answers), talk.prompts
    lines = rank_lines(talk.result.stdout, 1)
    text = "\n".join(lines)
    assert "-> y = x + 1" in text  # stopped at the line after breakpoint()
    assert "  7  ->\t    y = x + 1" in text, text  # `l`: the cell's own line numbers
    assert "if rank == 1:" in text  # ... and its source
    assert "10" in lines  # p x
    assert "11" in lines  # p y, after two `n`
    n = talk.result.execution_count
    assert f"> Cell In[{n}], line 7\n-> y = x + 1" in text, text  # where it stopped, named as IPython names a cell
    assert f"> Cell In[{n}], line 8\n-> z = y * 2" in text, text  # `w`: the cell's frame, at line 8
    assert "<nbspawn-cell>" not in text
    assert "_cell.py" not in text  # ... and nothing of nbspawn below it
    assert "done 1 10" in text and "done 0 0" in "\n".join(rank_lines(talk.result.stdout, 0))


@pytest.mark.parametrize("method", METHODS)
def test_input_and_getpass_in_a_rank_ask_the_frontend(kernel, method):
    code = f"""%%spawn -n 2 --start-method {method} --ranks 1
import os, getpass
if os.environ["RANK"] == "1":
    name = input("your name? ")
    secret = getpass.getpass("token: ")
    print("hello", name, len(secret))
"""
    talk = converse(kernel, code, ["Ada", "s3cr3t"])
    assert talk.result.status == "ok", talk.text
    assert talk.prompts == ["[rank 1] your name? ", "[rank 1] token: "]
    assert talk.passwords == [False, True]
    assert "hello Ada 6" in rank_lines(talk.result.stdout, 1)


@pytest.mark.parametrize("method", METHODS)
def test_pdb_names_cells_as_ipython_does(kernel, method):
    """A function from an earlier cell, stepped into, reads ``Cell In[N], line 2, in helper`` in pdb:
    never ``<nbspawn-cell>``, a kernel's temporary file or cloudpickle's ``<dynamic-code>``."""
    defined = ok(kernel, "def helper(a):\n    b = a + 1\n    return b").execution_count
    code = f"%%spawn -n 1 --start-method {method}\nbreakpoint()\nhelper(2)\n"
    talk = converse(kernel, code, [*TO_NEXT_LINE, "s", "n", "w", "c"])
    assert talk.result.status == "ok", talk.text
    text = "\n".join(rank_lines(talk.result.stdout, 0))
    cell = talk.result.execution_count
    assert f"> Cell In[{cell}], line 3\n-> helper(2)" in text, text
    assert f"> Cell In[{defined}], line 2, in helper" in text, text
    assert f"  Cell In[{cell}], line 3\n-> helper(2)" in text, text  # `w`: the caller, then helper
    assert "nbspawn-cell" not in text and "dynamic-code" not in text and "ipykernel" not in text


def test_pdb_names_cells_as_ipython_does_on_a_kept_world(kernel):
    """The same on a kept world's later cell: the cell and a function defined after the world started
    read as IPython names them (a world's cell once handed its ranks no cell numbers: ``<ipython-input>``
    or a kernel's temporary file's name)."""
    ok(kernel, "%%spawn --world pdbnames -n 1\npass")
    try:
        defined = ok(kernel, "def helper2(a):\n    b = a + 1\n    return b").execution_count
        talk = converse(kernel, "%%spawn --world pdbnames\nbreakpoint()\nhelper2(2)\n", [*TO_NEXT_LINE, "s", "n", "w", "c"])
        assert talk.result.status == "ok", talk.text
        text = "\n".join(rank_lines(talk.result.stdout, 0))
        cell = talk.result.execution_count
        assert f"> Cell In[{cell}], line 3\n-> helper2(2)" in text, text
        assert f"> Cell In[{defined}], line 2, in helper2" in text, text
        assert "nbspawn-cell" not in text and "dynamic-code" not in text and "ipykernel" not in text
    finally:
        ok(kernel, "%spawn stop pdbnames")


def test_pdb_set_trace_in_a_function_steps_into_it(kernel):
    code = """%%spawn -n 1
import pdb
def f(a):
    b = a + 1
    return b * 2
pdb.set_trace()
r = f(3)
print("r =", r)
"""
    talk = converse(kernel, code, [*TO_NEXT_LINE, "s", "s", "n", "p b", "c"])
    assert talk.result.status == "ok", talk.text
    text = "\n".join(rank_lines(talk.result.stdout, 0))
    assert "--Call--" in text and f"Cell In[{talk.result.execution_count}], line 3, in f" in text
    assert "4" in rank_lines(talk.result.stdout, 0)  # p b
    assert "r = 8" in text


@pytest.mark.parametrize("method", METHODS)
def test_quit_fails_that_rank_and_the_run_ends_without_hanging(kernel, method):
    code = f"""%%spawn -n 2 --backend gloo --start-method {method}
import os, torch.distributed as dist
if os.environ["RANK"] == "1":
    breakpoint()
dist.barrier()
"""
    start = time.monotonic()
    talk = converse(kernel, code, ["q"], timeout=90)
    assert talk.result.status == "error"
    assert "debugger quit on rank 1" in talk.text
    assert "bdb.py" not in talk.text and "pdb.py" not in talk.text  # the traceback ends in the cell
    assert re.search(r"^\s*DebuggerQuit: debugger quit on rank 1", talk.text, re.M), talk.text
    assert "nbspawn.ranks" not in talk.text  # no internal path
    assert time.monotonic() - start < 60


def test_after_quit_the_verdict_says_where_each_rank_really_was(kernel):
    """``q`` on rank 1 ends the run: ranks 0 and 2, in the cell's all_reduce (or failing in it as its
    peer left, asking whether to stop in post-mortem), are told there, never as "still starting"."""
    code = """%%spawn -n 3 --backend gloo
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
t = torch.ones(1)
if rank == 1:
    breakpoint()
    t += 1
dist.all_reduce(t)
"""
    talk = converse(kernel, code, ["q"], timeout=90)
    assert talk.result.status == "error"
    text = strip_ansi(talk.text)
    assert "still starting" not in text and "had not begun" not in text, text
    others = text[text.index("Other ranks:") :]
    assert f"Cell In[{talk.result.execution_count}], line 8" in others and "dist.all_reduce(t)" in others, others
    assert all(f"rank {r}" in others or re.search(rf"ranks [0-9,]*{r}", others) for r in (0, 2)), others


TRANSCRIPT = """%%spawn -n 2{options}
import os
rank = int(os.environ["RANK"])
x = rank * 10 + 7
if rank == 1:
    breakpoint()
print("after", rank)
"""
TRANSCRIPT_ANSWERS = [*TO_NEXT_LINE, "p x", "p x * 2", "c"]


def assert_transcript(lines: list[str]) -> None:
    """Rank 1's output holds its pdb session as a terminal shows it: each command, then its answer."""
    assert lines[lines.index("(Pdb rank 1) p x") + 1] == "17", lines
    assert lines[lines.index("(Pdb rank 1) p x * 2") + 1] == "34", lines
    assert lines.index("(Pdb rank 1) p x") < lines.index("(Pdb rank 1) p x * 2") < lines.index("(Pdb rank 1) c")
    assert lines.index("(Pdb rank 1) c") < lines.index("after 1"), lines


def test_each_pdb_command_is_in_the_ranks_output_above_its_answer(kernel):
    talk = converse(kernel, TRANSCRIPT.format(options=" --view text"), TRANSCRIPT_ANSWERS)
    assert talk.result.status == "ok", talk.text
    assert_transcript(rank_lines(talk.result.stdout, 1))
    assert not any("(Pdb" in line for line in rank_lines(talk.result.stdout, 0))  # the session is rank 1's alone


@pytest.mark.skipif(not widget_available(), reason="widget.js is not built")
def test_the_widgets_pane_and_saved_view_hold_the_pdb_transcript(kernel):
    live_at_once(kernel)
    talk = converse(kernel, TRANSCRIPT.format(options=" --view widget"), TRANSCRIPT_ANSWERS)
    assert talk.result.status == "ok", talk.text
    view = sort_out(talk.result.outputs)
    assert_transcript(strip_ansi(view.live_text()[1]).splitlines())  # the rank's live pane
    assert view.frozen is not None
    assert_transcript(rank_outputs(view.frozen["text/html"])[1].text().splitlines())  # the saved view


def test_several_ranks_at_breakpoints_are_asked_one_at_a_time(kernel):
    code = """%%spawn -n 3 --backend gloo
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
breakpoint()
t = torch.ones(1) * rank
dist.all_reduce(t)
print("sum", int(t.item()))
"""
    seen: list[str] = []
    answered: list[str] = []
    first_asked = time.monotonic()

    def rank_of(prompt: str) -> int:
        return int(prompt.split("(Pdb rank ")[1].split(")", maxsplit=1)[0])

    def names_waiting(prompt: str) -> bool:
        return "wait: one prompt at a time" in prompt or "waits: one prompt at a time" in prompt

    def answer(prompt: str) -> str:
        seen.append(prompt)
        first = rank_of(seen[0])
        # the others reach their breakpoints while the first rank is asked (on a loaded machine, ci63, later
        # than two prompts' answers): the first rank is asked again until its prompt names them waiting (a
        # minute at most: a hang guard); every other rank, `p rank` then `c`
        if rank_of(prompt) == first:
            more = not names_waiting(prompt) and time.monotonic() - first_asked < 60
            reply = "p rank" if len(seen) == 1 or more else "c"
        else:
            reply = "p rank" if answered and answered[-1] == "c" else "c"
        answered.append(reply)
        return reply

    talk = converse(kernel, code, answer)
    assert talk.result.status == "ok", talk.text
    sessions = [(rank, [a for p, a in zip(seen, answered, strict=True) if rank_of(p) == rank]) for rank in range(3)]
    order = [rank for i, rank in enumerate(map(rank_of, seen)) if i == 0 or rank_of(seen[i - 1]) != rank]
    assert sorted(order) == [0, 1, 2], seen  # each rank's session whole: it kept the prompt until its `c`
    for rank, replies in sessions:
        assert replies[0] == "p rank" and replies[-1] == "c" and replies.count("c") == 1, (rank, seen, answered)
    assert any(names_waiting(p) for p in seen), seen
    for r in range(3):
        assert "sum 3" in rank_lines(talk.result.stdout, r)


def test_torch_distributed_breakpoint_with_the_others_waiting(kernel):
    code = """%%spawn -n 2 --backend gloo
import os, torch.distributed as dist
value = 40 + int(os.environ["RANK"])
dist.breakpoint(rank=1)
print("after", value)
"""
    talk = converse(kernel, code, ["up", "p value", "c"])
    assert talk.result.status == "ok", talk.text
    assert talk.prompts == ["(Pdb rank 1) "] * 3
    assert "41" in rank_lines(talk.result.stdout, 1)
    assert "after 40" in rank_lines(talk.result.stdout, 0)


def test_groups_keep_torchs_timeout_until_a_rank_stops_at_a_prompt(kernel):
    """Where the kernel answers prompts (always, in a notebook) the ranks' groups used to wait an hour,
    so NCCL's watchdog and its dump on timeout never fired.  They keep torch's own timeout (gloo's 30
    minutes here; nccl's 10), and only a rank that stops at a prompt raises its own to an hour, for
    the collectives it issues from then on (issue 25, item 9; docs/guide.md, CUDA)."""
    code = """%%spawn -n 2 --backend gloo
import torch, torch.distributed as dist
def timeout():
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).options._timeout
print("before", timeout())
if dist.get_rank() == 0:
    breakpoint()
print("after", timeout())
"""
    talk = converse(kernel, code, ["c"])
    assert talk.result.status == "ok", talk.text
    said = {r: [line for line in rank_lines(talk.result.stdout, r) if line.startswith(("before", "after"))] for r in (0, 1)}
    assert said == {0: ["before 0:30:00", "after 1:00:00"], 1: ["before 0:30:00", "after 0:30:00"]}


@pytest.mark.parametrize("method", METHODS)
def test_pdb_option_stops_the_first_failing_rank_in_post_mortem(kernel, method):
    code = f"""%%spawn -n 2 --pdb --start-method {method}
import os
def check(v):
    if v == 1:
        bad = v * 7
        raise ValueError("rank 1 broke")
check(int(os.environ["RANK"]))
"""
    talk = converse(kernel, code, ["p bad", "w", "q"])
    assert talk.prompts == ["(Pdb rank 1) "] * 3
    assert "7" in rank_lines(talk.result.stdout, 1)
    assert "post-mortem of rank 1" in talk.text
    assert talk.result.status == "error"
    assert "ValueError: rank 1 broke" in talk.text  # the run ends as it would have


def test_ipython_pdb_on_is_honoured(fresh_kernel):
    ok(fresh_kernel, "%pdb on")
    talk = converse(fresh_kernel, "%%spawn -n 2\nimport os\nx = 1 / (int(os.environ['RANK']) - 1)\n", ["p 2 + 2", "c"])
    assert "(Pdb rank 1) " in talk.prompts
    assert "4" in rank_lines(talk.result.stdout, 1)
    assert talk.result.status == "error" and "ZeroDivisionError" in talk.text
    ok(fresh_kernel, "%pdb off")
    talk = converse(fresh_kernel, "%%spawn -n 2\nimport os\nx = 1 / (int(os.environ['RANK']) - 1)\n", [])
    assert talk.prompts == [] and "ZeroDivisionError" in talk.text


def test_without_stdin_input_and_breakpoint_fail_at_once(kernel):
    for body in ("input('x? ')", "breakpoint()", "import pdb; pdb.set_trace()"):
        start = time.monotonic()
        result = run(kernel, f"%%spawn -n 2\n{body}\n", timeout=60)  # the harness sends allow_stdin=False
        text = strip_ansi(result.stderr + result.error_text)
        assert result.status == "error"
        assert "nothing can answer a prompt here" in text, text
        assert "allow_stdin" in text
        assert time.monotonic() - start < 30


def test_interrupt_at_a_prompt_stops_the_run(fresh_kernel):
    code = """%%spawn -n 2 --backend gloo
import os, torch.distributed as dist
if os.environ["RANK"] == "0":
    breakpoint()
dist.barrier()
"""
    talk = converse(fresh_kernel, code, lambda prompt: None, timeout=90)  # interrupt instead of answering
    assert talk.result.status == "error" and talk.result.error.ename == "SpawnInterrupted", talk.text
    ok(fresh_kernel, "%%spawn -n 2\nprint('still fine')")


def test_timeout_ends_an_unanswered_prompt(kernel):
    kc = kernel.client
    # a --timeout that only a hang of the rank's start would outlast before its prompt (counted from its start)
    msg_id = kc.execute("%%spawn -n 1 --timeout 15\ninput('never answered? ')\n", allow_stdin=True)
    start = time.monotonic()
    msg = kc.get_stdin_msg(timeout=60)
    assert msg["content"]["prompt"] == "[rank 0] never answered? "
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "SpawnTimeoutError"
    assert time.monotonic() - start < 60  # a hang guard (the timeout is 15 s)


@pytest.mark.parametrize("method", METHODS)
def test_a_kept_world_debugs_and_lives_on(fresh_kernel, method):
    ok(fresh_kernel, f"%%spawn --world w -n 2 --backend gloo --start-method {method}\nimport os\nrank = int(os.environ['RANK'])")
    code = """%%spawn --world w
v = rank + 100
if rank == 1:
    breakpoint()
    v += 1
print("v", v)
"""
    talk = converse(fresh_kernel, code, [*TO_NEXT_LINE, "l", "p v", "n", "p v", "c"])
    assert talk.result.status == "ok", talk.text
    lines = rank_lines(talk.result.stdout, 1)
    assert "101" in lines and "102" in lines and "v 102" in lines
    # q fails the cell on rank 1; the world survives (the other rank comes back)
    # (a grace no interrupted rank needs to come back in: the world's survival is an event, not a race with 5 s)
    talk = converse(
        fresh_kernel, "%%spawn --world w --grace-period 120\nif rank == 1:\n    breakpoint()\nprint('after')\n", ["q"]
    )
    assert talk.result.status == "error" and "debugger quit on rank 1" in talk.text
    result = ok(fresh_kernel, "%%spawn --world w\nprint('alive', rank)")
    assert "alive 1" in rank_lines(result.stdout, 1)
    # post-mortem on the world, with --pdb on the cell only
    talk = converse(
        fresh_kernel, "%%spawn --world w --pdb\nif rank == 0:\n    oops = 5\n    raise KeyError(oops)\n", ["p oops", "c"]
    )
    assert "5" in rank_lines(talk.result.stdout, 0)
    assert talk.result.status == "error" and "KeyError" in talk.text
    ok(fresh_kernel, "%spawn stop w")


def test_stepping_reaches_the_cells_trailing_expression_and_never_nbspawn(kernel):
    code = """%%spawn -n 1
a = 2
breakpoint()
b = a * 3
b + 1
"""
    talk = converse(kernel, code, [*TO_NEXT_LINE, "n", "p b", "n"])
    assert talk.result.status == "ok", talk.text
    text = "\n".join(rank_lines(talk.result.stdout, 0))
    assert "-> b + 1" in text  # `n` went on into the trailing expression
    assert "6" in rank_lines(talk.result.stdout, 0)
    assert "7" in rank_lines(talk.result.stdout, 0)  # its value, shown as the cell's result
    assert "nbspawn/ranks" not in text and "--Return--" not in text


def test_breakpoint_in_a_program(kernel, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os\nstep = 3\nif os.environ['RANK'] == '1':\n    breakpoint()\nloss = step * 2\nprint('loss', loss, os.environ['RANK'])\n"
    )
    answers = [*TO_NEXT_LINE, "p step", "n", "p loss", "c"]
    talk = converse(kernel, f"%spawn -n 2 -- {script}", answers)
    assert talk.result.status == "ok", talk.text
    assert talk.prompts == ["(Pdb rank 1) "] * len(answers)
    text = "\n".join(rank_lines(talk.result.stdout, 0) + rank_lines(talk.result.stdout, 1))
    assert "train.py(5)<module>()" in text and "-> loss = step * 2" in text
    assert "6" in rank_lines(talk.result.stdout, 1)
    assert "loss 6 0" in text and "loss 6 1" in text
    assert "_program.py" not in text and "runpy" not in text
