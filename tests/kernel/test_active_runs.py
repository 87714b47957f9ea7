"""The kernel's runs per cell (nbspawn/views/_active.py): what a page loaded without a save asks for.

Unit tests of the registry (one run per cell, a re-run forgets the earlier one, bounded in count and
age, ``have`` and ``only``), and a real kernel asked over the Jupyter protocol as the labextension
asks it (reattach.ts ``CellRuns``, kernel.ts ``askActive``): an ``nbspawn.active`` comm opened on a
subshell while the cell runs, then after it ended.
"""

from __future__ import annotations

import queue
import time
import uuid

import pytest

from nbspawn.views._active import TARGET, ActiveRuns, current_cell


def _live(run_id: str) -> dict:
    return {
        "run_id": run_id,
        "model_id": "m-" + run_id,
        "display_id": "d-" + run_id,
        "started_at": 1.0,
        "nprocs": 2,
        "log_dir": "/l",
    }


def test_a_cell_has_its_latest_run_live_then_frozen():
    runs = ActiveRuns()
    runs.started("cell-a", "r1", 3)
    assert runs.answer()["runs"] == []  # not shown yet: nothing a page could put in the cell
    runs.shown("r1", _live("r1"))  # type: ignore[arg-type]
    (run,) = runs.answer()["runs"]
    assert run == {
        "cell_id": "cell-a",
        "run_id": "r1",
        "execution_count": 3,
        "status": "running",
        "live": _live("r1"),
        "frozen": None,
    }
    runs.ended("r1", {"text/plain": "done"})
    (run,) = runs.answer()["runs"]
    assert run["status"] == "ended" and run["live"] is None and run["frozen"] == {"text/plain": "done"}
    # a page that shows this run already is not sent its bundle again
    assert runs.answer({"have": ["r1"]})["runs"][0]["frozen"] is None
    assert runs.answer({"only": ["r2"]})["runs"] == []


def test_a_rerun_replaces_the_cells_run_and_a_cell_run_again_forgets_it():
    runs = ActiveRuns()
    runs.started("cell-a", "r1", 1)
    runs.ended("r1", {"text/plain": "one"})
    runs.cell_ran("cell-a")  # the cell runs again (pre_run_cell)
    assert runs.answer()["runs"] == []
    runs.started("cell-a", "r2", 2)
    runs.shown("r2", _live("r2"))  # type: ignore[arg-type]
    runs.ended("r1", {"text/plain": "late"})  # an older run of the cell: not what it shows
    assert [(r["run_id"], r["status"]) for r in runs.answer()["runs"]] == [("r2", "running")]


def test_the_registry_is_bounded():
    runs = ActiveRuns(keep_cells=3, keep_seconds=60)
    for i in range(5):
        runs.started(f"cell-{i}", f"r{i}", i)
        runs.ended(f"r{i}", {"text/plain": str(i)})
    assert [r["cell_id"] for r in runs.answer()["runs"]] == ["cell-2", "cell-3", "cell-4"]
    runs.keep_seconds = 0.0
    time.sleep(0.01)
    runs.started("cell-9", "r9", 9)
    runs.shown("r9", _live("r9"))  # type: ignore[arg-type]
    assert [r["run_id"] for r in runs.answer()["runs"]] == ["r9"]  # ended runs expire, running ones stay


def test_outside_a_kernel_no_cell_is_known():
    assert current_cell() == (None, None)


# -- a real kernel ----------------------------------------------------------------------------------

LONG = """\
%%spawn -n 2 --view widget
import os, time
t0 = time.monotonic()
while not os.path.exists({flag!r}) and time.monotonic() - t0 < 60:
    time.sleep(0.1)
print("done", flush=True)
"""


