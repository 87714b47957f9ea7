"""Rank output as real training code makes it (issue #8), through a real kernel: notebook progress
bars, display() of HTML and images, matplotlib figures, floods, the order of stdout and stderr, the
saved size, and a kernel that says Busy while a run goes."""

from __future__ import annotations

import base64
import json
import queue
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from bundle_reader import rank_outputs
from kernel_harness import execute, start_kernel, stop_kernel
from widget_harness import create_subshell, delete_subshell, send_comm_msg, spawn_widget

from nbspawn.views._bundle import MIME

# a 4x4 red PNG, made here so the test needs no image library
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000004000000040802000000269309"
        "290000001549444154789c63f8cfc0f09f8181e13f0303c3ff0100f3ee1fe1a4"
        "8ba9c00000000049454e44ae426082"
    )
).decode()

RICH_BODY = f"""
import os, sys, time, base64
from IPython.display import display, Image
r = int(os.environ["RANK"])
print(f"before {{r}}")
class Table:
    def _repr_html_(self):
        return f"<table><tr><td>rank {{r}} table</td></tr></table>"
display(Table())
display(Image(data=base64.b64decode("{PNG}")))
from tqdm.auto import tqdm
for _ in tqdm(range(20), desc=f"auto{{r}}"):
    time.sleep(0.01)
from tqdm.notebook import tqdm as notebook_tqdm
for _ in notebook_tqdm(range(10), desc=f"nb{{r}}"):
    pass
import matplotlib.pyplot as plt
plt.plot([0, r, 2 * r])
plt.show()
print(f"after {{r}}", file=sys.stderr)
"""


def saved_size(bundle: dict) -> int:
    """Bytes the output adds to a notebook file, as nbformat writes it (multiline strings as lists)."""
    import nbformat

    empty = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")])
    full = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output("display_data", data=bundle)])]
    )
    return len(nbformat.writes(full).encode()) - len(nbformat.writes(empty).encode())


def live_items(run) -> dict[int, list[dict]]:
    items: dict[int, list[dict]] = {}
    for msg in run.custom:
        if msg["type"] == "output":
            for rank, stream, value in msg["chunks"]:
                if stream == "display":
                    items.setdefault(rank, []).append(value)
    return items


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_rich_output_and_notebook_bars_in_each_ranks_pane(kernel, method):
    result, run = spawn_widget(kernel, RICH_BODY, options=f"-n 2 --start-method {method}", timeout=180)
    assert result.status == "ok", result.error_text
    assert result.stdout == "" and "attempted to send" not in result.stderr
    live = live_items(run)
    saved = rank_outputs(run.frozen["text/html"])
    for r in range(2):
        # live: the rank's own HTML, its image, both notebook bars as progress trees, its figure
        mimes = [item["mime"] for item in live[r] if item["kind"] == "data"]
        assert "text/html" in mimes and mimes.count("image/png") == 2, mimes
        html_item = next(i for i in live[r] if i["mime"] == "text/html")
        assert f"rank {r} table" in html_item["value"]
        bars = [i for i in live[r] if i["mime"] == "application/vnd.nbspawn.widget+json"]
        assert bars and all(i["id"].startswith("widget:") for i in bars)
        # the bars' last states: complete
        final = {}
        for item in bars:
            final[item["id"]] = item["value"]
        progress = [c for tree in final.values() for c in tree["children"] if c["type"] == "progress"]
        assert sorted((p["value"], p["max"]) for p in progress) == [(10, 10), (20, 20)], final
        texts = " ".join(c["value"] for tree in final.values() for c in tree["children"] if c["type"] == "text")
        assert f"auto{r}" in texts and f"nb{r}" in texts

        # saved: in the order written, in that rank's pane
        order = saved[r].order
        kinds = [kind if kind == "line" else value["mime"] for kind, value in order]
        assert kinds[0] == "line" and order[0][1] == ("stdout", f"before {r}\n")
        assert kinds[1:4] == ["text/html", "image/png", "application/vnd.nbspawn.widget+json"], kinds
        assert order[-1][1] == ("stderr", f"after {r}\n"), order[-1]
        figure = [d for d in saved[r].displays if d["mime"] == "image/png"][-1]
        assert figure["src"].startswith("data:image/png;base64,iVBOR")
        assert f"rank {r} table" in saved[r].displays[0]["html"]
        widgets = [d["widget"] for d in saved[r].displays if "widget" in d]
        assert len(widgets) == 2 and all(w["children"][1]["value"] == w["children"][1]["max"] for w in widgets)

        # and everything the rank displayed is in its log directory too
        path = Path(run.frozen[MIME]["ranks"][r]["display_path"])
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert sum("image/png" in rec.get("data", {}) for rec in records) == 2


