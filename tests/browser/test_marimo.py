"""nbspawn in a marimo notebook (issue #46), in a real Chromium against a real ``marimo edit``.

marimo has no cell magics and no Jupyter comms: ``nbspawn.spawn`` (torch's own call) is how a marimo
cell starts ranks, and its view is the run's panes in the cell's output (``views._marimo``). Each
test writes a marimo notebook, serves it with ``marimo edit --headless``, presses Run all, and reads
the page as a user would:

- a function defined in a marimo cell runs under spawn and forkserver; its ranks' lines appear in the
  cell while it runs (the run says "running"), and the finished run stays as the cell's output;
- a failing rank is shown as marimo shows errors: the rank, its exception, its line in the cell;
- marimo's interrupt button (its Stop) stops the ranks: the cell says so and no rank is left.

Screenshots go to test-artifacts/browser/marimo-*.png.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from lab_harness import Page, shown_text, sync_api

pytest.importorskip("marimo", reason="marimo is not installed (pip install -e '.[marimo]')")
pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

RUN_ALL = "[data-testid='chrome-controls-bottom-right'] [data-testid='run-button']"
INTERRUPT = "[data-testid='interrupt-button']"
RUN_VIEW = ".nbspawn-run"
OUTDATED = "[data-testid='cell-status'][data-status='outdated']"


def _notebook(cells: list[str]) -> str:
    """A marimo notebook's file: each cell a function whose arguments are the names it reads."""
    body = "\n\n".join(
        f"@app.cell\ndef _({', '.join(reads)}):\n{textwrap.indent(textwrap.dedent(code).strip(), '    ')}\n    return{(' ' + ', '.join(binds) + ',') if binds else ''}\n"
        for reads, code, binds in cells
    )
    return f"import marimo\n\napp = marimo.App()\n\n\n{body}\n\nif __name__ == '__main__':\n    app.run()\n"


def _write(tmp_path: Path, name: str, call: str, fn: str) -> Path:
    path = tmp_path / name
    path.write_text(
        _notebook(
            [
                ((), "import nbspawn\nimport time", ("nbspawn", "time")),
                (("time",), fn, ("work",)),
                (("nbspawn", "work"), call, ()),
            ]
        )
    )
    return path


@contextmanager
def marimo_edit(path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``marimo edit --headless`` of ``path`` on a free port of 127.0.0.1: its URL and its process."""
    port = _free_port()
    log = open(path.with_suffix(".log"), "w")  # noqa: SIM115 - closed below, after the server
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marimo",
            "edit",
            str(path),
            "--headless",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-token",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=path.parent,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"marimo edit did not serve {url}: {path.with_suffix('.log').read_text()[-2000:]}"
                    ) from None
                time.sleep(0.3)
        yield url, server
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _ranks_of(server: subprocess.Popen) -> list[psutil.Process]:
    """The processes below marimo's kernel (the server's child), multiprocessing's fork server and
    resource tracker aside: the ranks."""
    found = []
    for kernel in psutil.Process(server.pid).children():
        for p in kernel.children(recursive=True):
            try:
                line = " ".join(p.cmdline())
                if "resource_tracker" not in line and "forkserver" not in line and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _open_and_run_all(browser, url: str):
    """A page of the notebook, its cells run: Run all, once the kernel has said each cell is not run yet
    (a click before it connects does nothing)."""
    page = Page(browser, width=1200, height=1100)
    pg = page.page
    pg.goto(url)
    outdated = pg.locator(OUTDATED)
    sync_api.expect(outdated).to_have_count(3, timeout=60_000)
    pg.locator(RUN_ALL).click()
    sync_api.expect(outdated).to_have_count(0, timeout=30_000)
    return page, pg


# with ``seen`` (a flag file's path), each rank holds after step 1 until the test has looked at the live
# run (120 s at most): 8 steps of 0.6 s were all that look had (issue #55, audit M34)
WORK = """
def work(rank, steps, seen=None):
    import os
    for step in range(steps):
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.6)
        if step == 1 and seen:
            until = time.monotonic() + 120
            while not os.path.exists(seen) and time.monotonic() < until:
                time.sleep(0.05)
    return rank * 100
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_marimo_cells_function_runs_on_every_rank_live_and_the_run_stays_as_the_cells_output(
    browser, artifacts, tmp_path, method
):
    path = _write(
        tmp_path,
        f"live_{method}.py",
        f"returned = nbspawn.spawn(work, args=(8, {str(tmp_path / 'seen.flag')!r}), nprocs=2, start_method={method!r})\n"
        "print('returned', returned)",
        WORK,
    )
    with marimo_edit(path) as (url, server):
        page, pg = _open_and_run_all(browser, url)
        try:
            run = pg.locator(RUN_VIEW)
            sync_api.expect(run).to_contain_text("rank 1 step 1", timeout=60_000)
            live = shown_text(run)
            assert "running" in live, live  # drawn while the ranks run, not only at the end
            pg.screenshot(path=str(artifacts / f"marimo-live-{method}.png"))
            (tmp_path / "seen.flag").write_text("")  # the ranks go on
            sync_api.expect(run).to_contain_text("succeeded", timeout=60_000)
            sync_api.expect(pg.locator("[data-testid='console-output-area']")).to_contain_text(
                "returned [0, 100]", timeout=30_000
            )
            done = shown_text(run)
            assert all(f"rank {r} step 7" in done for r in range(2)), done
            pg.screenshot(path=str(artifacts / f"marimo-done-{method}.png"))
            assert _ranks_of(server) == []
        finally:
            page.close()


