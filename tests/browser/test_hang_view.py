"""A hung run in a real browser (JupyterLab): the live hang signal on the ranks' chips, the Where
button's answer, and the verdict once Stop ends the run.

Four ranks: 0, 1 and 3 wait in a barrier that rank 2 never enters.  With no option given, a few seconds
into the silence the chips of the waiting ranks turn amber ("waiting in barrier #1 for N s"), and rank
2's says it has not entered it; Where? (sent on the kernel's subshell, as Stop is) shows every rank's
stack, grouped; Stop ends the run and the cell's error starts with the verdict.  The frozen run's
banner is the verdict, and each chip keeps where its rank was when it was stopped, there and in the
saved notebook opened again (issue #40, item 3).  Screenshots go to test-artifacts/browser/, the
saved notebook's in the light and the dark theme.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    FROZEN_RUN,
    NEEDS_WIDGET,
    Page,
    dark_theme,
    frozen_run,
    live_view,
    notebook_root,
    notebook_url,
    open_with_nbspawn,
    run_cell,
    save_until,
    serve,
    shot,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_WIDGET]

HANG = """\
%%spawn -n 4 --backend gloo
import time
import torch.distributed as dist
if dist.get_rank() != 2:
    dist.barrier()
else:
    time.sleep(300)
"""


# issue #57, item 1: rank 1 skips the all_reduce and finishes the cell; on a kept world (after a first cell
# that ran a barrier: torch's #2) it is back at its prompt, with fresh ranks it ends and gloo fails rank 0
SKIP = "t = torch.ones(3)\nif dist.get_rank() != 1:\n    dist.all_reduce(t)\nprint('finished the cell')\n"
WORLD = "%%spawn --world skip -n 2 --backend gloo\nimport torch\nimport torch.distributed as dist\ndist.barrier()"


def _write(root: Path) -> None:
    write_notebook(root, "hang.ipynb", ["%load_ext nbspawn", HANG])
    fresh = "%%spawn -n 2 --backend gloo\nimport torch\nimport torch.distributed as dist\n" + SKIP
    write_notebook(root, "skip.ipynb", ["%load_ext nbspawn", WORLD, "%%spawn --world skip\n" + SKIP, fresh])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("hang-lab"), _write)


def test_a_hang_is_seen_live_asked_where_and_explained(lab, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "hang.ipynb")

        hang = cells.nth(1)
        run_cell(pg, hang)
        view = live_view(hang, widget=True)

        # ---- the live signal: amber chips within a few seconds, no option given --------------------
        waiting = view.locator(".nbs-Chip.nbs-mod-waiting")
        sync_api.expect(waiting).to_have_count(4, timeout=60_000)  # a 3 s first look after a cold start: a hang guard
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
        sync_api.expect(answer).to_contain_text("ranks 0-1,3: Cell In[2], line 5: dist.barrier()", timeout=60_000)
        text = answer.inner_text()
        assert re.search(r"\[in barrier #1 for \d+(-\d+)? s\]", text), text
        assert "rank 2: Cell In[2], line 7: time.sleep(300)" in text
        # the box is padded (JupyterLab's rule for an output's <pre> took it off) and inset from the view's edges
        padding = answer.evaluate("e => parseFloat(getComputedStyle(e).paddingLeft)")
        inset = view.locator(".nbs-Where").evaluate(
            "e => e.getBoundingClientRect().left - e.closest('.nbs-Run').getBoundingClientRect().left"
        )
        assert padding >= 8 and inset >= 8, (padding, inset)
        shot(view, artifacts, "hang-live-where.png", unhover=True)
        view.locator(".nbs-Where-close").click()
        sync_api.expect(view.locator(".nbs-Where")).to_be_hidden()

        # ---- Stop: the verdict heads the error, and is the frozen run's banner ----------------------
        view.locator(".nbs-Stop").click()
        frozen = frozen_run(hang)
        output = hang.locator(".jp-OutputArea")
        sync_api.expect(output).to_contain_text("Hang: rank 2 never entered barrier #1", timeout=30_000)
        _where_they_were(frozen)
        shot(hang, artifacts, "hang-stopped.png", unhover=True)

        # ---- the saved notebook, opened again: the same banner and chips, light and dark -------------
        save_until(pg, lab.root / "hang.ipynb", lambda nb: RUN_MIME in str(nb["cells"][1]["outputs"]))
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        pg.goto(notebook_url(lab, "hang.ipynb"))
        saved = notebook_root(pg, lab).locator(".jp-Cell").nth(1).locator(FROZEN_RUN)
        saved.wait_for(timeout=90_000)
        _where_they_were(saved)
        shot(saved, artifacts, "hang-saved.png", unhover=True)
        with dark_theme(pg):
            _where_they_were(saved)
            shot(saved, artifacts, "hang-saved-dark.png", unhover=True)


RUN_MIME = "application/vnd.nbspawn.run+json"


def _where_they_were(run) -> None:
    """A stopped hang's view: the verdict is its banner (what stopped it, in the banner's title), and
    each chip says where its rank was when it was stopped, with its ■; none is drawn as hung now."""
    banner = run.locator(".nbs-Banner")
    sync_api.expect(banner).to_have_count(1)
    text = banner.inner_text().strip()
    assert re.fullmatch(
        r"!?\s*Hang: rank 2 never entered barrier #1 \(it is at Cell In\[2\], line 7: time\.sleep\(300\)\); "
        r"ranks 0-1,3 waited in it for \d+ s at Cell In\[2\], line 5: dist\.barrier\(\)",
        text,
    ), text
    assert banner.get_attribute("title") == "stopped by you (Stop)"
    for rank in (0, 1, 3):
        chip = run.locator(f".nbs-Chip[data-rank='{rank}']")
        assert chip.get_attribute("data-status") == "stopped"
        assert re.fullmatch(r"waiting in barrier #1 for \d+ s", chip.locator(".nbs-Chip-detail").inner_text()), chip.inner_text()
        assert "rank 2 has not entered it" in (chip.get_attribute("title") or "")
    absent = run.locator(".nbs-Chip[data-rank='2']")
    assert absent.get_attribute("data-status") == "stopped"
    assert absent.locator(".nbs-Chip-detail").inner_text() == "has not entered barrier #1"
    assert "Cell In[2], line 7: time.sleep(300)" in (absent.get_attribute("title") or "")
    assert run.locator(".nbs-mod-waiting").count() == 0  # stopped: not amber, as a rank that looks hung now


def test_a_rank_that_skipped_the_collective_and_finished_the_cell_is_named(lab, browser, artifacts):
    """A kept world: rank 1 is back at its prompt (✓), rank 0 waits; a few seconds in both chips turn
    amber, rank 1's saying it never entered all_reduce #2, and Stop's verdict leads with it.  Fresh ranks:
    gloo fails rank 0 as rank 1 ends, and the banner leads with the cause, not gloo's words."""
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "skip.ipynb")
        run_cell(pg, cells.nth(1), until="[2]:")
        kept = cells.nth(2)
        run_cell(pg, kept)
        view = live_view(kept, widget=True)
        gone_on = view.locator(".nbs-Chip[data-rank='1']")
        sync_api.expect(gone_on).to_have_class(re.compile("nbs-mod-waiting"), timeout=60_000)
        assert gone_on.get_attribute("data-status") == "done"
        assert gone_on.locator(".nbs-Chip-detail").inner_text() == "never entered all_reduce #2"
        assert "never entered all_reduce #2 (it finished the cell)" in (gone_on.get_attribute("title") or "")
        waits = view.locator(".nbs-Chip[data-rank='0']")
        assert re.fullmatch(r"waiting in all_reduce #2 for \d+ s", waits.locator(".nbs-Chip-detail").inner_text())
        assert "rank 1 finished the cell without entering it" in (waits.get_attribute("title") or "")
        shot(view, artifacts, "skip-kept-live.png", unhover=True)
        view.locator(".nbs-Stop").click()
        frozen = frozen_run(kept)
        banner = frozen.locator(".nbs-Banner")
        sync_api.expect(banner).to_contain_text("Hang: rank 1 never entered all_reduce #2 (it finished the cell); rank 0 waited")
        shot(kept, artifacts, "skip-kept-stopped.png", unhover=True)

        fresh = cells.nth(3)
        run_cell(pg, fresh)
        ended = frozen_run(fresh)
        banner = ended.locator(".nbs-Banner")
        # the cause, not "rank 0: ..." (the rank gloo failed), though a click still shows rank 0's traceback
        assert re.fullmatch(
            r"!?\s*RankRaisedError: rank 1 never entered all_reduce #1 \(it finished the cell\); "
            r"rank 0 waited in it at Cell In\[4\], line 6: dist\.all_reduce\(t\)",
            banner.inner_text().strip(),
        ), banner.inner_text()
        left = ended.locator(".nbs-Chip[data-rank='1']")
        assert left.get_attribute("data-status") == "done"
        assert left.locator(".nbs-Chip-detail").inner_text() == "never entered all_reduce #1"
        output = fresh.locator(".jp-OutputArea")
        sync_api.expect(output).to_contain_text("Because of it, rank 0 (pid ")
        shot(ended, artifacts, "skip-fresh.png", unhover=True)
