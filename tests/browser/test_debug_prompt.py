"""A rank's pdb prompt answered in a real browser, in JupyterLab and Notebook 7: the frontend's own
stdin box (the kernel's input_request) names the rank, its chip says it is at a breakpoint, `p` shows
the rank's value in its pane, `c` lets the run end, and the frozen run keeps the session in the rank's
pane.  The pane reads as a terminal's pdb session: each command right above its answer (the frontend's
own echo of its stdin box stays below the cell).  Screenshots go to test-artifacts/browser/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    NEEDS_WIDGET,
    Page,
    answer_prompt,
    frozen_run,
    live_view,
    next_prompt,
    open_with_nbspawn,
    pane_lines,
    read_until,
    run_cell,
    select_pane,
    serve,
    shot,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_WIDGET]

BREAK = """\
%%spawn -n 2
import os
x = int(os.environ["RANK"]) * 10 + 7
if x == 17:
    breakpoint()
print("after", x)
"""


def _write(root: Path) -> None:
    write_notebook(root, "debug.ipynb", ["%load_ext nbspawn", BREAK])
    write_notebook(root, "transcript.ipynb", ["%load_ext nbspawn", BREAK])  # a kernel of its own


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("debug-lab"), _write)


@pytest.fixture(scope="module")
def nb7(tmp_path_factory):
    yield from serve("notebook", tmp_path_factory.mktemp("debug-nb7"), _write)


def _answer_the_prompt(pg, server, artifacts, name: str) -> None:
    cells = open_with_nbspawn(pg, server, "debug.ipynb")
    cell = cells.nth(1)
    run_cell(pg, cell)
    sync_api.expect(next_prompt(cell)).to_contain_text("(Pdb rank 1)")
    answer_prompt(cell, "p x")
    # the rank's answer is in its pane (the live view is shown for a prompt, however quick the run)
    view = live_view(cell, 30_000)
    sync_api.expect(view).to_contain_text("17", timeout=30_000)
    sync_api.expect(next_prompt(cell)).to_contain_text("(Pdb rank 1)")  # the next prompt
    # the rank's chip says it is at a prompt (not hung): "at a breakpoint", where in its tooltip
    chip = view.locator(".nbs-Chip[data-rank='1']")
    sync_api.expect(chip).to_have_class(re.compile(r"\bnbs-mod-prompt\b"), timeout=30_000)
    sync_api.expect(chip).to_contain_text("at a breakpoint")
    assert "cell line 6" in (chip.get_attribute("title") or "")
    assert "nbs-mod-prompt" not in (view.locator(".nbs-Chip[data-rank='0']").get_attribute("class") or "")
    shot(cell, artifacts, f"{name}-pdb-prompt.png", unhover=True)
    answer_prompt(cell, "c")
    frozen = frozen_run(cell)
    frozen.locator(".nbs-Chip[data-rank='1']").click()
    pane = frozen.locator(".nbs-Pane[data-rank='1'] .nbs-Output")
    sync_api.expect(pane).to_contain_text("after 17", timeout=30_000)  # drawn at the next animation frame
    # the session stays in rank 1's pane (asked of the pane as found now: the frozen run may be drawn
    # again as the notebook settles, and a pane read from the first drawing can be gone)
    sync_api.expect(pane).to_contain_text('-> print("after", x)', timeout=30_000)
    frozen.locator(".nbs-Chip[data-rank='1']").click()  # rank 1's pane shown again for the screenshot
    shot(cell, artifacts, f"{name}-pdb-done.png", unhover=True)


def test_jupyterlab_answers_a_ranks_pdb_prompt(lab, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        _answer_the_prompt(p.page, lab, artifacts, "lab")


def test_notebook7_answers_a_ranks_pdb_prompt(nb7, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        _answer_the_prompt(p.page, nb7, artifacts, "nb7")


def _above(pane, command: str, answer: str) -> None:
    """``command`` (as the prompt showed it) is the line right above ``answer`` in ``pane``, within 30 s (the
    answer comes from the rank's output, the echoed command from the prompt's answer: a frame or more apart)."""

    def above(lines: list[str]) -> bool:
        at = next((i for i, line in enumerate(lines) if line.endswith(command)), None)
        return at is not None and at + 1 < len(lines) and lines[at + 1].endswith(answer)

    lines = read_until(pane.page, lambda: [line.strip() for line in pane_lines(pane)], above)
    assert above(lines), lines


def test_the_ranks_pane_reads_each_pdb_command_above_its_answer(lab, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "transcript.ipynb")
        cell = cells.nth(1)
        run_cell(pg, cell)
        # each prompt answered once it came (not counted: answered prompts and their echoes redraw as
        # JupyterLab pleases, and ci failed once waiting for a third `.jp-Stdin` that had merged away)
        for command in ["p x", "p x * 2"]:
            sync_api.expect(next_prompt(cell)).to_contain_text("(Pdb rank 1)")
            answer_prompt(cell, command)
        sync_api.expect(next_prompt(cell)).to_contain_text("(Pdb rank 1)")  # the prompt after `p x * 2`
        view = live_view(cell, 30_000)
        pane = select_pane(view, 1)
        _above(pane, "(Pdb rank 1) p x", "17")
        _above(pane, "(Pdb rank 1) p x * 2", "34")
        shot(cell, artifacts, "lab-pdb-transcript-pane.png", unhover=True)
        merged = select_pane(view, "merged")
        _above(merged, "(Pdb rank 1) p x * 2", "34")  # the merged pane: the same lines, in time order
        shot(cell, artifacts, "lab-pdb-transcript-merged.png", unhover=True)
        answer_prompt(cell, "c")
        frozen = frozen_run(cell)
        saved = select_pane(frozen, 1)
        sync_api.expect(saved).to_contain_text("after 17", timeout=30_000)
        _above(saved, "(Pdb rank 1) p x", "17")  # the saved view keeps the transcript
        _above(saved, "(Pdb rank 1) p x * 2", "34")
        shot(cell, artifacts, "lab-pdb-transcript-saved.png", unhover=True)
