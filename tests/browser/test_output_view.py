"""Rank output as real training code produces it (issue #8), in a real browser: JupyterLab and Notebook 7.

Each test runs one `%%spawn` cell of one notebook for real, in both front ends (one server, one page
and one kernel per front end, shared by the tests):

- a 16-rank flood: the page's main thread does not spend most of the time it had in its own scripts
  (Chromium's own count of its script and task time, in CPU time: CDP ``Performance`` with thread
  ticks), no task of the page ran over 1 s of CPU (a `PerformanceObserver` for long tasks, installed
  before the page loads, and the thread's CPU time from /proc: RendererCpu), and another cell stays
  editable meanwhile: every character typed arrives;
- Stop during a flood: the run ends, every rank stopped;
- the kernel shows Busy for the whole of a run (JupyterLab's status bar text; Notebook 7's tab icon,
  its only kernel-status indicator that follows the kernel's status messages);
- rich output in the rank's pane, live and frozen: an HTML table (in an iframe), a matplotlib figure
  (an `<img>`), a `tqdm.auto` bar below the newest printed line;
- a plain tqdm bar on stderr stays the pane's last line while lines are printed, not styled as an error;
- the merged view keeps the order the ranks printed in, live and frozen (saved).

The figures measured (long tasks, typing and Stop latency) are printed (run with -s to see them) and
named in assertion messages; bench/page.py runs these tests with NBSPAWN_PAGE_TARGETS=1 and reports them
against the issue's targets: the suite asserts what the page did, never how fast a loaded machine did it
(issue #55).  Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
Needs what test_lab_renderer.py needs, and matplotlib and tqdm in the kernel's environment.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from kernel_harness import until_flag
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    FRONTS,
    KERNEL_STATUS_JS,
    NEEDS_WIDGET,
    Front,
    Page,
    PageWork,
    RendererCpu,
    chip_statuses,
    live_view,
    open_notebook,
    page_shot,
    pane_lines,
    run_cell,
    select_pane,
    serving,
    shot,
    shown_text,
    status_spells,
    sync_api,
    wait_for_js,
    write_notebook,
)

if TYPE_CHECKING:
    from playwright.sync_api import Locator

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]
pytest.importorskip("tqdm", reason="tqdm is not installed (pip install -e '.[test]')")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[test]')")

# The targets (no task over 100 ms, typing keeps up, Stop within 1 s) are performance figures
# on a 2-core machine that the flood itself saturates: they are measured and printed by every run, and
# asserted only with NBSPAWN_PAGE_TARGETS=1, as bench/page.py runs these tests (the project keeps timing
# targets in bench/, not in its test suite: issue #55). Otherwise a test fails on what the page did:
# a task in which its main thread itself ran over 1 s of CPU, or its scripts taking most of the CPU
# time its main thread had (SCRIPT_SHARE_MAX), never on seconds spent waiting for a core.
STRICT = os.environ.get("NBSPAWN_PAGE_TARGETS") == "1"
LONG_TASK_MAX_MS = 100 if STRICT else 1000
STOP_MAX_S = 1.0  # the bench's target only (STRICT)
TYPING_MAX_S = 5.0  # the bench's target only (STRICT)
# the page's script CPU time over the flood, as a share of the time its main thread had a core or wanted
# none (the flood's wall time less the time it waited on a run queue, Linux's count): a page that cannot
# keep up with 16 ranks runs scripts nearly all of that time (share near 1); measured 0.15 (lab) and 0.12
# (nb7) on 2 loaded cores, where the renderer waited 5-8 s of 8-10 for a core: 4x and more of margin
SCRIPT_SHARE_MAX = 0.6
BUSY_GRACE_MS = 300
FLICKER_MS = 100  # a page's request answered mid-run: its idle, then the cell's busy (test_busy_for_the_whole_run)
HANG_MS = 60_000  # a wait for something that does come: only a hang takes this long

LOAD = "%load_ext nbspawn"

# 16 ranks print as fast as they can for 10 s: lines of varied length, every 400th line on stderr.
# it floods until the test has typed and looked (FLOOD_DONE, in the notebook's folder), 60 s at most: a
# fixed 10 s ended before the typing on a slow machine (ci71: the live view was gone for its screenshot)
FLOOD_DONE = "flood-done.flag"
FLOOD = f"""\
%%spawn -n 16
import os, sys, time
rank = int(os.environ["RANK"])
end = time.time() + 60
i = 0
while time.time() < end:
    i += 1
    print(f"rank {{rank}} line {{i}} " + "abcdefghij" * (i % 23), flush=(i % 50 == 0))
    if i % 400 == 0:
        print(f"rank {{rank}} warning: step {{i}} is slow", file=sys.stderr, flush=True)
        if os.path.exists({FLOOD_DONE!r}):
            break
print(f"rank {{rank}} flooded {{i}} lines", flush=True)
"""

# Edited while FLOOD runs.
SCRATCH = "# scratch"
TYPED = "typed_during_the_flood = 42"

# 16 ranks flood until stopped (at most 120 s).
FLOOD_FOREVER = """\
%%spawn -n 16
import os, sys, time
rank = int(os.environ["RANK"])
end = time.time() + 120
i = 0
while time.time() < end:
    i += 1
    print(f"rank {rank} line {i} " + "0123456789" * (i % 17), flush=(i % 50 == 0))
    if i % 400 == 0:
        print(f"rank {rank} warning: step {i}", file=sys.stderr, flush=True)
