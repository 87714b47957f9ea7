"""The live widget in a real browser: JupyterLab (and Notebook 7) running `%%spawn` cells for real.

A kernel runs 4 ranks that print lines and redraw a tqdm-style `\\r` bar for a few seconds, one rank
failing; the widget must show the 4 rank chips and their statuses as they change, redraw the bar in
place, select the failed rank's pane with its traceback, tick its clock, and stop the run from its
Stop button while the cell is still running (JupyterLab >= 4.4 sends widget messages on a kernel
subshell).  After a save and a reload, the frozen runs are drawn by the labextension's renderer.

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).  Needs what
test_lab_renderer.py needs: /usr/bin/chromium, playwright (no browser download), the extension built
and installed (`pip install -e ".[test,lab]"`), and nbspawn/_static/widget.js.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    Page,
    code_cell,
    lab_url,
    notebook,
    run_cell,
    serve,
    shot,
    sync_api,
)

from nbspawn.views._widget import widget_available

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not widget_available(), reason="nbspawn/_static/widget.js is not built"),
]

LOAD = "%load_ext nbspawn"

# Four ranks train for ~8 s (rank r a little slower than rank r-1) with a progress bar on stderr and a
# line per 40 %; rank 1 fails at 60 %.  The others are slow to stop (they take SIGTERM as "save a
# checkpoint first"), so for a moment the view shows a failed rank beside running ones, until the
# grace period ends and SIGKILL stops them.
TRAIN = """\
%%spawn -n 4 --grace-period 1.5
import os, signal, sys, time
rank = int(os.environ["RANK"])
signal.signal(signal.SIGTERM, lambda *_: print(f"rank {rank}: SIGTERM, saving a checkpoint first", flush=True))
print(f"rank {rank}: loading <shard-{rank}.bin> \\x1b[32mok\\x1b[0m", flush=True)
for step in range(0, 101, 2):
    bar = "\\u2588" * (step // 10) + " " * (10 - step // 10)
    sys.stderr.write(f"\\rtrain: {step:3d}%|{bar}| {step}/100")
    sys.stderr.flush()
    if step % 40 == 0:
        print(f"step {step:3d}  loss \\x1b[36m{2.0 / (step + 2 + rank):.4f}\\x1b[0m", flush=True)
    if rank == 1 and step == 60:
        raise ValueError("rank 1 diverged: loss is nan")
    time.sleep(0.16 + 0.02 * rank)
sys.stderr.write("\\n")
print("done", flush=True)
"""

# Runs until Stop is clicked.
FOREVER = """\
%%spawn -n 4
import os, time
rank = int(os.environ["RANK"])
for i in range(10_000):
    print(f"rank {rank} tick {i}", flush=True)
    time.sleep(0.2)
"""

# A short run for Notebook 7.
SHORT = """\
%%spawn -n 4
import os, sys, time
rank = int(os.environ["RANK"])
for step in range(0, 101, 10):
    sys.stderr.write(f"\\rprogress {step:3d}%")
    sys.stderr.flush()
    time.sleep(0.2)
print()
print(f"rank {rank} finished")
"""


def _write(root: Path) -> None:
    (root / "live.ipynb").write_text(json.dumps(notebook([code_cell(i, s) for i, s in enumerate([LOAD, TRAIN, FOREVER])])))
    (root / "nb7-live.ipynb").write_text(json.dumps(notebook([code_cell(i, s) for i, s in enumerate([LOAD, SHORT])])))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("live-lab"), _write)


@pytest.fixture(scope="module")
def nb7(tmp_path_factory):
    yield from serve("notebook", tmp_path_factory.mktemp("live-nb7"), _write)


def _statuses(view) -> list[str | None]:
    chips = view.locator(".nbs-Chip")
    return [chips.nth(i).get_attribute("data-status") for i in range(chips.count())]


def _wait(pg, predicate_js: str, arg, timeout: float = 30_000):
    pg.wait_for_function(predicate_js, arg=arg, timeout=timeout)


def test_lab_live_run_stop_and_reload(lab, browser, artifacts):
    p = Page(browser, width=1200, height=1100)
    pg = p.page
    try:
        pg.goto(lab_url(lab, "live.ipynb"))
        panel = pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        cells = panel.locator(".jp-Cell")
        cells.first.wait_for(timeout=90_000)
        panel.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=90_000)
        run_cell(pg, cells.nth(0))
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=120_000)

        # ---- a live run: chips, the clock, the bar redrawn in place ---------------------------------
        train = cells.nth(1)
        run_cell(pg, train)
        view = train.locator(".nbs-Widget .nbs-Run.nbs-mod-live")
        view.wait_for(timeout=60_000)
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(4)
        sync_api.expect(view.locator(".nbs-Chip[data-status='running']")).to_have_count(4, timeout=15_000)
        assert view.locator(".nbs-Badge").inner_text().strip().lower() == "running"
        assert view.locator(".nbs-Stop").is_visible()
        # the merged view first: every rank's lines, colour-coded prefixes
        assert view.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-tab") == "merged"
        _wait(pg, "v => v.querySelectorAll('.nbs-mod-merged .nbs-Line').length >= 12", view.element_handle())
        clock = view.locator(".nbs-Clock")
        first = clock.inner_text()
        pg.wait_for_timeout(1300)
        assert clock.inner_text() != first, "the elapsed-time counter does not tick"

        # rank 0's pane: one bar line, redrawn in place (its percentage moves, no second line appears)
        dialog = pg.locator(".jp-Dialog")
        assert dialog.count() == 0, f"JupyterLab opened a dialog: {dialog.first.inner_text()!r}"
        view.locator(".nbs-Chip[data-rank='0']").click()
        pane = view.locator(".nbs-Pane[data-rank='0'] .nbs-Output")
        seen = []
        for _ in range(4):
            text = pane.inner_text()
            bars = [line for line in text.splitlines() if line.startswith("train:")]
            assert len(bars) == 1, text
            seen.append(bars[0])
            pg.wait_for_timeout(300)
        assert len(set(seen)) >= 3, seen  # it moved
        assert "\r" not in text and "\x1b" not in text and "[32m" not in text
        assert "rank 0: loading <shard-0.bin> ok" in text  # markup stays text
        assert pane.locator(".nbs-Line-text *:not(span)").count() == 0
        green = pane.locator(".nbs-fg-2").first
        assert green.inner_text() == "ok"
        assert pane.locator(".nbs-Line.nbs-stderr").count() == 1  # the bar, marked as stderr
        view.locator(".nbs-Tab-merged").click()
        pg.mouse.move(0, 0)
        shot(view, artifacts, "live-running.png")

        # ---- rank 1 fails: its chip, its pane selected with the traceback, the others still going ----
        failed = view.locator(".nbs-Chip[data-rank='1'][data-status='failed']")
        failed.wait_for(timeout=30_000)
        assert "ValueError" in failed.inner_text()
        sync_api.expect(view.locator(".nbs-Tab[aria-selected='true']")).to_have_attribute("data-rank", "1")
        tb = view.locator(".nbs-Pane[data-rank='1'] .nbs-Traceback")
        sync_api.expect(tb).to_be_visible()
        assert "ValueError: rank 1 diverged: loss is nan" in tb.inner_text()
        assert "Cell In[2], line 13" in tb.inner_text()
        assert "running" in _statuses(view)  # the others are being stopped, not yet gone
        pg.mouse.move(0, 0)
        shot(view, artifacts, "live-failed-rank.png")

        # ---- the end: the live view is replaced in place by the frozen run --------------------------
        frozen = train.locator(".nbs-RunRenderer .nbs-Run")
        frozen.wait_for(timeout=30_000)
        assert train.locator(".nbs-mod-live").count() == 0
        assert _statuses(frozen) == ["stopped", "failed", "stopped", "stopped"]
        assert frozen.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "1"
        sync_api.expect(train.locator(".jp-OutputArea")).to_contain_text("RankRaisedError")
        frozen.locator(".nbs-Chip[data-rank='0']").click()
        bars = [line for line in frozen.locator(".nbs-Output").inner_text().splitlines() if line.startswith("train:")]
        assert len(bars) == 1, bars
        frozen.locator(".nbs-Chip[data-rank='1']").click()
        pg.mouse.move(0, 0)
        shot(frozen, artifacts, "frozen-after-run.png")

        # ---- Stop, mid-run -------------------------------------------------------------------------
        forever = cells.nth(2)
        run_cell(pg, forever)
        live = forever.locator(".nbs-Run.nbs-mod-live")
        live.wait_for(timeout=60_000)
        _wait(pg, "v => (v.textContent.match(/tick \\d+/g) || []).length >= 8", live.element_handle())
        stop = live.locator(".nbs-Stop")
        stop.click()
        clicked = time.monotonic()
        # the button says it is stopping, unless the run was already over and frozen by then
        _wait(
            pg,
            "c => !!c.querySelector('.nbs-RunRenderer .nbs-Run') || /Stopping/.test(c.querySelector('.nbs-Stop')?.textContent || '')",
            forever.element_handle(),
        )
        frozen2 = forever.locator(".nbs-RunRenderer .nbs-Run")
        frozen2.wait_for(timeout=20_000)
        took = time.monotonic() - clicked
        assert took < 10, took
        assert _statuses(frozen2) == ["stopped"] * 4
        assert frozen2.locator(".nbs-Badge").inner_text().strip().lower() == "stopped"
        sync_api.expect(forever.locator(".jp-OutputArea")).to_contain_text("the run was stopped (Stop button)")
        sync_api.expect(forever.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"))
        pg.mouse.move(0, 0)
        shot(frozen2, artifacts, "frozen-stopped.png")

        # ---- save, reload: the labextension draws the frozen runs, no widget needed ------------------
        pg.keyboard.press("Control+s")
        pg.wait_for_timeout(1500)
        pg.reload()
        panel = pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        runs = panel.locator(".nbs-RunRenderer .nbs-Run")
        runs.first.wait_for(timeout=90_000)
        sync_api.expect(runs).to_have_count(2)
        assert panel.locator(".nbs-mod-live").count() == 0
        reloaded = runs.nth(0)
        assert _statuses(reloaded) == ["stopped", "failed", "stopped", "stopped"]
        assert reloaded.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "1"
        assert "ValueError: rank 1 diverged" in reloaded.locator(".nbs-Traceback").inner_text()
        assert _statuses(runs.nth(1)) == ["stopped"] * 4
        pg.mouse.move(0, 0)
        shot(reloaded, artifacts, "frozen-reloaded.png")
        pg.screenshot(path=str(artifacts / "live-lab-page.png"))
        assert p.dialogs == [], p.dialogs
        assert not [e for e in p.errors if "nbs" in e or "anywidget" in e], p.errors
    finally:
        p.close()


def test_notebook7_live_widget(nb7, browser, artifacts):
    p = Page(browser, width=1200, height=1000)
    try:
        p.page.goto(nb7.url("/notebooks/nb7-live.ipynb"))
        pg = p.page
        cells = pg.locator(".jp-Cell")
        cells.first.wait_for(timeout=90_000)
        pg.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=90_000)
        run_cell(pg, cells.nth(0))
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=120_000)
        run_cell(pg, cells.nth(1))
        view = cells.nth(1).locator(".nbs-Run.nbs-mod-live")
        view.wait_for(timeout=60_000)
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(4)
        _wait(pg, "v => /progress\\s+\\d+%/.test(v.textContent)", view.element_handle())
        pg.mouse.move(0, 0)
        shot(view, artifacts, "nb7-live.png")
        frozen = cells.nth(1).locator(".nbs-RunRenderer .nbs-Run")
        frozen.wait_for(timeout=30_000)
        assert _statuses(frozen) == ["done"] * 4
        text = frozen.locator(".nbs-Output").inner_text()
        assert all(f"rank {r} finished" in text for r in range(4))
        assert text.count("progress 100%") == 4 and "progress  50%" not in text
        shot(frozen, artifacts, "nb7-frozen.png")
        assert p.dialogs == []
    finally:
        p.close()
