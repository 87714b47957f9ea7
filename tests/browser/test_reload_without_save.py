"""A page reloaded while (or after) a `%%spawn` cell re-ran, with no save since the run started.

The file then holds the cell's *previous* run.  The kernel remembers each cell's latest run
(nbspawn/views/_active.py, keyed by the execute_request's ``cellId``); the labextension asks for
them on a subshell when the notebook connects to its kernel (reattach.ts ``CellRuns``) and puts
them in the cell: the live display (which reattaches: the live view, then the frozen run when the
run ends) or, if the run ended before the page asked, its frozen run.  Never the previous run.
The reattached view's Stop button is the live widget's red one (computed style).

Each test: run the cell once to its end and save; re-run it (it runs until the test creates a flag
file) and reload ~4 s later without saving.  Real JupyterLab and Notebook 7, a real kernel,
Debian's Chromium via Playwright.  Screenshots go to test-artifacts/browser/ (reload-*.png).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    FROZEN_RUN,
    KERNEL_IDLE,
    NEEDS_WIDGET,
    Page,
    Server,
    chip_statuses,
    frozen_run,
    live_view,
    notebook_root,
    notebook_url,
    page_shot,
    run_cell,
    save_until,
    serve,
    shot,
    shown_text,
    sync_api,
    wait_for_js,
    wait_until_ready,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_WIDGET]

LIVE_MIME = "application/vnd.nbspawn.live+json"
RUN_MIME = "application/vnd.nbspawn.run+json"
LOAD = "%load_ext nbspawn"
FLAG = "end-{name}.flag"  # in the server's root, the kernel's working directory

# 2 ranks, a line every 0.25 s until the flag file exists (at once, if it does), then a last line
# that says how many ticks the run made: 0 for the first run, more for the re-run.
LONG = """\
%%spawn -n 2
import os, time
rank = int(os.environ["RANK"])
t0 = time.monotonic()
i = 0
while not os.path.exists({flag!r}) and time.monotonic() - t0 < 240:
    print(f"rank {{rank}} tick {{i}}", flush=True)
    i += 1
    time.sleep(0.25)
print(f"rank {{rank}} finished after {{i}} ticks", flush=True)
"""

NAMES = ("running", "ended")
STOP_STYLE = """e => { const s = getComputedStyle(e);
    return {color: s.color, background: s.backgroundColor, border: s.borderTopColor, radius: s.borderTopLeftRadius}; }"""


def _write(root: Path) -> None:
    for name in NAMES:
        write_notebook(root, f"{name}.ipynb", [LOAD, LONG.format(flag=FLAG.format(name=name))])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("reload-lab"), _write)


@pytest.fixture(scope="module")
def nb7(tmp_path_factory):
    yield from serve("notebook", tmp_path_factory.mktemp("reload-nb7"), _write)


def _run_ids(nb: dict) -> list[str]:
    """The run ids of the frozen runs in a notebook's long cell."""
    outs = nb["cells"][1]["outputs"]
    return [o["data"][RUN_MIME]["run_id"] for o in outs if RUN_MIME in o.get("data", {})]


def _saved_run_ids(path: Path) -> list[str]:
    return _run_ids(json.loads(path.read_text()))


@contextmanager
def _shot_on_failure(p: Page, artifacts: Path) -> Iterator[None]:
    """A failing test leaves a picture of its page (whichever page it has by then)."""
    try:
        yield
    except Exception:
        page_shot(p.page, artifacts, f"reload-failed-{time.strftime('%H%M%S')}.png")
        raise


def _rerun_unsaved(pg, root, server, name: str, artifacts: Path, prefix: str) -> tuple[str, dict]:
    """Run the long cell to its end and save; re-run it (live, not saved).  Returns the first run's id
    and the live widget's Stop style."""
    path, flag = server.root / f"{name}.ipynb", server.root / FLAG.format(name=name)
    cells = wait_until_ready(root)
    run_cell(pg, cells.nth(0), until="[1]:")

    flag.write_text("")  # the first run ends at once
    run_cell(pg, cells.nth(1), until="[2]:")
    frozen_run(cells.nth(1))
    save_until(pg, path, lambda nb: len(_run_ids(nb)) == 1)
    first = _saved_run_ids(path)[0]

    flag.unlink()
    run_cell(pg, cells.nth(1))
    live = live_view(cells.nth(1), widget=True)
    wait_for_js(live, "v => /tick 4/.test(v.textContent)")
    style = live.locator(".nbs-Stop").evaluate(STOP_STYLE)
    shot(live, artifacts, f"{prefix}-before-reload.png", unhover=True)
    assert _saved_run_ids(path) == [first]  # no save since the re-run started
    return first, style


def _reload(p: Page, url: str):
    """The page goes away unsaved and the notebook is loaded again (a reload, without the "leave the
    page?" prompt that Chromium shows for a dirty notebook): the new page and its notebook's root."""
    p.page.close()  # no beforeunload: the run goes on, unsaved
    pg = p.page = p.new_page()
    pg.goto(url)
    return pg