"""

# A ~6 s run that prints now and then.
SIX_SECONDS = """\
%%spawn -n 2
import os, time
rank = int(os.environ["RANK"])
for step in range(30):
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.2)
"""

# display() of an HTML table and a matplotlib figure, then a tqdm.auto bar with a print a fifth of the way,
# where it waits until the test has looked at the live view (RICH_SEEN, in the notebook's folder; 120 s at
# most): a fixed 4 s of bar left was all the live checks had (issue #55)
RICH_SEEN = "rich-seen.flag"
RICH = f"""\
%%spawn -n 2
import os, time
rank = int(os.environ["RANK"])
from IPython.display import display
class Table:
    def _repr_html_(self):
        return (f"<table class='losses'><tr><th>rank</th><th>loss</th></tr>"
                f"<tr><td>{{rank}}</td><td>0.{{rank}}25</td></tr></table>")
print(f"rank {{rank}} starting", flush=True)
display(Table())
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(3, 2), dpi=60)
ax.plot([0, 1, 2, 3], [3, 1 + rank, 2, 0])
ax.set_title(f"rank {{rank}} loss")
plt.show()
from tqdm.auto import tqdm
for i in tqdm(range(50), desc=f"epoch-r{{rank}}"):
    time.sleep(0.1)
    if i == 10:
        print(f"rank {{rank}} halfway there", flush=True)
        end = time.time() + 120
        while not os.path.exists({RICH_SEEN!r}) and time.time() < end:
            time.sleep(0.05)
print(f"rank {{rank}} done", flush=True)
"""

# A plain tqdm bar on stderr advancing while the rank prints a line every 0.5 s.  It waits at step 20
# until the test has taken its first look (BAR_LOOKING), and at step 55 until it has seen the bar move
# (BAR_SEEN), 120 s at most each: the bar moves while the test looks, however slow the machine (a fixed
# 4 s of bar was all it had: issue #55)
BAR_LOOKING, BAR_SEEN = "bar-looking.flag", "bar-seen.flag"
BAR = f"""\
%%spawn -n 2
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
def wait_for(flag):
    end = time.time() + 120
    while not os.path.exists(flag) and time.time() < end:
        time.sleep(0.05)
bar = tqdm(total=60, desc=f"train-r{{rank}}", file=sys.stderr, mininterval=0, ascii=False)
for i in range(60):
    time.sleep(0.1)
    bar.update(1)
    if i % 5 == 0:
        print(f"rank {{rank}} step {{i:02d}} loss {{1 / (i + 1):.4f}}", flush=True)
    if i == 20:
        wait_for({BAR_LOOKING!r})
    if i == 55:
        wait_for({BAR_SEEN!r})
bar.close()
print(f"rank {{rank}} trained", flush=True)
"""

# Rank 1 prints three lines, then rank 0 three (after a barrier) once the page shows rank 1's
# (IN_TURN_EARLY: a fixed 0.5 s was what a loaded kernel had to read them in first), then rank 1 one more
# once the test has seen the live view (IN_TURN_SEEN, 120 s at most each: a fixed 2 s was all the live
# check had, issue #55).
IN_TURN_EARLY = "in-turn-early.flag"
IN_TURN_SEEN = "in-turn-seen.flag"
IN_TURN = f"""\
%%spawn -n 2 --backend gloo
import os, time, torch.distributed as dist
r = dist.get_rank()
time.sleep(1)  # the live view is up
if r == 1:
    for i in range(3):
        print(f"rank 1 early {{i}}", flush=True)
dist.barrier()
if r == 0:
    {until_flag(IN_TURN_EARLY)}  # the page shows rank 1's lines
    for i in range(3):
        print(f"rank 0 late {{i}}", flush=True)
dist.barrier()
if r == 1:
    {until_flag(IN_TURN_SEEN)}  # the live view is seen with rank 0's lines
    print("rank 1 last", flush=True)
"""
IN_TURN_LINES = [
    *(f"[rank1] rank 1 early {i}" for i in range(3)),
    *(f"[rank0] rank 0 late {i}" for i in range(3)),
    "[rank1] rank 1 last",
]

# 16 ranks run 10,000 all_reduces (issue #43's page row: the collectives tab open, live, all along)
COLLECTIVES = """\
%%spawn -n 16 --backend gloo
import torch, torch.distributed as dist
t = torch.ones(8)
for _ in range(10_000):
    dist.all_reduce(t)
