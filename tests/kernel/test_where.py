"""``%spawn where``: every rank's stack right now, of background runs and kept worlds, through a real
kernel.  A rank blocked in C (a gloo barrier) still answers: faulthandler writes its dump from the
signal handler, without the interpreter's help."""

from __future__ import annotations

import itertools
import json
import re
import time

from kernel_harness import interrupt_later, ok, ready_line, run

HANG = (
    "%%spawn --bg -n 4 --backend gloo\n"
    "import time, torch.distributed as dist\n"
    "if dist.get_rank() != 2:\n"
    "    dist.barrier()\n"
    "else:\n"
    "    time.sleep(300)\n"
)


def wait_for(kernel, code: str, seconds: float = 60) -> None:
    until = time.monotonic() + seconds
    while ok(kernel, f"print({code})").stdout.strip() != "True":
        assert time.monotonic() < until, code
        time.sleep(0.2)


def where_until(kernel, *patterns: str, names: str = "", seconds: float = 60) -> str:
    """``%spawn where`` asked again until its answer matches every one of ``patterns`` (re.M): the ranks
    are in their places when they say so, however long a loaded machine takes to start them (a hang
    guard of ``seconds``)."""
    until = time.monotonic() + seconds
    while True:
        text = ok(kernel, f"%spawn where {names}".rstrip()).stdout
        if all(re.search(pattern, text, re.M) for pattern in patterns):
            return text
        assert time.monotonic() < until, (patterns, text)
        time.sleep(0.3)


# HANG's ranks in place: three in the barrier, rank 2 in its sleep
IN_BARRIER = r"^ranks 0-1,3: Cell In\[\d+\], line 4: dist\.barrier\(\)  \(in barrier, distributed_c10d\.py\)"
IN_SLEEP = r"^rank 2: Cell In\[\d+\], line 6: time\.sleep\(300\)$"


def test_where_groups_the_ranks_of_a_hung_background_run(kernel):
    ok(kernel, HANG)
    ok(kernel, "import nbspawn\nhung = nbspawn.last_run()")
    try:
        # every rank past init_process_group and into its place, as `where` itself says
        text = where_until(kernel, IN_BARRIER, IN_SLEEP)
        head = re.search(r"run \S+ \(background, \d+ s\):", text)
        assert head, text
        assert re.search(
            r"^ranks 0-1,3: Cell In\[\d+\], line 4: dist\.barrier\(\)  \(in barrier, distributed_c10d\.py\)  "
            r"\[in barrier #1 for \d+(-\d+)? s\]$",  # a range where the ranks entered it in different seconds
            text,
            re.M,
        ), text
        assert re.search(r"^rank 2: Cell In\[\d+\], line 6: time\.sleep\(300\)$", text, re.M), text  # it ran no collective
        by_id = ok(kernel, "%spawn where {hung.run_id}").stdout
        assert "ranks 0-1,3:" in by_id and "rank 2:" in by_id
    finally:
        ok(kernel, "hung.stop(); hung._done.wait(30)")
    assert ok(kernel, "print(hung.status)").stdout.strip() == "stopped"


def test_where_on_an_idle_world_and_a_program(kernel):
    ok(kernel, "%%spawn --world wh -n 2\nx = 1")
    ok(kernel, "prog = %spawn --bg -n 2 -- python -c 'import time; time.sleep(300)'")
    try:
        program_in_place = r'^ranks 0-1: File "<string>", line 1 in <module>'
        text = where_until(kernel, program_in_place, names="wh {prog.run_id}")
        assert "world 'wh' (idle, 1 cell):\nranks 0-1: idle: waiting for the next cell" in text, text
    finally:
        ok(kernel, "%spawn stop wh {prog.run_id}")


