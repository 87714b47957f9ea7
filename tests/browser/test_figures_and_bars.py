"""Figures, bars and the empty placeholder in a rank's pane (issue 17, items 10-12), in a real browser:
JupyterLab and Notebook 7 (one server, page and kernel per front end, shared by the tests).

- a default-size matplotlib figure (640 x 480) in each rank is shown whole: its ``<img>`` fits the pane's
  width and its height, its top in view, live and frozen;
- a progress bar stays where it was last seen when the view freezes: a ``tqdm.auto`` widget bar below
  the line printed while it ran (not back at the place it was first displayed), and a text bar still
  open when the rank ended below the line printed after its last redraw;
- a program that prints, then sleeps (``%spawn -n 2 -- python -c ...``): no "no output" placeholder
  under its lines (the pane was built before the first line came), and the rank that printed nothing
  still says "no output".

Each run ends once the test has looked at its live view (a flag file the test writes into the server's
root, the ranks' working folder; 120 s at most): a fixed few seconds were all the live checks had on a
loaded machine (issue #55, audit H10).  What is asserted on the page is read once drawn (read_until), not
after a fixed wait (M7).

Screenshots go to test-artifacts/browser/ (figures-*, bars-*, placeholder-*).  About 40 s a front end.
"""

from __future__ import annotations

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    ARTIFACTS,
    FRONTS,
    NEEDS_CHROMIUM,
    NEEDS_WIDGET,
    Front,
    Page,
    live_view,
    open_notebook,
    page_shot,
    read_until,
    run_cell,
    select_pane,
    serving,
    shot,
    shown_text,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_CHROMIUM, NEEDS_WIDGET]
pytest.importorskip("tqdm", reason="tqdm is not installed (pip install -e '.[test]')")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[test]')")

LOAD = "%load_ext nbspawn"

# The flags the test writes once it has looked (in the server's root, where the kernel and its ranks run).
FIGURE_SEEN, BARS_LOOKED, BARS_SEEN, PROGRAM_SEEN = "figure-seen.flag", "bars-looked.flag", "bars-seen.flag", "program-seen.flag"


def _hold(flag: str, indent: str = "") -> str:
    """Cell lines that wait until the test writes ``flag`` (120 s at most: a test that failed before
    writing it leaves no rank waiting for ever)."""
    return (
        f"{indent}_until = time.monotonic() + 120\n"
        f"{indent}while not os.path.exists({flag!r}) and time.monotonic() < _until:\n"
        f"{indent}    time.sleep(0.05)\n"
    )


# A default-size figure (6.4 x 4.8 in at 100 dpi: 640 x 480 px, cropped to ~550 x 430) in each rank, shown
# until the test has looked at it.
FIGURE = f"""\
%%spawn -n 2
import os, time
import matplotlib.pyplot as plt
rank = int(os.environ["RANK"])
print(f"rank {{rank}} plotting", flush=True)
plt.plot([0, 1, 2, 3], [3, 1 + rank, 2, 0])
plt.title(f"rank {{rank}}: the top of the figure")
plt.show()
{_hold(FIGURE_SEEN)}"""

# A tqdm.auto (widget) bar with a line printed while it runs, held mid-epoch (a few redraws after that
# line) until the test has looked; then a text bar on stderr left open, with a line printed after its
# last redraw, held until the test has looked again.
BARS = f"""\
%%spawn -n 2
import os, sys, time
from tqdm.auto import tqdm
rank = int(os.environ["RANK"])
print(f"rank {{rank}} starting", flush=True)
for i in tqdm(range(30), desc=f"epoch-r{{rank}}"):
    time.sleep(0.1)
    if i == 5:
        print(f"rank {{rank}} halfway", flush=True)
    if i == 10:
{_hold(BARS_LOOKED, "        ")}print(f"rank {{rank}} epoch over", flush=True)
sys.stderr.write(f"\\rtail-r{{rank}}  1/9"); sys.stderr.flush(); time.sleep(0.3)
sys.stderr.write(f"\\rtail-r{{rank}}  2/9"); sys.stderr.flush()
print(f"rank {{rank}} printed under the bar", flush=True)
{_hold(BARS_SEEN)}"""

