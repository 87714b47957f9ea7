"""A `%%spawn --view widget` cell through a real kernel, as the browser sees it: its messages sorted
out into the widget's state, custom messages, syncs and frozen bundle (sort_out, spawn_widget), and what
the browser sends back (a comm message on a subshell, as JupyterLab sends Stop while the cell runs)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kernel_harness import ExecResult, execute

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_ID = "nbspawn.views._widget.RunWidget"


@dataclass
class WidgetRun:
    """A `%%spawn` cell's messages, sorted out."""

    comm_id: str
    state: dict[str, Any]
    display_id: str
    custom: list[dict[str, Any]] = field(default_factory=list)  # the widget's custom messages, in order
    comm_msgs: list[dict[str, Any]] = field(default_factory=list)  # every comm_msg of the run
    updates: list[dict[str, Any]] = field(default_factory=list)  # trait syncs
    frozen: dict[str, Any] | None = None  # update_display_data's data
    status: list[dict[str, Any]] = field(default_factory=list)  # nbspawn.status: open, msgs
    status_closed: bool = False
    widget_closed: bool = False

    def synced(self) -> dict[str, Any]:
        """The widget's traits after the last sync (each sync sends only what changed)."""
        state = dict(self.state)
        for update in self.updates:
            state.update(update)
        return state

    def live_text(self) -> dict[int, str]:
        """Each rank's output as the browser received it (replays start over)."""
        text: dict[int, str] = {}
        for msg in self.custom:
            if msg["type"] == "replay":
                text = {int(r): "".join(t for s, t in chunks if s != "display") for r, chunks in msg["tails"].items()}
            elif msg["type"] == "output":
                for rank, stream, chunk in msg["chunks"]:
                    if stream != "display":
                        text[rank] = text.get(rank, "") + chunk
        return text

    def live_lines(self) -> list[tuple[int, str]]:
        """Every rank's lines in the order the live messages brought them (the live merged view), for
        output of whole lines; a replay starts over in its own order."""
        lines: list[tuple[int, str]] = []
        for msg in self.custom:
            if msg["type"] == "replay":
                tails = {int(r): list(chunks) for r, chunks in msg["tails"].items()}
                chunks = []
                for run in msg["order"].split(",") if msg["order"] else []:
                    rank, _, count = run.partition("*")
                    chunks += [[int(rank), *tails[int(rank)].pop(0)] for _ in range(int(count or 1))]
                lines = []
            elif msg["type"] == "output":
                chunks = msg["chunks"]
            else:
                continue
            lines += [(rank, line) for rank, stream, text in chunks if stream != "display" for line in text.splitlines()]
        return lines

    def live_elided(self) -> dict[int, int]:
        elided: dict[int, int] = {}
        for msg in self.custom:
            if msg["type"] == "replay":
                elided = {}
            for rank, n in msg.get("elided", {}).items():
                elided[int(rank)] = elided.get(int(rank), 0) + n
        return elided


def live_states(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state of each widget update among ``outputs`` so far: what a test's ``seen`` looks at while the
    cell runs (before :func:`sort_out` can sort the whole of them)."""
    return [o["data"]["state"] for o in outputs if o["msg_type"] == "comm_msg" and o["data"].get("method") == "update"]


def sort_out(outputs: list[dict[str, Any]]) -> WidgetRun:
    opens = [o for o in outputs if o["msg_type"] == "comm_open" and o["target_name"] == "jupyter.widget"]
    widget = next(o for o in opens if o["data"]["state"].get("_anywidget_id") == WIDGET_ID)
    shown = [o for o in outputs if o["msg_type"] == "display_data" and WIDGET_MIME in o["data"]]
    assert len(shown) == 1, shown
    assert shown[0]["data"][WIDGET_MIME]["model_id"] == widget["comm_id"]
    run = WidgetRun(widget["comm_id"], widget["data"]["state"], shown[0]["transient"]["display_id"])
    status_id = None
    for o in outputs:
        kind = o["msg_type"]
        if kind == "comm_open" and o["target_name"] == "nbspawn.status":
            status_id = o["comm_id"]
            run.status.append(o["data"])
        elif kind == "comm_msg":
            run.comm_msgs.append(o)
            if o["comm_id"] == run.comm_id:
                data = o["data"]
                if data["method"] == "custom":
                    run.custom.append(data["content"])
                elif data["method"] == "update":
                    run.updates.append(data["state"])
            elif o["comm_id"] == status_id:
                run.status.append(o["data"])
        elif kind == "comm_close":
            run.widget_closed |= o["comm_id"] == run.comm_id
            run.status_closed |= o["comm_id"] == status_id
        elif kind == "update_display_data":
            assert o["transient"]["display_id"] == run.display_id
            run.frozen = o["data"]
    return run


LIVE_AT_ONCE = "%config SpawnMagics.live_after = 0"


def live_at_once(kernel) -> None:
    """Quick cells get their live widget too (by default a run shorter than 0.2 s shows only its
    frozen view): what these tests look at is the widget's messages."""
    assert execute(kernel.client, LIVE_AT_ONCE, timeout=30).status == "ok"


def spawn_widget(
    kernel, body: str, options: str = "-n 4", timeout: float = 120, seen: Callable[[list[dict[str, Any]]], None] | None = None
) -> tuple[ExecResult, WidgetRun]:
    """Run `body` in a `%%spawn {options} --view widget` cell, its live widget shown at once: its
    result and its messages sorted out (``seen``: as :func:`kernel_harness.execute`'s)."""
    live_at_once(kernel)
    result = execute(kernel.client, f"%%spawn {options} --view widget\n{body}", timeout=timeout, seen=seen)
    return result, sort_out(result.outputs)


# -- what the browser sends ------------------------------------------------------------------------


def send_comm_msg(client, comm_id: str, content: dict, subshell_id: str | None) -> None:
    msg = client.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": content}})
    if subshell_id is not None:
        msg["header"]["subshell_id"] = subshell_id
    client.shell_channel.send(msg)


def skip_without_subshells(client) -> None:
    """Skip a test of what a page asks while a cell runs where the kernel has no subshells (ipykernel < 7,
    as on Colab and Kaggle: a comm message waits there until the running cell ends)."""
    info = client.kernel_info(reply=True, timeout=30)["content"]
    if "kernel subshells" not in info.get("supported_features", []):
        pytest.skip("this ipykernel has no subshells (ipykernel >= 7 has): comms wait for the running cell")


def create_subshell(client) -> str:
    msg = client.session.msg("create_subshell_request", {})
    client.control_channel.send(msg)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply = client.get_control_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            assert reply["content"]["status"] == "ok", reply["content"]
            return reply["content"]["subshell_id"]
    raise TimeoutError("no create_subshell_reply")


def delete_subshell(client, subshell_id: str) -> None:
    msg = client.session.msg("delete_subshell_request", {"subshell_id": subshell_id})
    client.control_channel.send(msg)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            reply = client.get_control_msg(timeout=1)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return
