"""A background run stopped with ``%spawn stop`` in a real JupyterLab: stopped everywhere it is shown,
at once (issue #26, item 4).  Its view is replaced by the frozen run with stopped ranks, its ``Out[]``
line is redrawn "stopped", and the next cell has no failure notice: nobody failed, the user stopped it.

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_harness import (
    NEEDS_WIDGET,
    Page,
    chip_statuses,
    frozen_run,
    live_view,
    open_with_nbspawn,
    run_cell,
    serve,
    shot,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

BACKGROUND = """\
%%spawn --bg -n 2
import os, time
for i in range(10_000):
    print("rank", os.environ["RANK"], "tick", i, flush=True)
    time.sleep(0.2)
"""


def _write(root: Path) -> None:
    write_notebook(root, "bg.ipynb", ["%load_ext nbspawn", BACKGROUND, "%spawn stop", "print('the next cell')"])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("bg-lab"), _write)


def test_a_background_run_stopped_with_spawn_stop_is_stopped_everywhere(lab, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "bg.ipynb")
        bg = cells.nth(1)
        run_cell(pg, bg, until="[2]:")  # the cell returns at once; the run goes on
        view = live_view(bg, widget=True)
        sync_api.expect(view.locator(".nbs-Chip[data-status='running']")).to_have_count(2, timeout=30_000)
        out = bg.locator(".jp-OutputArea-output", has_text="nbspawn Run")
        sync_api.expect(out).to_contain_text(" running ")
        shot(bg, artifacts, "background-running.png", unhover=True)

        run_cell(pg, cells.nth(2), until="[3]:")
        sync_api.expect(cells.nth(2).locator(".jp-OutputArea")).to_contain_text("stopped")
        frozen = frozen_run(bg, 30_000)  # the live view, replaced in place
        assert bg.locator(".nbs-mod-live").count() == 0
        assert chip_statuses(frozen) == ["stopped", "stopped"]
        sync_api.expect(out).to_contain_text(re.compile(r" stopped in [\d.]+s "))
        assert " running " not in out.inner_text()

        nxt = cells.nth(3)
        run_cell(pg, nxt, until="[4]:")
        sync_api.expect(nxt.locator(".jp-OutputArea")).to_contain_text("the next cell")
        assert nxt.locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0, nxt.inner_text()
        shot(bg, artifacts, "background-stopped.png", unhover=True)
        shot(cells.nth(2), artifacts, "background-stop-cell.png", unhover=True)
        shot(nxt, artifacts, "background-next-cell.png", unhover=True)