# A program that prints (rank 0 only), then waits for the test's look (120 s at most): its pane is built
# before the first line arrives.
PROGRAM = f"""\
%spawn -n 2 -- python -c "import os, time; r = os.environ['RANK']; r == '0' and print('program line one', flush=True); r == '0' and print('program line two', flush=True); next((1 for _ in range(2400) if os.path.exists('{PROGRAM_SEEN}') or time.sleep(0.05)), 0)"
"""

CELLS = [LOAD, FIGURE, BARS, PROGRAM]
C_FIGURE, C_BARS, C_PROGRAM = 1, 2, 3


def _write(root) -> None:
    write_notebook(root, "figures.ipynb", CELLS)


class FigureFront(Front):
    """A front end with figures.ipynb open and nbspawn loaded; its server's root, where the flags go."""

    def __init__(self, name: str, p: Page, cells, root) -> None:
        super().__init__(name, p, cells)
        self.root = root

    def seen(self, flag: str) -> None:
        """Tell the ranks the test has looked (they go on)."""
        (self.root / flag).write_text("")

    def live(self, i: int):
        """Run cell ``i``; its live view (a picture of the page if none comes)."""
        run_cell(self.pg, self.cell(i))
        try:
            return live_view(self.cell(i), 90_000)
        except Exception:
            page_shot(self.pg, ARTIFACTS, f"figures-{self.name}-no-live-view.png")
            raise


@pytest.fixture(scope="module", params=list(FRONTS))
def front(request, browser, artifacts, tmp_path_factory):
    name = request.param
    with (
        serving(FRONTS[name], tmp_path_factory.mktemp(f"figures-{name}"), _write) as server,
        Page(browser, width=1200, height=1000) as p,
    ):
        cells = open_notebook(p.page, server, "figures.ipynb")
        run_cell(p.page, cells.nth(0), until="[1]:")
        yield FigureFront(name, p, cells, server.root)
        assert p.dialogs == [], p.dialogs


# -- 10. a figure is shown whole --------------------------------------------------------------------

FIGURE_BOX_JS = """pane => {
    const imgs = [...pane.querySelectorAll('img.nbs-Rich-img')];
    const img = imgs[imgs.length - 1];
    if (!img || !img.complete || !img.naturalWidth) return null;
    const p = pane.getBoundingClientRect(), i = img.getBoundingClientRect();
    const cs = getComputedStyle(pane);
    // the pane's inside: within its borders, less its vertical scrollbar
    const top = p.top + parseFloat(cs.borderTopWidth), left = p.left + parseFloat(cs.borderLeftWidth);
    const inner = {top, left, right: left + pane.clientWidth, bottom: top + pane.clientHeight};
    return {
        natural: [img.naturalWidth, img.naturalHeight],
        box: [i.left, i.top, i.right, i.bottom].map(Math.round),
        pane: [inner.left, inner.top, inner.right, inner.bottom].map(Math.round),
        fitsWidth: i.left >= inner.left - 0.5 && i.right <= inner.right + 0.5,
        topVisible: i.top >= inner.top - 0.5 && i.top < inner.bottom,
        whole: i.top >= inner.top - 0.5 && i.bottom <= inner.bottom + 0.5,
        ratio: (i.width / i.height) / (img.naturalWidth / img.naturalHeight),
        width: i.width, height: i.height, cls: pane.className, outH: cs.getPropertyValue("--nbs-out-h"), maxH: cs.maxHeight,
    };
}"""


