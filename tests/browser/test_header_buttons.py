"""The live view's buttons take a click that a redraw of the header comes in the middle of.

The header is drawn again whenever what it says changes (a rank ends, each rank's memory figure moves,
every few seconds), and Chromium sends a click whose press and release straddle the removal of its
button to the button's old parent: the Where? a user pressed while a figure changed did nothing (a
hang's Where? asked in test_hang_view waited 60 s for an answer that was never asked for).  Here the
widget's own bundle (nbspawn/_static/widget.js) draws a run from a model the test holds, in a real
Chromium; between the mouse's press and its release the model says a rank has ended, and the button
must still have been clicked.
"""

from __future__ import annotations

import json

import pytest
from lab_harness import NEEDS_CHROMIUM, NEEDS_WIDGET, REPO, Page, sync_api

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120), NEEDS_CHROMIUM, NEEDS_WIDGET]

STATIC = REPO / "nbspawn" / "_static"

# anywidget's model API as the bundle uses it (get, on, off, send), over traits the test changes; what
# the view sends goes to window.sent
MODEL = """async ([js, state]) => {
  const handlers = {};
  window.sent = [];
  window.state = state;
  window.model = {
    get: name => window.state[name],
    on: (event, f) => { (handlers[event] ||= []).push(f); },
    off: () => {},
    send: content => window.sent.push(content),
    set_and_tell: (name, value) => { window.state[name] = value; (handlers['change:' + name] || []).forEach(f => f()); },
  };
  const url = URL.createObjectURL(new Blob([js], {type: 'text/javascript'}));
  const widget = (await import(url)).default;
  widget.initialize({model: window.model});
  widget.render({model: window.model, el: document.getElementById('out')});
}"""

HEADER = {"run_id": "r1", "status": "running", "nprocs": 2, "start_method": "fork", "backend": "gloo", "elapsed": 1}


def ranks(*statuses: str) -> list[dict]:
    return [{"rank": r, "status": s} for r, s in enumerate(statuses)]


def _live_run(p: Page) -> None:
    """The widget's bundle drawing a live run of two ranks from a model the test holds (``MODEL``)."""
    css = (STATIC / "widget.css").read_text()
    p.page.set_content(f"<!doctype html><html><head><style>{css}</style></head><body><div id='out'></div></body></html>")
    state = {"header": HEADER, "ranks": ranks("running", "running"), "error": None}
    p.page.evaluate(MODEL, [(STATIC / "widget.js").read_text(), state])
    sync_api.expect(p.page.locator(".nbs-Header .nbs-Header-counts")).to_have_text("2 running")


def _press(p: Page, button: str) -> None:
    box = p.page.locator(button).bounding_box()
    assert box is not None
    p.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    p.page.mouse.down()


@pytest.mark.parametrize(("button", "request_type"), [(".nbs-Where-button", "where"), (".nbs-Stop", "stop")])
def test_a_click_whose_press_and_release_straddle_a_redraw_of_the_header_is_taken(browser, button, request_type):
    with Page(browser, width=900, height=600) as p:
        pg = p.page
        _live_run(p)
        header = pg.locator(".nbs-Header")
        _press(p, button)
        # rank 1 ends while the button is held: the header says so before the button is let go
        pg.evaluate(f"() => window.model.set_and_tell('ranks', {json.dumps(ranks('running', 'done'))})")
        sync_api.expect(header.locator(".nbs-Header-counts")).to_have_text("1 running · 1 done")
        pg.mouse.up()
        sent = pg.evaluate("() => window.sent.map(m => m.type)")
        assert request_type in sent, sent
        assert sent.count(request_type) == 1, sent
        # the redrawn header is whole: its badge, title and counts, then the buttons, then the figures
        main = [c.split()[0] for c in pg.eval_on_selector_all(".nbs-Header-main > *", "els => els.map(e => e.className)")]
        assert main == ["nbs-Badge", "nbs-Header-title", "nbs-Header-counts", "nbs-Header-actions"], main
        assert pg.locator(".nbs-Header-meta").count() == 1 and pg.locator(".nbs-Header").count() == 1
        assert not p.errors, p.errors


def test_where_pressed_as_the_unanswered_stops_hint_comes_is_taken(browser):
    """A Stop the kernel has not answered in 4 s gets a hint under the header (use Interrupt), and the
    button says "Stop" again instead of "Stopping…": the Where? held down meanwhile stays in the page
    and where it was, and its click is taken."""
    with Page(browser, width=900, height=600) as p:
        pg = p.page
        _live_run(p)
        where = pg.locator(".nbs-Where-button")
        before = where.bounding_box()
        pg.locator(".nbs-Stop").click()  # the model never says the run is stopping
        assert where.bounding_box() == before  # "Stopping…" takes no more room than "Stop"
        _press(p, ".nbs-Where-button")
        hint = pg.locator(".nbs-Header > .nbs-Stop-hint")
        sync_api.expect(hint).to_be_visible(timeout=30_000)  # 4 s after the click
        assert where.bounding_box() == before  # nothing moved under the pointer
        pg.mouse.up()
        sent = pg.evaluate("() => window.sent.map(m => m.type)")
        assert sent.count("stop") == 1 and sent.count("where") == 1, sent
        assert "use Interrupt" in hint.inner_text()
        assert pg.locator(".nbs-Stop").is_enabled()  # to be tried again
        assert not p.errors, p.errors
