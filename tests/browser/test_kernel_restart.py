"""A live view whose kernel restarts, in a real JupyterLab (issue #26, item 2): the run ended with its
kernel, and the view must say so, stop its clock and drop its buttons, instead of staying RUNNING with
a ticking clock and dead buttons.  (The live widget's own bundle, nbspawn/_static/widget.js.)

The clock stops at the run's length when the kernel went (issue #40, item 8): from the run's start (the
kernel's clock, which is this page's here) to the moment the page learnt the kernel was going, not its
last tick, which may be a second old, or more on a busy page.

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_harness import (
    NEEDS_WIDGET,
    Page,
    dark_theme,
    live_view,
    open_with_nbspawn,
    run_cell,
    save_until,
    serve,
    shot,
    shown_text,
    sync_api,
    write_notebook,
)

LIVE_MIME = "application/vnd.nbspawn.live+json"
# The page busy for 2.5 s (no timer fires, as on a page drawing a flood), then the restart accepted:
# the clock's last tick is then at least 2 s old.  When the accept was clicked, on this page's clock.
BUSY_THEN_RESTART = """() => {
    const t = performance.now();
    while (performance.now() - t < 2500) {}
    const now = Date.now() / 1000;
    document.querySelector('.jp-Dialog .jp-Dialog-button.jp-mod-accept').click();
    return now;
}"""

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
        saved = save_until(pg, lab.root / "restart.ipynb", lambda nb: LIVE_MIME in str(nb["cells"][1]["outputs"]))
        started = next(o["data"][LIVE_MIME]["started_at"] for o in saved["cells"][1]["outputs"] if LIVE_MIME in o["data"])
        sync_api.expect(view.locator(".nbs-Clock")).to_have_text(re.compile(r"^([3-9]|\d\d+) s$"), timeout=30_000)

        pg.keyboard.press("Escape")  # command mode, then JupyterLab's "restart the kernel" (0, 0)
        pg.keyboard.press("0")
        pg.keyboard.press("0")
        pg.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").wait_for()
        # when the page learned of the restart (the view said it ended), on the page's clock: the clock's
        # upper bound, whatever a loaded machine took to tell the page (issue #55)
        pg.evaluate(
            """() => {
                window.__nbsLostAt = null;
                new MutationObserver((_, o) => {
                    if (document.querySelector('.nbs-Lost')) { window.__nbsLostAt = Date.now() / 1000; o.disconnect(); }
                }).observe(document, {subtree: true, childList: true, characterData: true});
            }"""
        )
        ended = pg.evaluate(BUSY_THEN_RESTART)

        view = cell.locator(".nbs-Widget")  # no longer a live one
        sync_api.expect(view.locator(".nbs-Lost")).to_have_text("kernel restarted: this run ended with it", timeout=30_000)
        assert view.locator(".nbs-Stop").count() == 0 and view.locator(".nbs-Where-button").count() == 0
        assert view.locator(".nbs-Badge").inner_text().strip().lower() == "ended"
        assert view.locator(".nbs-Chip[data-status='running']").count() == 0  # no rank says it still runs
        assert "running" not in view.locator(".nbs-Header").inner_text()
        clock = view.locator(".nbs-Clock")
        before = clock.inner_text()
        # the run's length when the kernel went, whole seconds as the clock counts them
        shown = int(re.fullmatch(r"(\d+) s", before)[1])
        lost_at = pg.evaluate("window.__nbsLostAt")
        assert ended - started - 1 < shown <= lost_at - started + 0.5, (before, ended - started, lost_at - started)
        pg.wait_for_timeout(2500)
        assert clock.inner_text() == before, "the clock still ticks after the kernel restarted"
        assert "tick" in shown_text(view)  # what it showed of the run stays
        shot(cell, artifacts, "kernel-restarted.png", unhover=True)
        with dark_theme(pg):
            shot(cell, artifacts, "kernel-restarted-dark.png", unhover=True)