"""

# Where the time from Stop's click to the cell's end went, kernel side (the clock is the page's too: one machine)
STOP_TIMES = """\
import json, nbspawn
_run = nbspawn.last_run()
print("STOP_TIMES", json.dumps([_run.stop_began_at, _run.ranks_signalled_at, max(s.ended_at for s in _run.ranks), _run.ended_at]))
"""

CELLS = [LOAD, FLOOD, SCRATCH, FLOOD_FOREVER, SIX_SECONDS, RICH, BAR, IN_TURN, COLLECTIVES, STOP_TIMES]
C_FLOOD, C_SCRATCH, C_FOREVER, C_SIX, C_RICH, C_BAR, C_IN_TURN, C_COLLECTIVES, C_STOP_TIMES = range(1, 10)

# Every long task of the page, from its first moment: [startTime, duration] in ms.
LONGTASK_OBSERVER = """
window.__nbsLongTasks = [];
try {
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) window.__nbsLongTasks.push([e.startTime, e.duration]);
  }).observe({type: 'longtask', buffered: true});
} catch (err) {
  window.__nbsLongTaskError = String(err);
}
// where the time went (diagnostics only): the scripts of long animation frames, where Chromium has them
window.__nbsLongFrames = [];
try {
  new PerformanceObserver(list => {
    for (const e of list.getEntries()) {
      if (e.duration <= 100) continue;
      const scripts = (e.scripts || []).filter(s => s.duration > 20).map(s =>
        `${Math.round(s.duration)} ms ${s.invoker || s.invokerType} ${(s.sourceFunctionName || '')} ` +
        `${(s.sourceURL || '').split('/').pop()}:${s.sourceCharPosition}`);
      window.__nbsLongFrames.push([e.startTime, e.duration, Math.round(e.styleAndLayoutStart ? e.startTime + e.duration - e.styleAndLayoutStart : 0), scripts]);
    }
  }).observe({type: 'long-animation-frame', buffered: true});
} catch (err) {}
"""


def _write(root) -> None:
    write_notebook(root, "output.ipynb", CELLS)


class OutputFront(Front):
    """A front end with output.ipynb open and nbspawn loaded, its long tasks observed from the start."""

    def __init__(self, name: str, p: Page, cells: Locator, root: Path) -> None:
        super().__init__(name, p, cells)
        self.root = root  # the notebook's folder: its kernel's working directory

    def now(self) -> float:
        return self.pg.evaluate("performance.now()")

    def start(self, i: int) -> float:
        """Run cell ``i``; the page's clock (ms) just before."""
        t0 = self.now()
        run_cell(self.pg, self.cell(i))
        return t0

    def live(self, i: int):
        return live_view(self.cell(i), 90_000)

    def stop_times(self) -> str:
        """Where the time from Stop's click went in the kernel, from the stopped run's own record: the
        supervisor began stopping, interrupted the ranks, the last rank was reaped, the run was over."""
        cell = self.cell(C_STOP_TIMES)
        run_cell(self.pg, cell)
        out = cell.locator(".jp-OutputArea-output", has_text="STOP_TIMES")
        sync_api.expect(out).to_have_count(1, timeout=HANG_MS)
        times = json.loads(out.inner_text().split("STOP_TIMES", 1)[1])
        clicked = self.pg.evaluate("(performance.timeOrigin + window.__nbsClicked) / 1000")
        names = ("began stopping", "ranks interrupted", "last rank reaped", "run over")
        return "kernel: " + ", ".join(f"{n} {t - clicked:.2f} s" for n, t in zip(names, times, strict=True) if t is not None)

    def long_tasks(self, since: float, until: float) -> list[float]:
        err = self.pg.evaluate("window.__nbsLongTaskError || null")
        assert err is None, f"no long-task observer in this Chromium: {err}"
        tasks = self.pg.evaluate("window.__nbsLongTasks")
        return [d for start, d in tasks if start + d >= since and start <= until]

    def long_frames(self, since: float, until: float, top: int = 5) -> str:
        """The longest animation frames over 100 ms in a window: duration, style+layout, scripts (wall time)."""
        frames = [f for f in self.pg.evaluate("window.__nbsLongFrames || []") if f[0] + f[1] >= since and f[0] <= until]
        frames.sort(key=lambda f: -f[1])
        return "\n".join(f"  frame {d:.0f} ms (style+layout {sl} ms): {'; '.join(sc) or '-'}" for _, d, sl, sc in frames[:top])

    def frozen_by_the_page(self, cpu: RendererCpu, since: float, until: float) -> list[tuple[float, float]]:
        """Each long task in a window as (its duration, the time the page's main thread ran in it), in
        ms, longest-running first: a 1.8 s task in which the renderer ran 60 ms waited for a core
        (2 cores, 16 flooding ranks); one in which it ran 1.5 s is the page's own freeze."""
        origin = self.pg.evaluate("performance.timeOrigin") / 1000
        tasks = [t for t in self.pg.evaluate("window.__nbsLongTasks") if t[0] + t[1] >= since and t[0] <= until]
        # no thread runs longer than the wall time that passed: the samples bounding a task can be far
        # apart (the sampler needs this process's GIL, held through Playwright's calls), and a 108 ms
        # task once read as 1003 ms run (the sampled span's), failing the test for the sampler's delay
        ran = [(d, min(d, cpu.ran_ms(origin + start / 1000, origin + (start + d) / 1000))) for start, d in tasks]
        return sorted(ran, key=lambda t: -t[1])


@pytest.fixture(scope="module", params=list(FRONTS))
def front(request, browser, artifacts, tmp_path_factory):
    name = request.param
    with (
        serving(FRONTS[name], tmp_path_factory.mktemp(f"output-{name}"), _write) as server,
        Page(browser, width=1200, height=1000) as p,
    ):
        p.page.add_init_script(LONGTASK_OBSERVER)
        pg = p.page
        cells = open_notebook(pg, server, "output.ipynb")
        dialog = pg.locator(".jp-Dialog")
        if dialog.count():
            page_shot(pg, artifacts, f"{name}-output-dialog.png")
            pytest.fail(f"{name} opened a dialog: {dialog.first.inner_text()!r}", pytrace=False)
        run_cell(pg, cells.nth(0), until="[1]:")
        yield OutputFront(name, p, cells, server.root)
        assert p.dialogs == [], p.dialogs


