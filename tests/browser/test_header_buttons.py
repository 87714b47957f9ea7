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


@pytest.mark.parametrize(("button", "request_type"), [(".nbs-Where-button", "where"), (".nbs-Stop", "stop")])
def test_a_click_whose_press_and_release_straddle_a_redraw_of_the_header_is_taken(browser, button, request_type):
    with Page(browser, width=900, height=600) as p:
        pg = p.page
        css = (STATIC / "widget.css").read_text()
        pg.set_content(f"<!doctype html><html><head><style>{css}</style></head><body><div id='out'></div></body></html>")
        state = {"header": HEADER, "ranks": ranks("running", "running"), "error": None}
        pg.evaluate(MODEL, [(STATIC / "widget.js").read_text(), state])
        header = pg.locator(".nbs-Header")
        sync_api.expect(header.locator(".nbs-Header-counts")).to_have_text("2 running")
        box = pg.locator(button).bounding_box()
        assert box is not None
        pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        pg.mouse.down()
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