def _figure(pg, pane, where: str) -> dict:
    img = pane.locator("img.nbs-Rich-img")
    sync_api.expect(img.last).to_be_visible(timeout=60_000)
    # once the image is laid out and the pane scrolled to its bottom
    box = read_until(pg, lambda: pane.evaluate(FIGURE_BOX_JS), lambda b: b is not None and b["whole"] and b["fitsWidth"])
    assert box is not None, f"{where}: the figure's image never loaded"
    # 640 x 480 less what the inline backend's tight bounding box crops (about 550 x 430)
    assert box["natural"][0] >= 500 and box["natural"][1] >= 400, f"{where}: not a default-size figure: {box}"
    assert box["fitsWidth"], f"{where}: the figure is wider than the pane: {box}"
    assert box["topVisible"], f"{where}: the figure's top is cut off (the pane is scrolled past it): {box}"
    assert box["whole"], f"{where}: the figure is not shown whole in the pane: {box}"
    assert abs(box["ratio"] - 1) < 0.02, f"{where}: the figure is distorted: {box}"
    assert box["height"] >= 300, f"{where}: the figure is shrunk too far: {box}"
    return box


def test_a_default_size_figure_is_shown_whole_live_and_frozen(front, artifacts):
    pg = front.pg
    view = front.live(C_FIGURE)
    boxes = {}
    for rank in (0, 1):
        pane = select_pane(view, rank)
        sync_api.expect(pane).to_contain_text(f"rank {rank} plotting", timeout=60_000)
        boxes[f"live {rank}"] = _figure(pg, pane, f"{front.name} live, rank {rank}")
    shot(view, artifacts, f"figures-{front.name}-live.png", unhover=True)
    # the merged view opens at its bottom: the newest figure is whole there too
    boxes["live merged"] = _figure(pg, select_pane(view, "merged"), f"{front.name} live, merged")
    front.seen(FIGURE_SEEN)

    frozen = front.frozen(C_FIGURE)
    for rank in (0, 1):
        pane = select_pane(frozen, rank)
        boxes[f"frozen {rank}"] = _figure(pg, pane, f"{front.name} frozen, rank {rank}")
    shot(frozen, artifacts, f"figures-{front.name}-frozen.png", unhover=True)
    boxes["frozen merged"] = _figure(pg, select_pane(frozen, "merged"), f"{front.name} frozen, merged")
    shot(frozen, artifacts, f"figures-{front.name}-frozen-merged.png")
    print(front.name, {k: (round(b["width"]), round(b["height"]), b["cls"], b["outH"], b["maxH"]) for k, b in boxes.items()})


# -- 11. a bar stays where it was last seen -------------------------------------------------------------

# The pane's visible entries that name one of the markers, in document order; and whether the last
# one is in view.
ORDER_JS = """([pane, marks]) => {
    const nodes = [...pane.querySelectorAll('.nbs-Line, .nbs-Display')].filter(n => !n.hidden && n.getClientRects().length);
    const order = [];
    for (const n of nodes) {
        const text = n.textContent;
        const mark = marks.find(m => text.includes(m));
        if (mark) order.push(mark + (n.querySelector('progress') ? ' (widget)' : ''));
    }
    const last = nodes[nodes.length - 1];
    const p = pane.getBoundingClientRect(), r = last ? last.getBoundingClientRect() : null;
    return {order, lastText: last ? last.textContent.slice(0, 80) : null,
            lastInView: !!r && r.top >= p.top - 1 && r.bottom <= p.bottom + 1};
}"""


def _order(pg, pane, rank: int) -> dict:
    marks = [
        f"rank {rank} starting",
        f"rank {rank} halfway",
        f"epoch-r{rank}",
        f"rank {rank} epoch over",
        f"rank {rank} printed under the bar",
        f"tail-r{rank}",
    ]
    return pg.evaluate(ORDER_JS, [pane.element_handle(), marks])