def test_where_names_what_it_does_not_know(kernel):
    result = run(kernel, "%spawn where nosuch")
    assert result.status == "error" and result.error.ename == "UsageError"
    assert "no background run or kept world named 'nosuch'" in result.error.evalue
    assert ok(kernel, "%spawn where").stdout.strip().startswith(("nothing is running", "run ", "world "))


def test_stop_names_both_kinds_it_takes_when_it_does_not_know_a_name(kernel):
    """``%spawn stop`` takes run ids as well as world names: its refusal says so, and stops nothing."""
    result = run(kernel, "%spawn stop nosuch")
    assert result.status == "error" and result.error.ename == "UsageError"
    assert "no background run or kept world named 'nosuch' (running: " in result.error.evalue, result.error.evalue
    assert "\n" not in result.error.evalue.strip()


# -- the hang verdict: why a stopped run was stuck, in one line ----------------------------------------


def hang_verdict(barrier_line: int = 4, sleep_line: int = 6) -> re.Pattern:
    return re.compile(
        rf"^Hang: rank 2 never entered barrier #1 \(it is at Cell In\[\d+\], line {sleep_line}: time\.sleep\(300\)\); "
        rf"ranks 0-1,3 waited in it for \d+ s at Cell In\[\d+\], line {barrier_line}: dist\.barrier\(\)$",
        re.M,
    )


VERDICT = hang_verdict()

# The --timeout of the tests below is what ends their runs, and their verdict needs every rank in its place
# when it fires: counted from the ranks' start (forks, gloo's rendezvous), it is long enough that only a
# hang would leave a rank short of its place (about 1 s on a quiet machine; each such run costs its timeout).
HANG_TIMEOUT = 20


def test_a_timeout_says_which_rank_never_entered_the_barrier(kernel):
    result = run(kernel, HANG.replace("--bg ", f"--timeout {HANG_TIMEOUT} "))
    assert result.status == "error" and result.error.ename == "SpawnTimeoutError"
    text = result.error.traceback_text
    assert VERDICT.search(text), text
    lines = text.splitlines()
    assert lines[1].startswith("Hang: ")  # first, before the detail
    assert "ranks 0-1,3 were stopped the same way" in text  # one group: they were all in the barrier
    assert "Connection closed" not in text and "GLHF" not in text

    record, _html, _plain = _frozen(kernel)
    assert f"Hang: {record['error']['verdict']}" == next(line for line in lines if line.startswith("Hang: "))


def _frozen(kernel) -> tuple[dict, str, str]:
    """The last run's frozen view, as the notebook saves it: its record, text/html and text/plain."""
    saved = ok(
        kernel,
        "import json, nbspawn\n"
        "from nbspawn.views._bundle import FrozenRun\n"
        "frozen = FrozenRun(nbspawn.last_run(), {})\n"
        "print(json.dumps([frozen.record, frozen.html, frozen.text]))",
    ).stdout
    record, html, plain = json.loads(saved)
    return record, html, plain


def test_a_hangs_frozen_view_keeps_its_verdict_and_where_each_rank_was(kernel):
    """Rank 2 prints while the others wait in the barrier: output flows, so no live look is made, and
    what the look before the timeout's stop saw is all there is: the banner's verdict, each chip's place."""
    busy = HANG.replace("--bg ", f"--timeout {HANG_TIMEOUT} ").replace(
        "    time.sleep(300)\n", "    while True:\n        print('working', flush=True)\n        time.sleep(0.3)\n"
    )
    result = run(kernel, busy)
    assert result.status == "error" and result.error.ename == "SpawnTimeoutError"
    record, html, plain = _frozen(kernel)
    verdict = record["error"]["verdict"]
    assert re.fullmatch(
        r"rank 2 never entered barrier #1 \(it is at Cell In\[\d+\], line 8: time\.sleep\(0\.3\)\); "
        r"ranks 0-1,3 waited in it for (\d+) s at Cell In\[\d+\], line 4: dist\.barrier\(\)",
        verdict or "",
    ), record["error"]
    assert f"Hang: {verdict}" in result.error.traceback_text.splitlines()
    assert f"Hang: {verdict}" in plain.splitlines()
    notes = {r["rank"]: r["note"] for r in record["ranks"]}
    waited = re.search(r"waited in it for (\d+) s", verdict)[1]
    for rank in (0, 1, 3):  # the seconds the verdict counts
        assert notes[rank] == f"waiting in barrier #1 for {waited} s; rank 2 has not entered it", notes
    assert re.fullmatch(r"has not entered barrier #1 \(Cell In\[\d+\], line 8: time\.sleep\(0\.3\)\)", notes[2]), notes
    assert all(r["status"] == "stopped" for r in record["ranks"]), record["ranks"]
    assert re.search(r'<div role="alert"[^>]*>Hang: rank 2 never entered barrier #1 ', html), html[:2000]
    assert "stopped (killed by SIGTERM)" in html and "— has not entered barrier #1 (Cell In[" in html