def test_images_past_the_runs_budget_are_named_not_shown(kernel):
    assert execute(kernel.client, "%config SpawnMagics.max_image_kb = 1", timeout=30).status == "ok"
    try:
        body = (
            "import os\nfrom IPython.display import display, Image\n"
            "display(Image(data=os.urandom(8) + b'\\x89PNG' * 100, format='png'))\n"
            "display(Image(data=os.urandom(8) + b'\\x89PNG' * 400, format='png'))\n"
        )
        result, run = spawn_widget(kernel, body, options="-n 1")
    finally:
        execute(kernel.client, "%config SpawnMagics.max_image_kb = 2048", timeout=30)
    assert result.status == "ok", result.error_text
    displays = rank_outputs(run.frozen["text/html"])[0].displays
    assert [d["mime"] for d in displays] == ["image/png", "text/plain"]
    note = displays[1]["text"]
    path = run.frozen[MIME]["ranks"][0]["display_path"]
    assert "not shown" in note and "SpawnMagics.max_image_kb" in note and f"{path}, line 2" in note
    records = Path(path).read_text().splitlines()
    assert len(records) == 2 and len(json.loads(records[1])["data"]["image/png"]) > 2000  # kept whole


def test_the_last_lines_of_every_stream_survive_a_flood(kernel):
    """4 ranks x 50k stdout lines, then one stderr line, then one stdout line: both in the snapshot."""
    body = (
        "import os, sys\n"
        "r = os.environ['RANK']\n"
        "for i in range(50_000):\n"
        "    print(f'rank {r} line {i} ' + 'x' * 30)\n"
        "print(f'rank {r} last stderr line', file=sys.stderr, flush=True)\n"
        "print(f'rank {r} last stdout line', flush=True)\n"
    )
    result, run = spawn_widget(kernel, body, options="-n 4", timeout=180)
    assert result.status == "ok", result.error_text
    saved = rank_outputs(run.frozen["text/html"])
    assert saved_size(run.frozen) <= 256 * 1024, saved_size(run.frozen)
    for r in range(4):
        lines = saved[r].lines
        assert lines[-2:] == [("stderr", f"rank {r} last stderr line\n"), ("stdout", f"rank {r} last stdout line\n")]
        assert run.frozen[MIME]["ranks"][r]["elided_lines"] + len(lines) == 50_002
        # live too: the last message shows both, in order
        live = [(s, t) for msg in run.custom if msg["type"] == "output" for rank, s, t in msg["chunks"] if rank == r]
        text = "".join(t for _s, t in live)
        assert text.index(f"rank {r} last stderr line") < text.index(f"rank {r} last stdout line")