def _follow_live_then_freeze(pg, root, server, name, first, style, artifacts, prefix) -> None:
    path, flag = server.root / f"{name}.ipynb", server.root / FLAG.format(name=name)
    cell = root.locator(".jp-Cell").nth(1)
    reattach = cell.locator(".nbs-Reattach[data-mode='live']")
    view = live_view(reattach)
    run_id = reattach.get_attribute("data-run-id")
    assert run_id and run_id != first, (run_id, first)
    assert cell.locator(".nbs-RunRenderer").count() == 0, "the previous run's frozen output is still shown"
    sync_api.expect(view.locator(".nbs-Chip[data-status='running']")).to_have_count(2)
    ticks = lambda: max(int(n) for n in re.findall(r"tick (\d+)", shown_text(view)))  # noqa: E731
    wait_for_js(view, "v => /tick \\d+/.test(v.textContent)", 60_000)
    before = ticks()
    # the reattached view follows the run: a newer tick comes (waited for, not a while; issue #55)
    wait_for_js(view, f"v => Math.max(...(v.textContent.match(/tick \\d+/g) || []).map(t => +t.slice(5))) > {before}", 60_000)

    # its Stop is the live widget's red button, not a grey default one
    stop = view.locator(".nbs-Stop")
    got = stop.evaluate(STOP_STYLE)
    assert got == style, (got, style)
    r, g, b = (int(x) for x in re.findall(r"\d+", got["color"])[:3])
    assert r > 150 and g < 100 and b < 100, got
    assert got["radius"] not in ("0px", ""), got
    shot(view, artifacts, f"{prefix}-reattached-live.png", unhover=True)

    flag.write_text("")
    frozen = frozen_run(cell, 30_000)
    assert cell.locator(".nbs-mod-live").count() == 0
    assert chip_statuses(frozen) == ["done"] * 2
    text = shown_text(frozen)
    counts = [int(n) for n in re.findall(r"finished after (\d+) ticks", text)]
    assert len(counts) == 2 and min(counts) > 0, text  # the re-run's end, not the first run's (0 ticks)
    shot(frozen, artifacts, f"{prefix}-frozen.png", unhover=True)
    save_until(pg, path, lambda nb: _run_ids(nb) == [run_id])
    assert LIVE_MIME not in json.dumps(json.loads(path.read_text())["cells"][1]["outputs"])


def _reload_mid_rerun(p: Page, server: Server, artifacts: Path, prefix: str) -> None:
    """Re-run the cell unsaved, reload ~4 s after the re-run started: the reattached view follows the
    new run to its end."""
    url = notebook_url(server, "running.ipynb")
    p.page.goto(url)
    first, style = _rerun_unsaved(p.page, notebook_root(p.page, server), server, "running", artifacts, prefix)
    p.page.wait_for_timeout(2500)  # ~4 s after the re-run started
    pg = _reload(p, url)
    _follow_live_then_freeze(pg, notebook_root(pg, server), server, "running", first, style, artifacts, prefix)
    assert not p.nbspawn_errors(), p.errors
    # the notebook opened on a new kernel (no nbspawn there yet: nothing asked of it), then reloaded
    # (asked, answered): no page logged the close of an nbspawn.active comm it does not know.  (The
    # reloaded page does log it for the run's widget and status comms, opened before it connected.)
    assert not [e for e in p.console_errors if "Comm not found for comm id nbspawn-active" in e], p.console_errors


def test_lab_reload_mid_rerun_without_save_shows_the_new_run(lab, browser, artifacts):
    with Page(browser, width=1200, height=900) as p, _shot_on_failure(p, artifacts):
        _reload_mid_rerun(p, lab, artifacts, "reload-lab")


def test_lab_reload_after_the_rerun_ended_without_save_shows_its_end(lab, browser, artifacts):
    path, flag = lab.root / "ended.ipynb", lab.root / FLAG.format(name="ended")
    with Page(browser, width=1200, height=900) as p, _shot_on_failure(p, artifacts):
        pg = p.page
        url = notebook_url(lab, "ended.ipynb")
        pg.goto(url)
        root = notebook_root(pg, lab)
        first, _ = _rerun_unsaved(pg, root, lab, "ended", artifacts, "reload-lab-ended")
        flag.write_text("")
        cell = root.locator(".jp-Cell").nth(1)
        frozen_run(cell, 30_000)
        root.locator(KERNEL_IDLE).wait_for(timeout=30_000)
        assert _saved_run_ids(path) == [first]
        pg = _reload(p, url)
        root = notebook_root(pg, lab)
        cell = root.locator(".jp-Cell").nth(1)

        frozen = cell.locator(FROZEN_RUN)
        # the file's (first) run shows first; the kernel's answer replaces it
        sync_api.expect(frozen).to_contain_text(re.compile(r"finished after [1-9]\d* ticks"), timeout=60_000)
        assert frozen.count() == 1
        counts = [int(n) for n in re.findall(r"finished after (\d+) ticks", shown_text(frozen))]
        assert len(counts) == 2 and min(counts) > 0, shown_text(frozen)  # not the first run (0 ticks)
        sync_api.expect(cell.locator(".jp-InputPrompt")).to_have_text("[3]:")
        shot(frozen, artifacts, "reload-lab-ended-frozen.png", unhover=True)
        save_until(pg, path, lambda nb: _run_ids(nb) not in ([], [first]))
        assert len(_saved_run_ids(path)) == 1
        assert not p.nbspawn_errors(), p.errors


def test_notebook7_reload_mid_rerun_without_save_shows_the_new_run(nb7, browser, artifacts):
    with Page(browser, width=1200, height=900) as p, _shot_on_failure(p, artifacts):
        _reload_mid_rerun(p, nb7, artifacts, "reload-nb7")