def test_a_bar_stays_where_it_was_last_seen_when_the_view_freezes(front, artifacts):
    pg = front.pg
    view = front.live(C_BARS)
    pane = select_pane(view, 0)
    sync_api.expect(pane).to_contain_text("rank 0 halfway", timeout=60_000)
    # the ranks hold mid-epoch, a few redraws of the bar after that line, until the test has looked
    widget_last = ["rank 0 halfway", "epoch-r0 (widget)"]
    running = read_until(pg, lambda: _order(pg, pane, 0), lambda o: o["order"][-2:] == widget_last)
    shot(view, artifacts, f"bars-{front.name}-live-widget.png", unhover=True)
    front.seen(BARS_LOOKED)
    assert running["order"][-2:] == widget_last, f"live: the bar is not below the line printed meanwhile: {running}"

    sync_api.expect(pane).to_contain_text("rank 0 printed under the bar", timeout=60_000)
    order = [
        "rank 0 starting",
        "rank 0 halfway",
        "epoch-r0 (widget)",
        "rank 0 epoch over",
        "rank 0 printed under the bar",
        "tail-r0",
    ]

    def settled(o: dict) -> bool:
        return o["order"] == order and o["lastInView"] and "tail-r0" in (o["lastText"] or "")

    live = read_until(pg, lambda: _order(pg, pane, 0), settled)
    shot(view, artifacts, f"bars-{front.name}-live-tail.png")
    front.seen(BARS_SEEN)
    assert live["order"] == order, f"live: {live}"
    assert live["lastInView"] and "tail-r0" in live["lastText"], f"live: {live}"

    frozen = front.frozen(C_BARS)
    pane = select_pane(frozen, 0)
    end = read_until(pg, lambda: _order(pg, pane, 0), settled)
    shot(frozen, artifacts, f"bars-{front.name}-frozen.png", unhover=True)
    assert end["order"] == live["order"], f"the bars moved when the view froze: live {live['order']}, frozen {end['order']}"
    assert end["lastInView"] and "tail-r0" in end["lastText"], f"frozen: the open bar is not the last thing in view: {end}"


# -- 12. no "no output" under printed lines --------------------------------------------------------------


def _placeholders(pg, view) -> list[dict]:
    return pg.evaluate(
        """v => [...v.querySelectorAll('.nbs-Output')].map(o => ({
            pane: o.closest('.nbs-Pane').getAttribute('data-rank'),
            lines: [...o.querySelectorAll('.nbs-Flow > .nbs-Line')].filter(n => !n.hidden).length,
            empty: o.querySelectorAll('.nbs-Empty').length,
            shown: [...o.querySelectorAll('.nbs-Empty')].filter(n => n.getClientRects().length).length,
        }))""",
        view.element_handle(),
    )


def test_no_placeholder_under_a_programs_printed_lines(front, artifacts):
    pg = front.pg
    view = front.live(C_PROGRAM)
    # the pane first shown (the merged one) was built before the program printed anything
    sync_api.expect(view.locator(".nbs-Pane .nbs-Output")).to_contain_text("program line two", timeout=60_000)
    merged = read_until(pg, lambda: _placeholders(pg, view), lambda m: m and m[0]["lines"] >= 2 and m[0]["empty"] == 0)
    shot(view, artifacts, f"placeholder-{front.name}-live.png", unhover=True)
    assert merged and merged[0]["lines"] >= 2 and merged[0]["empty"] == 0, f"live: a placeholder under printed lines: {merged}"
    assert "no output" not in shown_text(view.locator(".nbs-Pane"))
    # the placeholder itself still works: rank 1 printed nothing
    select_pane(view, 1)
    quiet = read_until(pg, lambda: _placeholders(pg, view), lambda q: q[0]["lines"] == 0 and q[0]["shown"] == 1)
    assert quiet[0]["lines"] == 0 and quiet[0]["shown"] == 1, f"live: rank 1 printed nothing but shows no placeholder: {quiet}"
    pane0 = select_pane(view, 0)
    sync_api.expect(pane0).to_contain_text("program line one")
    assert _placeholders(pg, view)[0]["empty"] == 0
    front.seen(PROGRAM_SEEN)

    frozen = front.frozen(C_PROGRAM)
    pane0 = select_pane(frozen, 0)
    sync_api.expect(pane0).to_contain_text("program line two")
    assert _placeholders(pg, frozen)[0]["empty"] == 0
    shot(frozen, artifacts, f"placeholder-{front.name}-frozen.png", unhover=True)
