"""A page reloaded (or opened in a second tab) while a `%%spawn` cell runs: reattaching, never an error.

The widget manager of a page loaded while the kernel's main shell runs the cell cannot get the live
widget's model (its `comm_info_request` waits for the cell), and the page does not know the cell's
display id.  The labextension's renderer of `application/vnd.nbspawn.live+json` (reattach.ts) must
show "running for N s; reattaching…", then the live view (following the widget's messages on the
kernel's iopub, asking for the state and the kept tail on a subshell), then the frozen run when the
kernel replaces the display, and put the frozen bundle in the notebook, so that a save keeps it.
A live display whose run the kernel no longer knows says that its end was not recorded.

Real JupyterLab and Notebook 7, a real kernel, Debian's Chromium via Playwright.  Screenshots go to
test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    KERNEL_IDLE,
    KERNEL_STATUS_JS,
    NEEDS_WIDGET,
    KernelStatuses,
    Page,
    chip_statuses,
    close_current_tab,
    dark_theme,
    frozen_run,
    live_view,
    notebook_root,
    notebook_url,
    open_notebook,
    open_with_nbspawn,
    page_shot,
    run_cell,
    save_until,
    serve,
    shot,
    shown_text,
    sync_api,
    wait_for_js,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

LIVE_MIME = "application/vnd.nbspawn.live+json"
RUN_MIME = "application/vnd.nbspawn.run+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
LOAD = "%load_ext nbspawn"

# 4 ranks, a line every 0.25 s and a progress line on stderr until the test creates END (in the
# server's root, the kernel's working directory), then a last line.
END = "end-the-run.flag"
LONG = f"""\
%%spawn -n 4
import os, sys, time
rank = int(os.environ["RANK"])
t0 = time.monotonic()
i = 0
while not os.path.exists({END!r}) and time.monotonic() - t0 < 300:
    print(f"rank {{rank}} tick {{i}}", flush=True)
    sys.stderr.write(f"\\rwork {{i:4d}}")
    sys.stderr.flush()
    i += 1
    time.sleep(0.25)
print(f"rank {{rank}} finished after {{i}} ticks", flush=True)
"""

# Runs until Stop is clicked.
FOREVER = """\
%%spawn -n 2
import os, time
rank = int(os.environ["RANK"])
for i in range(100_000):
    print(f"rank {rank} tick {i}", flush=True)
    time.sleep(0.25)