def test_an_interrupt_and_a_stop_give_the_verdict_too(fresh_kernel, tmp_path):
    ok(fresh_kernel, "import nbspawn")
    # the interrupt comes once every rank is blocked where the verdict is to find it (its ready line before)
    ready = ready_line(tmp_path)
    cell = HANG.replace("--bg ", "").replace("    dist.barrier()", f"    {ready}\n    dist.barrier()")
    cell = cell.replace("    time.sleep(300)", f"    {ready}\n    time.sleep(300)")
    thread = interrupt_later(fresh_kernel, tmp_path, 4)
    result = run(fresh_kernel, cell)
    thread.join()
    assert result.status == "error" and result.error.ename == "SpawnInterrupted", result.error_text
    text = result.error.traceback_text
    assert hang_verdict(barrier_line=5, sleep_line=8).search(text), text
    # the barrier ranks are stopped where they were, not as the interrupt unwound them in torch's logging
    assert "ranks 0-1,3 were stopped the same way: KeyboardInterrupt" in text and "c10d_logger" in text
    assert "Connection closed" not in text and "_get_msg_dict" not in text

    ok(fresh_kernel, HANG)
    ok(fresh_kernel, "hung = nbspawn.last_run()")
    where_until(fresh_kernel, IN_BARRIER, IN_SLEEP)
    ok(fresh_kernel, "hung.stop(); hung._done.wait(30)")
    verdict = ok(fresh_kernel, "print(hung.status, hung.error.verdict)").stdout
    assert verdict.startswith("stopped rank 2 never entered barrier #1"), verdict


def test_ranks_in_different_collectives_are_named_as_such(kernel):
    """In the background, stopped once ``where`` finds each rank in its collective: the verdict is the
    stop's, as it would be the timeout's (test_a_timeout_says_which_rank_never_entered_the_barrier)."""
    ok(
        kernel,
        "%%spawn --bg -n 2 --backend gloo\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.ones(4)\n"
        "if dist.get_rank() == 0:\n"
        "    dist.all_reduce(t)\n"
        "else:\n"
        "    dist.broadcast(t, src=0)\n",
    )
    ok(kernel, "import nbspawn\nmixed = nbspawn.last_run()")
    try:
        where_until(
            kernel, r"^rank 0: .*\(in all_reduce, distributed_c10d\.py\)", r"^rank 1: .*\(in broadcast, distributed_c10d\.py\)"
        )
    finally:
        ok(kernel, "mixed.stop(); mixed._done.wait(30)")
    result = run(kernel, "mixed.wait()")
    assert result.status == "error" and result.error.ename == "SpawnInterrupted", result.error_text
    assert re.search(
        r"^Hang: the ranks were in different collectives: rank 0 in all_reduce #1 \(Cell In\[\d+\], line 5: "
        r"dist\.all_reduce\(t\)\); rank 1 in broadcast #1 \(Cell In\[\d+\], line 7: dist\.broadcast\(t, src=0\)\)$",
        result.error.traceback_text,
        re.M,
    ), result.error.traceback_text


