"""What a run view draws that a user reads at a glance (issue #40, items 9 and 13), in real JupyterLab,
light and dark: a DataFrame opens at its header, in JupyterLab's table style; a rich bar sits on its
``[rankN]`` prefix's line in the merged pane; a failed run's error headline reads in the dark theme.

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from lab_harness import (
    NEEDS_WIDGET,
    Page,
    dark_theme,
    frozen_run,
    live_view,
    open_with_nbspawn,
    read_until,
    run_cell,
    select_pane,
    serve,
    shot,
    sync_api,
    write_notebook,
    write_settings,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]
MISSING = [m for m in ("pandas", "rich") if importlib.util.find_spec(m) is None]

# rank 0 shows a DataFrame taller than the pane; rank 1 draws rich's bar (a <pre> display, updated in place)
SHOWS = """\
%%spawn -n 2
import os, time
from IPython.display import display
if os.environ["RANK"] == "0":
    import pandas as pd
    display(pd.DataFrame({"epoch": range(1, 41), "loss": [round(1 / e, 4) for e in range(1, 41)]}))
    print("shown")
else:
    from rich.progress import track
    for _ in track(range(3), description="rich"):
        time.sleep(0.1)
time.sleep(60)
"""

FAILS = "%%spawn -n 1\nraise ValueError('a bad batch')\n"

# where the DataFrame is: its frame within the pane, the frame scrolled to its top, its cells' borders
DATAFRAME = """pane => {
  const frame = pane.querySelector('iframe.nbs-Rich-frame');
  const doc = frame.contentDocument;
  const th = doc.querySelector('thead th:last-child'), td = doc.querySelector('tbody td');
  const f = frame.getBoundingClientRect(), p = pane.getBoundingClientRect();
  const header = th.getBoundingClientRect();
  return {
    frameTop: f.top - p.top, frameBottom: f.bottom - p.bottom, inner: doc.scrollingElement.scrollTop,
    headerShown: f.top + header.top >= p.top && f.top + header.bottom <= p.bottom,
    borders: [getComputedStyle(td).borderLeftStyle, getComputedStyle(td).borderTopStyle, getComputedStyle(th).borderRightStyle],
    rows: [...doc.querySelectorAll('tbody tr')].slice(0, 2).map(r => getComputedStyle(r).backgroundColor),
  };
}"""

# rich's bar in the merged pane: the top of its text against the top of its [rank1] prefix
RICH_BAR = """pane => {
  for (const d of pane.querySelectorAll('.nbs-Display')) {
    const prefix = d.querySelector('.nbs-Prefix'), frame = d.querySelector('iframe.nbs-Rich-frame');
    const pre = frame && frame.contentDocument && frame.contentDocument.querySelector('pre');
    if (prefix && pre && pre.textContent.includes('rich')) {
      d.scrollIntoView({block: 'center'});
      const text = frame.getBoundingClientRect().top + pre.getBoundingClientRect().top;
      return text - prefix.getBoundingClientRect().top;
    }
  }
  return null;
}"""


def _try(element, js: str):
    """``js`` of ``element``'s node, or None while it throws (a frame not loaded yet)."""
    try:
        return element.evaluate(js)
    except Exception:
        return None


def _luminance(rgb: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: tuple[float, ...], bg: tuple[float, ...]) -> float:
    """WCAG's contrast ratio of two opaque colours."""
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


# the headline's colour and what is drawn behind it: each translucent background up the tree laid on
# the next, down to an opaque one
HEADLINE = """out => {
  const parse = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const first = [...out.querySelectorAll('pre span, pre')].find(e => /RankRaisedError/.test(e.textContent) && e.children.length === 0)
    || out.querySelector('pre');
  let layers = [];
  for (let e = first; e; e = e.parentElement) {
    const bg = parse(getComputedStyle(e).backgroundColor);
    if (bg.length >= 3 && (bg.length < 4 || bg[3] > 0)) { layers.push(bg); if (bg.length < 4 || bg[3] >= 1) break; }
  }
  let [r, g, b] = layers.length ? layers[layers.length - 1].slice(0, 3) : [255, 255, 255];
  for (const l of layers.slice(0, -1).reverse()) { const a = l[3]; r = l[0] * a + r * (1 - a); g = l[1] * a + g * (1 - a); b = l[2] * a + b * (1 - a); }
  return {fg: parse(getComputedStyle(first).color), bg: [r, g, b], text: first.textContent.slice(0, 80)};
}"""


