"""The ranks a root cause takes down, drawn as such in a real browser (JupyterLab, light and dark).

Four gloo ranks: rank 2 raises, and 0, 1 and 3, waiting in a barrier, fail as it leaves (gloo's
"Connection closed by peer [127.0.0.1]:port" or "Read error ... Connection reset by peer").  Their chips
read "after rank 2" in a muted style (not red, not the exception: the root cause is the one red chip),
the header "1 failed · 3 after it", and the cell's error folds torch's frames under the cell's line.
Screenshots go to test-artifacts/browser/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    NEEDS_WIDGET,
    Page,
    chip_statuses,
    dark_theme,
    frozen_run,
    open_with_nbspawn,
    run_cell,
    serve,
    shot,
    sync_api,
    write_notebook,
    write_settings,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_WIDGET]

ROOT_CAUSE = """\
%%spawn -n 4 --backend gloo
import torch.distributed as dist
if dist.get_rank() == 2:
    raise ValueError('rank 2 has a bug')
dist.barrier()
"""


def _write(root: Path) -> None:
    write_notebook(root, "after-light.ipynb", ["%load_ext nbspawn", ROOT_CAUSE])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("after-lab"), _write)


def test_ranks_a_root_cause_took_down_read_after_it(lab, browser, artifacts):
    """Read in the light theme, then again once the user switched JupyterLab to its dark one (one run
    for both: issue #55)."""
    settings = lab.settings
    write_settings(settings, theme="JupyterLab Light")
    try:
        with Page(browser, width=1200, height=1000) as p:
            pg = p.page
            cells = open_with_nbspawn(pg, lab, "after-light.ipynb")
            cell = cells.nth(1)
            run_cell(pg, cell)
            run = frozen_run(cell, timeout=120_000)  # the run is over in a second: its live view may come and go unseen
            sync_api.expect(run.locator(".nbs-Chip[data-status='failed_after']")).to_have_count(3, timeout=30_000)

            assert chip_statuses(run) == ["failed_after", "failed_after", "failed", "failed_after"]
            for rank in (0, 1, 3):
                chip = run.locator(f".nbs-Chip[data-rank='{rank}']")
                assert chip.locator(".nbs-Chip-detail").inner_text() == "after rank 2"
                assert (chip.get_attribute("title") or "").startswith(f"rank {rank}: failed after rank 2")
            assert "ValueError: rank 2 has a bug" in run.locator(".nbs-Chip[data-rank='2']").inner_text()
            assert "1 failed · 3 after it" in run.locator(".nbs-Header-counts").inner_text()

            def muted(theme: str) -> None:
                """The root cause's chip is the only one drawn in the error colour."""
                colour = "e => getComputedStyle(e.querySelector('.nbs-Chip-detail')).color"
                root, after = (
                    run.locator(".nbs-Chip[data-rank='2']").evaluate(colour),
                    run.locator(".nbs-Chip[data-rank='0']").evaluate(colour),
                )
                assert root != after, (theme, root, after)
                shot(run, artifacts, f"failed-after-{theme}.png", unhover=True)

            muted("light")
            # a taken-down rank's pane: its status in words, its traceback folded under the cell's line
            run.locator(".nbs-Chip[data-rank='0']").click()
            pane = run.locator(".nbs-Pane[data-rank='0']")
            sync_api.expect(pane.locator(".nbs-Pane-facts")).to_contain_text("failed after rank 2")
            text = pane.locator(".nbs-Traceback-text").inner_text()
            assert "dist.barrier()" in text and "frames in torch ..." in text and "c10d_logger" not in text, text
            shot(run, artifacts, "failed-after-light-rank0.png", unhover=True)
            with dark_theme(pg):
                muted("dark")
                shot(run, artifacts, "failed-after-dark-rank0.png", unhover=True)

            # the cell's error says the same: one root cause, the others after it, torch's frames folded
            error = cell.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").last
            said = error.inner_text()
            assert "RankRaisedError: rank 2" in said and "failed after rank 2" in said and "c10d_logger" not in said, said
    finally:
        write_settings(settings)