# ---------------------------------------------------------------------------------------------


@pytest.mark.alone  # it measures the page's CPU time; the bench (STRICT) times the page
def test_no_long_task_under_a_16_rank_flood_and_another_cell_stays_editable(front, artifacts):
    """Under a 16-rank flood the page does its own work in its share of the CPU: no task of its own
    over 1 s of CPU, its scripts not most of the time its main thread had, and a cell typed into
    meanwhile gets every character.  How long the typing took (a starved renderer's wall time: ci
    measured 5.62 and 8.68 s) is printed, and asserted only as the bench's target (STRICT)."""
    pg = front.pg
    work = PageWork(pg)
    with RendererCpu() as cpu:
        t0 = front.start(C_FLOOD)
        view = front.live(C_FLOOD)
        wait_for_js(view, "v => v.querySelectorAll('.nbs-Chip[data-status=\"running\"]').length === 16", HANG_MS)
        pg.wait_for_timeout(2500)  # the flood is on (the figures below are per second of it)
        work_from, sched_from = work.now(), cpu.now()

        # another cell, edited meanwhile: every typed character arrives
        scratch = front.cell(C_SCRATCH)
        editor = scratch.locator(".jp-InputArea-editor")
        typed_at, waits_before = time.monotonic(), cpu.now()
        editor.click()
        pg.keyboard.press("End")
        pg.keyboard.press("Enter")
        pg.keyboard.type(TYPED, delay=20)
        sync_api.expect(editor).to_contain_text(TYPED, timeout=HANG_MS)
        typing_s, waits_after = time.monotonic() - typed_at, cpu.now()
        pg.keyboard.press("Escape")
        pg.mouse.move(0, 0)
        page_shot(pg, artifacts, f"{front.name}-flood-page.png")
        still_live = front.cell(C_FLOOD).locator(".nbs-mod-live").count() == 1
        if still_live:
            shot(view, artifacts, f"{front.name}-flood-live.png")
        work_to, sched_to = work.now(), cpu.now()
        (front.root / FLOOD_DONE).write_text("")  # the flood ends now

        frozen = front.frozen(C_FLOOD)
        t1 = front.now()
    work.close()
    text = shown_text(frozen)
    shot(frozen, artifacts, f"{front.name}-flood-frozen.png")
    tasks = front.long_tasks(t0, t1)
    worst = max(tasks, default=0.0)
    over50 = sum(d > 50 for d in tasks)
    ran = front.frozen_by_the_page(cpu, t0, t1)
    # the typing's time the page's renderer spent waiting for a core (16 ranks flood 2 cores), as Linux
    # counts it for its main thread
    starved_s = RendererCpu.page_waited_s(waits_before, waits_after)
    # the page's own work over the flood (from 2.5 s into it to the typing's end): Chromium's CPU-time
    # counts, and the time its main thread had: the wall time less what it waited for a core
    did = PageWork.between(work_from, work_to)
    waited_s = RendererCpu.page_waited_s(sched_from, sched_to)
    had_s = max(did["wall"] - waited_s, 1e-3)
    script_share = did["ScriptDuration"] / had_s
    figures = (
        f"{front.name}: 16-rank flood, {(t1 - t0) / 1000:.1f} s: {len(tasks)} long tasks, max {worst:.0f} ms, "
        f"{over50} over 50 ms, {sum(d > LONG_TASK_MAX_MS for d in tasks)} over {LONG_TASK_MAX_MS} ms "
        f"(all: {sorted(round(d) for d in tasks)[-12:]}); the page's main thread ran at most "
        f"{max((r for _, r in ran), default=0.0):.0f} ms in one "
        f"(task ms, ran ms: {[(round(d), round(r)) for d, r in ran[:5]]}); "
        f"over {did['wall']:.1f} s of it the page's main thread had {had_s:.1f} s (waited {waited_s:.1f} s for a core) "
        f"and spent CPU: scripts {did['ScriptDuration']:.2f} s (share {script_share:.2f}), tasks {did['TaskDuration']:.2f} s, "
        f"layout {did['LayoutDuration']:.2f} s, style {did['RecalcStyleDuration']:.2f} s; "
        f"typing {len(TYPED)} characters took {typing_s:.2f} s, {starved_s:.2f} s of it the renderer waiting for a core"
    )
    print(figures)
    print(front.long_frames(t0, t1))
    assert still_live, f"the flood ended before the typing was done: {figures}"
    if STRICT:  # the bench's targets: every task, whatever held it, and the typing's wall time
        assert worst <= LONG_TASK_MAX_MS, figures
        assert typing_s < TYPING_MAX_S, figures
    else:  # the suite: the page's own work froze it (a 1.8 s task in which it ran 60 ms, the renderer starved of a core, is not)
        assert all(r <= LONG_TASK_MAX_MS for _, r in ran), f"{figures}\n{front.long_frames(t0, t1)}"
    # the page's scripts took most of the time its main thread had: it cannot keep up with the flood
    assert script_share <= SCRIPT_SHARE_MAX, figures
    # the typed line arrived whole, once, where it was typed
    assert editor.inner_text().count(TYPED) == 1 and SCRATCH in editor.inner_text(), editor.inner_text()
    assert all(s == "done" for s in (frozen.locator(".nbs-Chip").nth(r).get_attribute("data-status") for r in range(16)))
    assert "flooded" in text, text[-2000:]


