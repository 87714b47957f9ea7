"""A hung run in a real browser (JupyterLab): the live hang signal on the ranks' chips, the Where
button's answer, and the verdict once Stop ends the run.

Four ranks: 0, 1 and 3 wait in a barrier that rank 2 never enters.  With no option given, a few seconds
into the silence the chips of the waiting ranks turn amber ("waiting in barrier #1 for N s"), and rank
2's says it has not entered it; Where? (sent on the kernel's subshell, as Stop is) shows every rank's
stack, grouped; Stop ends the run and the cell's error starts with the verdict.  Screenshots go to
test-artifacts/browser/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lab_harness import Page, code_cell, lab_url, notebook, run_cell, serve, shot, sync_api

from nbspawn.views._widget import widget_available

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not widget_available(), reason="nbspawn/_static/widget.js is not built"),
]

HANG = """\
%%spawn -n 4 --backend gloo
import time
import torch.distributed as dist
if dist.get_rank() != 2:
    dist.barrier()
else:
    time.sleep(300)
"""


def _write(root: Path) -> None:
    (root / "hang.ipynb").write_text(json.dumps(notebook([code_cell(i, s) for i, s in enumerate(["%load_ext nbspawn", HANG])])))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("hang-lab"), _write)


def test_a_hang_is_seen_live_asked_where_and_explained(lab, browser, artifacts):
    p = Page(browser, width=1200, height=1000)
    pg = p.page
    try:
        pg.goto(lab_url(lab, "hang.ipynb"))
        panel = pg.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        cells = panel.locator(".jp-Cell")
        cells.first.wait_for(timeout=90_000)
        panel.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=90_000)
        run_cell(pg, cells.nth(0))
        sync_api.expect(cells.nth(0).locator(".jp-InputPrompt")).to_have_text("[1]:", timeout=120_000)

        hang = cells.nth(1)
        run_cell(pg, hang)
        view = hang.locator(".nbs-Widget .nbs-Run.nbs-mod-live")
        view.wait_for(timeout=60_000)

        # ---- the live signal: amber chips within a few seconds, no option given --------------------
        waiting = view.locator(".nbs-Chip.nbs-mod-waiting")
        sync_api.expect(waiting).to_have_count(4, timeout=20_000)
        for rank in (0, 1, 3):
            chip = view.locator(f".nbs-Chip[data-rank='{rank}']")
            assert re.match(r"waiting in barrier #1 for \d+ s", chip.locator(".nbs-Chip-detail").inner_text()), chip.inner_text()
            assert "rank 2 has not entered it" in (chip.get_attribute("title") or "")
        absent = view.locator(".nbs-Chip[data-rank='2']")
        assert absent.locator(".nbs-Chip-detail").inner_text() == "has not entered barrier #1"
        assert "Cell In[2], line 7: time.sleep(300)" in (absent.get_attribute("title") or "")

        # ---- Where? : every rank's stack, grouped ---------------------------------------------------
        view.locator(".nbs-Where-button").click()
        answer = view.locator(".nbs-Where-text")
        sync_api.expect(answer).to_contain_text("ranks 0-1,3: Cell In[2], line 5: dist.barrier()", timeout=20_000)
        text = answer.inner_text()
        assert re.search(r"\[in barrier #1 for \d+ s\]", text), text
        assert "rank 2: Cell In[2], line 7: time.sleep(300)" in text
        pg.mouse.move(0, 0)
        shot(view, artifacts, "hang-live-where.png")
        view.locator(".nbs-Where-close").click()
        sync_api.expect(view.locator(".nbs-Where")).to_be_hidden()

        # ---- Stop: the verdict heads the error -----------------------------------------------------
        view.locator(".nbs-Stop").click()
        frozen = hang.locator(".nbs-RunRenderer .nbs-Run")
        frozen.wait_for(timeout=60_000)
        output = hang.locator(".jp-OutputArea")
        sync_api.expect(output).to_contain_text("Hang: rank 2 never entered barrier #1", timeout=30_000)
        assert hang.locator(".nbs-mod-waiting").count() == 0  # the frozen run has no live notes
        pg.mouse.move(0, 0)
        shot(hang, artifacts, "hang-stopped.png")
    finally:
        p.close()
