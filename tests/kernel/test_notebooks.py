"""Every tracked notebook in notebooks/ runs top to bottom (nbclient), and an executed notebook converts to
HTML (``jupyter nbconvert --to html``) showing every rank's output, with no script from nbspawn.

The kernel is this interpreter's (kernel_harness writes the kernelspec), with nbspawn's defaults:
in a kernel that is the live widget, which the frozen bundle replaces in place when a run ends.
"""

from __future__ import annotations

import asyncio
import html
import os
import queue
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from jupyter_client import AsyncKernelManager
from kernel_harness import KERNEL_NAME, _kernel_spec_manager
from nbclient import NotebookClient

from nbspawn.views._bundle import MIME

REPO = Path(__file__).resolve().parents[2]


def tracked_notebooks(repo: Path) -> list[Path]:
    """The example notebooks git tracks in ``repo/notebooks``: a scratch notebook someone saved there
    is not an example, and must not change what the suite runs (``make lab`` serves a copy elsewhere,
    scripts/lab-folder.sh)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--", "notebooks/*.ipynb"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    return sorted(repo / name for name in names if name)


NOTEBOOKS = tracked_notebooks(REPO)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class AnsweringClient(NotebookClient):
    """nbclient, answering prompts as a person would: a cell whose metadata holds
    ``{"nbspawn": {"answers": [...]}}`` is sent with stdin allowed (nbclient never allows it), and
    each ``input_request`` it makes gets the next answer (what a rank's ``input()`` or pdb asks,
    notebooks/debugging.ipynb).  The prompts seen are kept, and any prompt past the answers too."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[tuple[int, str]] = []  # (cell index, prompt)
        self.unanswered: list[tuple[int, str]] = []

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):  # type: ignore[override]
        answers = list(cell.get("metadata", {}).get("nbspawn", {}).get("answers", []))
        if not answers or self.kc is None:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        self.kc.allow_stdin = True
        task = asyncio.ensure_future(self._answer(cell_index, answers))
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        finally:
            task.cancel()
            self.kc.allow_stdin = False
            if answers:
                self.unanswered.append((cell_index, f"answers never asked for: {answers}"))

    async def _answer(self, cell_index: int, answers: list[str]) -> None:
        assert self.kc is not None
        while True:
            try:
                msg = await self.kc.get_stdin_msg(timeout=0.05)
            except queue.Empty:
                continue
            if msg["msg_type"] != "input_request":
                continue
            prompt = msg["content"]["prompt"]
            self.prompts.append((cell_index, prompt))
            if answers:
                self.kc.input(answers.pop(0))
            else:  # past the script: go on (pdb's c), and say so
                self.unanswered.append((cell_index, prompt))
                self.kc.input("c")


def run_notebook(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 300) -> nbformat.NotebookNode:
    km = AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=_kernel_spec_manager())
    client = AnsweringClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(cwd)}})
    executed = client.execute()
    assert not client.unanswered, (client.unanswered, client.prompts)
    return executed


def spawn_outputs(nb: nbformat.NotebookNode) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%spawn") for o in c.outputs]


def test_quickstart_is_there():
    assert REPO / "notebooks" / "quickstart.ipynb" in NOTEBOOKS


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_only_tracked_notebooks_run(tmp_path: Path):
    """An untracked notebook in notebooks/ (a newcomer's scratch) is not one the suite runs."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "example.ipynb").write_text("{}")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "notebooks/example.ipynb")
    (tmp_path / "notebooks" / "Untitled.ipynb").write_text("{}")
    assert tracked_notebooks(tmp_path) == [tmp_path / "notebooks" / "example.ipynb"]


def test_lab_serves_a_working_copy_outside_the_tests(tmp_path: Path):
    """``make lab``'s folder is seeded with copies of the examples, keeps what the user saved there,
    and (by default, work/) is ignored by git, so nothing saved in it reaches what the tests run."""
    folder = tmp_path / "lab"
    script = REPO / "scripts" / "lab-folder.sh"
    subprocess.run(["bash", str(script), str(folder)], check=True, capture_output=True)
    assert sorted(p.name for p in folder.glob("*.ipynb")) == sorted(p.name for p in NOTEBOOKS)
    assert (folder / "quickstart.ipynb").read_bytes() == (REPO / "notebooks" / "quickstart.ipynb").read_bytes()
    (folder / "quickstart.ipynb").write_text("edited")
    subprocess.run(["bash", str(script), str(folder)], check=True, capture_output=True)
    assert (folder / "quickstart.ipynb").read_text() == "edited"
    ignored = subprocess.run(["git", "check-ignore", "-q", "work/Untitled.ipynb"], cwd=REPO)
    assert ignored.returncode == 0, "work/ (make lab's default folder) must be git-ignored"
    lab = subprocess.run(["make", "-n", "lab", f"LAB_DIR={folder}"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    assert f'scripts/lab-folder.sh "{folder}"' in lab and f'cd "{folder}" && ' in lab, lab


def needs_missing(nb: nbformat.NotebookNode) -> str | None:
    """Why a notebook cannot run here: ``{"nbspawn": {"needs": "tpu"}}`` in its metadata (notebooks/tpu.ipynb)
    runs only on a TPU host; None when it can run."""
    if nb.metadata.get("nbspawn", {}).get("needs") == "tpu":
        from nbspawn import _tpu

        if not _tpu.wants_tpu("auto", os.environ):
            return "needs a TPU host (torch_xla and TPU chips); none here"
    return None


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path):
    nb = nbformat.read(path, as_version=4)
    missing = needs_missing(nb)
    if missing:
        pytest.skip(f"{path.name} {missing}")
    nb = run_notebook(nb, tmp_path)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if "raises-exception" not in cell.metadata.get("tags", []):
            assert not errors, (cell.source, errors)
        # what the notebook's text tells the reader the cell shows: {"nbspawn": {"says": [...]}} in its metadata
        shown = _shown(cell)
        for words in cell.metadata.get("nbspawn", {}).get("says", []):
            assert words in shown, (cell.source, words, shown[-3000:])
        if cell.source.startswith(("%%spawn", "%spawn -")) and not cell.source.startswith("%%spawn?"):
            # the live widget was replaced by the frozen run: no widget left in the saved notebook
            data = [o.data for o in cell.outputs if o.output_type == "display_data"]
            assert data and all(WIDGET_MIME not in d for d in data), cell.source
            assert any(MIME in d and "text/html" in d and "text/plain" in d for d in data), cell.source


def _shown(cell) -> str:
    """What a cell's outputs say in words: its error's traceback, its streams, its displays' text/plain."""
    texts = []
    for output in cell.outputs:
        if output.output_type == "error":
            texts.append("\n".join(output.traceback))
        elif output.output_type == "stream":
            texts.append(output.text)
        elif "text/plain" in output.get("data", {}):
            texts.append(output.data["text/plain"])
    return re.sub(r"\x1b\[[0-?]*[ -/]*[@-~]", "", "\n".join(texts))