@pytest.mark.alone  # it times the page
@pytest.mark.skipif(not STRICT, reason="a bench row (about 2 min a front): bench/page.py runs it")
def test_the_collectives_tab_stays_responsive_while_16_ranks_run_10000_collectives(front, artifacts):
    """Issue #43's page row: no main-thread task over 100 ms while a 16-rank cell runs 10,000
    collectives with its live X-ray open, redrawn as the ranks' records come in."""
    with RendererCpu() as cpu:
        t0 = front.start(C_COLLECTIVES)
        view = front.live(C_COLLECTIVES)
        tab = view.locator(".nbs-Tab-xray")
        tab.wait_for(timeout=120_000)  # once the ranks' first records are read
        opened = front.now()
        tab.click()
        view.locator("iframe.nbs-XRay-frame").wait_for(timeout=30_000)
        shot(view, artifacts, f"{front.name}-collectives-live.png", unhover=True)
        frozen = front.frozen(C_COLLECTIVES, timeout=600_000)
        t1 = front.now()
    tasks = front.long_tasks(opened, t1)
    worst = max(tasks, default=0.0)
    ran = front.frozen_by_the_page(cpu, opened, t1)
    figures = (
        f"{front.name}: 16 ranks x 10,000 collectives, {(t1 - t0) / 1000:.1f} s, the X-ray open for "
        f"{(t1 - opened) / 1000:.1f} s: {len(tasks)} long tasks, max {worst:.0f} ms, "
        f"{sum(d > LONG_TASK_MAX_MS for d in tasks)} over {LONG_TASK_MAX_MS} ms (all: {sorted(round(d) for d in tasks)[-12:]}); "
        f"the page's main thread ran at most {max((r for _, r in ran), default=0.0):.0f} ms in one"
    )
    print(figures)
    print(front.long_frames(opened, t1))
    assert all(chip == "done" for chip in frozen.locator(".nbs-Chip").evaluate_all("cs => cs.map(c => c.dataset.status)"))
    assert worst <= LONG_TASK_MAX_MS, figures


@pytest.mark.alone  # it measures the page's CPU time
def test_a_page_frozen_by_its_own_script_is_told_from_one_waiting_for_a_core(front):
    """The flood test's measures, checked: a 4 s script is a 4 s task in which the page's main thread
    ran well over the suite's 1 s (it would fail the flood test), and Chromium counts it as over 1 s
    of script CPU time (so the flood test's script share is not blind to a busy page).  4 s, so that
    a renderer given half a core still runs over 1 s of it."""
    pg = front.pg
    work = PageWork(pg)
    with RendererCpu() as cpu:
        t0 = front.now()
        before = work.now()
        # a task of the page's own (a script evaluated by the test itself is not one of its tasks)
        pg.evaluate(
            "() => { window.__nbsBusyScript = false; setTimeout(() => { const t = performance.now(); "
            "while (performance.now() - t < 4000) {} window.__nbsBusyScript = true; }); }"
        )
        pg.wait_for_function("window.__nbsBusyScript", timeout=HANG_MS)
        # the long-task observer's entry comes after the task: wait for it, not for a while
        pg.wait_for_function(
            "t0 => window.__nbsLongTasks.some(([start, d]) => start >= t0 && d >= 4000)", arg=t0, timeout=HANG_MS
        )
        after = work.now()
        t1 = front.now()
    work.close()
    ran = front.frozen_by_the_page(cpu, t0, t1)
    did = PageWork.between(before, after)
    assert ran, "no long task recorded for a 4 s script"
    duration, ran_ms = ran[0]
    assert duration >= 4000 and ran_ms > LONG_TASK_MAX_MS, ran
    assert did["ScriptDuration"] > 1.0, did


