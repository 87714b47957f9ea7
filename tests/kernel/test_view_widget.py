"""The live widget through a real kernel, over the Jupyter protocol, as a frontend sees it.

What a frontend gets: a widget (comm_open + display_data), custom comm messages carrying every
rank's output (at most ten a second, each capped in size), and at the end an update_display_data
replacing the widget with the frozen bundle (JSON, escaped HTML, text).  What it sends: ``replay``
and ``stop``; ``stop`` must reach the kernel while the cell still runs, which ipykernel 7's
subshells allow (JupyterLab >= 4.4 sends comm messages on one).
"""

from __future__ import annotations

import html
import json
import queue
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bundle_reader import HOSTILE_HTML, SHOWN_HTML, acting_markup, merged_entries, rank_outputs
from kernel_harness import GLOO_CONNECTED, execute, strip_ansi, until_flag
from widget_harness import (
    WIDGET_ID,
    create_subshell,
    delete_subshell,
    live_at_once,
    send_comm_msg,
    skip_without_subshells,
    sort_out,
    spawn_widget,
)

from nbspawn.views._bundle import MIME, TAIL_LINES
from nbspawn.views._widget import MAX_BYTES_PER_MESSAGE, STOPPING_BYTES_PER_MESSAGE, widget_available

pytestmark = pytest.mark.skipif(
    not widget_available(),
    reason="nbspawn/_static/widget.js is not built (pip install -e '.[test,lab]' or npm run build:prod in labextension/)",
)


def rank_output(frozen: dict, rank: int) -> str:
    """What the saved bundle shows of a rank's output: its lines, read back from the text/html."""
    return rank_outputs(frozen["text/html"])[rank].text()


# ---------------------------------------------------------------------------------------------


def test_widget_then_frozen_bundle(kernel):
    body = (
        "import os, sys\n"
        "r = int(os.environ['RANK'])\n"
        "for i in range(5):\n"
        "    print(f'rank {r} says {i}')\n"
        "print(f'rank {r} warns', file=sys.stderr)\n"
    )
    result, run = spawn_widget(kernel, body)
    assert result.status == "ok", result.error_text
    assert result.stdout == ""  # no [rank{r}]: lines: the widget shows them

    # the widget: its front end inline, the run's header and ranks as traits
    assert "export" in run.state["_esm"] and "nbs-Run" in run.state["_esm"]
    assert ".nbs-Run" in run.state["_css"]
    assert run.state["header"]["nprocs"] == 4 and "elapsed" in run.state["header"]
    assert "ranks" not in run.state["header"]
    assert [r["rank"] for r in run.state["ranks"]] == [0, 1, 2, 3]
    assert all("output" not in r for r in run.state["ranks"])
    assert run.synced()["header"]["status"] == "succeeded"
    assert [r["status"] for r in run.synced()["ranks"]] == ["done"] * 4

    # every rank's lines, live and frozen
    live = run.live_text()
    frozen = run.frozen
    assert frozen is not None and set(frozen) == {MIME, "text/html", "text/plain"}
    record = frozen[MIME]
    assert record["status"] == "succeeded" and record["error"] is None
    assert record["version"] == 2 and record["output_in"] == "text/html"
    saved = rank_outputs(frozen["text/html"])
    for r in range(4):
        assert "output" not in record["ranks"][r]  # the tail is stored once, in the text/html
        for i in range(5):
            line = f"rank {r} says {i}"
            assert line in live[r]
            assert ("stdout", line + "\n") in saved[r].lines
            assert line not in frozen["text/plain"]
        assert f"rank {r} warns" in live[r]
        assert saved[r].lines[-1] == ("stderr", f"rank {r} warns\n")  # in the order written
    assert frozen["text/plain"].startswith(f"nbspawn run {record['run_id']}: succeeded")

    # the widget's comms are closed; the toolbar's status comm said running, then the end
    assert run.widget_closed
    assert run.status[0]["status"] == "running" and run.status[0]["running"] == [0, 1, 2, 3]
    assert run.status[-1] == {"run_id": record["run_id"], "status": "succeeded", "nprocs": 4, "running": []}
    assert run.status_closed