def test_debug_collectives_turns_a_shape_mismatch_into_an_error_at_once(kernel):
    result = run(
        kernel,
        "%%spawn -n 2 --backend gloo --debug-collectives --timeout 60\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.ones(4 if dist.get_rank() == 0 else 3)\n"
        "dist.all_reduce(t)\n",
    )
    assert result.status == "error" and result.error.ename == "RankRaisedError", result.error_text
    text = result.error.traceback_text
    assert "Detected mismatch between collectives on ranks" in text and "Tensor shapes: 4vs 3" in text.replace("3vs 4", "4vs 3")
    assert "Connection closed" not in text.splitlines()[0]  # the root cause is torch's check, not a peer's noise


def test_the_live_signal_while_a_run_hangs(kernel):
    """No option needed: a few seconds into the hang, the text view says it, and the ranks' notes (the
    widget's chips) say who waits for whom; the run then ends by its --timeout."""
    # the ranks look hung once 10 s in the barrier (HANG_SUSPECT_AFTER; half a --timeout under 20 s), and a
    # rank that reached it late on a loaded machine must still be seen so before the timeout
    result = run(kernel, HANG.replace("--bg ", "--timeout 25 "))
    assert result.error.ename == "SpawnTimeoutError"
    said = [ln for ln in result.stderr.splitlines() if ln.startswith("nbspawn: looks hung: ")]
    assert len(said) == 1, result.stderr  # once, though the ranks were looked at again
    assert "rank 2 never entered barrier #1" in said[0]


def test_a_hung_ranks_note_counts_each_second(kernel):
    """The chip's "waiting in barrier #1 for N s" counts on as the wait goes on, each second, not
    once per look at the ranks (every 10 s while hung): it never lags behind the clock."""
    ok(kernel, HANG)
    ok(kernel, "import json, nbspawn\nhung = nbspawn.last_run()")
    try:
        wait_for(kernel, "bool(hung.ranks[0].note)", seconds=60)
        # sampled inside one cell (twelve cells' round trips, 0.25 s apart, once left a gap on a loaded
        # machine), until five counts were seen: each a step of about a second on the last (recounted each
        # second, and a recount late by a loop's turn can skip one), not a look's ten
        sampled = ok(
            kernel,
            "import re, time\nseen, notes = [], []\nuntil = time.monotonic() + 60\n"
            "while len(seen) < 5 and time.monotonic() < until:\n"
            "    note = hung.ranks[0].note or ''\n"
            "    m = re.search(r'for (\\d+) s', note)\n"
            "    if m and (not seen or int(m[1]) != seen[-1]):\n"
            "        seen.append(int(m[1])); notes.append(note)\n"
            "    time.sleep(0.05)\n"
            "print(json.dumps([seen, notes]))",
        ).stdout
        counts, seen = json.loads(sampled)
        steps = [b - a for a, b in itertools.pairwise(counts)]
        assert len(counts) == 5 and all(1 <= step <= 3 for step in steps), seen
        assert "rank 2 has not entered it" in seen[-1]
    finally:
        ok(kernel, "hung.stop(); hung._done.wait(30)")


# issue #57, item 1: the commonest hang, a rank that skips a collective and goes on to the end of the cell
SKIP = "import torch, torch.distributed as dist\nt = torch.ones(3)\nif dist.get_rank() != 1:\n    dist.all_reduce(t)\nprint('done')\n"