def test_stdout_and_stderr_keep_the_order_they_were_written_in(kernel):
    """8 ranks x 40k stdout lines, a stderr line, 50 ms later a stdout line: never swapped; and lines
    10 ms apart on alternating streams stay in order."""
    body = (
        "import os, sys, time\n"
        "r = os.environ['RANK']\n"
        "for i in range(40_000):\n"
        "    print(f'rank {r} line {i}')\n"
        "print('the stderr line', file=sys.stderr, flush=True)\n"
        "time.sleep(0.05)\n"
        "print('the stdout line', flush=True)\n"
        "for i in range(20):\n"
        "    print(f'tick {i}', file=sys.stderr if i % 2 else sys.stdout, flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    result, run = spawn_widget(kernel, body, options="-n 8", timeout=240)
    assert result.status == "ok", result.error_text
    saved = rank_outputs(run.frozen["text/html"])
    ticks = [("stderr" if i % 2 else "stdout", f"tick {i}\n") for i in range(20)]
    for r in range(8):
        assert saved[r].lines[-22:] == [("stderr", "the stderr line\n"), ("stdout", "the stdout line\n"), *ticks], r


@pytest.mark.parametrize("view", ["widget", "text"])
def test_a_line_left_open_comes_before_the_cells_value(kernel, view):
    """``sys.stdout.write("abc")`` then the cell's value: "abc" first, in the saved view and in text (the
    open line once waited for its end, and came after the value)."""
    body = "import sys\nsys.stdout.write('abc')\n42"
    if view == "text":
        result = execute(kernel.client, f"%%spawn -n 1 --view text\n{body}")
        assert result.status == "ok", result.error_text
        assert result.stdout == "[rank0]: abc\n[rank0]: 42\n"
        return
    result, run = spawn_widget(kernel, body, options="-n 1")
    assert result.status == "ok", result.error_text
    order = rank_outputs(run.frozen["text/html"])[0].order
    assert [kind for kind, _ in order] == ["line", "display"] and order[0][1] == ("stdout", "abc"), order


def test_a_smaller_saved_size_is_configurable(kernel):
    assert execute(kernel.client, "%config SpawnMagics.max_saved_kb = 32", timeout=30).status == "ok"
    try:
        body = "for i in range(20_000):\n    print(f'line {i} ' + 'y' * 50)\n"
        result, run = spawn_widget(kernel, body, options="-n 2", timeout=120)
    finally:
        execute(kernel.client, "%config SpawnMagics.max_saved_kb = 256", timeout=30)
    assert result.status == "ok", result.error_text
    assert saved_size(run.frozen) <= 32 * 1024, saved_size(run.frozen)
    for r in range(2):
        lines = rank_outputs(run.frozen["text/html"])[r].lines
        assert lines and lines[-1] == ("stdout", f"line 19999 {'y' * 50}\n")


@pytest.mark.parametrize("written", [True, False], ids=["printed-before", "nothing-printed"])
def test_the_frozen_view_comes_after_what_the_kernel_printed_before_it(kernel, world, written):
    """The frozen view skips ipykernel's stream flushes only for a stream with nothing waiting: text the
    kernel printed just before a run still arrives before the view, text printed after it after; and
    the display publisher is ipykernel's own again once the view is shown.  A kept world's cell, since
    it ends well within the 0.2 s after which ipykernel would send the text anyway."""
    magic = f"get_ipython().run_cell_magic('spawn', '--world {world} -n 2 --view widget', 'pass')\n"
    assert execute(kernel.client, magic, timeout=120).status == "ok"
    before = 'print("kernel: before")\n' if written else ""
    result = execute(
        kernel.client,
        f'{before}{magic}print("kernel: after", "_flush_streams" in vars(get_ipython().display_pub))',
        timeout=120,
    )
    assert result.status == "ok", result.error_text
    shown = [  # the frozen view: displayed, or in place of the live one where the run outlived live_after
        out["text"].strip() if out["msg_type"] == "stream" else "the frozen view"
        for out in result.outputs
        if out["msg_type"] == "stream" or MIME in out.get("data", {})
    ]
    assert shown == ["kernel: before"] * written + ["the frozen view", "kernel: after False"]


def _statuses_until_idle(client, msg_id: str, seen: Callable[[dict], None]) -> list[tuple[str, str | None]]:
    """Every status published, as (state, parent msg_id) in order, until ``msg_id``'s idle; each iopub
    message is shown to ``seen`` first (the test's requests go out as a browser's would)."""
    statuses: list[tuple[str, str | None]] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        seen(msg)
        if msg["msg_type"] == "status":
            statuses.append((msg["content"]["execution_state"], msg["parent_header"].get("msg_id")))
            if statuses[-1] == ("idle", msg_id):
                break
    return statuses


def test_the_kernel_stays_busy_while_a_run_goes(kernel):
    """A comm message handled on a subshell mid-run (the live view's replay, any widget) publishes
    busy/idle of its own: the cell's busy must come back at once, so the status bar says Busy."""
    client = kernel.client
    info = client.kernel_info(reply=True, timeout=30)["content"]
    if "kernel subshells" not in info.get("supported_features", []):
        pytest.skip("this ipykernel has no subshells (ipykernel >= 7 has)")
    subshell = create_subshell(client)
    msg_id = client.execute("%%spawn -n 2 --view widget\nimport time\nprint('up', flush=True)\ntime.sleep(4)\n")
    comm_id = None
    sent = 0

    def replay_asked(msg: dict) -> None:
        nonlocal comm_id, sent
        if msg["msg_type"] == "comm_open" and msg["content"]["data"].get("state", {}).get("_anywidget_id"):
            comm_id = msg["content"]["comm_id"]  # the live view's own comm
        elif msg["msg_type"] == "comm_msg" and comm_id and sent < 3:
            send_comm_msg(client, comm_id, {"type": "replay"}, subshell)  # as a browser would
            sent += 1

    try:
        statuses = _statuses_until_idle(client, msg_id, replay_asked)
    finally:
        delete_subshell(client, subshell)
    assert sent, "the run sent no output message"
    # cut at the cell's own idle: before it, every idle of another request is followed by busy
    run_part = statuses[statuses.index(("busy", msg_id)) : statuses.index(("idle", msg_id))]
    others = [i for i, (state, parent) in enumerate(run_part) if state == "idle" and parent != msg_id]
    assert others, statuses
    for i in others:
        assert i + 1 < len(run_part) and run_part[i + 1] == ("busy", msg_id), statuses
    assert run_part[-1] == ("busy", msg_id), statuses


@pytest.mark.parametrize("view", ["widget", "text"])
def test_a_status_published_before_the_run_started_is_put_right_when_it_starts(kernel, view):
    """A request answered while the cell had not yet reached its run (here on the control channel,
    as JupyterLab asks; on ipykernel 7 also a page's comm on a subshell) publishes its own idle: the
    run's start must say busy again, or the status bar reads Idle until something else is published."""
    client = kernel.client
    body = "import time\nprint('up', flush=True)\ntime.sleep(1)\n"
    code = f"import time\ntime.sleep(1)\nget_ipython().run_cell_magic('spawn', '-n 2 --view {view}', {body!r})\n"
    msg_id = client.execute(code)
    asked = client.session.msg("kernel_info_request", {})
    sent = False

    def ask_once_the_cell_began(msg: dict) -> None:
        nonlocal sent
        if not sent and msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id:
            client.control_channel.send(asked)  # answered during the cell's sleep, before its run
            sent = True

    statuses = _statuses_until_idle(client, msg_id, ask_once_the_cell_began)
    cell = statuses[statuses.index(("busy", msg_id)) : statuses.index(("idle", msg_id))]
    asked_idle = cell.index(("idle", asked["header"]["msg_id"]))  # inside the cell: during its sleep
    assert ("busy", msg_id) in cell[asked_idle + 1 :], statuses
    assert cell[-1] == ("busy", msg_id), statuses


@pytest.mark.parametrize("view", ["widget", "text"])
def test_a_run_says_busy_again_only_when_another_status_came_after_its_cells(kernel, world, view):
    """Nothing answered between the cell's busy and its run: the run publishes no status of its own
    (each costs the cell 0.2 ms), so the cell's statuses are ipykernel's busy and idle alone."""
    client = kernel.client
    magic = f"get_ipython().run_cell_magic('spawn', '--world {world} -n 2 --view {view}', 'pass')"
    assert execute(client, magic, timeout=120).status == "ok"
    msg_id = client.execute(magic)
    statuses = _statuses_until_idle(client, msg_id, lambda msg: None)
    assert [s for s in statuses if s[1] == msg_id] == [("busy", msg_id), ("idle", msg_id)], statuses


def test_the_text_view_shows_what_a_rank_displays(kernel):
    body = "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\n42\n"
    result = execute(kernel.client, f"%%spawn -n 2 --view text\n{body}", timeout=120)
    assert result.status == "ok", result.error_text
    for r in range(2):
        assert f"[rank{r}]: <IPython.core.display.HTML object>" in result.stdout
        assert f"[rank{r}]: 42" in result.stdout


def test_ranks_never_talk_to_the_kernels_frontend(tmp_path):
    """A forked rank holds the kernel's sockets: widgets and displays made there once made ipykernel
    dump every message into the server's console ("attempted to send message from fork")."""
    with open(tmp_path / "kernel.log", "w") as log:
        kernel = start_kernel(log=log, env={"PYTEST_CURRENT_TEST": None})  # ipykernel as in a real server
        try:
            assert execute(kernel.client, "%load_ext nbspawn", timeout=120).status == "ok"
            body = "from tqdm.notebook import tqdm\nfor _ in tqdm(range(50)):\n    pass\nfrom IPython.display import display\ndisplay({'a': 1})\n"
            result = execute(
                kernel.client, f"%%spawn -n 2 --start-method fork --view widget --log-dir {tmp_path}\n{body}", timeout=120
            )
            assert result.status == "ok", result.error_text
            rank_logs = "".join(p.read_text() for p in tmp_path.glob("*/*/stderr.log"))
            assert "attempted to send" not in rank_logs, rank_logs[-2000:]
        finally:
            stop_kernel(kernel)
    text = (tmp_path / "kernel.log").read_text()
    assert "attempted to send message from fork" not in text, text[-2000:]
    assert "comm_open" not in text and "IntProgress" not in text, text[-2000:]
