"""The labextension in a real browser: the run renderer in JupyterLab and Notebook 7, the status item.

Starts `jupyter lab` / `jupyter notebook` from this interpreter on 127.0.0.1 with a private config,
data, settings and workspace dir, opens notebooks holding a saved `application/vnd.nbspawn.run+json`
output in Chromium (Playwright, system browser: NBSPAWN_CHROMIUM, default /usr/bin/chromium), and
checks what is drawn.  Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).

Needs: `apt-get install chromium`, `pip install playwright` (never `playwright install`), and the
extension built and installed (`pip install -e ".[test,lab]"` does both).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    KERNEL_IDLE,
    NEEDS_CHROMIUM,
    Page,
    code_cell,
    notebook_root,
    open_lab_notebook,
    open_notebook,
    page_shot,
    pane_text,
    run_cell,
    serve,
    shot,
    shown_text,
    sync_api,
    write_notebook,
    write_settings,
)

MIME = "application/vnd.nbspawn.run+json"

pytestmark = [pytest.mark.browser, NEEDS_CHROMIUM, pytest.mark.timeout(600)]


# ---------------------------------------------------------------------------------------------
# sample runs
# ---------------------------------------------------------------------------------------------

TQDM_EPOCH1 = (
    "".join(
        f"train: {p:3d}%|{'█' * (p // 10):<10}| {p}/100 [00:0{p // 60}<00:00, {95 + p / 20:.1f}it/s]\r"
        for p in (0, 10, 35, 55, 80)
    )
    + "train: 100%|██████████| 100/100 [00:01<00:00, 99.6it/s]\n"
)

FAILED_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/tmp/ipykernel_4242/1739212.py", line 7, in train_step\n'
    "    scale = 1.0 / (rank - 1)\n"
    "Cell In[5], line 12\n"
    "      9 for epoch in range(1, 3):\n"
    '     10     for step, (x, y) in enumerate(tqdm(loader, desc="train")):\n'
    "---> 12         loss = train_step(x, y) \n"
    "ZeroDivisionError: float division by zero"
)


def sample_run() -> dict:
    """A realistic 4-rank run: rank 1 failed, 0 and 3 were stopped, 2 had finished."""
    log_dir = "/tmp/nbspawn-k3x9/20261121-191503-a3f9"

    def rank(r, status, output, **kw):
        base = {
            "rank": r,
            "pid": 4242 + r,
            "status": status,
            "exit_code": 0 if status == "done" else -15,
            "signal": "SIGTERM" if status == "stopped" else None,
            "duration": 1.8,
            "summary": None,
            "traceback": None,
            "output": output,
            "elided_lines": 0,
            "stdout_path": f"{log_dir}/{r}/stdout.log",
            "stderr_path": f"{log_dir}/{r}/stderr.log",
        }
        base.update(kw)
        return base

    setup = lambda r: ["stdout", f"[setup] rank {r}/4 on cpu · backend gloo · seed 1234\n"]  # noqa: E731
    return {
        "version": 1,
        "run_id": "20261121-191503-a3f9",
        "nprocs": 4,
        "start_method": "fork",
        "backend": "gloo",
        "log_dir": log_dir,
        "started_at": 1795364103.2,
        "duration": 1.84,
        "status": "failed",
        "error": {"rank": 1, "summary": "ZeroDivisionError: float division by zero", "traceback": FAILED_TRACEBACK},
        "ranks": [
            rank(
                0,
                "stopped",
                [
                    setup(0),
                    ["stderr", "\x1b[33mUserWarning: TypedStorage is deprecated\x1b[0m\n"],
                    ["stdout", "\x1b[1mepoch 1\x1b[0m\n"],
                    ["stderr", TQDM_EPOCH1[:90]],
                    ["stderr", TQDM_EPOCH1[90:]],
                    ["stdout", "epoch 1: loss=\x1b[32m0.6931\x1b[0m acc=\x1b[32m51.2%\x1b[0m\n"],
                    ["stdout", "\x1b[1mepoch 2\x1b[0m\n"],
                    ["stderr", "train:  12%|█▏        | 12/100 [00:00<00:00, 97.0it/s]\r"],
                ],
                duration=1.80,
            ),
            rank(
                1,
                "failed",
                [
                    setup(1),
                    ["stdout", "\x1b[1mepoch 1\x1b[0m\n"],
                    ["stderr", "train:   0%|          | 0/100 [00:00<?, ?it/s]\r"],
                ],
                exit_code=1,
                duration=1.21,
                summary="ZeroDivisionError: float division by zero",
                traceback=FAILED_TRACEBACK,
            ),
            rank(
                2,
                "done",
                [
                    setup(2),
                    ["stdout", "evaluating shard 2 of 4 (no training on this rank)\n"],
                    ["stdout", "<script>alert(1)</script>\n"],
                    ["stdout", '<img src=x onerror="alert(2)"> &amp; <b>not bold</b>\n'],
                    [
                        "stdout",
                        "\x1b[38;5;208m256-colour\x1b[0m \x1b[38;2;120;80;255mtrue colour\x1b[0m "
                        "\x1b[7m inverse \x1b[0m \x1b[4munderline\x1b[0m \x1b[2mdim\x1b[0m\n",
                    ],
                    ["stdout", "shard 2: 2500 samples, mean=0.4973 std=0.2887\n"],
                ],
                duration=0.93,
            ),
            rank(
                3,
                "stopped",
                [
                    ["stdout", "".join(f"prefetch batch {i}: 64 samples\n" for i in range(1196, 1200))],
                    ["stderr", "\x1b[31mwarning:\x1b[0m loader worker 3 slow (412 ms)\n"],
                ],
                elided_lines=1196,
                duration=1.80,
            ),
        ],
    }


def many_ranks_run(n: int = 64) -> dict:
    run = sample_run()
    tmpl = run["ranks"]
    ranks = []
    for r in range(n):
        if r == 37:
            status, extra = (
                "failed",
                {
                    "summary": "AssertionError: shard 37 is empty",
                    "traceback": 'Traceback (most recent call last):\n  Cell In[3], line 4\n    assert len(shard), f"shard {rank} is empty"\nAssertionError: shard 37 is empty',
                    "exit_code": 1,
                    "signal": None,
                },
            )
        elif r < 24:
            status, extra = "done", {"exit_code": 0, "signal": None, "duration": 0.8 + r / 100}
        else:
            status, extra = "stopped", {"exit_code": -15, "signal": "SIGTERM"}
        base = dict(tmpl[2] if status == "done" else tmpl[0])
        base.update(
            rank=r,
            pid=5000 + r,
            status=status,
            elided_lines=0,
            output=[["stdout", f"rank {r}: loaded shard {r}\n"], ["stdout", f"rank {r}: step 1 ok\n"]],
            **extra,
        )
        if status != "failed":
            base.update(summary=None, traceback=None)
        ranks.append(base)
    run.update(nprocs=n, ranks=ranks, error={"rank": 37, "summary": ranks[37]["summary"], "traceback": ranks[37]["traceback"]})
    return run


def single_rank_run() -> dict:
    run = sample_run()
    done = dict(run["ranks"][2], rank=0, output=[["stdout", "tensor([10.])\n"]])
    run.update(nprocs=1, status="succeeded", error=None, duration=0.41, ranks=[done], start_method="spawn", backend="none")
    return run


def running_run() -> dict:
    run = sample_run()
    ranks = []
    for r in range(3):
        base = dict(run["ranks"][2], rank=r, pid=6000 + r)
        if r == 2:
            base.update(output=[["stdout", "rank 2: done early\n"]])
        else:
            base.update(
                status="running",
                exit_code=None,
                duration=None,
                output=[["stderr", f"step: {40 + r}%|████      | {40 + r}/100\r"]],
            )
        ranks.append(base)
    run.update(nprocs=3, status="running", error=None, duration=None, ranks=ranks)
    return run


def run_output(run: dict) -> dict:
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {
            MIME: run,
            "text/html": "<pre class='nbspawn-html-fallback'>fallback html</pre>",
            "text/plain": "fallback text",
        },
    }


STATUS_CELLS = [
    "from comm import create_comm\n"
    'c = create_comm(target_name="nbspawn.status",\n'
    '                data={"run_id": "r-test", "status": "running", "nprocs": 4, "running": [0, 1, 2, 3]})',
    'c.send({"run_id": "r-test", "status": "running", "nprocs": 4, "running": [0, 2, 3]})',
    "import time\ntry:\n    print('in the try', flush=True)\n    time.sleep(120)\nfinally:\n    c.close()",
]


# ---------------------------------------------------------------------------------------------
# servers
# ---------------------------------------------------------------------------------------------


def _write_notebooks(root: Path) -> None:
    write_notebook(root, "run.ipynb", [code_cell(0, "%%spawn -n 4 --backend gloo\ntrain()", [run_output(sample_run())])])
    write_notebook(root, "many.ipynb", [code_cell(0, "%%spawn -n 64\nload_shards()", [run_output(many_ranks_run(64))])])
    write_notebook(root, "small.ipynb", [
        code_cell(0, "%%spawn -n 1 --start-method spawn\nprint(t)", [run_output(single_rank_run())]),
        code_cell(1, "%%spawn -n 3\ntrain()", [run_output(running_run())]),
    ])  # fmt: skip
    write_notebook(root, "status.ipynb", STATUS_CELLS)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("lab"), _write_notebooks)


@pytest.fixture(scope="module")
def nb7(tmp_path_factory):
    yield from serve("notebook", tmp_path_factory.mktemp("nb7"), _write_notebooks)


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------


def test_lab_renders_a_failed_run(lab, page, artifacts):
    pg = page.page
    run = open_lab_notebook(pg, lab, "run.ipynb")

    # the extension's renderer won over the text/html fallback
    assert pg.locator(".nbspawn-html-fallback").count() == 0
    header = run.locator(".nbs-Header").inner_text()
    for expected in ("FAILED", "4 ranks", "fork", "gloo", "1.84 s", "20261121-191503-a3f9", "/tmp/nbspawn-k3x9"):
        assert expected in header, (expected, header)

    chips = run.locator(".nbs-Chip")
    assert chips.count() == 4
    assert [chips.nth(i).get_attribute("data-status") for i in range(4)] == ["stopped", "failed", "done", "stopped"]
    assert "0.93 s" in chips.nth(2).inner_text()
    assert "ZeroDivisionError" in chips.nth(1).inner_text()

    # the root-cause rank is selected, its traceback first in its pane
    selected = run.locator(".nbs-Tab[aria-selected='true']")
    assert selected.count() == 1 and selected.get_attribute("data-rank") == "1"
    tb = run.locator(".nbs-Pane[data-rank='1'] .nbs-Traceback")
    assert tb.is_visible()
    assert "ZeroDivisionError: float division by zero" in tb.locator(".nbs-Traceback-summary").inner_text()
    assert "Cell In[5], line 12" in tb.locator(".nbs-Traceback-text").inner_text()
    assert run.locator(".nbs-Banner").inner_text().startswith("!")  # run-level banner names the rank
    assert "rank 1:" in run.locator(".nbs-Banner").inner_text()
    shot(run, artifacts, "lab-failed-rank.png", unhover=True)

    # rank 0: ANSI colours, stderr apart, the tqdm line settled to its final state
    run.locator(".nbs-Chip[data-rank='0']").click()
    # the pane is drawn in the next animation frame: wait for it before reading
    sync_api.expect(run.locator(".nbs-Pane[data-rank='0'] .nbs-Output")).to_contain_text("train:")
    text = pane_text(run)
    assert "100/100 [00:01<00:00, 99.6it/s]" in text
    for stale in ("10/100", "35/100", "55/100", "80/100", "0/100 [00:00<?"):
        assert stale not in text, stale
    assert text.count("train:") == 2  # epoch 1 finished, epoch 2 stopped at 12%
    assert "12/100" in text
    assert "\x1b" not in text and "[32m" not in text
    green = run.locator(".nbs-Pane[data-rank='0'] .nbs-fg-2").first
    sync_api.expect(green).to_have_text("0.6931")  # textContent: innerText is "" for a line out of view
    assert green.evaluate("e => getComputedStyle(e).color") not in (
        run.locator(".nbs-Pane[data-rank='0'] .nbs-Output").evaluate("e => getComputedStyle(e).color"),
    )
    stderr_lines = run.locator(".nbs-Pane[data-rank='0'] .nbs-Line.nbs-stderr")
    assert stderr_lines.count() == 3  # the warning and two progress lines
    # stderr is marked (a rule at its left), not styled as an error: tqdm, warnings and logging live there
    style = stderr_lines.first.evaluate(
        "e => { const s = getComputedStyle(e); return [s.backgroundColor, s.boxShadow, s.color]; }"
    )
    background, rule, _colour = style
    assert rule != "none", style
    red = [int(v) for v in re.findall(r"\d+", background)[:3]] if background != "rgba(0, 0, 0, 0)" else [0, 0, 0]
    assert not (red[0] > 200 and red[1] < 230 and red[2] < 230 and red[0] - red[2] > 20), style
    shot(run, artifacts, "lab-rank0-tqdm-ansi.png")

    # rank 2: markup in the output is text, and nothing ran
    run.locator(".nbs-Chip[data-rank='2']").click()
    out = run.locator(".nbs-Pane[data-rank='2'] .nbs-Output")
    assert out.get_by_text("<script>alert(1)</script>", exact=True).is_visible()
    assert out.get_by_text('<img src=x onerror="alert(2)"> &amp; <b>not bold</b>', exact=True).is_visible()
    assert run.locator("script, img, b").count() == 0
    assert out.locator(".nbs-inverse").count() == 1
    pg.wait_for_timeout(300)
    assert page.dialogs == []
    shot(run, artifacts, "lab-rank2-markup-as-text.png")

    # rank 3: the elision marker comes before the output
    run.locator(".nbs-Chip[data-rank='3']").click()
    first = run.locator(".nbs-Pane[data-rank='3'] .nbs-Output > *").first
    assert first.inner_text() == ("1196 lines elided — full log at /tmp/nbspawn-k3x9/20261121-191503-a3f9/3/stdout.log")

    # merged: every rank, colour-coded prefixes
    run.locator(".nbs-Tab-merged").click()
    merged = run.locator(".nbs-mod-merged")
    prefixes = merged.locator(".nbs-Line .nbs-Prefix").all_inner_texts()
    assert set(prefixes) == {"[rank0]", "[rank1]", "[rank2]", "[rank3]"}
    colours = {
        merged.locator(".nbs-Line .nbs-Prefix", has_text=f"[rank{r}]").first.evaluate("e => getComputedStyle(e).color")
        for r in range(4)
    }
    assert len(colours) == 4
    assert merged.get_by_text("<script>alert(1)</script>", exact=True).is_visible()
    shot(run, artifacts, "lab-merged.png")

    # keyboard: arrows move between tabs
    run.locator(".nbs-Tab-merged").focus()
    pg.keyboard.press("ArrowRight")
    assert run.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "0"

    page_shot(pg, artifacts, "lab-page.png")
    assert page.dialogs == [] and not page.nbspawn_errors(), (page.dialogs, page.errors)


def test_lab_renders_64_ranks(lab, page, artifacts):
    run = open_lab_notebook(page.page, lab, "many.ipynb")
    chips = run.locator(".nbs-Chip")
    assert chips.count() == 64
    tabs = run.locator(".nbs-Tabs")
    # the chips wrap: no horizontal scrolling, and every chip is inside the view's width
    assert tabs.evaluate("e => e.scrollWidth <= e.clientWidth")
    run_box = run.bounding_box()
    for i in (0, 31, 63):
        box = chips.nth(i).bounding_box()
        assert box["x"] >= run_box["x"] and box["x"] + box["width"] <= run_box["x"] + run_box["width"]
    assert run.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "37"
    assert "shard 37 is empty" in run.locator(".nbs-Traceback").inner_text()
    shot(run, artifacts, "lab-64-ranks.png", unhover=True)


def test_lab_renders_one_rank_and_a_running_run(lab, page, artifacts):
    open_lab_notebook(page.page, lab, "small.ipynb")
    runs = notebook_root(page.page, lab).locator(".nbs-Run")
    sync_api.expect(runs).to_have_count(2)
    one, running = runs.nth(0), runs.nth(1)
    # one rank: no merged tab, its pane shown
    assert one.locator(".nbs-Tab-merged").count() == 0
    assert one.locator(".nbs-Chip").count() == 1
    assert shown_text(one.locator(".nbs-Pane[data-rank='0']")).count("tensor([10.])") == 1
    assert one.locator(".nbs-Banner").count() == 0
    assert "SUCCEEDED" in one.locator(".nbs-Badge").inner_text()
    # running: spinner chips, the merged view by default
    assert [running.locator(".nbs-Chip").nth(i).get_attribute("data-status") for i in range(3)] == [
        "running", "running", "done"]  # fmt: skip
    assert running.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-tab") == "merged"
    merged = shown_text(running.locator(".nbs-mod-merged"))
    assert "[rank1]" in merged and "41/100" in merged
    shot(one, artifacts, "lab-one-rank.png", unhover=True)
    shot(running, artifacts, "lab-running.png")


def test_lab_dark_theme(lab, browser, artifacts):
    home_settings = lab.settings
    write_settings(home_settings, theme="JupyterLab Dark")
    try:
        with Page(browser, color_scheme="dark") as p:
            run = open_lab_notebook(p.page, lab, "run.ipynb")
            p.page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
            p.page.wait_for_timeout(500)
            shot(run, artifacts, "lab-dark-failed-rank.png", unhover=True)
            run.locator(".nbs-Chip[data-rank='0']").click()
            shot(run, artifacts, "lab-dark-rank0.png")
            run.locator(".nbs-Tab-merged").click()
            shot(run, artifacts, "lab-dark-merged.png")
    finally:
        write_settings(home_settings)


def test_notebook7_renders_the_run(nb7, page, artifacts):
    pg = page.page
    pg.goto(nb7.url(f"/tree/{nb7.folder}"))
    item = pg.locator(".jp-DirListing-item", has_text="run.ipynb")
    item.wait_for(timeout=90_000)
    with page.context.expect_page(timeout=30_000) as opened:
        item.dblclick()
    nb = page.watch(opened.value)
    run = nb.locator(".nbs-Run").first
    run.wait_for(state="visible", timeout=90_000)
    assert f"/notebooks/{nb7.path('run.ipynb')}" in nb.url
    assert run.locator(".nbs-Chip").count() == 4
    assert run.locator(".nbs-Tab[aria-selected='true']").get_attribute("data-rank") == "1"
    assert "ZeroDivisionError" in run.locator(".nbs-Traceback").inner_text()
    run.locator(".nbs-Chip[data-rank='2']").click()
    assert run.get_by_text("<script>alert(1)</script>", exact=True).is_visible()
    nb.wait_for_timeout(300)
    assert page.dialogs == []
    shot(run, artifacts, "nb7-rank2.png", unhover=True)
    page_shot(nb, artifacts, "nb7-page.png")


def test_lab_status_item_follows_the_comm_and_stops_the_run(lab, page, artifacts):
    pg = page.page
    cells = open_notebook(pg, lab, "status.ipynb")  # the kernel up
    panel = notebook_root(pg, lab)
    status = panel.locator(".nbs-Status")
    status.wait_for(state="attached", timeout=30_000)
    assert status.is_hidden()  # nothing running yet

    run_cell(pg, cells.nth(0))  # the comm opens: 4 ranks running
    status.wait_for(state="visible", timeout=30_000)
    assert status.locator(".nbs-Status-label").inner_text() == "nbspawn: 4 ranks running"
    shot(panel.locator(".jp-NotebookPanel-toolbar"), artifacts, "lab-status-toolbar.png")

    run_cell(pg, cells.nth(1))  # a message: rank 1 ended
    pg.wait_for_function(
        "() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .nbs-Status-label')"
        ".textContent === 'nbspawn: 3 of 4 ranks running'",
        timeout=30_000,
    )

    run_cell(pg, cells.nth(2))  # a long cell; Stop interrupts the kernel, the comm closes
    # Stop once the cell is inside its try (its [*] shows as the request is sent, before the kernel runs it)
    sync_api.expect(cells.nth(2).locator(".jp-OutputArea")).to_contain_text("in the try", timeout=30_000)
    status.locator(".nbs-Status-stop").click()
    status.wait_for(state="hidden", timeout=30_000)
    sync_api.expect(cells.nth(2).locator(".jp-OutputArea")).to_contain_text("KeyboardInterrupt", timeout=30_000)
    page_shot(pg, artifacts, "lab-status-after-stop.png")

    # a kernel restart ends the run in the toolbar, and the comm target still works afterwards
    run_cell(pg, cells.nth(0))
    status.wait_for(state="visible", timeout=30_000)
    pg.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    pg.locator(".lm-Menu-itemLabel", has_text="Restart Kernel…").first.click()
    pg.locator(".jp-Dialog .jp-mod-accept").click()
    status.wait_for(state="hidden", timeout=30_000)
    panel.locator(KERNEL_IDLE).wait_for(timeout=60_000)
    run_cell(pg, cells.nth(0))
    status.wait_for(state="visible", timeout=30_000)
    assert status.locator(".nbs-Status-label").inner_text() == "nbspawn: 4 ranks running"
