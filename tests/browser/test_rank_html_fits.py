"""HTML a rank displays shows whole, as in a cell of its own (issue #26, item 1): the sandboxed frame
it is drawn in is as tall as its content, margins of its first and last elements included (a heading
and paragraphs, a table as pandas draws it, a <pre> with margins as rich's output has).  Real JupyterLab, the live widget.

What is asserted is read once the page has drawn it (read_until: frames sized, the pane scrolled, more
lines arrived), not after a fixed wait (issue #55, audit M7, M8).

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from lab_harness import (
    NEEDS_WIDGET,
    Page,
    live_view,
    open_with_nbspawn,
    read_until,
    run_cell,
    select_pane,
    serve,
    shot,
    sync_api,
    write_notebook,
)
from training_cells import LIGHTNING

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

SHOWS = """\
%%spawn -n 1
import time
from IPython.display import HTML, display
display(HTML("<h3>Epoch 1</h3><p>first paragraph</p><p>last paragraph</p>"))
display(HTML("<table style='margin: 1em 0'><tr><th>loss</th></tr><tr><td>0.5</td></tr><tr><td>0.25</td></tr></table>"))
display(HTML("<pre style='margin: 1em 0'>a pre with margins</pre>"))
from rich.progress import track
for _ in track(range(3), description="rich"):  # rich's own bar: a <pre> display, updated in place
    time.sleep(0.1)
time.sleep(60)
"""

# every frame: its content's bottom (the last element's margin box) within the frame's height
FITS = """frames => frames.map(f => {
  const doc = f.contentDocument;
  const last = doc.body.lastElementChild;
  if (!last) return [true, true, 0, 0];
  const bottom = last.getBoundingClientRect().bottom + parseFloat(getComputedStyle(last).marginBottom);
  const top = doc.body.firstElementChild.getBoundingClientRect().top - parseFloat(getComputedStyle(doc.body.firstElementChild).marginTop);
  return [top >= -0.5, bottom <= f.getBoundingClientRect().height + 0.5, f.getBoundingClientRect().height, bottom];
})"""


# what a user's training cell displays: a pandas DataFrame, and Lightning with its defaults, which with
# rich installed are RichModelSummary (a table) and RichProgressBar (a live <pre> display)
TRAINS = (
    """\
%%spawn -n 1
import time, pandas as pd
from IPython.display import display
display(pd.DataFrame({"epoch": [1, 2, 3], "loss": [0.9, 0.5, 0.25]}))"""
    + LIGHTNING
    + """\
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False)
trainer.fit(Tiny(), data)
print("fitted", trainer.global_step)
time.sleep(60)
"""
)
MISSING = [m for m in ("pandas", "lightning", "rich") if importlib.util.find_spec(m) is None]


# a rank that prints on (for 2 minutes at most; the test stops it): the pane follows it, unless the user
# scrolled up to read
PRINTS = """\
%%spawn -n 1
import time
for i in range(4000):
    print("line", i, flush=True)
    time.sleep(0.03)