@pytest.mark.alone  # the bench (STRICT) times the page
def test_stop_within_a_second_during_a_flood(front, artifacts):
    """Stop, clicked during a 16-rank flood, ends the run: the cell's execution ends, its frozen run
    says stopped, every rank stopped.  How soon after the click (the issue's target: within 1 s) is
    printed, and asserted only as the bench's target (STRICT): on a loaded machine it is the time the
    flood's 16 ranks leave the page and the kernel a core."""
    pg = front.pg
    cell = front.cell(C_FOREVER)
    front.start(C_FOREVER)
    view = front.live(C_FOREVER)
    wait_for_js(view, "v => v.querySelectorAll('.nbs-Chip[data-status=\"running\"]').length === 16", 60_000)
    pg.wait_for_timeout(3000)
    # when the click reached the page (the event's own time) and when the cell's execution ended
    pg.evaluate(
        """cell => {
            window.__nbsClicked = null; window.__nbsEnded = null;
            document.addEventListener('pointerdown', e => { window.__nbsClicked ??= e.timeStamp; }, {capture: true, once: true});
            const prompt = cell.querySelector('.jp-InputPrompt');
            const marks = window.__nbsStopMarks = {};
            const mark = (k, yes) => { if (yes && !(k in marks)) marks[k] = performance.now(); };
            const tick = () => {
                mark('Stopping', /Stopping/.test(cell.querySelector('.nbs-Stop')?.textContent || ''));
                mark('a chip stopped', cell.querySelector('.nbs-mod-live .nbs-Chip[data-status="stopped"]'));
                mark('every chip stopped', cell.querySelectorAll('.nbs-mod-live .nbs-Chip[data-status="stopped"]').length === 16);
                mark('frozen view', cell.querySelector('.nbs-RunRenderer .nbs-Run'));
                mark('prompt', /\\[\\d+\\]/.test(prompt.textContent));
                const ended = /\\[\\d+\\]/.test(prompt.textContent) || cell.querySelector('.nbs-RunRenderer .nbs-Run');
                if (ended) { window.__nbsEnded = performance.now(); } else { setTimeout(tick, 5); }
            };
            tick();
        }""",
        cell.element_handle(),
    )
    stop = view.locator(".nbs-Stop")
    clicked = time.monotonic()
    stop.click()
    pg.wait_for_function("window.__nbsEnded !== null", timeout=HANG_MS, polling=20)
    wall = time.monotonic() - clicked
    took = pg.evaluate("(window.__nbsEnded - window.__nbsClicked) / 1000")
    marks = pg.evaluate(
        "Object.entries(window.__nbsStopMarks).map(([k, t]) => `${k} ${((t - window.__nbsClicked) / 1000).toFixed(2)} s`)"
    )
    frozen = front.frozen(C_FOREVER)
    shot(frozen, artifacts, f"{front.name}-flood-stopped.png", unhover=True)
    figures = f"{front.name}: Stop during a 16-rank flood: the cell ended {took:.2f} s after the click ({wall:.2f} s as the test saw it; after the click: {', '.join(marks)}; {front.stop_times()})"
    print(figures)
    if STRICT:  # the bench's target
        assert took <= STOP_MAX_S, figures
    assert frozen.locator(".nbs-Badge").inner_text().strip().lower() == "stopped", figures
    assert chip_statuses(frozen) == ["stopped"] * 16, figures
    order = pg.evaluate("window.__nbsStopMarks")
    # what the page showed came after the click, and the frozen view last (Stopping may be over before a look sees it)
    assert "frozen view" in order or "prompt" in order, figures
    assert all(t >= pg.evaluate("window.__nbsClicked") for t in order.values()), figures
    if "Stopping" in order and "frozen view" in order:
        assert order["Stopping"] <= order["frozen view"], figures


@pytest.mark.alone  # it records what the page drew, as it drew it
def test_busy_for_the_whole_run(front, artifacts):
    """The kernel's status reads Busy from the run's start to its end (it once read Idle for the rest
    of a run after one comm message of the page).  Every change of the status and of the cell's
    prompt is recorded as it happens (a MutationObserver, not samples), and every spell of anything
    but Busy inside the run must end in Busy again before the run does: a request of the page
    answered mid-run (JupyterLab 4.4+ opens a subshell for each comm target when the live view's
    comms open: two ``create_subshell_request`` here) publishes an idle of its own, which the kernel
    follows at once with the cell's busy; the page gets them as two messages, and may draw the first
    for a frame (1-20 ms measured on a quiet machine, longer when the renderer waits for a core, so
    how long is printed, not asserted: spells of ``FLICKER_MS`` or more are named in the figures)."""
    pg = front.pg
    cell = front.cell(C_SIX)
    pg.evaluate(
        """([cell, read]) => {
            const status = eval(read);
            const prompt = cell.querySelector('.jp-InputPrompt');
            const t0 = performance.now();
            window.__nbsBusy = [];  // [ms, status, running] at each change of either
            window.__nbsBusyRan = false; window.__nbsBusyDone = false; window.__nbsBusyFrozenAt = null;
            let last = '';
            const look = () => {
                const now = [status(), /\\*/.test(prompt.textContent)];
                if (JSON.stringify(now) === last) return;
                last = JSON.stringify(now);
                window.__nbsBusy.push([performance.now() - t0, ...now]);
                if (now[1]) window.__nbsBusyRan = true;
                if (window.__nbsBusyFrozenAt === null && cell.querySelector('.nbs-RunRenderer .nbs-Run')) {
                    window.__nbsBusyFrozenAt = performance.now() - t0;  // the run's end, as the page drew it
                }
            };
            look();
            const observer = new MutationObserver(look);
            observer.observe(document.documentElement, {subtree: true, childList: true, characterData: true, attributes: true});
            window.__nbsBusyStop = () => { look(); observer.disconnect(); window.__nbsBusyDone = true; };
        }""",
        [cell.element_handle(), KERNEL_STATUS_JS[front.name]],
    )
    run_cell(pg, cell)
    live_view(cell, HANG_MS)
    if front.name == "lab":  # the status bar as a user sees it during the run (a picture, nothing asserted)
        shot(pg.locator("#jp-main-statusbar"), artifacts, "lab-statusbar-during-run.png")
    front.frozen(C_SIX)
    # the status after the run: Idle, once the page has drawn it (the cell's idle may come after its prompt)
    pg.wait_for_function(f"({KERNEL_STATUS_JS[front.name]})() === 'Idle'", timeout=HANG_MS)
    pg.evaluate("window.__nbsBusyStop()")
    changes = pg.evaluate("window.__nbsBusy")
    frozen_at = pg.evaluate("window.__nbsBusyFrozenAt")
    spells = status_spells(changes, grace_ms=BUSY_GRACE_MS)
    started = next(t for t, _s, running in changes if running)
    figures = (
        f"{front.name}: the frozen run drawn {(frozen_at - started) / 1000:.1f} s after the prompt showed *; a {spells.run_ms / 1000:.1f} s run, {spells.busy_ms / 1000:.1f} s of it Busy; "
        f"spells of anything else: {spells.others[:10]} (ms after the prompt showed *, status, ms long; "
        f"{sum(s[2] >= FLICKER_MS for s in spells.others)} of {FLICKER_MS} ms or more)"
    )
    print(figures)
    assert spells.run_ms >= 5000, figures  # the six-second cell, seen running
    # each spell of another status ended in Busy again before the run did: Busy came back after every
    # idle of another request (what the kernel sends), the run never read Idle to its end (the bug).
    # One that lasts to the prompt's count is the run's own end only if it began once the run was over
    # (its frozen view drawn): the cell's idle may reach the page before its prompt's count does.
    cut = spells.run_ms - 200  # status_spells leaves the run's last 200 ms out
    assert all(start + length < cut or started + start >= frozen_at for start, _status, length in spells.others), figures
    # and Idle after the run
    assert changes[-1][1] == "Idle" and not changes[-1][2], changes[-8:]