def test_a_rank_that_skipped_the_collective_and_finished_is_the_cause_not_the_rank_gloo_failed(kernel):
    """Fresh ranks: rank 1 ends its cell, its connections close, and gloo fails rank 0 in the all_reduce
    ("Connection closed by peer").  The cell leads with the cause, gloo's words after it as the consequence,
    and the chips say the same (rank 1: ✓, never entered all_reduce #1)."""
    result = run(kernel, "%%spawn -n 2 --backend gloo --timeout 60\n" + SKIP)
    assert result.status == "error" and result.error.ename == "RankRaisedError", result.error_text
    lines = result.error.traceback_text.splitlines()
    assert re.fullmatch(
        r"RankRaisedError: rank 1 never entered all_reduce #1 \(it finished the cell\); "
        r"rank 0 waited in it at Cell In\[\d+\], line 5: dist\.all_reduce\(t\)",
        lines[0],
    ), lines[:3]
    assert re.match(r"Because of it, rank 0 \(pid \d+\) failed: RuntimeError: ", lines[1]), lines[:3]
    # the traceback as it reads without nbspawn: the cell's line, then torch's; not the X-ray's wrapper of the call
    cell = re.search(r"Cell In\[\d+\]", lines[0])[0]  # type: ignore[index]
    at = lines.index(f"  {cell}, line 5")
    assert lines[at + 1].strip() == "dist.all_reduce(t)" and "/torch/distributed/" in lines[at + 2], lines[at:]
    assert not [line for line in lines if line.lstrip().startswith("File") and "/nbspawn/" in line], lines
    record, html, _plain = _frozen(kernel)
    ranks = {r["rank"]: r for r in record["ranks"]}
    assert ranks[1]["status"] == "done" and ranks[1]["note"] == "never entered all_reduce #1 (it finished the cell)", ranks
    assert ranks[0]["note"] == "waited in all_reduce #1; rank 1 finished the cell without entering it", ranks
    assert "Rank 0 entered all_reduce #1; rank 1 never did" in record["xray"], record["xray"]
    assert "— never entered all_reduce #1 (it finished the cell)" in html


def test_in_a_kept_world_the_rank_back_at_its_prompt_is_named_live_with_torchs_numbers(kernel):
    """A kept world: rank 1 is back at its prompt while rank 0 waits, so nothing fails, and the hang watch
    must count the rank at the prompt as one that will never come: the live signal fires, both chips say
    it, and the timeout's verdict leads.  The world's first cell ran a barrier, so the all_reduce is torch's
    #2 on every rank's recorder: the verdict, the chips and the X-ray all say #2, with the op's name.
    gloo's wait cannot be interrupted (its abort does not wake it), so the world is lost, and says why."""
    ok(kernel, "%%spawn --world skip -n 2 --backend gloo\nimport torch.distributed as dist\ndist.barrier()")
    result = run(kernel, "%%spawn --world skip --timeout 14\n" + SKIP)
    assert result.status == "error" and result.error.ename == "SpawnTimeoutError", result.error_text
    said = [ln for ln in result.stderr.splitlines() if ln.startswith("nbspawn: looks hung: ")]
    cause = (
        r"rank 1 never entered all_reduce #2 \(it finished the cell\); rank 0 waited in it for (\d+) s at Cell In\[\d+\], line 5"
    )
    assert len(said) == 1 and re.match("nbspawn: looks hung: " + cause, said[0]), result.stderr
    lines = result.error.traceback_text.splitlines()
    assert lines[0] == "SpawnTimeoutError: the run timed out after 14 s with 1 rank still running", lines[:3]
    waited = re.match("Hang: " + cause, lines[1])
    assert waited and int(waited[1]) <= 15, lines[:3]  # counted to the look at the timeout, not past the interrupt's grace
    record, _html, _plain = _frozen(kernel)
    ranks = {r["rank"]: r for r in record["ranks"]}
    assert ranks[1]["status"] == "done" and ranks[1]["note"] == "never entered all_reduce #2 (it finished the cell)", ranks
    assert ranks[0]["note"].startswith("waiting in all_reduce #2 for "), ranks
    assert "Rank 0 entered all_reduce #2; rank 1 never did" in record["xray"], record["xray"]
