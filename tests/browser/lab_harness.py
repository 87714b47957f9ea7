"""The browser tests' harness: a jupyter server (``lab`` or ``notebook``) from this interpreter on
127.0.0.1 with a private config, data, settings and workspace dir (serve, serving), notebooks written
for it (write_notebook, notebook, code_cell), Chromium pages that record dialogs and errors (Page), and
what the tests do in them: open a notebook in either front end and wait for its kernel (open_notebook,
notebook_url, notebook_root, wait_until_ready; Front, for a test run in both, FRONTS), run a cell
(run_cell), find a run's views (live_view, frozen_run, chip_statuses, select_pane), wait on the page
(wait_for_js, read_until), read the kernel's status over a run (status_spells), save (save_until), switch the theme
(use_theme, dark_theme), take screenshots (shot, page_shot) and tell the page's own work from time its
renderer waited for a core (RendererCpu).  tests/browser/conftest.py
holds the fixtures (artifacts, browser, page).

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
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import pytest

from nbspawn.views._widget import widget_available

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Dialog, Locator
    from playwright.sync_api import Page as PwPage

T = TypeVar("T")

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

# a test module's pytestmark: skip it where the live widget's bundle is not built
NEEDS_WIDGET = pytest.mark.skipif(not widget_available(), reason="nbspawn/_static/widget.js is not built")

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright; no browser download needed)"
)

# Playwright's expect() waits 5 s by default: on a loaded 2-core machine a chip, a badge or a prompt that
# does come can take longer than that to be drawn (issue #55: a test asserts what the code does, never
# how fast a loaded machine did it).  Every expect() without a timeout of its own waits up to a minute,
# a hang guard; one that means "not yet" or "not within" must say its own timeout, with its reason.
EXPECT_TIMEOUT_MS = 60_000
sync_api.expect.set_options(timeout=EXPECT_TIMEOUT_MS)
# The same for the browser's own waits (the ``browser`` fixture sets them on its context): an action's
# (a click, a locator's wait_for without a timeout of its own) from Playwright's 30 s to a minute, and a
# page's load (goto, reload) to two: a JupyterLab page's reload, three browser workers beside a busy core
# and more, took over 30 s (a loaded make test, 2026-12-03).
ACTION_TIMEOUT_MS = 60_000
NAVIGATION_TIMEOUT_MS = 120_000


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


def write_notebook(root: Path, name: str, cells: list[str | dict]) -> Path:
    """``root/name``: a notebook of ``cells`` (a source is a code cell of its own; a dict, a cell as it is)."""
    path = root / name
    path.write_text(json.dumps(notebook([code_cell(i, c) if isinstance(c, str) else c for i, c in enumerate(cells)])))
    return path


# -- servers ------------------------------------------------------------------------------------


@dataclass
class Server:
    app: str  # "lab" (JupyterLab), "notebook" (Notebook 7) or "classic" (Notebook 6.5, Colab's widget stack)
    base: str
    token: str
    root: Path  # the test module's folder: its notebooks, and their kernels' working directory
    proc: subprocess.Popen
    log: Path
    settings: Path  # the server's JupyterLab settings (write_settings: its theme), read at each page load
    folder: str = ""  # root's path under the server's own root, where the server is shared (serve)

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def path(self, name: str) -> str:
        """``name`` (a notebook in root) as the server names it."""
        return f"{self.folder}/{name}" if self.folder else name


# The servers running now, whose logs a failing test's report ends with (conftest's makereport hook): the
# kernels' own stderr is there, and a view that never came is often explained by it.
RUNNING: list[Server] = []


def log_tail(server: Server, chars: int = 6000) -> str:
    try:
        return server.log.read_text(errors="replace")[-chars:]
    except OSError as err:
        return f"(no log: {err})"


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
    server_app = "NotebookApp" if app == "classic" else "ServerApp"  # Notebook 6.5 runs its own server
    cmd = [
        sys.executable, "-m", "jupyterlab" if app == "lab" else "notebook",
        "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--{server_app}.port_retries=0",
        f"--{server_app}.token={token}", f"--{server_app}.{'notebook_dir' if app == 'classic' else 'root_dir'}={root}",
    ]  # fmt: skip
    if app == "lab":
        cmd.append("--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI images run as root
    log = tmp / f"{app}-server.log"
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=root)
    server = Server(app, f"http://127.0.0.1:{port}", token, root, proc, log, home / "settings")
    RUNNING.append(server)
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
    if server in RUNNING:
        RUNNING.remove(server)
    server.proc.terminate()
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(10)


def _require_classic_notebook() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("notebook")
    except PackageNotFoundError:
        found = "none"
    if not found.startswith("6."):
        pytest.skip(f"needs the classic Notebook 6.x (found {found}): the Colab runtime job (.ci/runtime colab-gpu) runs it")


def _require_extension() -> None:
    if not _extension_installed():
        pytest.fail(
            f"the {EXTENSION} labextension is not installed in any of jupyter's labextensions paths; "
            'build and install it with `pip install -e ".[test,lab]"` (needs node and npm)',
            pytrace=False,
        )


# The JupyterLab and Notebook 7 servers this test process shares between its modules (serve), by app.
_SHARED: dict[str, Server] = {}


def serve(app: str, tmp: Path, write: Callable[[Path], None]) -> Iterator[Server]:
    """A jupyter server (``lab``, ``notebook`` or ``classic``) holding ``write``'s notebooks; JupyterLab
    and Notebook 7 with nbspawn's extension, the classic Notebook 6.5 with what widgetsnbextension and
    anywidget install for it (no nbspawn extension: as on Colab).

    JupyterLab and Notebook 7 are shared by the modules a test process runs (a start is 4 s of CPU,
    about 30 a run): a module gets a folder of its own on it, named after ``tmp``, and its notebooks'
    sessions and kernels are shut down when it is done. Pages open notebooks in a workspace of their
    own (lab_url), so nothing of another module's is restored; a module that sets a theme writes it to
    Server.settings and restores it, as before. The classic Notebook is each module's own."""
    if app == "classic":
        _require_classic_notebook()
    else:
        pytest.importorskip("jupyterlab", reason="jupyterlab is not installed (pip install -e '.[lab]')")
        if app == "notebook":
            pytest.importorskip("notebook", reason="notebook 7 is not installed (pip install -e '.[lab]')")
        _require_extension()
    if app == "classic":
        server = _start(app, tmp)
        write(server.root)
        try:
            yield server
        finally:
            _stop(server)
        return
    shared = _SHARED.get(app)
    if shared is None or shared.proc.poll() is not None:
        shared = _SHARED[app] = _start(app, Path(tempfile.mkdtemp(prefix=f"nbspawn-{app}-server-")))
    module = replace(shared, root=shared.root / tmp.name, folder=tmp.name)
    module.root.mkdir()
    write(module.root)
    try:
        yield module
    finally:
        _shut_down_sessions(module)