def test_status_spells_judge_what_the_page_showed():
    busy_throughout = [[0, "Idle", False], [50, "Busy", False], [60, "Busy", True], [6000, "Idle", True], [6030, "Idle", False]]
    spells = status_spells(busy_throughout, grace_ms=300)
    assert (spells.run_ms, spells.busy_ms, spells.others) == (5970, 5940, [])  # the end's race is left out
    flicker = [[0, "Busy", True], [400, "Idle", True], [404, "Busy", True], [2000, "Idle", False]]
    assert status_spells(flicker, grace_ms=300).others == [(400, "Idle", 4)]
    idle_after_a_comm = [[0, "Busy", True], [500, "Idle", True], [3000, "Idle", False]]
    assert status_spells(idle_after_a_comm, grace_ms=300).others == [(500, "Idle", 2300)]
    before_nbspawn = [[0, "Busy", True], [100, "Idle", True], [450, "Busy", True], [2000, "Idle", False]]
    assert status_spells(before_nbspawn, grace_ms=300).others == [(300, "Idle", 150)]  # from the grace's end
    assert status_spells([[0, "Idle", False]], grace_ms=300).run_ms == 0  # never ran


def _rich_checks(pg, pane, rank: int, where: str) -> dict:
    img = pane.locator("img.nbs-Rich-img")
    assert img.count() >= 1, f"{where}: no <img> in rank {rank}'s pane: {pane.inner_html()[:1500]}"
    sync_api.expect(img.first).to_be_visible()
    wait_for_js(img.first, "i => i.complete && i.naturalWidth > 0", 10_000)
    frame = pane.locator("iframe.nbs-Rich-frame")
    assert frame.count() >= 1, f"{where}: no HTML iframe in rank {rank}'s pane: {pane.inner_html()[:1500]}"
    table = frame.first.content_frame.locator("table.losses")
    sync_api.expect(table).to_contain_text(f"0.{rank}25", timeout=60_000)
    # the bar: a progress element, or a text line naming its description; the last thing in the pane
    desc = f"epoch-r{rank}"
    return pg.evaluate(
        """([pane, desc, printed]) => {
            const bars = [...pane.querySelectorAll('progress')].map(p => p.closest('.nbs-Display, .nbs-Line') || p);
            const textBars = [...pane.querySelectorAll('.nbs-Line, .nbs-Display')].filter(n => n.textContent.includes(desc));
            const bar = bars[bars.length - 1] || textBars[textBars.length - 1] || null;
            const lines = [...pane.querySelectorAll('.nbs-Line')].filter(n => n.textContent.includes(printed));
            const line = lines[lines.length - 1] || null;
            const visible = [...pane.querySelectorAll('.nbs-Line, .nbs-Display')].filter(n => !n.hidden && n.getClientRects().length);
            return {
                bar: bar ? bar.textContent.slice(0, 120) : null,
                progress: bars.length > 0,
                value: bars.length ? pane.querySelector('progress').value : null,
                after: bar && line ? !!(line.compareDocumentPosition(bar) & Node.DOCUMENT_POSITION_FOLLOWING) : null,
                last: bar ? visible[visible.length - 1] === bar || bar.contains(visible[visible.length - 1]) : false,
            };
        }""",
        [pane.element_handle(), desc, f"rank {rank} "],
    )


def test_rich_output_in_the_pane_live_and_frozen(front, artifacts):
    pg = front.pg
    front.start(C_RICH)
    view = front.live(C_RICH)
    pane = select_pane(view, 0)
    sync_api.expect(pane).to_contain_text("rank 0 halfway there", timeout=HANG_MS)
    # the ranks wait there until the test has looked; the bar is drawn below the line in a frame or two
    deadline = time.monotonic() + HANG_MS / 1000
    while True:
        live = _rich_checks(pg, pane, 0, "live")
        if (live["bar"] is not None and live["after"] and live["last"]) or time.monotonic() > deadline:
            break
        pg.wait_for_timeout(100)
    shot(view, artifacts, f"{front.name}-rich-live.png", unhover=True)
    (front.root / RICH_SEEN).write_text("")  # the ranks go on
    assert live["bar"] is not None, f"live: no tqdm.auto bar in rank 0's pane: {shown_text(pane)[-1500:]}"
    assert live["after"] and live["last"], f"live: the bar is not at the bottom of the pane: {live}"

    frozen = front.frozen(C_RICH)
    pane = select_pane(frozen, 0)
    end = _rich_checks(pg, pane, 0, "frozen")
    text = shown_text(pane)
    shot(frozen, artifacts, f"{front.name}-rich-frozen.png", unhover=True)
    assert end["bar"] is not None, f"frozen: no tqdm.auto bar in rank 0's pane: {text[-1500:]}"
    assert "50/50" in end["bar"] or end["value"] == 50, f"frozen: the bar did not finish: {end}"
    assert "rank 0 done" in text and "rank 1" not in text, text[-1500:]
    assert "attempted to send message from fork" not in text