def test_the_saved_merged_view_keeps_the_order_the_ranks_printed_in(kernel, tmp_path):
    """Rank 1 prints three lines, then (after a barrier) rank 0 three and a figure's text, then rank 1
    once more: the saved view merges them as they came, as the live view did, not rank by rank in
    turn (issue 26, item 5).  Each rank prints once the kernel has sent on what the other printed
    before (a flag file each: a fixed 0.5 s was what a loaded kernel had to read them in, audit)."""
    early, late = tmp_path / "early.flag", tmp_path / "late.flag"
    body = (
        "import torch.distributed as dist\n"
        "from IPython.display import display\n"
        "r = dist.get_rank()\n"
        "if r == 1:\n"
        "    for i in range(3):\n"
        "        print(f'rank 1 early {i}', flush=True)\n"
        "dist.barrier()\n"
        "if r == 0:\n"
        f"    {until_flag(early)}  # the kernel has sent on rank 1's lines\n"
        "    for i in range(3):\n"
        "        print(f'rank 0 late {i}', flush=True)\n"
        "    display('a ' + 'table')  # its text in no message before the rank's own\n"
        "dist.barrier()\n"
        "if r == 1:\n"
        f"    {until_flag(late)}\n"
        "    print('rank 1 last', flush=True)\n"
    )

    def seen(outputs: list[dict]) -> None:
        sent = json.dumps(outputs[-1])
        if "rank 1 early 2" in sent:
            early.touch()
        if "a table" in sent:
            late.touch()

    result, run = spawn_widget(kernel, body, options="-n 2 --backend gloo", seen=seen)
    assert result.status == "ok", result.error_text
    printed = [(1, f"rank 1 early {i}") for i in range(3)] + [(0, f"rank 0 late {i}") for i in range(3)]
    # (torch 2.10's gloo prints its own connection line in each rank, shown as any rank output is)
    assert [(r, line) for r, line in run.live_lines() if not GLOO_CONNECTED.match(line)] == [*printed, (1, "rank 1 last")]
    merged = merged_entries(run.frozen["text/html"])
    shown = [(rank, entry[1] if kind == "line" else entry["text"]) for rank, (kind, entry) in merged]
    shown = [(rank, text) for rank, text in shown if not GLOO_CONNECTED.match(text)]
    assert shown == [
        *[(rank, line + "\n") for rank, line in printed],
        (0, "'a table'"),
        (1, "rank 1 last\n"),
    ], shown


def test_auto_view_is_the_widget_in_a_kernel(kernel):
    live_at_once(kernel)
    result = execute(kernel.client, "%config SpawnMagics.view = 'auto'", timeout=30)
    assert result.status == "ok"
    try:
        result = execute(kernel.client, "%%spawn -n 2\nprint('hello')", timeout=120)
        assert result.status == "ok", result.error_text
        run = sort_out(result.outputs)
        assert run.frozen is not None
        assert rank_outputs(run.frozen["text/html"])[1].lines == [("stdout", "hello\n")]
    finally:
        execute(kernel.client, "%config SpawnMagics.view = 'text'", timeout=30)


