"""``ipywidgets.Output`` in a rank (issue #17): it captures what the rank prints and displays while
it is entered, as in a notebook, and its pane shows what it holds where it was displayed, updated in
place; rich's live displays (``rich.progress.track``) draw this way in a kernel."""

from __future__ import annotations

import importlib.util
import uuid

import pytest
from kernel_harness import ok, rank_lines
from widget_harness import spawn_widget

# found, not imported: what this test process imports, ranks it forks elsewhere would inherit
_MISSING = [m for m in ("ipywidgets", "rich") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"not installed: {_MISSING}")

OUTPUT = """
import os, sys, ipywidgets as widgets
from IPython.display import display, clear_output
r = os.environ["RANK"]
out = widgets.Output()
print(f"before {r}")
with out:
    print(f"held {r}")  # captured before the widget is shown: shown with it
display(out)
with out:
    print(f"inside {r}")
    print(f"warned {r}", file=sys.stderr)
    display({"text/html": f"<b>bold {r}</b>", "text/plain": f"bold {r}"}, raw=True)
print(f"between {r}")
ticker = widgets.Output()
display(ticker)
for i in range(3):
    with ticker:
        clear_output(wait=True)
        print(f"tick {i} of rank {r}")
print(f"after {r}")
"""


def _items(run, rank: int) -> list[dict]:
    return [v for m in run.custom if m["type"] == "output" for k, s, v in m["chunks"] if k == rank and s == "display"]


def _last_by_id(items: list[dict]) -> dict[str, dict]:
    """Each display's last content (its first showing, then its updates), by id, in order shown."""
    last: dict[str, dict] = {}
    for item in items:
        if item.get("id") is not None:
            last[str(item["id"])] = item
    return last


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_an_output_widget_holds_what_the_rank_wrote_in_it_and_shows_it_in_the_pane(kernel, method):
    result, run = spawn_widget(kernel, OUTPUT, options=f"-n 2 --start-method {method}", timeout=180)
    assert result.status == "ok", result.error_text
    assert "set_parent" not in result.stderr
    text = run.live_text()
    for r in range(2):
        # the rank's own lines, and none of what went into the widgets
        lines = text[r].splitlines()
        assert lines == [f"before {r}", f"between {r}", f"after {r}"], text[r]
        shown = _last_by_id(_items(run, r))
        outputs = [item for key, item in shown.items() if key.startswith("nbspawn-output:")]
        assert len(outputs) == 2, shown
        first, ticker = outputs
        assert first["mime"] == "text/html", first
        assert first["text"] == f"held {r}\ninside {r}\nwarned {r}\nbold {r}\n", first
        assert f"<b>bold {r}</b>" in first["value"] and f"<pre>held {r}\ninside {r}\n</pre>" in first["value"]
        # clear_output(wait=True) in the widget clears it, not the pane, when the next line comes
        assert ticker["mime"] == "text/plain" and ticker["value"] == f"tick 2 of rank {r}\n", ticker


def test_rich_progress_track_draws_in_its_rank_pane(kernel):
    body = (
        "import os, time\nfrom rich.progress import track\n"
        "for _ in track(range(5), description=f'rich{os.environ[\"RANK\"]}'):\n    time.sleep(0.02)\n"
        "print('done')\n"
    )
    result, run = spawn_widget(kernel, body, options="-n 2 --start-method fork", timeout=180)
    assert result.status == "ok", result.error_text
    assert "Traceback" not in result.stderr
    for r in range(2):
        assert run.live_text()[r] == "done\n"
        bars = [i for k, i in _last_by_id(_items(run, r)).items() if k.startswith("nbspawn-output:")]
        assert bars and f"rich{r}" in bars[-1]["text"] and "100%" in bars[-1]["text"], bars


def test_output_widgets_on_a_kept_world_cell_after_cell(kernel):
    world = f"ow{uuid.uuid4().hex[:6]}"
    try:
        body = (
            "import ipywidgets as widgets\nout = widgets.Output()\ndisplay(out)\n"
            "with out:\n    print('in the widget')\nprint('in the pane')\n"
        )
        for first in (True, False):
            options = f"--world {world}" + (" -n 2 --start-method fork" if first else "")
            result, run = spawn_widget(kernel, body, options=options)
            assert result.status == "ok", result.error_text
            for r in range(2):
                assert run.live_text()[r] == "in the pane\n"
                bars = [i for k, i in _last_by_id(_items(run, r)).items() if k.startswith("nbspawn-output:")]
                assert [b["text"] for b in bars] == ["in the widget\n"], bars
        # the text view: what a widget holds is its text, a display updated in place (so drawn as a
        # bar is, and printed when the rank ends)
        shown = ok(kernel, f"%%spawn --world {world} --view text\n{body}").stdout
        for r in range(2):
            assert rank_lines(shown, r) == ["in the pane", "in the widget"], shown
    finally:
        ok(kernel, f"%spawn stop {world}")