def _api(server: Server, path: str, method: str = "GET") -> object:
    request = urllib.request.Request(server.url(path), method=method)
    with urllib.request.urlopen(request, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _shut_down_sessions(module: Server, timeout: float = 120) -> None:
    """Shut down the kernels of ``module``'s notebooks on its shared server (a kept world's ranks with
    them), as stopping a server of its own did: nothing of a module's runs on beside the next."""

    def sessions() -> list[dict]:
        found = _api(module, "/api/sessions")
        assert isinstance(found, list)
        return [s for s in found if str(s.get("path", "")).startswith(module.folder + "/")]

    for session in sessions():
        try:
            _api(module, f"/api/sessions/{session['id']}", method="DELETE")
        except urllib.error.HTTPError as err:
            if err.code != 404:  # gone meanwhile
                raise
    deadline = time.monotonic() + timeout
    while (left := sessions()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"sessions still open {timeout} s after their shutdown: {left}"


def stop_shared_servers() -> None:
    """The shared servers' end, at the end of the test process (tests/browser/conftest.py)."""
    while _SHARED:
        _stop(_SHARED.popitem()[1])


@contextmanager
def serving(app: str, tmp: Path, write: Callable[[Path], None]) -> Iterator[Server]:
    """serve() as a context manager: for a fixture that holds more than the server (a page too)."""
    yield from serve(app, tmp, write)


# -- pages --------------------------------------------------------------------------------------


class Page:
    """A page that records dialogs (alert() must never run) and console errors; a context manager
    that closes it, and every other page opened since in its browser, on the way out.

    ``browser`` is the test process's one browser context (the ``browser`` fixture), a profile on disk:
    there Chromium keeps the compiled code of the scripts a page ran, and the next page of JupyterLab
    runs them without compiling them again (4.4 s of CPU for a page instead of 6.0, measured here).
    What a test's page sets up (its size, its colour scheme, a script it adds) is the page's own.
    """

    def __init__(
        self,
        browser: BrowserContext,
        width: int = 1280,
        height: int = 1000,
        color_scheme: Literal["light", "dark"] = "light",
    ) -> None:
        self.context = browser
        self._size = {"width": width, "height": height}
        self._color_scheme = color_scheme
        self._others = set(browser.pages)  # the pages of the browser that are not this test's
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.console_errors: list[str] = []  # console.error(...) of the page's own scripts (JupyterLab's too)
        self.page = self.new_page()

    def new_page(self) -> PwPage:
        """Another page of this test (a second tab, a page opened anew), its size and colour scheme
        this one's, watched as it is."""
        page = self.context.new_page()
        page.set_viewport_size(self._size)
        page.emulate_media(color_scheme=self._color_scheme)
        return self.watch(page)

    def watch(self, page: PwPage) -> PwPage:
        """Record ``page``'s dialogs and errors too (a second tab, a reloaded page)."""

        def on_dialog(d: Dialog) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        count_executes(page)
        return page

    def nbspawn_errors(self) -> list[str]:
        """The page errors that come from nbspawn's front end or anywidget (JupyterLab's own are not ours)."""
        return [e for e in self.errors if "nbs" in e or "anywidget" in e]

    def close(self) -> None:
        for page in self.context.pages:
            if page not in self._others:
                page.close()

    def what_was_open(self) -> str:
        """What each of this test's pages shows, for a failed test's report: a JupyterLab dialog's text
        (one waits for a click, so a test that does not expect it times out on something else), the
        page's errors and console errors; with a screenshot of each saved under ARTIFACTS
        (failed-<test>-<n>.png). A failure on a loaded CI machine is not seen again at will: what the
        page was doing is recorded the one time it happens."""
        test = os.environ.get("PYTEST_CURRENT_TEST", "test").split(" ")[0].rsplit("::", 1)[-1]
        lines = []
        for n, page in enumerate(p for p in self.context.pages if p not in self._others):
            shot_to = ARTIFACTS / f"failed-{re.sub(r'[^A-Za-z0-9_.-]', '_', test)}-{n}.png"
            try:
                dialogs = page.locator(".jp-Dialog").all_inner_texts()
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=shot_to, timeout=10_000)
            except Exception as e:  # a page that cannot answer is itself what is recorded
                lines.append(f"page {n} ({page.url}) did not answer: {e!r}")
                continue
            lines.append(f"page {n} ({page.url}): screenshot {shot_to}; JupyterLab dialogs open: {dialogs!r}")
        lines.append(f"page errors: {self.errors!r}")
        lines.append(f"console errors (the last 20): {self.console_errors[-20:]!r}")
        lines.append(f"alert()s: {self.dialogs!r}")
        return "\n".join(lines)

    def __enter__(self) -> Page:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            print(f"lab_harness: what the test's pages showed as it failed\n{self.what_was_open()}")
        self.close()


# The notebook a page shows: JupyterLab's visible notebook panel, or Notebook 7's page; its cells; its
# kernel, idle (the execution indicator in the notebook's toolbar).
LAB_PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
CELLS = ".jp-Notebook .jp-Cell"
KERNEL_IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
# A run's views in a cell: the live one (the widget's, or the reattaching renderer's), the frozen one.
LIVE_VIEW = ".nbs-Run.nbs-mod-live"
WIDGET_VIEW = ".nbs-Widget .nbs-Run.nbs-mod-live"
FROZEN_RUN = ".nbs-RunRenderer .nbs-Run"

# What the kernel's status reads now: JupyterLab's status bar text; Notebook 7's tab icon, which is
# the only indicator there that follows the kernel's status (its menu-bar item is blank for busy and
# idle, and the toolbar circle counts pending executions).
KERNEL_STATUS_JS = {
    "lab": """() => {
        const m = (document.querySelector('#jp-main-statusbar')?.textContent || '').match(/\\|\\s*(Busy|Idle|Starting|Restarting|Autorestarting|Connecting|Initializing|Unknown|Dead|Terminating|Disconnected|No Kernel)/);
        return m ? m[1] : '?';
    }""",
    "nb7": """() => {
        const href = document.querySelector("link[rel*='icon']")?.href || '';
        return /busy/.test(href) ? 'Busy' : /favicon-notebook/.test(href) ? 'Idle' : '?' + href;
    }""",
}


def lab_url(lab: Server, name: str) -> str:
    """The notebook alone in a new workspace: nothing restored from an earlier test."""
    return lab.url(f"/lab/workspaces/t{secrets.token_hex(4)}/tree/{lab.path(name)}?reset")


def notebook_url(server: Server, name: str) -> str:
    """Where ``name`` opens: a fresh JupyterLab workspace (lab_url), or Notebook 7's notebook page."""
    return lab_url(server, name) if server.app == "lab" else server.url(f"/notebooks/{server.path(name)}")


def notebook_root(pg: PwPage, server: Server) -> Locator:
    """The element that holds the open notebook: JupyterLab's visible panel, Notebook 7's body."""
    return pg.locator(LAB_PANEL if server.app == "lab" else "body")


def wait_until_ready(root: Locator) -> Locator:
    """The notebook under ``root`` drawn and its kernel idle; its cells."""
    cells = root.locator(CELLS)
    cells.first.wait_for(timeout=90_000)
    root.locator(KERNEL_IDLE).first.wait_for(timeout=90_000)
    return cells


def open_notebook(pg: PwPage, server: Server, name: str) -> Locator:
    """Open ``name`` in the server's front end (notebook_url) and wait until it is ready; its cells."""
    pg.goto(notebook_url(server, name))
    return wait_until_ready(notebook_root(pg, server))


def open_with_nbspawn(pg: PwPage, server: Server, name: str) -> Locator:
    """Open ``name`` and run its first cell (``%load_ext nbspawn``, as every test notebook begins) to
    its end; its cells."""
    cells = open_notebook(pg, server, name)
    run_cell(pg, cells.nth(0), until="[1]:")
    return cells


def open_lab_notebook(page: PwPage, lab: Server, name: str) -> Locator:
    """Open ``name`` in JupyterLab; its first run view (a saved run, drawn by the renderer)."""
    page.goto(lab_url(lab, name))
    run = page.locator(f"{LAB_PANEL} .nbs-Run").first
    run.wait_for(state="visible", timeout=90_000)
    return run


def pane_text(run: Locator) -> str:
    return shown_text(run.locator(".nbs-Pane-host"))


# The execute_requests each page has sent its kernels (count_executes), by page: what tells run_cell a
# Shift+Enter was taken though the prompt has not shown it yet.
_EXECUTES: weakref.WeakKeyDictionary[PwPage, list[int]] = weakref.WeakKeyDictionary()


def count_executes(page: PwPage) -> None:
    """Count the execute_requests ``page`` sends on its kernel websockets from now on (Page does it for
    each page it watches).  Frames are JSON or Jupyter's v1 binary protocol (KernelStatuses)."""
    sent = _EXECUTES.setdefault(page, [0])

    def frame(payload: str | bytes) -> None:
        try:
            if isinstance(payload, bytes):
                count = int.from_bytes(payload[:8], "little")
                offsets = [int.from_bytes(payload[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
                channel, header = payload[offsets[0] : offsets[1]], json.loads(payload[offsets[1] : offsets[2]])
                channel = channel.decode()
            else:
                msg = json.loads(payload)
                channel, header = msg.get("channel"), msg["header"]
            if channel == "shell" and header.get("msg_type") == "execute_request":
                sent[0] += 1
        except Exception:  # never fail a test for the counter's sake
            pass

    page.on("websocket", lambda ws: ws.on("framesent", frame) if "/channels" in ws.url else None)


def close_current_tab(pg: PwPage, panel: Locator) -> None:
    """Close JupyterLab's current document tab with its close icon, as a user does, and wait until
    ``panel`` (its panel) is gone. A JupyterLab dialog that opens instead (its document unsaved) fails
    the test with its text. A click the page lost is clicked again, said on the test's output: on CI
    (2026-12-03, a loaded machine) a tab stayed open 30 s after its close icon was clicked, and once here
    under heavier load too, with no dialog. The limits are hang guards (a quiet machine closes a tab in
    well under a second)."""
    close = pg.locator(".lm-TabBar-tab.jp-mod-current.lm-mod-current .lm-TabBar-tabCloseIcon")
    for attempt in (1, 2):
        close.first.click()
        try:
            panel.wait_for(state="detached", timeout=20_000 if attempt == 1 else ACTION_TIMEOUT_MS)
            return
        except sync_api.TimeoutError:
            dialogs = pg.locator(".jp-Dialog").all_inner_texts()
            assert not dialogs, f"closing the tab opened a JupyterLab dialog: {dialogs!r}"
            if attempt == 2:
                raise
            print("lab_harness: the tab was still open 20 s after its close icon was clicked; clicking it again")


def run_cell(pg: PwPage, cell: Locator, until: str | re.Pattern[str] | None = None, timeout: float = 120_000) -> None:
    """Select a cell and run it (Shift+Enter), retrying until its prompt shows it ran or runs; with
    ``until``, then wait (``timeout`` ms) for the prompt to read that (``"[1]:"``: it ran first).

    A press is tried again only when, 10 s on, neither the prompt shows it nor the page has sent its
    kernel an execute_request since (on a page count_executes watches): a slow page or kernel is not
    asked to run the cell twice (issue #55, audit M11).  The wait stays short because a fresh page's
    first press is often dropped whole (nothing sent, the prompt blank: 3 fresh pages in 3 here)."""
    prompt = cell.locator(".jp-InputPrompt")
    ran = re.compile(r"\[[*0-9]+\]")
    sent = _EXECUTES.get(pg)
    for attempt in range(3):
        if _dismiss_dialog(pg) and attempt:
            # the press before waited on that dialog (JupyterLab's "Select Kernel"): once it is answered
            # the cell runs, and pressing again would run it twice (a prompt of [2] where [1] was due)
            try:
                sync_api.expect(prompt).to_have_text(ran, timeout=30_000)
                break
            except AssertionError:
                pass
        cell.locator(".jp-InputArea-editor").click()
        sync_api.expect(cell).to_have_class(re.compile(r"\bjp-mod-active\b"))
        before = sent[0] if sent is not None else None
        pg.keyboard.press("Shift+Enter")
        try:
            sync_api.expect(prompt).to_have_text(ran, timeout=10_000)
            break
        except AssertionError:
            if before is not None and sent[0] > before:
                # the press was taken (the request is on its way, or queued at the kernel): its prompt is late
                print(f"lab_harness: the cell's execute_request went out, its prompt still reads {prompt.inner_text()!r}")
                sync_api.expect(prompt).to_have_text(ran, timeout=90_000)
                break
            print(f"lab_harness: Shift+Enter #{attempt + 1} ran nothing: nothing sent, the prompt {prompt.inner_text()!r}")
            continue
    else:
        raise AssertionError(f"the cell did not run: prompt {prompt.inner_text()!r}")
    if until is not None:
        sync_api.expect(prompt).to_have_text(until, timeout=timeout)


# A stdin prompt answer_prompt answered (JupyterLab keeps it drawn for 500 ms after its Enter; the answers
# themselves become stdin stream outputs, and two in a row merge into one, so counting `.jp-Stdin`
# elements says nothing of how many prompts came).
ANSWERED = "data-nbs-answered"


def next_prompt(cell: Locator, timeout: float = 60_000) -> Locator:
    """The cell's stdin prompt (the kernel's input_request) that answer_prompt has not answered yet, once
    there is one: its `.jp-Stdin` box, whose text is the prompt."""
    prompt = cell.locator(".jp-Stdin").filter(has=cell.page.locator(f"input.jp-Stdin-input:not([{ANSWERED}])")).last
    prompt.wait_for(timeout=timeout)
    return prompt


def answer_prompt(cell: Locator, text: str, timeout: float = 60_000) -> None:
    """Type ``text`` into the cell's next prompt (next_prompt) and press Enter, as a user does."""
    box = next_prompt(cell, timeout).locator(f"input.jp-Stdin-input:not([{ANSWERED}])").element_handle()
    box.evaluate(f"el => el.setAttribute('{ANSWERED}', '')")  # the element itself: a locator would lose it
    box.fill(text)
    box.press("Enter")


def _dismiss_dialog(pg: PwPage) -> bool:
    """A JupyterLab dialog open before a cell is clicked (seen now and then on a loaded machine, as a
    fresh server's first page settles its kernel): said on the test's output, then accepted, as a user
    would, so it does not swallow the click.  Whether there was one."""
    dialog = pg.locator(".jp-Dialog")
    if not dialog.count():
        return False
    print(f"lab_harness: a JupyterLab dialog was open: {dialog.first.inner_text()!r}")
    accept = dialog.first.locator(".jp-Dialog-button.jp-mod-accept")
    (accept.first if accept.count() else dialog.first.locator(".jp-Dialog-button").last).click()
    dialog.first.wait_for(state="detached", timeout=ACTION_TIMEOUT_MS)
    return True


# The front ends a test may run in both of, by the name a test gives them: the server app of each.
FRONTS = {"lab": "lab", "nb7": "notebook"}


class Front:
    """One front end (``lab`` or ``nb7``, FRONTS) on a page of its own, a notebook open in it: its cells."""

    def __init__(self, name: str, p: Page, cells: Locator) -> None:
        self.name = name
        self.p = p
        self.pg = p.page
        self.cells = cells

    def cell(self, i: int) -> Locator:
        return self.cells.nth(i)

    def frozen(self, i: int, timeout: float = 120_000) -> Locator:
        """Cell ``i``'s frozen run, once drawn and the cell's execution over."""
        run = frozen_run(self.cell(i), timeout)
        sync_api.expect(self.cell(i).locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"), timeout=30_000)
        return run


# -- run views ----------------------------------------------------------------------------------


def live_view(cell: Locator, timeout: float = 60_000, *, widget: bool = False) -> Locator:
    """The cell's live run view, once drawn; ``widget``: the live widget's own (not a reattached one)."""
    view = cell.locator(WIDGET_VIEW if widget else LIVE_VIEW)
    view.wait_for(timeout=timeout)
    return view


def frozen_run(cell: Locator, timeout: float = 60_000) -> Locator:
    """The cell's frozen run (the renderer's), once drawn."""
    run = cell.locator(FROZEN_RUN)
    run.wait_for(timeout=timeout)
    return run


def chip_statuses(view: Locator) -> list[str | None]:
    """Each rank chip's status in a run view, in rank order."""
    chips = view.locator(".nbs-Chip")
    return [chips.nth(i).get_attribute("data-status") for i in range(chips.count())]


def select_pane(view: Locator, tab: int | str) -> Locator:
    """Select a tab in a run view (a rank, or ``"merged"``); its pane's output, once shown."""
    if tab == "merged":
        view.locator(".nbs-Tab-merged").click()
    else:
        view.locator(f".nbs-Chip[data-rank='{tab}']").click()
    pane = view.locator(f".nbs-Pane[data-rank='{tab}'] .nbs-Output")
    pane.wait_for(timeout=ACTION_TIMEOUT_MS)  # a hang guard: drawn in the next frame (CI: 10 s was not enough once, cores busy)
    return pane


# innerText with every rank line laid out for the read, then left to the page again: a line out of view is
# not laid out (content-visibility: auto) and its innerText is "", though a user scrolling to it reads it
SHOWN_TEXT = """el => {
  const lines = [...el.querySelectorAll('.nbs-Line')];
  lines.forEach(l => l.style.setProperty('content-visibility', 'visible'));
  try { return el.innerText; } finally { lines.forEach(l => l.style.removeProperty('content-visibility')); }
}"""


def shown_text(element: Locator) -> str:
    """``element``'s text as the page shows it (``innerText``), its rank lines out of view included."""
    return element.evaluate(SHOWN_TEXT)


def pane_lines(pane: Locator) -> list[str]:
    """The lines of a pane's flow as text, each as the DOM holds it, whether or not the page laid it out:
    a line out of view is not laid out (``content-visibility: auto``) and Chromium's ``innerText`` of it
    is "" (rehearsal Z read a live merged pane scrolled out of view as no lines at all)."""
    return pane.locator(".nbs-Line").evaluate_all("lines => lines.map(line => line.textContent)")


def wait_for_js(element: Locator, predicate: str, timeout: float = 30_000) -> None:
    """Wait until ``predicate`` (a JavaScript function of the element) holds for ``element``'s node."""
    element.page.wait_for_function(predicate, arg=element.element_handle(), timeout=timeout)


def read_until(pg: PwPage, read: Callable[[], T], holds: Callable[[T], bool], timeout: float = 30_000) -> T:
    """``read()`` once ``holds`` of it is true, read again every 100 ms: what a test asserts, read once the
    page has drawn it (a frame sized, a pane scrolled) rather than after a fixed wait.  At ``timeout`` ms (a
    hang guard) what it reads then, for the test's assertion to say."""
    deadline = time.monotonic() + timeout / 1000
    while True:
        value = read()
        if holds(value) or time.monotonic() > deadline:
            return value
        pg.wait_for_timeout(100)


# JupyterLab marks a document's tab with this while the page holds changes it has not heard saved.
UNSAVED = ".lm-TabBar-tab.jp-mod-dirty"


def save_until(pg: PwPage, path: Path, predicate: Callable[[dict], bool]) -> dict:
    """Ctrl+S until the notebook on disk satisfies ``predicate`` (a save is asynchronous) and the page has
    heard that it is saved (no tab marked unsaved); that notebook.

    The file is on disk before the server's answer reaches the page, which only then marks the document
    saved: a test that closes the tab or reloads the page in between meets the page's unsaved state
    (JupyterLab's "Save your work?" dialog, the browser's leave-page prompt), which waits for a click. The
    likeliest cause of CI's tab that never closed (2026-12-03), not proven. The limit is a hang guard (a
    quiet machine: 1-2 s)."""
    deadline = time.monotonic() + 60
    while True:
        pg.keyboard.press("Control+s")
        pg.wait_for_timeout(1000)
        nb = json.loads(path.read_text())
        if predicate(nb) and not pg.locator(UNSAVED).count():
            return nb
        if time.monotonic() > deadline:
            unsaved = pg.locator(UNSAVED).all_inner_texts()
            raise AssertionError(f"the saved notebook never matched (tabs unsaved: {unsaved}): {json.dumps(nb)[:3000]}")


@dataclass(frozen=True)
class StatusSpells:
    """The kernel's status over one cell's run, as the page showed it (``status_spells``)."""

    run_ms: float  # from the prompt's * to its count
    busy_ms: float  # how much of that the status read Busy
    others: list[tuple[int, str, int]]  # each spell of another status: (ms after the *, status, ms long)


def status_spells(changes: list[list], grace_ms: float, end_race_ms: float = 200) -> StatusSpells:
    """``changes``: ``[ms, status, running]`` at each change of the status or of the cell's prompt
    (running: it shows ``*``).  The run is the first spell of running.  Its first ``grace_ms`` are
    left out (the status before nbspawn's magic runs is the kernel's own), and so are its last
    ``end_race_ms`` (the cell's idle may come before the prompt's count)."""
    start = next((t for t, _s, running in changes if running), None)
    if start is None:
        return StatusSpells(0.0, 0.0, [])
    end = next((t for t, _s, running in changes if not running and t > start), changes[-1][0])
    lo, hi = start + grace_ms, end - end_race_ms
    busy = 0.0
    others: list[tuple[int, str, int]] = []
    for (t, status, _running), (t_next, _n, _r) in zip(changes, [*changes[1:], [end, None, None]], strict=True):
        a, b = max(t, start), min(t_next, end)
        if b <= a:
            continue
        if status == "Busy":
            busy += b - a
            continue
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        if others and others[-1][1] == status and round(a - start) == others[-1][0] + others[-1][2]:
            others[-1] = (others[-1][0], status, others[-1][2] + round(b - a))  # the prompt changed, not the status
        else:
            others.append((round(a - start), status, round(b - a)))
    return StatusSpells(end - start, busy, others)


class KernelStatuses:
    """Every kernel status a page heard on its kernel websockets, in order, with what it answered: the
    evidence when a status bar reads what a test did not expect (the reattach test's first tab read
    Idle beside a second tab, about one run in eight).  Frames are JSON or Jupyter's v1 binary protocol
    (``v1.kernel.websocket.jupyter.org``: a count of offsets, the offsets, then channel, header,
    parent header, metadata, content)."""

    def __init__(self, page: PwPage) -> None:
        self.seen: list[str] = []
        self.started = time.monotonic()
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame) if "/channels" in ws.url else None)

    def _frame(self, payload: str | bytes) -> None:
        try:
            if isinstance(payload, bytes):
                count = int.from_bytes(payload[:8], "little")
                offsets = [int.from_bytes(payload[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
                channel, header, parent, _meta, content = (payload[offsets[i] : offsets[i + 1]] for i in range(5))
                if channel != b"iopub" or b'"status"' not in header:
                    return
                msg = {"header": json.loads(header), "parent_header": json.loads(parent), "content": json.loads(content)}
            else:
                msg = json.loads(payload)
                if msg.get("channel") != "iopub":
                    return
            if msg["header"]["msg_type"] != "status":
                return
            parent = msg.get("parent_header") or {}
            self.seen.append(
                f"{time.monotonic() - self.started:8.3f} s {msg['content'].get('execution_state')} for "
                f"{parent.get('msg_type')} {str(parent.get('msg_id'))[:8]} (session {str(parent.get('session'))[:8]}"
                f"{', subshell ' + str(parent['subshell_id'])[:8] if parent.get('subshell_id') else ''})"
            )
        except Exception as err:  # never fail the page's test for the recorder's sake
            self.seen.append(f"(a frame not read: {err!r})")

    def recent(self, n: int = 30) -> str:
        return "the statuses the page heard, last first:\n" + "\n".join(reversed(self.seen[-n:]))


# -- screenshots ---------------------------------------------------------------------------------


def use_theme(pg: PwPage, theme: str) -> None:
    """Switch the open JupyterLab page to ``theme`` ("JupyterLab Dark", "JupyterLab Light") as a user
    would, from its command palette; the server's settings keep it, so a test switches back."""
    pg.keyboard.press("Escape")
    pg.keyboard.press("Control+Shift+C")
    palette = pg.locator("#command-palette input")
    palette.wait_for(timeout=ACTION_TIMEOUT_MS)
    palette.fill(f"Use Theme: {theme}")
    pg.locator("#command-palette .lm-CommandPalette-item", has_text=f"Use Theme: {theme}").first.click()
    light = "false" if "Dark" in theme else "true"
    pg.wait_for_function(f"document.body.dataset.jpThemeLight === '{light}'", timeout=30_000)
    pg.wait_for_timeout(500)  # the theme's stylesheet applied everywhere


@contextmanager
def dark_theme(pg: PwPage) -> Iterator[None]:
    """The open JupyterLab page in the dark theme for the block, then light again (use_theme)."""
    use_theme(pg, "JupyterLab Dark")
    try:
        yield
    finally:
        use_theme(pg, "JupyterLab Light")


def shot(locator: Locator, artifacts: Path, name: str, *, unhover: bool = False) -> None:
    """A screenshot of one element; ``unhover``: the mouse moved to the page's corner first, so that no
    tooltip or hover style is in the picture."""
    if unhover:
        locator.page.mouse.move(0, 0)
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(artifacts / name), animations="disabled")


def page_shot(pg: PwPage, artifacts: Path, name: str) -> None:
    """A screenshot of the whole page."""
    pg.screenshot(path=str(artifacts / name))


# -- the page's own work, apart from time its renderer waited for a core -------------------------


def renderer_pids() -> list[int]:
    """The renderer processes of the Chromium this test process drives (Playwright's driver, a child of
    this process, starts it): ``--type=renderer`` on their command line, as Chromium starts them."""
    import psutil

    pids = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "--type=renderer" in child.cmdline():
                pids.append(child.pid)
        except psutil.Error:
            pass
    return pids


class RendererCpu:
    """The CPU time each renderer's main thread gets, sampled from ``/proc`` every ``every_s``.

    A long task's duration is wall time: on 2 cores with 16 flooding ranks the renderer's main thread
    can wait for a core for most of a second, in the middle of a 50 ms script. What the page itself
    did in a task is the time its main thread ran in it, which Linux counts per thread
    (``/proc/PID/task/PID/schedstat``, nanoseconds). The renderers are every renderer process of this
    test process's Chromium (``renderer_pids``), so the page's renderer is among them whatever
    Chromium's process model; the page's figure is the largest among them.
    """

    def __init__(self, every_s: float = 0.02) -> None:
        self.pids = renderer_pids()
        if not self.pids:  # every figure would read 0: a page that did no work
            raise RuntimeError("no renderer process of this test process's Chromium was found")
        self._every = every_s
        self._samples: list[tuple[float, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="renderer-cpu", daemon=True)

    def _read(self) -> dict[int, int]:
        ran = {}
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
                    ran[pid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return ran

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._samples.append((time.time(), self._read()))
            self._stop.wait(self._every)

    def __enter__(self) -> RendererCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> dict[int, tuple[int, int]]:
        """Each renderer's main thread now: (ns it has run, ns it has waited on a run queue for a
        core), Linux's own counts (``schedstat``'s first two fields), read at this moment."""
        counts = {}
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
                    ran, waited = f.read().split()[:2]
                counts[pid] = (int(ran), int(waited))
            except (OSError, ValueError):
                pass
        return counts

    @staticmethod
    def page_waited_s(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> float:
        """How long the page's renderer main thread (the one that ran most between the two readings of
        :meth:`now`) waited for a core between them, in seconds: the time it was ready to run and did
        not, every task and every moment between tasks counted, as the kernel's scheduler counts it."""
        common = before.keys() & after.keys()
        if not common:
            return 0.0
        page = max(common, key=lambda pid: after[pid][0] - before[pid][0])
        return (after[page][1] - before[page][1]) / 1e9

    def ran_ms(self, start: float, end: float) -> float:
        """The most any renderer's main thread ran between two moments (epoch seconds), in ms: from
        the last sample at or before ``start`` to the first at or after ``end`` (so at most two sample
        periods more than the truth, never less). ``nan`` when the samples do not cover the span."""
        before = [s for s in self._samples if s[0] <= start]
        after = [s for s in self._samples if s[0] >= end]
        if not before or not after:
            return float("nan")
        (_, a), (_, b) = before[-1], after[0]
        return max((b[p] - a[p] for p in a.keys() & b.keys()), default=0) / 1e6


class PageWork:
    """What a page's main thread itself did, as Chromium counts it (CDP ``Performance.getMetrics``):
    its script, task, layout and style time in seconds of the thread's CPU time, not wall time.

    ``Performance.enable`` with ``timeDomain: "threadTicks"`` makes those durations thread CPU time:
    with the default (``timeTicks``) a 2 s busy script read ScriptDuration 2.0 s whether the renderer
    ran 1.2 s or, beside three busy loops on its core, 0.5 s; with thread ticks it read 1.19 and 0.59 s
    (Chromium 156 here).  A starved renderer so makes these smaller, never larger: a bound on them
    asserts the page's own work, not the speed of a loaded machine."""

    NAMES = ("ScriptDuration", "TaskDuration", "LayoutDuration", "RecalcStyleDuration")

    def __init__(self, pg: PwPage) -> None:
        self.cdp = pg.context.new_cdp_session(pg)
        self.cdp.send("Performance.enable", {"timeDomain": "threadTicks"})

    def now(self) -> dict[str, float]:
        """The page's counts so far, and ``wall`` (this process's monotonic clock), in seconds."""
        metrics = {m["name"]: m["value"] for m in self.cdp.send("Performance.getMetrics")["metrics"]}
        return {"wall": time.monotonic(), **{k: metrics.get(k, 0.0) for k in self.NAMES}}

    @staticmethod
    def between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """Each count's growth between two readings of :meth:`now` (``wall``: the seconds between)."""
        return {k: after[k] - before[k] for k in before}

    def close(self) -> None:
        try:
            self.cdp.send("Performance.disable")
            self.cdp.detach()
        except Exception:  # the page may be gone; nothing to undo then
            pass