"""

# A live display whose widget the kernel never had (a notebook saved mid-run, opened again later).
STALE = """\
from IPython.display import display
handle = display({
    "application/vnd.jupyter.widget-view+json": {"model_id": "0123456789abcdef0123456789abcdef",
                                                 "version_major": 2, "version_minor": 1},
    "application/vnd.nbspawn.live+json": {"run_id": "20260101-000000-dead", "model_id": "0123456789abcdef0123456789abcdef",
                                          "display_id": "feedfacefeedfacefeedfacefeedface",
                                          "started_at": 1767225600.0, "nprocs": 2},
    "text/plain": "nbspawn run 20260101-000000-dead: 2 ranks, running",
}, raw=True, display_id="feedfacefeedfacefeedfacefeedface")
"""

# Installed in every document before its scripts run: records any "Error displaying widget" drawn
# in an output (polled every 50 ms), the modes the reattaching renderer went through, and whether a
# live display ever showed nothing of its run.
WATCH_JS = """
(() => {
  window.__nbsErrors = [];
  window.__nbsModes = [];
  window.__nbsBlank = [];
  window.__nbsPlaceholders = [];  // each text a reattaching placeholder showed, as it was drawn
  new MutationObserver(() => {
    for (const ph of document.querySelectorAll('.nbs-Reattach-placeholder')) {
      const t = (ph.textContent || '').trim();
      if (t && !window.__nbsPlaceholders.includes(t)) window.__nbsPlaceholders.push(t);
    }
  }).observe(document, {subtree: true, childList: true, characterData: true});
  setInterval(() => {
    for (const out of document.querySelectorAll('.jp-OutputArea-output')) {
      const t = out.innerText || '';  // what is shown: not the hidden widget behind a placeholder
      if (t.includes('Error displaying widget')) {
        if (!window.__nbsErrors.includes(t.slice(0, 200))) window.__nbsErrors.push(t.slice(0, 200));
      }
    }
    for (const r of document.querySelectorAll('.nbs-Reattach[data-mode]')) {
      const m = r.getAttribute('data-mode');
      if (window.__nbsModes[window.__nbsModes.length - 1] !== m) window.__nbsModes.push(m);
    }
    // a live display that shows nothing of its run (blank, or the widget manager's "Loading widget...")
    // where it can be seen: JupyterLab 4.6 gives each cell `content-visibility: auto` (its default
    // windowing mode), so a cell the browser counts off screen while a reloaded notebook is laid out
    // is skipped, and innerText is '' in a skipped subtree though no user sees it blank (read so, in
    // CI at 5f93009, Chromium 155)
    for (const r of document.querySelectorAll('.nbs-Reattach')) {
      const t = (r.innerText || '').trim();
      if (!(t === '' || t.startsWith('Loading widget'))) continue;
      const seen = r.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true});
      const what = `${seen ? 'shown' : 'not shown'} ${r.getAttribute('data-mode')} ${performance.now().toFixed(0)} ms: ` +
        r.outerHTML.slice(0, 600);
      // what it was when it read blank, for the failure's message
      if ((window.__nbsBlankSeen || []).length < 5) window.__nbsBlankSeen = (window.__nbsBlankSeen || []).concat([what]);
      if (seen && !window.__nbsBlank.includes(t)) window.__nbsBlank.push(t);
    }
  }, 50);
})();
"""


def _write(root: Path) -> None:
    write_notebook(root, "reattach.ipynb", [LOAD, LONG, STALE])
    write_notebook(root, "nb7-reattach.ipynb", [LOAD, FOREVER])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("reattach-lab"), _write)


@pytest.fixture(scope="module")
def nb7(tmp_path_factory):
    yield from serve("notebook", tmp_path_factory.mktemp("reattach-nb7"), _write)


def _saved_outputs(path: Path, index: int) -> list[dict]:
    return json.loads(path.read_text())["cells"][index]["outputs"]


def _save(pg, path: Path, predicate) -> list:
    """Ctrl+S until the file on disk satisfies ``predicate``; its cells."""
    return save_until(pg, path, predicate)["cells"]


def _start_and_reload(pg, cells, index: int, artifacts: Path, prefix: str, path: Path) -> None:
    """Run cell ``index`` (a %%spawn cell), see its live widget, save mid-run, reload the page."""
    run_cell(pg, cells.nth(index))
    live = live_view(cells.nth(index), widget=True)
    # the widget is drawn by way of the reattaching renderer, which only delegates on this page
    reattach = cells.nth(index).locator(".nbs-Reattach")
    assert reattach.get_attribute("data-mode") in (None, "delegate")
    # the run 5 s old (tick 20, 0.25 s apart) before the page is: a reattached clock that counted from the page's
    # load instead of the run's start would read 5 s less, where its whole seconds lag by up to one (rehearsal K
    # reloaded 2 s in: 8 s shown, the run 9.1 s old, the page 7.0)
    wait_for_js(live, "v => /tick (2\\d|[3-9]\\d|\\d{3,})\\b/.test(v.textContent)", 60_000)
    shot(live, artifacts, f"{prefix}-before-reload.png", unhover=True)
    # saved with its live display (a save is asynchronous: Ctrl+S until the file holds it, not a fixed wait)
    _save(pg, path, lambda nb: any(LIVE_MIME in o.get("data", {}) for o in nb["cells"][index]["outputs"]))
    # the document, not every resource's load: what the test needs of the page it waits for next (90 s
    # each); a reload mid-run under a busy machine once took longer than 120 s to fire 'load' (CI, 2026-12-03)
    pg.reload(wait_until="domcontentloaded")


@pytest.fixture
def ends_the_long_run(lab):
    """The LONG cell's run ends when this test does, passed or failed: the next test of this module
    opens the same notebook on the same kernel, and must find it idle."""
    yield
    (lab.root / END).write_text("")


def _says_busy(pg, timeout_ms: float, heard: KernelStatuses | None = None) -> None:
    """JupyterLab's status bar on ``pg`` says Busy within ``timeout_ms``; if not, the failure says what it
    said instead, and what statuses the page heard (``heard``, recorded from before the page loaded)."""
    try:
        pg.wait_for_function(f"() => ({KERNEL_STATUS_JS['lab']})() === 'Busy'", timeout=timeout_ms)
    except Exception:
        said = pg.evaluate(KERNEL_STATUS_JS["lab"])
        raise AssertionError(f"the status bar says {said!r}, not Busy" + (f"; {heard.recent()}" if heard else "")) from None


def test_lab_reload_mid_run_reattaches_then_freezes(lab, browser, artifacts, ends_the_long_run):
    path = lab.root / "reattach.ipynb"
    with Page(browser, width=1200, height=1100) as p:
        pg = p.page
        pg.add_init_script(WATCH_JS)
        heard = KernelStatuses(pg)
        cells = open_with_nbspawn(pg, lab, "reattach.ipynb")
        _start_and_reload(pg, cells, 1, artifacts, "reattach-lab", path)
        # the file saved mid-run holds the live display, with its run's ids
        saved = _saved_outputs(path, 1)
        live_info = next(o["data"][LIVE_MIME] for o in saved if LIVE_MIME in o.get("data", {}))
        assert set(live_info) >= {"run_id", "model_id", "display_id", "started_at", "nprocs"}

        # ---- after the reload: the placeholder or the live view, never an error ------------------
        panel = notebook_root(pg, lab)
        cell = panel.locator(".jp-Cell").nth(1)
        reattach = cell.locator(".nbs-Reattach")
        reattach.wait_for(timeout=90_000)
        placeholder = reattach.locator(".nbs-Reattach-placeholder")
        said = rf"nbspawn run {re.escape(live_info['run_id'])} — 4 ranks, running for \d+ s"
        if placeholder.is_visible():  # a picture of it, when the test is in time to see it
            shot(reattach, artifacts, "reattach-lab-placeholder.png")
        view = live_view(reattach, 60_000)
        # every text the placeholder showed, recorded as drawn (WATCH_JS): at once which run, for how long;
        # "reattaching" once the widget could not draw it here; nothing else, however soon the live view came
        placeholders = pg.evaluate("window.__nbsPlaceholders")
        print("the placeholder said:", placeholders)
        assert placeholders, "no placeholder was drawn before the live view"
        assert all(re.fullmatch(rf"{said}(; reattaching…)?", t) for t in placeholders), placeholders
        assert reattach.get_attribute("data-mode") == "live"
        # from its first frame the cell said which run it is: never blank, never "Loading widget..."
        print("blank reads of a reattaching view:", pg.evaluate("window.__nbsBlankSeen"))
        assert pg.evaluate("window.__nbsBlank") == [], pg.evaluate("window.__nbsBlankSeen")
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(4)
        sync_api.expect(view.locator(".nbs-Chip[data-status='running']")).to_have_count(4)
        # the kept tail came back (replay), and new lines keep coming
        wait_for_js(view, "v => (v.textContent.match(/tick \\d+/g) || []).length >= 10", 60_000)
        ticks = lambda: max(int(n) for n in re.findall(r"tick (\d+)", shown_text(view)))  # noqa: E731
        before = ticks()
        clock = view.locator(".nbs-Clock").inner_text()
        # the reattached view follows the run: new ticks come, and the clock ticks (waited for, not a while)
        wait_for_js(view, f"v => Math.max(...(v.textContent.match(/tick \\d+/g) || []).map(t => +t.slice(5))) > {before}", 60_000)
        sync_api.expect(view.locator(".nbs-Clock")).not_to_have_text(clock, timeout=30_000)
        # the elapsed time is the run's, not the page's: read beside the run's age and the page's, at one moment
        shown, run_age, page_age = view.locator(".nbs-Clock").evaluate(
            "(c, started) => [c.textContent.trim(), Date.now() / 1000 - started, performance.now() / 1000]",
            live_info["started_at"],
        )
        m = re.fullmatch(r"(\d+) s", shown)
        assert m, shown
        secs = int(m.group(1))
        assert secs <= run_age + 1 and abs(secs - run_age) < abs(secs - page_age), (shown, run_age, page_age)
        # the kernel's status is that of the running cell, once the page has heard a status: the live view
        # can be drawn before that (the ranks' figures come with a sync every second), and CI's stop 54 read
        # "Unknown" here in that moment; the page's own requests bring the cell's busy
        _says_busy(pg, 60_000, heard)
        shot(view, artifacts, "reattach-lab-live.png", unhover=True)
        page_shot(pg, artifacts, "reattach-lab-page.png")
        # Where? is there, as on the page that ran the cell, and its answer comes to this page
        view.locator(".nbs-Where-button").click()
        where = view.locator(".nbs-Where-text")
        sync_api.expect(where).to_contain_text(re.compile(r"^ranks? [\d,-]+: Cell In\[2\], line \d+", re.M), timeout=20_000)
        shot(view, artifacts, "reattach-lab-where.png", unhover=True)
        with dark_theme(pg):
            shot(view, artifacts, "reattach-lab-where-dark.png", unhover=True)
        view.locator(".nbs-Where-close").click()

        # ---- a second tab, opened mid-run, reattaches too ------------------------------------------
        pg2 = p.new_page()
        pg2.add_init_script(WATCH_JS)
        pg2.goto(notebook_url(lab, "reattach.ipynb"))
        cell2 = notebook_root(pg2, lab).locator(".jp-Cell").nth(1)
        view2 = cell2.locator(".nbs-Reattach[data-mode='live'] .nbs-Run.nbs-mod-live")
        view2.wait_for(timeout=90_000)
        wait_for_js(view2, "v => (v.textContent.match(/tick \\d+/g) || []).length >= 10", 60_000)
        shot(view2, artifacts, "reattach-lab-second-tab.png", unhover=True)
        # its status bar says Busy once it has heard a status: the live view can be drawn before that now (the
        # ranks' figures come with a sync every second), and the page's own requests bring the cell's busy
        _says_busy(pg2, 60_000)
        # nor did the second tab's requests change the first tab's, once they are answered: each of them
        # (a reattaching page sends some 20: subshells, comm info, debug requests) publishes its own idle,
        # which nbspawn follows with the cell's busy within the millisecond; a page can be read between
        # the two (ci69 read Idle here once), so it is waited for as the second tab's is (a hang guard)
        _says_busy(pg, 60_000, heard)

        # ---- the end: the frozen run in the cell, and in the notebook --------------------------------
        (lab.root / END).write_text("")
        frozen = frozen_run(cell, 60_000)
        frozen2 = frozen_run(cell2, 60_000)
        assert chip_statuses(frozen2) == ["done"] * 4
        assert pg2.evaluate("window.__nbsErrors") == [], pg2.evaluate("window.__nbsErrors")
        pg2.close()  # unsaved: the first tab saves
        assert cell.locator(".nbs-mod-live").count() == 0
        assert cell.locator(".nbs-Reattach").count() == 0  # the output area draws the new bundle itself
        assert chip_statuses(frozen) == ["done"] * 4
        text = shown_text(frozen.locator(".nbs-Output"))
        assert all(f"rank {r} finished after" in text for r in range(4)), text
        shot(frozen, artifacts, "reattach-lab-frozen.png", unhover=True)
        sync_api.expect(panel.locator(KERNEL_IDLE)).to_have_count(1, timeout=30_000)

        cells_saved = _save(pg, path, lambda nb: any(RUN_MIME in o.get("data", {}) for o in nb["cells"][1]["outputs"]))
        outs = cells_saved[1]["outputs"]
        assert [o["output_type"] for o in outs] == ["display_data"], outs
        assert RUN_MIME in outs[0]["data"] and "text/html" in outs[0]["data"]
        assert LIVE_MIME not in outs[0]["data"] and WIDGET_MIME not in outs[0]["data"]
        assert outs[0]["data"][RUN_MIME]["run_id"] == live_info["run_id"]
        assert outs[0]["data"][RUN_MIME]["status"] == "succeeded"

        # ---- a live display whose run the kernel does not know: said so, no spinner, no error -----
        stale = panel.locator(".jp-Cell").nth(2)
        run_cell(pg, stale)
        lost = stale.locator(".nbs-Reattach[data-mode='lost'] .nbs-Reattach-lost")
        lost.wait_for(timeout=30_000)
        assert lost.inner_text() == (
            "nbspawn run 20260101-000000-dead: this run's live view was saved while it ran; its end was not "
            "recorded (logs: …/20260101-000000-dead/)."
        ), lost.inner_text()
        shot(stale, artifacts, "reattach-lab-lost.png")
        assert pg.evaluate("window.__nbsErrors") == [], pg.evaluate("window.__nbsErrors")
        # sampled every 50 ms by the page: a starved page may not have sampled since the lost note appeared
        pg.wait_for_function("(window.__nbsModes || []).includes('lost')", timeout=30_000)
        modes = pg.evaluate("window.__nbsModes")
        assert "live" in modes and "lost" in modes, modes
        assert p.dialogs == [], p.dialogs
        assert not p.nbspawn_errors(), p.errors


def test_notebook7_reload_mid_run_reattaches_and_stops(nb7, browser, artifacts):
    path = nb7.root / "nb7-reattach.ipynb"
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        pg.add_init_script(WATCH_JS)
        cells = open_with_nbspawn(pg, nb7, "nb7-reattach.ipynb")
        _start_and_reload(pg, cells, 1, artifacts, "reattach-nb7", path)

        cell = pg.locator(".jp-Cell").nth(1)
        reattach = cell.locator(".nbs-Reattach")
        reattach.wait_for(timeout=90_000)
        view = live_view(reattach, 60_000)
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(2)
        wait_for_js(view, "v => (v.textContent.match(/tick \\d+/g) || []).length >= 6", 60_000)
        shot(view, artifacts, "reattach-nb7-live.png", unhover=True)

        # Stop, from the reattached view (its message goes on the page's own subshell)
        stop = view.locator(".nbs-Stop")
        stop.click()
        frozen = frozen_run(cell, 60_000)  # a hang guard: Stop ends the run (how soon: bench/page.py's figure)
        assert chip_statuses(frozen) == ["stopped"] * 2
        shot(frozen, artifacts, "reattach-nb7-frozen.png")
        cells_saved = _save(pg, path, lambda nb: any(RUN_MIME in o.get("data", {}) for o in nb["cells"][1]["outputs"]))
        data = next(o["data"] for o in cells_saved[1]["outputs"] if o["output_type"] == "display_data")
        assert RUN_MIME in data and LIVE_MIME not in data and data[RUN_MIME]["status"] == "stopped"
        assert pg.evaluate("window.__nbsErrors") == [], pg.evaluate("window.__nbsErrors")
        assert p.dialogs == [], p.dialogs


def test_lab_notebook_closed_and_opened_again_mid_run(lab, browser, artifacts):
    """Same page, the notebook's tab closed and opened again mid-run: the new view's widget manager
    cannot get the model while the cell runs either, so it reattaches; the run's end, which no
    output area of this view asked for, replaces it."""
    path = lab.root / "reattach.ipynb"
    (lab.root / END).unlink(missing_ok=True)
    with Page(browser, width=1200, height=1100) as p:
        pg = p.page
        pg.add_init_script(WATCH_JS)
        cells = open_notebook(pg, lab, "reattach.ipynb")
        panel = notebook_root(pg, lab)
        run_cell(pg, cells.nth(0), until=re.compile(r"\[\d+\]:"))
        run_cell(pg, cells.nth(1))
        live_view(cells.nth(1), widget=True)
        _save(pg, path, lambda nb: any(LIVE_MIME in o.get("data", {}) for o in nb["cells"][1]["outputs"]))

        close_current_tab(pg, panel)
        pg.locator(
            ".jp-DirListing-item[title*='reattach.ipynb'] .jp-DirListing-itemText", has_text=re.compile(r"^reattach\.ipynb$")
        ).dblclick()
        panel = notebook_root(pg, lab)
        cell = panel.locator(".jp-Cell").nth(1)
        view = live_view(cell.locator(".nbs-Reattach"))
        assert cell.locator(".nbs-Reattach").get_attribute("data-mode") == "live"
        shot(view, artifacts, "reattach-lab-reopened.png", unhover=True)

        (lab.root / END).write_text("")
        frozen = frozen_run(cell, 30_000)
        assert chip_statuses(frozen) == ["done"] * 4
        assert cell.locator(".nbs-mod-live").count() == 0
        cells_saved = _save(pg, path, lambda nb: any(RUN_MIME in o.get("data", {}) for o in nb["cells"][1]["outputs"]))
        assert LIVE_MIME not in json.dumps(cells_saved[1]["outputs"])
        assert pg.evaluate("window.__nbsErrors") == [], pg.evaluate("window.__nbsErrors")
        assert p.dialogs == [], p.dialogs