def test_message_budget_and_lossless_logs(kernel):
    """4 ranks x 20k lines in bursts: at most ~10 messages a second, none over the cap, logs complete."""
    lines, bursts = 20_000, 20
    body = (
        "import os, sys, time\n"
        "r = int(os.environ['RANK'])\n"
        f"for b in range({bursts}):\n"
        f"    for i in range(b * {lines // bursts}, (b + 1) * {lines // bursts}):\n"
        "        print(f'rank {r} line {i:05d} ' + 'x' * 40)\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.1)\n"
    )
    started = time.monotonic()
    result, run = spawn_widget(kernel, body)
    wall = time.monotonic() - started
    assert result.status == "ok", result.error_text
    record = run.frozen[MIME]
    took = record["duration"]
    assert 1.5 < took < wall

    # the budget: output at most ten times a second; every message of the run, status included
    outputs = [m for m in run.custom if m["type"] == "output"]
    assert len(outputs) <= 10 * took + 3, (len(outputs), took)
    assert len(run.comm_msgs) <= 10 * took + 12, (len(run.comm_msgs), took)
    biggest = max(len(json.dumps(m["data"], ensure_ascii=False).encode()) for m in run.comm_msgs)
    assert biggest <= MAX_BYTES_PER_MESSAGE + 4096, biggest

    for r in range(4):
        # the logs have every line
        log = Path(record["ranks"][r]["stdout_path"]).read_text().splitlines()
        assert len(log) == lines and log[-1].startswith(f"rank {r} line {lines - 1:05d}")
        # live: what was sent plus what was counted as elided is every line, the last ones shown
        sent = run.live_text()[r].split("\n")
        assert sent[-1] == ""  # ends with a whole line
        sent = [s for s in sent if s]
        assert len(sent) + run.live_elided().get(r, 0) == lines
        assert sent[-1].startswith(f"rank {r} line {lines - 1:05d}")
        assert all(re.fullmatch(rf"rank {r} line \d{{5}} x{{40}}", s) for s in sent)  # no line cut or glued
        # frozen: the newest lines that fit the saved-size cap, the rest counted
        rank = record["ranks"][r]
        kept = rank_output(run.frozen, r).splitlines()
        assert 0 < len(kept) <= TAIL_LINES and rank["elided_lines"] == lines - len(kept)
        assert kept[-1] == log[-1] and all(line in log for line in kept)  # whole lines, none glued
        numbers = [int(line.split()[3]) for line in kept]
        assert numbers == sorted(set(numbers))  # in order, none twice
        assert f"{lines - len(kept)} lines elided — full log at" in run.frozen["text/html"]
    saved = sum(len(json.dumps(v, ensure_ascii=False).encode()) for v in run.frozen.values())
    assert saved <= 256 * 1024, saved


def test_worker_markup_is_escaped(kernel):
    body = "print('<script>alert(1)</script>')\nprint('<img src=x onerror=alert(2)> & <b>bold</b>')\n"
    result, run = spawn_widget(kernel, body, options="-n 2")
    assert result.status == "ok", result.error_text
    page = run.frozen["text/html"]
    assert "<script" not in page.lower() and "<img" not in page.lower() and "<b>bold" not in page
    assert html.escape("<script>alert(1)</script>") in page
    assert html.escape("<img src=x onerror=alert(2)> & <b>bold</b>") in page
    for r in range(2):
        assert rank_output(run.frozen, r).startswith("<script>alert(1)</script>\n")
        assert "<script" not in run.frozen["text/plain"]
        assert "<script>alert(1)</script>" in run.live_text()[r]


def test_rank_html_is_saved_inert_and_colours_as_set(kernel):
    """Issue 30: a rank's HTML that could act is saved inert, what shows stays; the SGR cases a
    coloured bar prints reach the saved HTML as a terminal shows them, with no raw escape."""
    body = (
        "from IPython.display import display\n"
        f"for value in {[*HOSTILE_HTML, SHOWN_HTML]!r}:\n"
        "    display({'text/html': value, 'text/plain': 'html'}, raw=True)\n"
        "print('\\x1b[38;5;208mA\\x1b[39mB \\x1b[1;38;2;10;20;30mC\\x1b[22mD \\x1b[4;9mE\\x1b[0m', flush=True)\n"
        "print('\\x1b]8;;https://example.org\\x1b\\\\link\\x1b]8;;\\x1b\\\\ \\x1b[38:2::255:0:0mred\\x1b[0m', flush=True)\n"
        "for i in range(500):\n"
        "    print(f'\\r\\x1b[32m{i}\\x1b[39m/500', end='', flush=True)\n"
    )
    result, run = spawn_widget(kernel, body, options="-n 1")
    assert result.status == "ok", result.error_text
    page = run.frozen["text/html"]
    assert acting_markup(page) == [] and "alert" not in page and "\x1b" not in page
    saved = rank_outputs(page)[0]
    assert len(saved.displays) == len(HOSTILE_HTML) + 1
    assert "<table" in saved.displays[-1]["html"] and 'src="data:image/png' in saved.displays[-1]["html"]
    assert [text for _, text in saved.lines] == ["AB CD E\n", "link red\n", "499/500"]
    runs = re.findall(r'<span data-sgr="([^"]*)" style="([^"]*)">([^<]*)</span>', page)
    assert ("38;5;208", "color:rgb(255,135,0)", "A") in runs and not [r for r in runs if r[2] == "B"]
    assert ("1;38;2;10;20;30", "color:rgb(10,20,30);font-weight:bold", "C") in runs
    assert ("38;2;10;20;30", "color:rgb(10,20,30)", "D ") in runs
    assert ("4;9;38;2;10;20;30", "color:rgb(10,20,30);text-decoration:underline line-through", "E") in runs
    assert ("38;2;255;0;0", "color:rgb(255,0,0)", "red") in runs
    assert ("32", "color:#116329", "499") in runs


