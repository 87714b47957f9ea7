"""The live view in the classic Notebook 6.5 with ipywidgets 7.7 and widgetsnbextension 3.6: the widget
stack Colab's runtime ships (its front end is Colab's own, built on the same widget manager).  No nbspawn
extension is there, as on Colab: the live view is anywidget's, the finished run a static HTML snapshot.

Runs where notebook 6.x is installed: the Colab runtime job (.ci/runtime colab-gpu); skipped elsewhere.
"""

from __future__ import annotations

import re

import pytest
from lab_harness import NEEDS_CHROMIUM, NEEDS_WIDGET, serving, shot, sync_api, write_notebook

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM, NEEDS_WIDGET]

CELLS = [
    "%load_ext nbspawn",
    "%%spawn -n 2 --view widget\n"
    "import os, time\n"
    "from tqdm.notebook import tqdm\n"
    "rank = int(os.environ['RANK'])\n"
    "print(f'hello from rank {rank}')\n"
    "for i in tqdm(range(30), desc=f'rank {rank}'):\n"
    "    time.sleep(0.1)\n"
    "print(f'rank {rank} done')",
]


@pytest.fixture(scope="module")
def classic(tmp_path_factory):
    with serving(
        "classic", tmp_path_factory.mktemp("classic"), lambda root: write_notebook(root, "colab.ipynb", CELLS)
    ) as server:
        yield server


def test_the_live_view_and_the_snapshot_draw_in_the_classic_notebook_with_ipywidgets_7(classic, page, artifacts):
    pg = page.page
    pg.goto(classic.url("/notebooks/colab.ipynb"))
    pg.wait_for_function(
        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected()",
        timeout=90_000,
    )
    pg.evaluate("() => Jupyter.notebook.execute_all_cells()")
    cell = pg.locator(".cell.code_cell").nth(1)

    live = cell.locator(".nbs-Widget .nbs-Run.nbs-mod-live")
    live.wait_for(timeout=90_000)
    sync_api.expect(live).to_contain_text("hello from rank", timeout=30_000)
    sync_api.expect(live.locator(".nbs-Chip")).to_have_count(2)
    # what each rank holds now, in its chip, as in JupyterLab (sampled about once a second)
    sync_api.expect(live.locator(".nbs-Chip-cost")).to_have_count(2, timeout=10_000)
    assert all(re.match(r"^\d+(\.\d)? (MB|GB)$", c) for c in live.locator(".nbs-Chip-cost").all_inner_texts())
    shot(cell, artifacts, "classic-notebook-live.png", unhover=True)

    # the run ends: the live view is replaced in place by the snapshot (HTML: no nbspawn renderer here)
    frozen = cell.locator(".nbspawn-run")
    try:
        frozen.wait_for(timeout=90_000)
    except sync_api.TimeoutError:  # what the live view said then: which rank had not ended, and where
        shot(cell, artifacts, "classic-notebook-no-snapshot.png")
        chips = [chip.get_attribute("title") for chip in live.locator(".nbs-Chip").all()]
        pytest.fail(f"no snapshot within 90 s; the live view's chips: {chips}\n{live.inner_text()[-3000:]}")
    sync_api.expect(live).to_have_count(0, timeout=30_000)
    text = frozen.inner_text().replace("\u2007", " ")  # tqdm pads its numbers with figure spaces
    for rank in (0, 1):
        assert f"rank {rank} done" in text, text[-2000:]
        assert re.search(rf"rank {rank}: 100%\s+30/30", text), text[-2000:]  # the tqdm.notebook bar, at its end
        assert re.search(rf"rank {rank} done, [\d.]+ s, peak \d", text), text[:500]  # its peak, saved
    assert re.search(r"memory: rank \d peaked at \d", text), text[:500]
    shot(cell, artifacts, "classic-notebook-frozen.png", unhover=True)
    assert not page.nbspawn_errors(), page.nbspawn_errors()
    assert not page.dialogs, page.dialogs