def _reddish(rgb: str) -> bool:
    nums = [float(x) for x in re.findall(r"[\d.]+", rgb)]
    if len(nums) < 3 or (len(nums) == 4 and nums[3] == 0):
        return False
    r, g, b = nums[:3]
    return r > g + 40 and r > b + 40


def test_plain_tqdm_bar_stays_at_the_bottom_and_is_not_an_error(front, artifacts):
    pg = front.pg
    front.start(C_BAR)
    view = front.live(C_BAR)
    pane = select_pane(view, 0)
    sync_api.expect(pane).to_contain_text("rank 0 step 20", timeout=HANG_MS)
    seen = []

    def look() -> None:
        seen.append(
            pg.evaluate(
                """pane => {
                    const lines = [...pane.querySelectorAll('.nbs-Line')].filter(n => !n.hidden);
                    const bar = lines.filter(n => n.textContent.includes('train-r0')).pop() || null;
                    const printed = lines.filter(n => /rank 0 step \\d+/.test(n.textContent)).pop() || null;
                    if (!bar || !printed) return {bar: bar && bar.textContent, printed: printed && printed.textContent};
                    const b = bar.getBoundingClientRect(), p = printed.getBoundingClientRect();
                    const cs = getComputedStyle(bar);
                    const text = bar.querySelector('.nbs-Line-text') || bar;
                    return {
                        bar: bar.textContent, printed: printed.textContent,
                        bars: lines.filter(n => n.textContent.includes('train-r0')).length,
                        after: !!(printed.compareDocumentPosition(bar) & Node.DOCUMENT_POSITION_FOLLOWING),
                        below: b.top >= p.bottom - 1, last: lines[lines.length - 1] === bar,
                        background: cs.backgroundColor, color: getComputedStyle(text).color,
                        stderr: bar.classList.contains('nbs-stderr'),
                    };
                }""",
                pane.element_handle(),
            )
        )

    # a look with the ranks waiting at step 20, then looks while they go on to step 55 (where they wait
    # again) until the bar and the printed lines have moved: the ranks wait for the test, not it for them
    look()
    (front.root / BAR_LOOKING).write_text("")
    deadline = time.monotonic() + HANG_MS / 1000
    while time.monotonic() < deadline:
        pg.wait_for_timeout(300)
        look()
        if len({s.get("printed") for s in seen}) >= 2 and len({s.get("bar") for s in seen}) >= 3:
            break
    shot(view, artifacts, f"{front.name}-bar-at-bottom.png", unhover=True)
    (front.root / BAR_SEEN).write_text("")
    for s in seen:
        assert s.get("bar") and s.get("printed"), f"no bar or no printed line in rank 0's pane: {s}"
        assert s["bars"] == 1, f"the bar is drawn more than once: {s}"
        assert s["after"] and s["below"] and s["last"], f"the bar is not the pane's last line: {s}"
        assert not _reddish(s["background"]) and not _reddish(s["color"]), f"the bar is styled as an error: {s}"
    assert len({s["printed"] for s in seen}) >= 2, f"no lines were printed meanwhile: {seen}"
    assert len({s["bar"] for s in seen}) >= 2, f"the bar did not move: {seen}"

    frozen = front.frozen(C_BAR)
    pane = select_pane(frozen, 0)
    text = shown_text(pane)
    shot(frozen, artifacts, f"{front.name}-bar-frozen.png")
    assert text.count("train-r0") == 1 and "60/60" in text, text[-1500:]
    assert "rank 0 trained" in text


def _merged_lines(pane) -> list[str]:
    """The merged pane's lines, each ``[rankN] text``."""
    return [re.sub(r"^\[rank(\d+)\]\s*", r"[rank\1] ", t.strip()) for t in pane_lines(pane) if t.strip()]


def test_the_merged_view_keeps_the_order_the_ranks_printed_in_live_and_frozen(front, artifacts):
    """Issue 26, item 5: the frozen (saved) merged view shows the lines in the order they were printed,
    as the live one did, not rank by rank in turn."""
    front.start(C_IN_TURN)
    view = front.live(C_IN_TURN)
    pane = select_pane(view, "merged")
    sync_api.expect(pane).to_contain_text("rank 1 early 2", timeout=HANG_MS)
    (front.root / IN_TURN_EARLY).write_text("")  # rank 0 prints its lines now
    sync_api.expect(pane).to_contain_text("rank 0 late 2", timeout=HANG_MS)
    live = _merged_lines(pane)
    (front.root / IN_TURN_SEEN).write_text("")  # rank 1 prints its last line now
    assert live == IN_TURN_LINES[:-1], f"live: {live}"
    frozen = front.frozen(C_IN_TURN)
    pane = select_pane(frozen, "merged")
    sync_api.expect(pane).to_contain_text("rank 1 last", timeout=30_000)
    shot(frozen, artifacts, f"{front.name}-merged-in-order-frozen.png", unhover=True)
    assert _merged_lines(pane) == IN_TURN_LINES, "frozen"
    assert "in arrival order" in shown_text(frozen)