def test_progress_bar_settles_to_its_final_state(kernel):
    body = (
        "import sys, time\n"
        "print('epoch 1')\n"
        "for p in range(0, 101, 2):\n"
        "    sys.stderr.write(f'\\rtrain: {p:3d}%|' + '#' * (p // 10) + ' ' * (10 - p // 10) + f'| {p}/100')\n"
        "    sys.stderr.flush()\n"
        "    time.sleep(0.01)\n"
        "sys.stderr.write('\\n')\n"
        "print('done')\n"
    )
    result, run = spawn_widget(kernel, body, options="-n 2")
    assert result.status == "ok", result.error_text
    saved = rank_outputs(run.frozen["text/html"])
    for r in range(2):
        # the bar's final state once, where it ended (after "epoch 1", before "done")
        assert saved[r].lines == [
            ("stdout", "epoch 1\n"),
            ("stderr", "train: 100%|##########| 100/100\n"),
            ("stdout", "done\n"),
        ], saved[r].lines
    assert "train:  50%" not in run.frozen["text/html"]


def test_failed_rank_in_the_widget_and_the_bundle(kernel):
    # a function from an earlier cell: its frame reads "Cell In[n]" in the widget and the bundle too
    assert execute(kernel.client, "def divide(x):\n    return 1 / x", timeout=30).status == "ok"
    body = "import os, time\nif os.environ['RANK'] == '1':\n    divide(0)\ntime.sleep(30)\n"
    result, run = spawn_widget(kernel, body, timeout=60)
    assert result.status == "error" and result.error.ename == "RankRaisedError"
    last = run.synced()
    assert [r["status"] for r in last["ranks"]] == ["stopped", "failed", "stopped", "stopped"]
    failed = last["ranks"][1]
    assert failed["summary"].startswith("ZeroDivisionError") and "divide(0)" in failed["traceback"]
    assert re.search(r"Cell In\[\d+\], line 2, in divide", failed["traceback"]), failed["traceback"]
    record = run.frozen[MIME]
    assert record["status"] == "failed" and record["error"]["rank"] == 1
    assert "ZeroDivisionError" in record["error"]["summary"]
    assert re.search(r"Cell In\[\d+\], line 2, in divide", record["ranks"][1]["traceback"])
    # the root cause's traceback once in the saved view (its rank's pane); the banner says what failed
    assert "traceback" not in record["error"]
    page = run.frozen["text/html"]
    assert "ZeroDivisionError" in page and page.count("line 2, in divide") == 1


