"""The README's two pictures, drawn by the real view (issue #40, item 11): a 4-rank run live, and the
same run frozen after rank 1 failed.  The screenshots (test-artifacts/browser/readme-live.png and
readme-frozen.png) are what docs/live-widget.png and docs/frozen-run.png are copied from when the
view's look changes; the test checks that they show today's view: the Where? button live, stderr
lines marked at their edge, not tinted as errors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_harness import (
    NEEDS_WIDGET,
    Page,
    frozen_run,
    live_view,
    open_with_nbspawn,
    run_cell,
    select_pane,
    serve,
    shot,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

# the README's scene: each rank loads its shard and trains; rank 1 diverges once the test has its picture
TRAIN = """\
%%spawn -n 4
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
print(f"rank {rank}: loading <shard-{rank}.bin> \\x1b[32mok\\x1b[0m", flush=True)
loss = 1.0 / (rank + 1)
bar = tqdm(total=100, desc="train", file=sys.stderr, ncols=60)
for step in range(100):
    if step % 40 == 0:
        print(f"step {step:3d}  loss \\x1b[36m{loss:.4f}\\x1b[0m", flush=True)
    if step == 30:
        bar.refresh()
        while not os.path.exists("go"):
            time.sleep(0.05)
    if rank == 1 and step == 60:
        raise ValueError("rank 1 diverged: loss is nan")
    loss *= 0.93
    time.sleep(0.02)
    bar.update(1)
"""


def _write(root: Path) -> None:
    write_notebook(root, "readme.ipynb", ["%load_ext nbspawn", TRAIN])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("readme-lab"), _write)


def test_the_readmes_scenes(lab, browser, artifacts):
    with Page(browser, width=1200, height=900) as p:  # the view ~770 px wide, as the README shows it
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "readme.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        view = live_view(cell, widget=True)
        merged = select_pane(view, "merged")
        pg.wait_for_function(
            "el => (el.innerText.match(/30\\/100/g) || []).length === 4", arg=merged.element_handle(), timeout=120_000
        )
        sync_api.expect(view.locator(".nbs-Where-button")).to_be_visible()
        stderr = merged.locator(".nbs-Line.nbs-stderr").first
        tint = stderr.evaluate("e => getComputedStyle(e).backgroundColor")
        assert tint in ("rgba(0, 0, 0, 0)", "transparent"), f"stderr is tinted {tint}"
        pg.wait_for_timeout(300)
        shot(view, artifacts, "readme-live.png", unhover=True)
        (lab.root / "go").touch()
        run = frozen_run(cell, timeout=120_000)
        run.locator(".nbs-Chip[data-rank='1']").click()
        sync_api.expect(run).to_contain_text("rank 1 diverged")
        pg.wait_for_timeout(300)
        shot(run, artifacts, "readme-frozen.png", unhover=True)