def test_a_failing_rank_shows_as_marimo_shows_errors_at_the_cells_line(browser, artifacts, tmp_path):
    fn = """
def work(rank):
    if rank == 1:
        raise ValueError("rank one broke")
    return rank
"""
    path = _write(tmp_path, "failing.py", "nbspawn.spawn(work, nprocs=2, start_method='spawn')", fn)
    with marimo_edit(path) as (url, server):
        page, pg = _open_and_run_all(browser, url)
        try:
            error = pg.get_by_text("RankRaisedError").first
            sync_api.expect(error).to_be_visible(timeout=60_000)
            text = pg.inner_text("body")
            assert "rank 1" in text and "ValueError: rank one broke" in text, text[-3000:]
            assert 'raise ValueError("rank one broke")' in text, text[-3000:]  # the rank's line, from the marimo cell
            pg.screenshot(path=str(artifacts / "marimo-failed.png"), full_page=True)
            assert _ranks_of(server) == []
        finally:
            page.close()


def test_marimos_stop_button_stops_the_ranks(browser, artifacts, tmp_path):
    path = _write(tmp_path, "stopped.py", "nbspawn.spawn(work, args=(10_000,), nprocs=2, start_method='spawn')", WORK)
    with marimo_edit(path) as (url, server):
        page, pg = _open_and_run_all(browser, url)
        try:
            # a hang guard: marimo's kernel, torch and the ranks start first (CI missed 60 s once, cores busy)
            sync_api.expect(pg.locator(RUN_VIEW)).to_contain_text("rank 1 step 2", timeout=180_000)
            assert len(_ranks_of(server)) == 2
            pg.locator(INTERRUPT).click()
            sync_api.expect(pg.get_by_text("SpawnInterrupted").first).to_be_visible(timeout=30_000)
            text = pg.inner_text("body")
            assert "the ranks were stopped" in text, text[-3000:]
            assert "fn(int(os.environ" not in text, text[-3000:]  # where they were: the user's function, not nbspawn's call
            pg.screenshot(path=str(artifacts / "marimo-stopped.png"), full_page=True)
            deadline = time.monotonic() + 30  # a hang guard
            while _ranks_of(server) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _ranks_of(server) == []
        finally:
            page.close()


def test_launch_draws_its_run_in_a_marimo_cell_too(browser, artifacts, tmp_path):
    """``nbspawn.launch`` (a cell's source on every rank) takes marimo's view by itself."""
    path = _write(
        tmp_path,
        "launched.py",
        "run = nbspawn.launch(\"import os, time\\nfor i in range(3):\\n    print('launched on', os.environ['RANK'], i)\\n    time.sleep(0.5)\", nprocs=2, start_method='fork')",
        "work = None",
    )
    with marimo_edit(path) as (url, server):
        page, pg = _open_and_run_all(browser, url)
        try:
            run = pg.locator(RUN_VIEW)
            sync_api.expect(run).to_contain_text("succeeded", timeout=60_000)
            text = shown_text(run)
            assert "launched on 1 2" in text and "launched on 0 2" in text, text
            pg.screenshot(path=str(artifacts / "marimo-launch.png"))
            assert _ranks_of(server) == []
        finally:
            page.close()