def pump_iopub(client, msg_id: str, outputs: list[dict], until, timeout: float) -> None:
    """The cell ``msg_id``'s iopub messages appended to ``outputs`` (its end as ``{"msg_type": "idle"}``)
    until ``until()`` holds, asked after each one; a TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not until():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"waited {timeout} s; got {[o['msg_type'] for o in outputs]}")
        try:
            msg = client.get_iopub_msg(timeout=min(left, 1))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                outputs.append({"msg_type": "idle"})
            continue
        outputs.append({"msg_type": msg["msg_type"], **msg["content"]})


def test_stop_and_replay_reach_the_kernel_while_the_cell_runs(kernel):
    client = kernel.client
    skip_without_subshells(client)
    subshell = create_subshell(client)
    # a grace no rank needs (SIGINT stops each at once): were one SIGTERMed, it would show, not a race with 5 s
    code = (
        "%%spawn -n 4 --view widget --grace-period 300\nimport os, time\n"
        "print('rank', os.environ['RANK'], 'is up', flush=True)\ntime.sleep(600)\n"
    )
    msg_id = client.execute(code)
    outputs: list[dict] = []
    comm_id = None
    up: set[str] = set()

    def pump(until, timeout: float) -> None:
        pump_iopub(client, msg_id, outputs, until, timeout)

    def every_rank_up() -> bool:
        nonlocal comm_id
        for o in outputs:
            if o["msg_type"] == "comm_open" and o["data"].get("state", {}).get("_anywidget_id") == WIDGET_ID:
                comm_id = o["comm_id"]
            if o["msg_type"] == "comm_msg" and o["data"].get("method") == "custom":
                for _r, _s, text in o["data"]["content"].get("chunks", []):
                    up.update(re.findall(r"rank (\d) is up", text))
        return len(up) == 4

    try:
        pump(every_rank_up, 60)
        n_before = len(outputs)
        # a view that opened late asks for what it missed: answered while the cell runs
        send_comm_msg(client, comm_id, {"type": "replay"}, subshell)
        pump(lambda: any(o["msg_type"] == "comm_msg" and o["data"].get("content", {}).get("type") == "replay"
                         for o in outputs[n_before:]), 10)  # fmt: skip
        replay = next(o["data"]["content"] for o in outputs[n_before:] if o["msg_type"] == "comm_msg"
                      and o["data"].get("content", {}).get("type") == "replay")  # fmt: skip
        assert {int(r) for r in replay["tails"]} == {0, 1, 2, 3}
        for r, chunks in replay["tails"].items():
            assert chunks == [["stdout", f"rank {r} is up\n"]]
        # and in which order they came, for its merged view: as the live messages brought them
        came = [int(rank) for o in outputs[:n_before] if o["msg_type"] == "comm_msg"
                for _r, _s, text in o["data"].get("content", {}).get("chunks", [])
                for rank in re.findall(r"rank (\d) is up", text)]  # fmt: skip
        assert replay["order"] == ",".join(map(str, came))

        # Stop, mid-run
        stopped_at = time.monotonic()
        send_comm_msg(client, comm_id, {"type": "stop"}, subshell)
        pump(lambda: outputs[-1]["msg_type"] == "idle", 60)
        took = time.monotonic() - stopped_at
    finally:
        delete_subshell(client, subshell)

    assert took < 60, took  # a hang guard: the grace alone would be 300 s
    errors = [o for o in outputs if o["msg_type"] == "error"]
    assert errors and errors[0]["ename"] == "SpawnInterrupted", errors
    run = sort_out([o for o in outputs if o["msg_type"] != "idle"])
    assert any(u.get("header", {}).get("stopping") for u in run.updates)  # the widget said "stopping"
    record = run.frozen[MIME]
    assert record["status"] == "stopped"
    assert [r["status"] for r in record["ranks"]] == ["stopped"] * 4
    # SIGINT: every rank stopped where it was by its KeyboardInterrupt, none SIGTERMed after a grace
    told = strip_ansi("\n".join(errors[0]["traceback"]))
    assert "ranks 0-3 were stopped the same way: KeyboardInterrupt" in told and "SIGTERM" not in told, told
    # the kernel is usable afterwards
    assert execute(client, "1 + 1", timeout=30).status == "ok"


def test_a_flood_being_stopped_sends_only_its_newest_lines_and_saves_its_end(kernel):
    """Stop while every rank prints as fast as it can: from the sync that says the run is stopping,
    each output message holds at most ``STOPPING_BYTES_PER_MESSAGE`` (the page, still taking in what
    was sent before, draws the end sooner), and the frozen view still ends with each rank's last line
    as its log holds it."""
    client = kernel.client
    skip_without_subshells(client)
    subshell = create_subshell(client)
    live_at_once(kernel)
    code = (
        "%%spawn -n 4 --view widget\nimport os\nrank = int(os.environ['RANK'])\ni = 0\n"
        "while True:\n    i += 1\n    print(f'rank {rank} line {i} ' + 'x' * (i % 50), flush=i % 20 == 0)\n"
    )
    msg_id = client.execute(code)
    outputs: list[dict] = []
    stopped = False

    def stopped_once_shown_then_ended() -> bool:
        nonlocal stopped
        custom = [o for o in outputs if o["msg_type"] == "comm_msg" and o["data"].get("method") == "custom"]
        if not stopped and len(custom) >= 10:  # a second of the flood shown: Stop
            send_comm_msg(client, custom[0]["comm_id"], {"type": "stop"}, subshell)
            stopped = True
        return bool(outputs) and outputs[-1]["msg_type"] == "idle"

    try:
        pump_iopub(client, msg_id, outputs, stopped_once_shown_then_ended, 120)
    finally:
        delete_subshell(client, subshell)
    run = sort_out([o for o in outputs if o["msg_type"] != "idle"])
    mine = [m["data"] for m in run.comm_msgs if m["comm_id"] == run.comm_id]
    told = next(
        i for i, data in enumerate(mine) if data["method"] == "update" and data["state"].get("header", {}).get("stopping")
    )
    before = [d["content"] for d in mine[:told] if d["method"] == "custom" and d["content"]["type"] == "output"]
    after = [d["content"] for d in mine[told:] if d["method"] == "custom" and d["content"]["type"] == "output"]
    assert max(len(json.dumps(m["chunks"], ensure_ascii=False).encode()) for m in before) > STOPPING_BYTES_PER_MESSAGE
    assert after and all(len(json.dumps(m["chunks"], ensure_ascii=False).encode()) <= STOPPING_BYTES_PER_MESSAGE for m in after)
    record = run.frozen[MIME]
    assert record["status"] == "stopped"
    for rank in range(4):
        log = Path(record["log_dir"], str(rank), "stdout.log").read_text()
        assert rank_output(run.frozen, rank).rstrip("\n").splitlines()[-1] == log.rstrip("\n").splitlines()[-1]


def test_ranks_option_limits_what_is_shown(kernel):
    body = "import os\nprint('from rank', os.environ['RANK'])\n"
    result, run = spawn_widget(kernel, body, options="-n 4 --ranks 0,2")
    assert result.status == "ok", result.error_text
    assert sorted(run.live_text()) == [0, 2]
    record = run.frozen[MIME]
    saved = rank_outputs(run.frozen["text/html"])
    assert [bool(saved[r].lines) for r in range(4)] == [True, False, True, False]
    assert [r["status"] for r in record["ranks"]] == ["done"] * 4


def test_widget_text_fallback_names_the_run(kernel):
    live_at_once(kernel)
    result = execute(kernel.client, "%%spawn -n 2 --view widget\npass", timeout=120)
    shown = next(o for o in result.outputs if o["msg_type"] == "display_data")
    assert re.fullmatch(r"nbspawn run \S+: 2 ranks, \w+", shown["data"]["text/plain"])


def test_a_quick_cell_shows_its_result_and_a_slower_one_its_live_view(kernel):
    """A run that ends within SpawnMagics.live_after (0.2 s by default) shows only its frozen view: no
    widget, no toolbar status that would flash and cost more than the cell; one that goes on longer
    gets both, and its frozen view replaces the live one.  The rule, not the machine: the quick cell is
    given a live_after it cannot outlast (60 s: once, at 0.2 s, a loaded machine's quick cell took
    longer), the slower one sleeps past the default's 0.2 s.  How quick a quick cell is, is bench/launch.py's."""
    assert execute(kernel.client, "%config SpawnMagics.live_after = 60", timeout=30).status == "ok"
    try:
        quick = execute(kernel.client, "%%spawn -n 2 --view widget\nprint('hi')", timeout=120)
        assert quick.status == "ok", quick.error_text
        kinds = [(o["msg_type"], o.get("target_name")) for o in quick.outputs]
        assert ("comm_open", "jupyter.widget") not in kinds and ("comm_open", "nbspawn.status") not in kinds
        shown = [o for o in quick.outputs if o["msg_type"] == "display_data"]
        assert len(shown) == 1 and MIME in shown[0]["data"]
        assert rank_outputs(shown[0]["data"]["text/html"])[1].lines == [("stdout", "hi\n")]

        assert execute(kernel.client, "%config SpawnMagics.live_after = 0.2", timeout=30).status == "ok"
        slow = execute(kernel.client, "%%spawn -n 2 --view widget\nimport time\nprint('hi')\ntime.sleep(0.6)", timeout=120)
        assert slow.status == "ok", slow.error_text
        run = sort_out(slow.outputs)
        assert run.frozen is not None and run.status and run.status[0]["status"] == "running" and run.status_closed
        assert rank_outputs(run.frozen["text/html"])[1].lines == [("stdout", "hi\n")]
    finally:
        live_at_once(kernel)


# -- pieces, without a kernel ----------------------------------------------------------------------


def test_spawn_show_draws_the_last_run_again(kernel):
    """A page reloaded before JupyterLab saved lost the run's view, but the kernel holds the run:
    ``%spawn show`` draws its frozen view again (the last run's, or a named background run's)."""
    ran = execute(kernel.client, "%%spawn -n 2 --view widget\nimport os\nprint('hello from', os.environ['RANK'])", timeout=120)
    assert ran.status == "ok", ran.error_text
    first = [o["data"] for o in ran.outputs if o["msg_type"] in ("display_data", "update_display_data") and MIME in o["data"]][-1]
    shown = execute(kernel.client, "%spawn show", timeout=60)
    assert shown.status == "ok", shown.error_text
    (again,) = [o["data"] for o in shown.outputs if o["msg_type"] == "display_data"]
    assert again == first  # the same frozen view, record, HTML and text
    assert rank_outputs(again["text/html"])[1].lines == [("stdout", "hello from 1\n")]
    unknown = execute(kernel.client, "%spawn show no-such-run", timeout=60)
    assert unknown.status == "error" and unknown.error.ename == "UsageError"
    assert "no run 'no-such-run' to show" in unknown.error.evalue and len(unknown.error.traceback_text.splitlines()) < 6


def test_status_comm_only_in_a_kernel():
    """Plain Python and terminal IPython have no kernel: no comm is even tried."""
    code = (
        "from nbspawn.views._status import StatusComm, in_kernel\n"
        "assert not in_kernel()\n"
        "from IPython.terminal.interactiveshell import TerminalInteractiveShell\n"
        "TerminalInteractiveShell.instance(term_title=False)\n"  # IPython 7 would write the title to stdout
        "assert not in_kernel()\n"
        "s = StatusComm(); s.open(None); assert s.comm is None\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_output_tail_keeps_the_newest_lines_and_keeps_bars_where_the_eye_is():
    from nbspawn.views._tail import OutputTail

    tail = OutputTail(limit=3)
    for i in range(10):
        tail.add("stdout", f"line {i}\n")
    assert tail.chunks() == [["stdout", "line 7\nline 8\nline 9\n"]] and tail.elided_lines == 7

    tail = OutputTail()
    for p in range(0, 101, 10):  # a bar on stderr, lines on stdout in between
        tail.add("stderr", f"\rtrain {p}%")
        tail.add("stdout", f"step {p}\n")
        # while it is drawn, the bar is the last line, under the newest printed one
        *_, last = tail.entries.values()
        assert (last.stream, last.plain) == ("stdout", f"step {p}") or last.plain == f"train {p}%"
    tail.add("stderr", "\r")
    tail.add("stderr", "train 100%")
    *_, last = tail.entries.values()
    assert last.plain == "train 100%" and not last.complete  # redrawn: at the bottom again
    tail.add("stdout", "after\n")  # printed while the bar is still drawn: the bar stays below it
    tail.add("stderr", "\n")  # the bar ends: it stays where it was last seen (issue 17, item 11)
    assert [line.plain for line in tail.entries.values()] == [f"step {p}" for p in range(0, 101, 10)] + ["after", "train 100%"]
    assert tail.chunks()[-1] == ["stderr", "\rtrain 100%\n"] and tail.chunks()[-2][1].endswith("step 100\nafter\n")
    tail.add("stdout", "next\n")  # and what comes after it goes below it
    assert [line.plain for line in tail.entries.values()][-3:] == ["after", "train 100%", "next"]
    colour = OutputTail()
    colour.add("stdout", "\x1b[32m 5%\r 6%\r")
    colour.add("stdout", " 7%\n")
    assert colour.chunks() == [["stdout", "\x1b[32m\r 7%\n"]]  # the colour still applies


def test_output_tail_applies_display_updates_and_clears():
    from nbspawn.views._tail import OutputTail

    tail = OutputTail()
    tail.add("stdout", "a\n")
    tail.display({"kind": "data", "id": "x", "mime": "text/plain", "value": "v1", "text": "v1"})
    tail.add("stdout", "b\n")
    tail.display({"kind": "update", "id": "x", "mime": "text/plain", "value": "v2", "text": "v2"})
    assert [c[0] for c in tail.chunks()] == ["stdout", "display", "stdout"]
    assert tail.chunks()[1][1]["value"] == "v2" and tail.chunks()[1][1]["kind"] == "data"  # in place
    tail.display({"kind": "clear", "wait": True})
    assert len(tail) == 3  # a waiting clear keeps the output until the next one comes
    tail.add("stdout", "c\n")
    assert tail.chunks() == [["stdout", "c\n"]]


def test_live_messages_cut_whole_lines_and_count_them():
    from nbspawn.views._widget import WidgetView

    view = WidgetView()
    messages = []
    view.widget = type("Widget", (), {"send": lambda self, msg: messages.append(msg)})()
    view.open_lines = {(0, "stdout")}  # the browser has rank 0's "epoch 1 lo" open
    view.pending = [[0, "stdout", "ss 0.5\n" + "".join(f"a{i}\n" for i in range(100))], [1, "stdout", "b\n"]]
    view._cut_pending({0: 60, 1: 1000})
    view._send_output()
    chunks = {rank: text for rank, _s, text in messages[0]["chunks"]}
    assert chunks[1] == "b\n"
    kept = chunks[0]
    assert kept.startswith("\na") and kept.endswith("a99\n")  # closes the open line, whole lines only
    assert messages[0]["elided"]["0"] + kept.count("\n") - 1 == 101  # every line is sent or counted


def test_live_messages_never_glue_or_lose_count_of_lines():
    """Random output, random cuts: every line the browser gets is whole (or the one it had open,
    closed as it was), in order, and lines shown plus lines counted as elided are all lines."""
    import random

    from nbspawn.views._bundle import OutputTail
    from nbspawn.views._widget import WidgetView

    for trial in range(150):
        rng = random.Random(trial)
        view = WidgetView()
        view.tails = {0: OutputTail(), 1: OutputTail()}
        sent, elided, count = {0: "", 1: ""}, {0: 0, 1: 0}, {0: 0, 1: 0}

        class Widget:
            def send(self, msg):
                for rank, _stream, text in msg["chunks"]:
                    sent[rank] += text
                for rank, n in msg["elided"].items():
                    elided[int(rank)] += n

        view.widget = Widget()
        for _batch in range(25):
            for _ in range(rng.randint(1, 6)):
                r = rng.randint(0, 1)
                text = ""
                for _ in range(rng.randint(0, 40)):
                    count[r] += 1
                    text += f"r{r} line {count[r]:06d} {'x' * rng.randint(0, 30)}\n"
                if text:
                    view.output(r, "stdout", text)
                if rng.random() < 0.3:  # a line written in two pieces, maybe two batches apart
                    count[r] += 1
                    head = f"r{r} line {count[r]:06d} "
                    cut = rng.randint(1, len(head) - 1)
                    view.output(r, "stdout", head[:cut])
                    if rng.random() < 0.3:
                        view._cut_pending({r: rng.randint(0, 300)})
                    if rng.random() < 0.3:
                        view._send_output()
                    view.output(r, "stdout", head[cut:] + "tail\n")
            if view.pending and rng.random() < 0.7:
                view._cut_pending({r: rng.randint(0, 800) for r in (0, 1)})
            if rng.random() < 0.8:
                view._send_output()
        view._send_output()
        for r in (0, 1):
            lines = sent[r].split("\n")
            last = lines.pop()  # "" or the line the browser has open
            whole = [line for line in lines if re.fullmatch(rf"r{r} line \d{{6}} (x*|tail)", line)]
            cut_short = [line for line in [*lines, last] if line and line not in whole]
            assert all(re.fullmatch(r"[r01 line\d]*", line) for line in cut_short), (trial, cut_short)
            numbers = [int(line.split()[2]) for line in whole]
            assert numbers == sorted(set(numbers)), trial
            assert len(whole) + elided[r] == count[r], (trial, r)
