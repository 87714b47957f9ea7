"""The collectives X-ray's static HTML (views._xray_html) as a reader sees it, in a real Chromium: on a page
that carries JupyterLab's own light or dark theme (its variables are what the drawing's colours read),
with no script and nothing fetched, as a saved notebook shows it.

Drawn from real records (tests/unit/xray_records: ``story``, a straggler and a mismatch; ``hang``, a
rank that never entered a barrier) and a 16-rank run of 10,000 collectives (tests/xray_samples.py).
Checked as seen: a lane per rank, every layer of marks painted with a size, every text inside the picture
and clear of the others, the legend inside its box; screenshots to test-artifacts/browser/xray-*.png
(docs/xray-story.png and docs/xray-hang-dark.png are these).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from lab_harness import NEEDS_CHROMIUM, Page
from xray_samples import long_run, sample

from nbspawn.views._xray_html import xray_html

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_CHROMIUM]

THEMES = Path(sys.prefix) / "share" / "jupyter" / "lab" / "themes" / "@jupyterlab"


def themed_page(body: str, theme: str) -> str:
    """``body`` on a page with JupyterLab's theme variables (its own stylesheet) and its background."""
    sheet = THEMES / f"theme-{theme}-extension" / "index.css"
    if theme == "dark" and not sheet.exists():  # dark is JupyterLab's variables; without them it is light
        pytest.skip("JupyterLab's dark theme is not installed here (a runtime without jupyterlab)")
    css = sheet.read_text() if sheet.exists() else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><style>{css}</style></head>'
        '<body style="margin:16px;background:var(--jp-layout-color0,#fff);font-family:var(--jp-ui-font-family,sans-serif)">'
        f"{body}</body></html>"
    )


# what the reader sees, measured in the page
SEEN = """root => {
  const svg = root.querySelector('svg[data-xray-lanes]');
  const box = svg.viewBox.baseVal;
  const layers = {};
  for (const p of svg.querySelectorAll('path[data-xray-layer]')) {
    const b = p.getBBox();
    const style = getComputedStyle(p);  // a mark is a stroke: its box is a line, its stroke's width its width
    const stroke = style.stroke !== 'none' ? parseFloat(style.strokeWidth) : 0;
    layers[p.dataset.xrayLayer] = [Math.max(b.width, stroke), Math.max(b.height, stroke), style.stroke, style.fill];
  }
  const texts = [...svg.querySelectorAll('text')].map(t => {
    const b = t.getBBox();
    return {text: [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.data).join(''), x: b.x, y: b.y, w: b.width, h: b.height,
            fill: getComputedStyle(t).fill};
  });
  const legend = root.querySelector('[data-xray-legend]').getBoundingClientRect();
  const outer = root.getBoundingClientRect();
  return {
    lanes: svg.querySelectorAll('text[data-xray-lane]').length,
    straggler: [...svg.querySelectorAll('text[data-xray-straggler]')].map(t => t.textContent),
    box: [box.width, box.height], shown: [svg.getBoundingClientRect().width, svg.getBoundingClientRect().height],
    layers, texts,
    legend: [legend.left >= outer.left - 0.5, legend.right <= outer.right + 0.5, legend.height],
    colour: getComputedStyle(root).color, background: getComputedStyle(document.body).backgroundColor,
  };
}"""


def overlaps(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["w"] - 1
        and b["x"] < a["x"] + a["w"] - 1
        and a["y"] < b["y"] + b["h"] - 1
        and b["y"] < a["y"] + a["h"] - 1
    )


def look(browser, artifacts: Path, name: str, html: str, theme: str, width: int = 1000) -> dict:
    with Page(browser, width=width, height=800, color_scheme=theme) as p:
        p.page.set_content(themed_page(html, theme))
        root = p.page.locator("div[data-xray]")
        seen = root.evaluate(SEEN)
        root.screenshot(path=str(artifacts / f"xray-{name}-{theme}.png"), animations="disabled")
        assert not p.errors and not p.dialogs
    width_, height = seen["box"]
    for text in seen["texts"]:  # inside the picture: nothing cut at an edge
        assert text["w"] > 0 and text["h"] > 0, text
        assert text["x"] >= -0.5 and text["x"] + text["w"] <= width_ + 0.5, text
        assert text["y"] >= -0.5 and text["y"] + text["h"] <= height + 0.5, text
    labels = [t for t in seen["texts"] if t["text"]]
    for i, a in enumerate(labels):  # and no words over other words
        for b in labels[i + 1 :]:
            assert not overlaps(a, b), (a["text"], b["text"])
    assert seen["legend"][:2] == [True, True] and seen["legend"][2] > 0
    return seen


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_story_reads_the_straggler_and_the_mismatch(browser, artifacts, theme):
    xray = sample("story")
    seen = look(browser, artifacts, "story", xray_html(xray), theme)
    assert seen["lanes"] == 4 and seen["straggler"] == ["rank 3"]
    for layer in ("lane", "arrival", "last", "wait", "connector", "mismatch", "band", "axis"):
        width, height, _stroke, _fill = seen["layers"][layer]
        assert width > 0 and height > 0, layer
    assert seen["layers"]["wait"][0] > 300  # rank 3's 30 ms lates, across most of the axis
    words = [t["text"] for t in seen["texts"]]
    assert "mismatch: " + xray.mismatches[0].text in words and "straggler" in words
    if theme == "dark":  # JupyterLab's dark variables are what the words read: light on dark
        assert seen["colour"].startswith("rgba(255, 255, 255") and seen["background"] == "rgb(17, 17, 17)"
        label = next(t for t in seen["texts"] if t["text"] == "rank 0")
        assert label["fill"].startswith("rgba(255, 255, 255")
    else:
        assert seen["background"] == "rgb(255, 255, 255)"


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_hang_shows_the_rank_that_never_came(browser, artifacts, theme):
    xray = sample("hang")
    seen = look(browser, artifacts, "hang", xray_html(xray), theme)
    assert seen["lanes"] == 4 and not seen["straggler"]
    width, height, stroke, _fill = seen["layers"]["never"]
    assert width > 5 and height > 15 and stroke not in ("none", "")
    words = [t["text"] for t in seen["texts"]]
    assert "hang: ranks 0, 1, 2 entered barrier #2; rank 3 never did" in words and "never" in words


def test_a_long_wide_run_in_a_narrow_output(browser, artifacts):
    """16 ranks, 10,000 collectives, in a 700-pixel output: the picture scales down whole, the legend wraps."""
    seen = look(browser, artifacts, "long", xray_html(long_run(16, 10_000)), "light", width=700)
    assert seen["lanes"] == 16 and seen["straggler"] == ["rank 5"]
    assert seen["shown"][0] < seen["box"][0] and abs(seen["shown"][0] / seen["shown"][1] - seen["box"][0] / seen["box"][1]) < 0.02
    words = [t["text"] for t in seen["texts"]]
    assert "9,936 more" in words
