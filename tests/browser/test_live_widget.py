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

import re
import time
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    NEEDS_WIDGET,
    Page,
    chip_statuses,
    frozen_run,
    live_view,
    notebook_root,
    open_with_nbspawn,
    page_shot,
    run_cell,
    serve,
    shot,
    sync_api,
    wait_for_js,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

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
    write_notebook(root, "live.ipynb", [LOAD, TRAIN, FOREVER])
    write_notebook(root, "nb7-live.ipynb", [LOAD, SHORT])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("live-lab"), _write)


@pytest.fixture(scope="module")
def nb7(tmp_path_factory):
    yield from serve("notebook", tmp_path_factory.mktemp("live-nb7"), _write)


def test_lab_live_run_stop_and_reload(lab, browser, artifacts):
    with Page(browser, width=1200, height=1100) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "live.ipynb")

        # ---- a live run: chips, the clock, the bar redrawn in place ---------------------------------
        train = cells.nth(1)
        run_cell(pg, train)
        view = live_view(train, widget=True)
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(4)
        sync_api.expect(view.locator(".nbs-Chip[data-status='running']")).to_have_count(4, timeout=15_000)
        assert view.locator(".nbs-Badge").inner_text().strip().lower() == "running"
        assert view.locator(".nbs-Stop").is_visible()
        # the merged view first: every rank's lines, colour-coded prefixes
        assert view.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-tab") == "merged"
        wait_for_js(view, "v => v.querySelectorAll('.nbs-mod-merged .nbs-Line').length >= 12")
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
        shot(view, artifacts, "live-running.png", unhover=True)

        # ---- rank 1 fails: its chip, its pane selected with the traceback, the others still going ----
        failed = view.locator(".nbs-Chip[data-rank='1'][data-status='failed']")
        failed.wait_for(timeout=30_000)
        assert "ValueError" in failed.inner_text()
        sync_api.expect(view.locator(".nbs-Tab[aria-selected='true']")).to_have_attribute("data-rank", "1")
        tb = view.locator(".nbs-Pane[data-rank='1'] .nbs-Traceback")
        sync_api.expect(tb).to_be_visible()
        assert "ValueError: rank 1 diverged: loss is nan" in tb.inner_text()
        assert "Cell In[2], line 13" in tb.inner_text()
        assert "running" in chip_statuses(view)  # the others are being stopped, not yet gone
        shot(view, artifacts, "live-failed-rank.png", unhover=True)

        # ---- the end: the live view is replaced in place by the frozen run --------------------------
        frozen = frozen_run(train, 30_000)
        assert train.locator(".nbs-mod-live").count() == 0
        assert chip_statuses(frozen) == ["stopped", "failed", "stopped", "stopped"]
        assert frozen.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "1"
        sync_api.expect(train.locator(".jp-OutputArea")).to_contain_text("RankRaisedError")
        frozen.locator(".nbs-Chip[data-rank='0']").click()
        bars = [line for line in frozen.locator(".nbs-Output").inner_text().splitlines() if line.startswith("train:")]
        assert len(bars) == 1, bars
        frozen.locator(".nbs-Chip[data-rank='1']").click()
        shot(frozen, artifacts, "frozen-after-run.png", unhover=True)

        # ---- Stop, mid-run -------------------------------------------------------------------------
        forever = cells.nth(2)
        run_cell(pg, forever)
        live = live_view(forever)
        wait_for_js(live, "v => (v.textContent.match(/tick \\d+/g) || []).length >= 8")
        stop = live.locator(".nbs-Stop")
        stop.click()
        clicked = time.monotonic()
        # the button says it is stopping, unless the run was already over and frozen by then
        wait_for_js(
            forever,
            "c => !!c.querySelector('.nbs-RunRenderer .nbs-Run') || /Stopping/.test(c.querySelector('.nbs-Stop')?.textContent || '')",
        )
        frozen2 = frozen_run(forever, 20_000)
        took = time.monotonic() - clicked
        assert took < 10, took
        assert chip_statuses(frozen2) == ["stopped"] * 4
        assert frozen2.locator(".nbs-Badge").inner_text().strip().lower() == "stopped"
        sync_api.expect(forever.locator(".jp-OutputArea")).to_contain_text("the run was stopped (Stop button)")
        sync_api.expect(forever.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"))
        shot(frozen2, artifacts, "frozen-stopped.png", unhover=True)

        # ---- save, reload: the labextension draws the frozen runs, no widget needed ------------------
        pg.keyboard.press("Control+s")
        pg.wait_for_timeout(1500)
        pg.reload()
        panel = notebook_root(pg, lab)
        runs = panel.locator(".nbs-RunRenderer .nbs-Run")
        runs.first.wait_for(timeout=90_000)
        sync_api.expect(runs).to_have_count(2)
        assert panel.locator(".nbs-mod-live").count() == 0
        reloaded = runs.nth(0)
        assert chip_statuses(reloaded) == ["stopped", "failed", "stopped", "stopped"]
        assert reloaded.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "1"
        assert "ValueError: rank 1 diverged" in reloaded.locator(".nbs-Traceback").inner_text()
        assert chip_statuses(runs.nth(1)) == ["stopped"] * 4
        shot(reloaded, artifacts, "frozen-reloaded.png", unhover=True)
        page_shot(pg, artifacts, "live-lab-page.png")
        assert p.dialogs == [], p.dialogs
        assert not p.nbspawn_errors(), p.errors


def test_notebook7_live_widget(nb7, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, nb7, "nb7-live.ipynb")
        run_cell(pg, cells.nth(1))
        view = live_view(cells.nth(1))
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(4)
        wait_for_js(view, "v => /progress\\s+\\d+%/.test(v.textContent)")
        shot(view, artifacts, "nb7-live.png", unhover=True)
        frozen = frozen_run(cells.nth(1), 30_000)
        assert chip_statuses(frozen) == ["done"] * 4
        text = frozen.locator(".nbs-Output").inner_text()
        assert all(f"rank {r} finished" in text for r in range(4))
        assert text.count("progress 100%") == 4 and "progress  50%" not in text
        shot(frozen, artifacts, "nb7-frozen.png")
        assert p.dialogs == []