time.sleep(60)
"""
AT_BOTTOM = "o => o.scrollTop + o.clientHeight >= o.scrollHeight - 8"
# the text of the first line in view at the pane's top (what the user reads)
TOP_LINE = """o => {
  const top = o.getBoundingClientRect().top;
  const line = [...o.querySelectorAll('.nbs-Line')].find(l => l.getBoundingClientRect().bottom > top + 1);
  return line ? line.textContent : null;
}"""
# the number of the last line the pane holds (-1: none yet)
LAST_LINE = """o => {
  const lines = o.querySelectorAll('.nbs-Line');
  const m = lines.length ? lines[lines.length - 1].textContent.match(/line (\\d+)/) : null;
  return m ? Number(m[1]) : -1;
}"""


def _write(root: Path) -> None:
    write_notebook(root, "html.ipynb", ["%load_ext nbspawn", SHOWS])
    write_notebook(root, "train.ipynb", ["%load_ext nbspawn", TRAINS])
    write_notebook(root, "prints.ipynb", ["%load_ext nbspawn", PRINTS])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("html-lab"), _write)


def test_a_ranks_html_shows_whole(lab, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "html.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        view = live_view(cell, widget=True)
        pane = select_pane(view, 0)
        frames = pane.locator("iframe.nbs-Rich-frame")
        # rich's bar, at its end (rich may add a display of its own after it)
        pg.wait_for_function(
            "el => [...el.querySelectorAll('iframe.nbs-Rich-frame')].some(f => (f.contentDocument?.body?.innerText || '').includes('100%'))",
            arg=pane.element_handle(),
            timeout=60_000,
        )
        # each frame sized once loaded
        fits = read_until(
            pg,
            lambda: [f for f in frames.evaluate_all(FITS) if f[3] > 0],  # frames with content
            lambda fits: len(fits) >= 4 and all(top and bottom for top, bottom, _, _ in fits),
        )
        assert len(fits) >= 4, fits
        assert all(top and bottom for top, bottom, _, _ in fits), fits
        shot(view, artifacts, "rank-html-whole.png", unhover=True)
        view.locator(".nbs-Stop").click()


@pytest.mark.skipif(bool(MISSING), reason=f"not installed here: {', '.join(MISSING)} (the test and frameworks extras)")
def test_a_dataframe_and_lightnings_default_bar_and_summary_show_whole(lab, browser, artifacts):
    with Page(browser, width=1200, height=1400) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "train.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        view = live_view(cell, widget=True)
        sync_api.expect(view).to_contain_text("fitted 16", timeout=240_000)  # 2 epochs of 8 steps
        pane = select_pane(view, 0)
        frames = pane.locator("iframe.nbs-Rich-frame")

        def drawn() -> tuple[list, list, bool]:
            texts = frames.evaluate_all("fs => fs.map(f => f.contentDocument?.body?.innerText || '')")
            return texts, [f for f in frames.evaluate_all(FITS) if f[3] > 0], pane.evaluate(AT_BOTTOM)

        def whole(seen: tuple[list, list, bool]) -> bool:
            texts, fits, at_bottom = seen
            return (
                any("Epoch 1/1" in t and "8/8" in t for t in texts)
                and len(fits) >= 3
                and all(top and bottom for top, bottom, _, _ in fits)
                and at_bottom
            )

        texts, fits, at_bottom = read_until(pg, drawn, whole)  # each frame sized once loaded, the pane scrolled
        assert any("loss" in t and "0.25" in t for t in texts), texts  # the DataFrame
        assert any("Total params" in t or "Trainable params" in t for t in texts), texts  # the model summary
        # the progress bar, where the training ended (not a frame from before the last epoch's steps)
        assert any("Epoch 1/1" in t and "8/8" in t for t in texts), texts
        assert len(fits) >= 3, fits
        assert all(top and bottom for top, bottom, _, _ in fits), fits
        # the pane followed its output to the end, frames sized after they loaded included
        assert at_bottom, "the pane stopped following its output"
        shot(view, artifacts, "rank-dataframe-lightning-whole.png", unhover=True)
        view.locator(".nbs-Stop").click()


def test_a_pane_follows_its_output_until_the_user_scrolls_up_and_again_from_the_bottom(lab, browser, artifacts):
    """The pane keeps its newest line in view while a rank prints, however its own scroll events and
    the output interleave; the user scrolling up to read stops that (the pane stays where they put it
    while lines keep coming), and scrolling back to the bottom starts it again."""
    with Page(browser, width=1200, height=900) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "prints.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        view = live_view(cell, widget=True)
        pane = select_pane(view, 0)
        # past the pane's window (its newest 200 entries, pane.ts WINDOW): from here on each new line
        # takes the oldest out unless the user reads above them
        sync_api.expect(pane).to_contain_text("line 260", timeout=60_000)
        assert pane.evaluate(AT_BOTTOM), "the pane did not follow its output"
        pane.hover()
        pg.mouse.wheel(0, -600)  # the user scrolls up to read
        # off the bottom, and still (the wheel's scroll may be animated): three reads 100 ms apart agree
        seen: list[tuple[bool, float]] = []

        def scrolled() -> list[tuple[bool, float]]:
            seen.append(pane.evaluate(f"o => [({AT_BOTTOM})(o), o.scrollTop]"))
            return seen[-3:]

        last3 = read_until(pg, scrolled, lambda s: len(s) == 3 and not s[-1][0] and s[0][1] == s[1][1] == s[2][1])
        assert not last3[-1][0], f"the wheel did not scroll up: {seen[-10:]}"
        read_at, last, reading = last3[-1][1], pane.evaluate(LAST_LINE), pane.evaluate(TOP_LINE)
        # 30 more lines arrive while the user reads (not a fixed while: the work, M8)
        pane.page.wait_for_function(f"o => ({LAST_LINE})(o) >= {last + 30}", arg=pane.element_handle(), timeout=60_000)
        assert not pane.evaluate(AT_BOTTOM), "the pane jumped back to its newest line while the user read"
        assert pane.evaluate(TOP_LINE) == reading, "the lines the user read moved away"
        assert abs(pane.evaluate("o => o.scrollTop") - read_at) <= 2, "the pane moved while the user read"
        pg.mouse.wheel(0, 100_000)  # back to the bottom
        assert read_until(pg, lambda: pane.evaluate(AT_BOTTOM), bool), "the wheel did not scroll to the bottom"
        # and it follows again: 30 more lines, the newest in view
        last = pane.evaluate(LAST_LINE)
        pane.page.wait_for_function(f"o => ({LAST_LINE})(o) >= {last + 30}", arg=pane.element_handle(), timeout=60_000)
        following = read_until(pg, lambda: pane.evaluate(AT_BOTTOM), bool, timeout=60_000)
        assert following, "the pane did not follow again from the bottom"
        shot(view, artifacts, "pane-follows-again.png", unhover=True)
        view.locator(".nbs-Stop").click()
