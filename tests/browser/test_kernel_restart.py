"""A live view whose kernel restarts, in a real JupyterLab (issue #26, item 2): the run ended with its
kernel, and the view must say so, stop its clock and drop its buttons, instead of staying RUNNING with
a ticking clock and dead buttons.  (The live widget's own bundle, nbspawn/_static/widget.js.)

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_harness import (
    NEEDS_WIDGET,
    Page,
    live_view,
    open_with_nbspawn,
    run_cell,
    serve,
    shot,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

FOREVER = """\
%%spawn -n 2
import os, time
for i in range(10_000):
    print("rank", os.environ["RANK"], "tick", i, flush=True)
    time.sleep(0.2)
"""


def _write(root: Path) -> None:
    write_notebook(root, "restart.ipynb", ["%load_ext nbspawn", FOREVER])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("restart-lab"), _write)


def test_a_kernel_restart_ends_the_live_view(lab, browser, artifacts):
    with Page(browser, width=1200, height=900) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "restart.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        view = live_view(cell, widget=True)
        sync_api.expect(view.locator(".nbs-Chip[data-status='running']")).to_have_count(2, timeout=30_000)
        sync_api.expect(view.locator(".nbs-Stop")).to_be_visible()
        sync_api.expect(view).to_contain_text("tick 1", timeout=30_000)  # the run has shown output to keep

        pg.keyboard.press("Escape")  # command mode, then JupyterLab's "restart the kernel" (0, 0)
        pg.keyboard.press("0")
        pg.keyboard.press("0")
        pg.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()

        view = cell.locator(".nbs-Widget")  # no longer a live one
        sync_api.expect(view.locator(".nbs-Lost")).to_have_text("kernel restarted: this run ended with it", timeout=30_000)
        assert view.locator(".nbs-Stop").count() == 0 and view.locator(".nbs-Where-button").count() == 0
        assert view.locator(".nbs-Badge").inner_text().strip().lower() == "ended"
        assert view.locator(".nbs-Chip[data-status='running']").count() == 0  # no rank says it still runs
        assert "running" not in view.locator(".nbs-Header").inner_text()
        clock = view.locator(".nbs-Clock")
        before = clock.inner_text()
        pg.wait_for_timeout(2500)
        assert clock.inner_text() == before, "the clock still ticks after the kernel restarted"
        assert "tick" in view.inner_text()  # what it showed of the run stays
        shot(cell, artifacts, "kernel-restarted.png", unhover=True)