def _execute_in_cell(client, code: str, cell_id: str) -> str:
    msg = client.session.msg(
        "execute_request",
        {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
    )
    msg["metadata"]["cellId"] = cell_id  # as JupyterLab and Notebook 7 send it
    client.shell_channel.send(msg)
    return msg["header"]["msg_id"]


def _ask(client, request: dict, subshell_id: str | None, timeout: float = 10) -> dict:
    comm_id = uuid.uuid4().hex
    msg = client.session.msg("comm_open", {"comm_id": comm_id, "target_name": TARGET, "data": request})
    if subshell_id:
        msg["header"]["subshell_id"] = subshell_id
    client.shell_channel.send(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = client.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id:
            client.shell_channel.send(client.session.msg("comm_close", {"comm_id": comm_id, "data": {}}))
            return m["content"]["data"]
        if m["msg_type"] == "comm_close" and m["content"]["comm_id"] == comm_id:
            return {"closed": True}  # no target: no run of nbspawn has started in this kernel yet
    raise AssertionError(f"no answer to {request} in {timeout} s")


def _wait_idle(client, msg_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = client.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" and m["parent_header"].get("msg_id") == msg_id:
            return
    raise AssertionError("the cell did not end")


@pytest.mark.timeout(180)
def test_a_kernel_says_which_cell_runs_what_while_busy_and_after(fresh_kernel, tmp_path):
    from widget_harness import create_subshell, delete_subshell, live_at_once, skip_without_subshells

    client = fresh_kernel.client
    skip_without_subshells(client)
    live_at_once(fresh_kernel)
    flag = tmp_path / "end.flag"
    first = _execute_in_cell(client, LONG.format(flag=str(flag)), "cell-long")
    subshell = create_subshell(client)
    try:
        deadline = time.monotonic() + 60
        while True:  # the main shell runs the cell: asked on the subshell, answered at once
            runs = _ask(client, {}, subshell).get("runs", [])
            if runs or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        (run,) = runs
        assert run["cell_id"] == "cell-long" and run["status"] == "running" and run["frozen"] is None
        assert set(run["live"]) == {"run_id", "model_id", "display_id", "started_at", "nprocs", "log_dir"}
        assert run["live"]["run_id"] == run["run_id"] and run["live"]["nprocs"] == 2
        assert isinstance(run["execution_count"], int)
        flag.write_text("")
        _wait_idle(client, first)
        (ended,) = _ask(client, {}, subshell)["runs"]
        assert ended["run_id"] == run["run_id"] and ended["status"] == "ended" and ended["live"] is None
        record = ended["frozen"]["application/vnd.nbspawn.run+json"]
        assert record["run_id"] == run["run_id"] and record["status"] == "succeeded"
        assert _ask(client, {"have": [run["run_id"]]}, subshell)["runs"][0]["frozen"] is None

        # the same cell running something else: its run is forgotten
        _wait_idle(client, _execute_in_cell(client, "x = 1", "cell-long"))
        assert _ask(client, {}, None)["runs"] == []
    finally:
        delete_subshell(client, subshell)


def _listed(client) -> dict:
    """The kernel's comms of the target, as a page asks before it opens one (kernel.ts ``targetListed``)."""
    reply = client.comm_info(target_name=TARGET, reply=True, timeout=30)
    assert reply["content"]["status"] == "ok", reply["content"]
    return reply["content"]["comms"]


@pytest.mark.timeout(180)
def test_a_page_opens_the_comm_only_where_the_target_is(plain_kernel):
    """A notebook's new kernel has not loaded nbspawn: asked which comms of the target it has, it names
    none, so the page opens none (a comm_open there is closed unanswered, and every page on the kernel
    logged "Comm not found" for that close).  Once nbspawn is loaded it names one, and the comm it
    names is no page's: nothing was ever sent for it."""
    from kernel_harness import load_nbspawn

    client = plain_kernel.client
    assert _listed(client) == {}
    load_nbspawn(plain_kernel)
    assert list(_listed(client).values()) == [{"target_name": TARGET}]
    assert _ask(client, {}, None) == {"type": "active", "runs": []}  # the target answers, as asked after
