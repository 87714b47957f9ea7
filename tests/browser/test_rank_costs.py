"""What each rank costs, in real JupyterLab (issue #44): while the cell runs each running rank's chip
shows the memory it holds and its pane head its CPU and memory, and the header the ranks' total
against the machine's; the saved view keeps each rank's peak.

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_harness import NEEDS_WIDGET, Page, frozen_run, live_view, open_with_nbspawn, run_cell, serve, shot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

# rank 1 holds 400 MB (written: resident) for about 8 s; rank 0 holds nothing of note
HOLDS = """\
%%spawn -n 2 --backend gloo
import os, time, torch
held = torch.ones(100_000_000) if int(os.environ["RANK"]) == 1 else None
for step in range(8):
    print("step", step)
    time.sleep(1)
"""
SIZE = re.compile(r"^\d+(\.\d)? (MB|GB)$")


def _write(root: Path) -> None:
    write_notebook(root, "costs.ipynb", ["%load_ext nbspawn", HOLDS])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("costs-lab"), _write)


def _megabytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * (1000 if unit == "GB" else 1)


def test_the_chips_and_header_show_each_ranks_memory_live_and_the_saved_view_its_peak(lab, browser, artifacts):
    with Page(browser, width=1100, height=700) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "costs.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        view = live_view(cell, widget=True)
        cost = view.locator(".nbs-Chip[data-rank='1'] .nbs-Chip-cost")
        # the chip is drawn again as its figures change: looked up anew each time
        pg.wait_for_function(
            """() => {
              const el = document.querySelector(".nbs-Chip[data-rank='1'] .nbs-Chip-cost");
              return el && (/^\\d+(\\.\\d)? GB$/.test(el.textContent) || parseFloat(el.textContent) >= 400);
            }""",
            timeout=60_000,
        )
        one, zero = cost.inner_text(), view.locator(".nbs-Chip[data-rank='0'] .nbs-Chip-cost").inner_text()
        assert SIZE.match(one) and SIZE.match(zero), (one, zero)
        assert _megabytes(one) - _megabytes(zero) >= 360, (one, zero)  # rank 1's 400 MB, seen at a glance
        memory = view.locator(".nbs-Meta", has=pg.locator(".nbs-Meta-label", has_text="memory"))
        assert re.match(r"^ranks \d.* · .* of .* in use$", memory.locator(".nbs-Meta-value").inner_text()), memory.inner_text()
        view.locator(".nbs-Chip[data-rank='1']").click()
        facts = view.locator(".nbs-Pane[data-rank='1'] .nbs-Pane-facts")
        facts.wait_for(timeout=10_000)
        pg.wait_for_function(
            "() => /CPU \\d+%/.test(document.querySelector(\".nbs-Pane[data-rank='1'] .nbs-Pane-facts\")?.textContent ?? '')",
            timeout=10_000,
        )
        shot(view, artifacts, "costs-live.png", unhover=True)

        saved = frozen_run(cell, timeout=120_000)
        shot(saved, artifacts, "costs-saved.png", unhover=True)
        assert saved.locator(".nbs-Chip-cost").count() == 0  # ended: no "now" figure
        title = saved.locator(".nbs-Chip[data-rank='1']").get_attribute("title") or ""
        assert re.search(r"peak \d", title), title
        peak = saved.locator(".nbs-Meta", has=pg.locator(".nbs-Meta-label", has_text="memory")).inner_text()
        assert re.search(r"peak \d.* of \d", peak), peak