class _RunRegions(HTMLParser):
    """The source text of every ``<div class="nbspawn-run">`` element, nested tags included."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=False)
        self.source = source
        self.lines = [0]
        for line in source.splitlines(keepends=True):
            self.lines.append(self.lines[-1] + len(line))
        self.regions: list[str] = []
        self.tags: list[tuple[str, list]] = []  # every tag inside a region, with its attributes
        self._start: int | None = None
        self._depth = 0

    def _offset(self) -> int:
        line, col = self.getpos()
        return self.lines[line - 1] + col

    def handle_starttag(self, tag, attrs):
        if self._start is not None:
            self.tags.append((tag, attrs))
            self._depth += tag == "div"
        elif tag == "div" and "nbspawn-run" in (dict(attrs).get("class") or "").split():
            self._start, self._depth = self._offset(), 1

    def handle_endtag(self, tag):
        if self._start is not None and tag == "div":
            self._depth -= 1
            if self._depth == 0:
                end = self.source.index(">", self._offset()) + 1
                self.regions.append(self.source[self._start : end])
                self._start = None


def test_nbconvert_html_shows_every_rank_and_no_script(tmp_path: Path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("%load_ext nbspawn"),
            nbformat.v4.new_code_cell(
                "%%spawn -n 4\n"
                "import os, sys\n"
                "r = os.environ['RANK']\n"
                "print(f'hello from rank {r}')\n"
                "print(f'warning on rank {r}', file=sys.stderr)\n"
                "print('<script>alert(1)</script> <img src=x onerror=alert(2)>')\n"
                "for p in range(0, 101, 25):\n"
                "    print(f'\\rprogress {p}%', end='', flush=True)\n"
                "print()\n"
            ),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    executed = run_notebook(nb, tmp_path)
    assert [o for o in spawn_outputs(executed) if MIME in o.get("data", {})]
    source = tmp_path / "run.ipynb"
    nbformat.write(executed, source)
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(source)],
        check=True, capture_output=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    page = (tmp_path / "run.html").read_text()

    parser = _RunRegions(page)
    parser.feed(page)
    assert len(parser.regions) == 1, parser.regions
    region = parser.regions[0]
    for r in range(4):
        assert f"hello from rank {r}" in region and f"warning on rank {r}" in region
    assert html.escape("<script>alert(1)</script> <img src=x onerror=alert(2)>") in region
    assert "progress 100%" in region and "progress 50%" not in region
    assert not re.search(r"<\s*script", region, re.I)
    # only the static view's own markup: no script, image, frame, event handler or link
    assert {tag for tag, _ in parser.tags} <= {"div", "b", "code", "pre", "span", "details", "summary"}
    # attributes: styles, and the data-* of docs/run-bundle.md that the JupyterLab renderer reads back
    allowed = {"style", "open", "class", "role", "data-rank", "data-s", "data-sgr", "data-elided", "data-traceback"}
    assert not [(tag, attrs) for tag, attrs in parser.tags for name, _ in attrs if name not in allowed]
    # the widget left no output behind (nbconvert's template may still load a widget manager, since
    # nbclient keeps closed widgets' state in the notebook's metadata)
    assert f'<script type="{WIDGET_MIME}">' not in page