def _write(root: Path) -> None:
    write_notebook(root, "shows-light.ipynb", ["%load_ext nbspawn", SHOWS, FAILS])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("polish-lab"), _write)


@pytest.mark.skipif(bool(MISSING), reason=f"not installed here: {', '.join(MISSING)}")
def test_a_dataframe_a_rich_bar_and_an_error_headline_read_as_in_jupyterlab(lab, browser, artifacts):
    """Each read in the light theme, then again once the user switched JupyterLab to its dark one (one
    run for both themes: issue #55)."""
    settings = lab.settings
    write_settings(settings, theme="JupyterLab Light")
    try:
        with Page(browser, width=1200, height=1200) as p:
            pg = p.page
            cells = open_with_nbspawn(pg, lab, "shows-light.ipynb")
            pg.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
            cell = cells.nth(1)
            run_cell(pg, cell)
            view = live_view(cell, widget=True)
            pane = select_pane(view, 0)
            sync_api.expect(pane).to_contain_text("shown", timeout=90_000)

            def dataframe_and_bar(theme: str) -> None:
                pane = select_pane(view, 0)
                # read once the frame is loaded and sized and the pane scrolled (not after a fixed second, M7)
                df = read_until(
                    pg,
                    lambda: _try(pane, DATAFRAME),
                    lambda d: (
                        d is not None and d["frameTop"] >= -1 and d["frameBottom"] <= 1 and d["inner"] == 0 and d["headerShown"]
                    ),
                )
                assert df is not None, "the DataFrame's frame never loaded"
                shot(view, artifacts, f"polish-{theme}-dataframe.png", unhover=True)
                # the pane opens at its bottom; the DataFrame, no taller than it, is whole in it, at its header
                assert df["frameTop"] >= -1 and df["frameBottom"] <= 1, df
                assert df["inner"] == 0 and df["headerShown"], df
                assert df["borders"] == ["none", "none", "none"], df  # not the browser's grid (border="1")
                assert df["rows"][0] != df["rows"][1], df  # JupyterLab's striped rows

                merged = select_pane(view, "merged")
                pg.wait_for_function(
                    "el => [...el.querySelectorAll('iframe.nbs-Rich-frame')].some(f => /100%/.test(f.contentDocument?.body?.innerText || ''))",
                    arg=merged.element_handle(),
                    timeout=60_000,
                )
                # scrolled to it, for the picture; read once laid out (not after a fixed 500 ms, M7)
                below = read_until(pg, lambda: merged.evaluate(RICH_BAR), lambda b: b is not None and abs(b) <= 4)
                shot(view, artifacts, f"polish-{theme}-merged-rich-bar.png", unhover=True)
                assert below is not None and abs(below) <= 4, f"rich's bar is {below}px below its [rank1] prefix"

            def headline(theme: str) -> None:
                head = out.evaluate(HEADLINE)
                shot(failing, artifacts, f"polish-{theme}-error-headline.png", unhover=True)
                ratio = contrast(tuple(head["fg"]), tuple(head["bg"]))
                assert ratio >= 4.5, (
                    f"{theme}: the headline {head['text']!r} is {head['fg']} on {head['bg']}: contrast {ratio:.1f}"
                )

            dataframe_and_bar("light")
            with dark_theme(pg):
                dataframe_and_bar("dark")
            view.locator(".nbs-Stop").click()
            frozen_run(cell, timeout=120_000)

            failing = cells.nth(2)
            run_cell(pg, failing)
            out = failing.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            sync_api.expect(out).to_contain_text("RankRaisedError", timeout=120_000)
            headline("light")
            with dark_theme(pg):
                headline("dark")
    finally:
        write_settings(settings)
