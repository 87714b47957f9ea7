"""The browser tests' harness: a jupyter server (``lab`` or ``notebook``) from this interpreter on
127.0.0.1 with a private config, data, settings and workspace dir (serve), notebooks written for it
(notebook, code_cell), Chromium pages that record dialogs and errors (Page), and what the tests do in
them (lab_url, open_lab_notebook, run_cell, pane_text, shot).  tests/browser/conftest.py holds the
fixtures (artifacts, browser, page).

Importing this module skips the importing test module when playwright or jupyterlab is missing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("NBSPAWN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
EXTENSION = "nbspawn-labextension"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("NBSPAWN_TEST_ARTIFACTS", REPO / "test-artifacts")) / "browser"
# a test module's pytestmark: skip it where there is no browser to drive
NEEDS_CHROMIUM = pytest.mark.skipif(
    not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)),
    reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or set NBSPAWN_CHROMIUM)",
)

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright; no browser download needed)"
)
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[lab]')")


# -- notebooks ----------------------------------------------------------------------------------


def notebook(cells: list[dict]) -> dict:
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def code_cell(i: int, source: str, outputs: list | None = None) -> dict:
    return {
        "cell_type": "code",
        "id": f"cell-{i}",
        "execution_count": None if outputs is None else i + 1,
        "metadata": {},
        "source": source,
        "outputs": outputs or [],
    }


# -- servers ------------------------------------------------------------------------------------


@dataclass
class Server:
    base: str
    token: str
    root: Path
    proc: subprocess.Popen
    log: Path

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _extension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(Path(p, EXTENSION, "package.json").is_file() for p in jupyter_path("labextensions"))


def write_settings(settings_dir: Path, theme: str = "JupyterLab Light") -> None:
    """No news/update toasts over the screenshots; the theme to draw with."""
    for plugin, values in {
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/apputils-extension/themes": {"theme": theme},
    }.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _start(app: str, tmp: Path) -> Server:
    root, home = tmp / "root", tmp / "home"
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for var, sub in {
        "JUPYTER_CONFIG_DIR": "config",
        "JUPYTER_DATA_DIR": "data",
        "JUPYTER_RUNTIME_DIR": "runtime",
        "JUPYTERLAB_SETTINGS_DIR": "settings",
        "JUPYTERLAB_WORKSPACES_DIR": "workspaces",
        "IPYTHONDIR": "ipython",
    }.items():
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / sub)
    env.pop("JUPYTER_PATH", None)
    write_settings(home / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyterlab" if app == "lab" else "notebook",
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--ServerApp.token={token}", f"--ServerApp.root_dir={root}",
    ]  # fmt: skip
    if app == "lab":
        cmd.append("--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI images run as root
    log = tmp / f"{app}-server.log"
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=root)
    server = Server(f"http://127.0.0.1:{port}", token, root, proc, log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"jupyter {app} exited ({proc.returncode}):\n{log.read_text()[-4000:]}", pytrace=False)
        try:
            with urllib.request.urlopen(server.url("/api/status"), timeout=5) as resp:
                if resp.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            _stop(server)
            pytest.fail(f"jupyter {app} did not answer in 120 s:\n{log.read_text()[-4000:]}", pytrace=False)
        time.sleep(0.3)


def _stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(10)


def _require_extension() -> None:
    if not _extension_installed():
        pytest.fail(
            f"the {EXTENSION} labextension is not installed in any of jupyter's labextensions paths; "
            'build and install it with `pip install -e ".[test,lab]"` (needs node and npm)',
            pytrace=False,
        )


def serve(app: str, tmp: Path, write: Callable[[Path], None]) -> Iterator[Server]:
    """A jupyter server (``lab`` or ``notebook``) with the extension, holding ``write``'s notebooks."""
    if app == "notebook":
        pytest.importorskip("notebook", reason="notebook 7 is not installed (pip install -e '.[lab]')")
    _require_extension()
    server = _start(app, tmp)
    write(server.root)
    try:
        yield server
    finally:
        _stop(server)


# -- pages --------------------------------------------------------------------------------------


class Page:
    """A page that records dialogs (alert() must never run) and console errors."""

    def __init__(self, browser, width=1280, height=1000, color_scheme="light"):
        self.context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.watch(self.page)

    def watch(self, page):
        def on_dialog(d):
            self.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        return page

    def close(self):
        self.context.close()


def lab_url(lab: Server, name: str) -> str:
    """The notebook alone in a new workspace: nothing restored from an earlier test."""
    return lab.url(f"/lab/workspaces/t{secrets.token_hex(4)}/tree/{name}?reset")


def open_lab_notebook(page, lab: Server, name: str):
    page.goto(lab_url(lab, name))
    run = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .nbs-Run").first
    run.wait_for(state="visible", timeout=90_000)
    return run


def pane_text(run) -> str:
    return run.locator(".nbs-Pane-host").inner_text()


def run_cell(pg, cell) -> None:
    """Select a cell and run it (Shift+Enter), retrying until its prompt shows it ran or runs."""
    prompt = cell.locator(".jp-InputPrompt")
    for _ in range(3):
        _dismiss_dialog(pg)
        cell.locator(".jp-InputArea-editor").click()
        sync_api.expect(cell).to_have_class(re.compile(r"\bjp-mod-active\b"))
        pg.keyboard.press("Shift+Enter")
        try:
            sync_api.expect(prompt).to_have_text(re.compile(r"\[[*0-9]+\]"), timeout=10_000)
            return
        except AssertionError:
            continue
    raise AssertionError(f"the cell did not run: prompt {prompt.inner_text()!r}")


def _dismiss_dialog(pg) -> None:
    """A JupyterLab dialog open before a cell is clicked (seen now and then on a loaded machine, as a
    fresh server's first page settles its kernel): said on the test's output, then accepted, as a user
    would, so it does not swallow the click."""
    dialog = pg.locator(".jp-Dialog")
    if dialog.count():
        print(f"lab_harness: a JupyterLab dialog was open: {dialog.first.inner_text()!r}")
        accept = dialog.first.locator(".jp-Dialog-button.jp-mod-accept")
        (accept.first if accept.count() else dialog.first.locator(".jp-Dialog-button").last).click()
        dialog.first.wait_for(state="detached", timeout=10_000)


def shot(locator, artifacts: Path, name: str) -> None:
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(artifacts / name), animations="disabled")
