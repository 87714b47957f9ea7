"""The text view: terminal IPython (live bars at the bottom, lines above them), columns that line up,
what ranks display in text, and what a stopped run says.

Terminal IPython runs for real in a pseudo-terminal (pexpect); pyte, a terminal emulator, turns what
it writes into the screen a user would see, which the tests read while the run is going.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
import re
import struct
import sys
import time
import zlib

import pexpect
import pyte
import pytest

import nbspawn
from nbspawn import SpawnInterrupted
from nbspawn.events._widgetbar import widget_text
from nbspawn.views._text import TextView, clip, item_text

pytestmark = pytest.mark.timeout(180)

ROWS, COLS = 30, 100
IPYTHON = os.path.join(os.path.dirname(sys.executable), "ipython")


class Terminal:
    """Terminal IPython in a pseudo-terminal, and the screen it draws."""

    def __init__(self, ipython_dir: str) -> None:
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "PYTEST_CURRENT_TEST")}
        env.update(TERM="xterm", IPYTHONDIR=ipython_dir, NO_COLOR="1")
        # --simple-prompt: the prompt is read with input(), so the screen holds only what IPython and
        # nbspawn write (prompt_toolkit would wait for cursor-position replies pyte does not send);
        # the cell runs the same way, with the terminal as its stdout and stderr.
        args = ["--no-banner", "--no-confirm-exit", "--colors=NoColor", "--simple-prompt", "--HistoryManager.enabled=False"]
        self.child = pexpect.spawn(IPYTHON, args, dimensions=(ROWS, COLS), env=env, cwd=ipython_dir)

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            try:
                data = self.child.read_nonblocking(1 << 16, timeout=max(0.0, min(0.05, left)))
            except pexpect.TIMEOUT:
                data = b""
            if data:
                self.raw += data
                self.stream.feed(data)
            if left <= 0:
                return

    def wait_raw(self, needle: bytes, count: int = 1, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while self.raw.count(needle) < count:
            assert time.monotonic() < deadline, f"{needle!r} x{count} not seen; screen:\n{self.text()}"
            self.pump(0.05)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def text(self) -> str:
        return "\n".join(self.lines())

    def run_cell(self, source: str) -> None:
        """Type a cell line by line, as a user would, waiting for each continuation prompt."""
        lines = source.rstrip("\n").split("\n")
        prompts = self.raw.count(b"...:")
        for i, line in enumerate(lines):
            self.child.sendline(line)
            if len(lines) > 1:
                self.wait_raw(b"...:", prompts + i + 1)
        if len(lines) > 1:  # input() reads a cell magic's cell up to a blank line: two newlines
            self.child.sendline("")
            self.wait_raw(b"...:", prompts + len(lines) + 1)
            self.child.sendline("")

    def close(self) -> None:
        self.child.sendline("exit")
        self.child.expect(pexpect.EOF, timeout=30)
        self.child.close()


@pytest.fixture(scope="module")
def terminal(tmp_path_factory):
    term = Terminal(str(tmp_path_factory.mktemp("ipython")))
    try:
        term.wait_raw(b"In [1]:")
        term.run_cell("%load_ext nbspawn")
        term.wait_raw(b"In [2]:")
        yield term
    finally:
        if term.child.isalive():
            term.child.terminate(force=True)


def run_and_watch(term: Terminal, cell: str, every: float = 0.1, timeout: float = 90) -> list[list[str]]:
    """Type ``cell``, then the screen every ``every`` seconds until the next prompt is drawn."""
    prompt = f"In [{term.raw.count(b'In [') + 1}]:".encode()
    term.screen.reset()  # the screen from here on: this cell's input and output only
    term.run_cell(cell)
    screens: list[list[str]] = []
    deadline = time.monotonic() + timeout
    while prompt not in term.raw:
        assert time.monotonic() < deadline, term.text()
        term.pump(every)
        screens.append(term.lines())
    return screens


BAR = re.compile(r"^\[rank(\d)\]: train\1: +(\d+)%\|")


def bars(screen: list[str]) -> list[tuple[int, int, int]]:
    """(row, rank, percent) of every bar on the screen."""
    return [(row, int(m[1]), int(m[2])) for row, line in enumerate(screen) if (m := BAR.match(line))]


def test_terminal_ipython_redraws_each_ranks_bar_live_at_the_bottom(terminal):
    cell = """%%spawn -n 2
import os, time
from tqdm import tqdm
r = int(os.environ["RANK"])
for i in tqdm(range(30), desc=f"train{r}", ncols=70, mininterval=0):
    time.sleep(0.1)
    if i in (5, 15):
        tqdm.write(f"step {i} of rank {r}")
print(f"finished {r}")
"""
    screens = run_and_watch(terminal, cell)
    live = [s for s in screens if {rank for _, rank, pct in bars(s) if pct < 100} == {0, 1}]
    assert len(live) >= 5, "\n\n".join("\n".join(s) for s in screens[-3:])
    for screen in live:
        content = [row for row, line in enumerate(screen) if line]
        found = bars(screen)
        # the footer: one row per rank, in rank order, the last rows written, each within the width
        assert [rank for _, rank, _ in found] == [0, 1], "\n".join(screen)
        assert [row for row, _, _ in found] == content[-2:], "\n".join(screen)
        assert all(len(screen[row]) < COLS for row, _, _ in found)
    # both bars advance while the run goes on, not only at its end
    for rank in (0, 1):
        seen = [pct for s in live for _, r, pct in bars(s) if r == rank]
        assert seen == sorted(seen) and len(set(seen)) >= 4, seen
    # complete lines are printed above the bars while they are being drawn
    above = [s for s in live if "[rank0]: step 5 of rank 0" in s and "[rank1]: step 5 of rank 1" in s]
    assert above, "no line printed above the live bars"
    for screen in above:
        assert screen.index("[rank0]: step 5 of rank 0") < bars(screen)[0][0]
    # the end: each bar's final state, once, as a normal line, and nothing left of the footer
    final = screens[-1]
    for rank in (0, 1):
        mine = [(row, pct) for row, r, pct in bars(final) if r == rank]
        assert [pct for _, pct in mine] == [100], "\n".join(final)
        assert final.count(f"[rank{rank}]: finished {rank}") == 1
        assert final.count(f"[rank{rank}]: step 5 of rank {rank}") == 1
        assert final.count(f"[rank{rank}]: step 15 of rank {rank}") == 1
        assert final.index(f"[rank{rank}]: step 15 of rank {rank}") < mine[0][0]


def test_a_bar_wider_than_the_terminal_is_clipped_never_wrapped(terminal):
    cell = """%%spawn -n 2
import time
from tqdm import tqdm
for i in tqdm(range(20), desc="wide" + "-" * 150, ncols=300, mininterval=0):
    time.sleep(0.1)
"""
    screens = run_and_watch(terminal, cell)
    live = [s for s in screens if sum(line.startswith(("[rank0]: wide", "[rank1]: wide")) for line in s) == 2]
    live = [s for s in live if not any("100%" in line for line in s)]  # mid-run: the final lines say 100%
    assert live
    for screen in live:
        content = [line for line in screen if line]
        assert content[-2].startswith("[rank0]: wide---") and content[-1].startswith("[rank1]: wide---"), "\n".join(screen)
        assert len(content[-2]) == COLS - 1 and len(content[-1]) == COLS - 1


def test_a_notebook_bar_in_a_rank_is_a_live_text_bar_in_terminal_ipython(terminal):
    """``tqdm.notebook`` makes a widget; the rank records it and the text view draws it as tqdm would."""
    cell = """%%spawn -n 2
import os, time
from tqdm.notebook import tqdm
r = int(os.environ["RANK"])
for i in tqdm(range(20), desc=f"train{r}"):
    time.sleep(0.1)
"""
    screens = run_and_watch(terminal, cell)
    live = [s for s in screens if {rank for _, rank, pct in bars(s) if pct < 100} == {0, 1}]
    assert len(live) >= 3, "\n".join(screens[-1])
    seen = [pct for s in live for _, r, pct in bars(s) if r == 0]
    assert seen == sorted(seen) and len(set(seen)) >= 3, seen
    final = screens[-1]
    for rank in (0, 1):
        done = [line for line in final if line.startswith(f"[rank{rank}]: train{rank}:")]
        assert len(done) == 1 and re.search(r"100%\|█{10}\| 20/20 \[", done[0]), "\n".join(final)


# -- the text view, in this process -------------------------------------------------------------------


def test_prefixes_of_eleven_ranks_line_up():
    out, err = io.StringIO(), io.StringIO()
    cell = "import os, sys\nprint('out', os.environ['RANK'])\nprint('err', file=sys.stderr)"
    nbspawn.launch(cell, nprocs=11, start_method="fork", view=TextView(out, err, live=False))
    for text, word in ((out.getvalue(), "out"), (err.getvalue(), "err")):
        lines = text.splitlines()
        assert len(lines) == 11, text
        assert {line.index(word) for line in lines} == {len("[rank10]: ")}, text
        assert sorted(lines) == sorted(f"{f'[rank{r}]:':<9} {word}" + (f" {r}" if word == "out" else "") for r in range(11))
    assert "[rank3]:  out 3" in out.getvalue() and "[rank10]: out 10" in out.getvalue()


def test_prefixes_are_not_padded_below_eleven_ranks():
    out = io.StringIO()
    nbspawn.launch("print('x')", nprocs=10, start_method="fork", view=TextView(out, io.StringIO(), live=False))
    assert sorted(out.getvalue().splitlines()) == sorted(f"[rank{r}]: x" for r in range(10))


def _png(width: int, height: int) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(png).decode()


class RichText(TextView):
    """The text view where ranks look like a notebook: what a Jupyter kernel's forked ranks get."""

    rich = True


# alone, for now: on Colab's stack (ipywidgets 7.7.1, Python 3.13) under load the finished tqdm.notebook
# bar is sometimes missing from the text view (1 run in 5 beside 3 busy loops; the Colab job's parallel
# part in a CI rehearsal at e57db10; never seen alone or on the development stack under the same load) — a defect to find,
# not a test to loosen: what it asserts is unchanged
@pytest.mark.alone
def test_what_ranks_display_is_shown_in_text_and_a_notebook_bar_once_finished(tmp_path):
    out = io.StringIO()
    cell = f"""
import os
from IPython.display import display, HTML
from tqdm.auto import tqdm
r = int(os.environ["RANK"])
print("before")
display({{"image/png": "{_png(7, 3)}"}}, raw=True)
display(HTML("<b>bold</b>"))
for _ in tqdm(range(40), desc=f"train{{r}}"):
    pass
print("after")
"""
    nbspawn.launch(cell, nprocs=2, start_method="fork", view=RichText(out, io.StringIO(), live=False), log_dir=str(tmp_path))
    text = out.getvalue()
    for rank in (0, 1):
        mine = [line[len(f"[rank{rank}]: ") :] for line in text.splitlines() if line.startswith(f"[rank{rank}]: ")]
        assert mine[:3] == ["before", "<image/png 7×3>", "<IPython.core.display.HTML object>"], text
        assert len(mine) == 5 and mine[4] == "after", text
        assert re.fullmatch(rf"train{rank}: 100%\|█{{10}}\| 40/40 \[.*\]", mine[3]), text  # tqdm's own text form


def test_a_live_footer_as_a_terminal_shows_it(monkeypatch, tmp_path):
    """The view's writes on one stream fed to a terminal emulator: bars at the bottom, lines above."""
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("LINES", "20")
    term = io.StringIO()
    screen = pyte.Screen(60, 20)
    stream = pyte.Stream(screen)
    seen: list[list[str]] = []

    redraws = 0

    def look() -> list[str]:
        nonlocal redraws
        redraws += term.getvalue().count("\r\x1b[K")  # each redraw of the footer starts by erasing it
        stream.feed(term.getvalue().replace("\n", "\r\n"))  # the tty's onlcr
        term.seek(0)
        term.truncate()
        return [line.rstrip() for line in screen.display]

    class Watching(TextView):
        def tick(self, run):  # after each step of the supervision loop: what the terminal shows now
            super().tick(run)
            seen.append(look())

    cell = """
import sys, time
for i in range(1, 151):  # a bar redrawn 100 times a second
    sys.stderr.write(f"\\rstep {i:3d}/150 " + "#" * 80)
    sys.stderr.flush()
    if i == 50:
        print("halfway")
    time.sleep(0.01)
_ = sys.stderr.write("\\n")
"""
    started = time.monotonic()
    nbspawn.launch(cell, nprocs=2, start_method="fork", view=Watching(term, term, live=True), log_dir=str(tmp_path))
    took = time.monotonic() - started
    final = look()
    assert 5 <= redraws <= 10 * took + 2 + 2, (redraws, took)  # ten a second, and one as each rank ends
    step = re.compile(r"\[rank(\d)\]: step +(\d+)/150 ")
    live = [s for s in seen if {m[1] for line in s if (m := step.match(line)) and int(m[2]) < 150} == {"0", "1"}]
    assert live, seen[-1]
    for s in live:
        content = [line for line in s if line]
        assert content[-2].startswith("[rank0]: step") and content[-1].startswith("[rank1]: step"), s
        assert len(content[-1]) == 59  # clipped to the width, less the last column
    steps = {int(line.split("step")[1].split("/")[0]) for s in live for line in s if line.startswith("[rank0]: step")}
    assert len(steps) >= 4, steps
    assert any("[rank0]: halfway" in s and s.index("[rank0]: halfway") < len(s) - 2 for s in live)
    content = [line for line in final if line]
    assert sum(line.startswith("[rank0]: step 150/150") for line in content) == 1, final
    left = [line for line in content if (m := step.match(line)) and int(m[2]) < 150]
    assert not left, final  # nothing left of the footer


def test_items_in_text():
    assert item_text({"kind": "data", "mime": "text/plain", "value": "42", "text": "42"}) == "42"
    assert item_text({"kind": "data", "mime": "image/png", "value": _png(640, 480), "text": ""}) == "<image/png 640×480>"
    assert item_text({"kind": "data", "mime": "image/jpeg", "value": "/9j/", "text": "", "meta": {"width": 8, "height": 2}}) == (
        "<image/jpeg 8×2>"
    )
    dropped = {"kind": "data", "mime": "text/plain", "value": "[image/png, 900 KB, not shown: ...]", "text": "<Figure>"}
    assert item_text(dropped) == dropped["value"]  # an image the run could not afford says so
    tree = {
        "type": "box",
        "dir": "row",
        "children": [
            {"type": "text", "value": "Epoch 1:  45%"},
            {"type": "progress", "value": 45, "min": 0, "max": 100, "bar_style": "", "description": ""},
            {"type": "text", "value": " 45/100 [00:01<00:02, 40.1it/s]"},
        ],
    }
    assert widget_text(tree) == "Epoch 1:  45%|████▌     | 45/100 [00:01<00:02, 40.1it/s]"
    alone = {"type": "progress", "value": 1, "min": 0, "max": 4, "bar_style": "", "description": "load"}
    assert widget_text(alone) == "load:  25%|██▌       |"
    assert clip("\x1b[31mred\x1b[0m and more", 6) == "\x1b[31mred\x1b[0m an\x1b[0m"
    assert clip("ab\x1b[2Kcd", 10) == "abcd"  # no escape but colours reaches the footer
    assert clip("表表表", 5) == "表表"


def test_a_run_stopped_with_its_stop_button_says_so(tmp_path):
    """A view's Stop (``wants_stop``) is not an interrupt: the error says the user stopped the run."""

    class StopAfterOutput(TextView):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shown: dict[int, float] = {}

        def output(self, rank, stream, text):
            super().output(rank, stream, text)
            self.shown.setdefault(rank, time.monotonic())

        def wants_stop(self):
            # as a user would: Stop once every rank has shown something, and is asleep (not when the first
            # line came: a rank still returning from its print was where it was, and read apart from the other)
            return len(self.shown) == 2 and time.monotonic() - max(self.shown.values()) > 0.5

    cell = "import time\nprint('going', flush=True)\ntime.sleep(60)"
    started = time.monotonic()
    with pytest.raises(SpawnInterrupted) as caught:
        nbspawn.launch(
            cell,
            nprocs=2,
            start_method="fork",
            view=StopAfterOutput(io.StringIO(), io.StringIO(), live=False),
            log_dir=str(tmp_path),
        )
    assert time.monotonic() - started < 30
    error = caught.value
    assert isinstance(error, KeyboardInterrupt)
    assert error.run.status == "stopped"
    text = str(error)
    assert text.splitlines()[0] == "SpawnInterrupted: the run was stopped (Stop button)", text
    assert "interrupted" not in text
    assert "ranks 0-1 were stopped the same way: KeyboardInterrupt" in text, text
    assert "time.sleep(60)" in text  # where they were
    again = pickle.loads(pickle.dumps(error))  # errors cross processes (a kept world's, a test's)
    assert again.stopped_by == "Stop button" and str(again).splitlines()[0] == text.splitlines()[0]


def test_a_ranks_breakpoint_is_answered_at_the_terminal(terminal):
    """Terminal IPython has no stdin channel but a terminal: a rank's pdb prompt is asked there, with
    its rank in the prompt; `p` shows the rank's value, `c` lets the run end."""
    prompt = f"In [{terminal.raw.count(b'In [') + 1}]:".encode()
    asked = terminal.raw.count(b"(Pdb rank 1)")
    ended = terminal.raw.count(b"[rank0]: after 7")
    terminal.run_cell(
        "%%spawn -n 2 --start-method fork --view text\n"
        "import os\n"
        "x = int(os.environ['RANK']) * 10 + 7\n"
        "if x == 17:\n"
        "    breakpoint()\n"
        "print('after', x)"
    )
    terminal.wait_raw(b"(Pdb rank 1)", asked + 1)
    # rank 0 runs on meanwhile: its line may come at any moment before it ends (after the typed
    # command too, as the Colab job once had it), so the user types once it has
    terminal.wait_raw(b"[rank0]: after 7", ended + 1)
    terminal.child.sendline("p x")
    terminal.wait_raw(b"17\r\n")
    terminal.wait_raw(b"(Pdb rank 1)", asked + 2)
    terminal.child.sendline("c")
    terminal.wait_raw(prompt)
    text = terminal.raw.decode("utf-8", "replace")
    assert "[rank1]: after 17" in text and "[rank0]: after 7" in text, terminal.text()
    # the command typed at the prompt is on the screen, right above its answer: not printed again as
    # the rank's echo of it (which a notebook's pane shows)
    assert "[rank1]: (Pdb rank 1)" not in text, terminal.text()
    # (rank 0's line lands after the prompt when it comes while rank 1's prompt is up: Colab job, ci76)
    assert re.search(r"\(Pdb rank 1\) (\[rank0\]: after 7\r\n)?p x\r\n\[rank1\]: 17\r\n", text), terminal.text()


def test_a_kept_worlds_post_mortem_at_the_terminal(terminal):
    """%spawn debug in terminal IPython: the world's failed rank's pdb asks at the terminal."""
    terminal.run_cell("%%spawn --world t -n 2 --start-method fork --view text\nimport os\nrank = int(os.environ['RANK'])")
    terminal.run_cell("%%spawn --world t --view text\nbad = rank * 5\nif rank == 1:\n    raise ValueError('no')")
    terminal.wait_raw(b"ValueError: no")
    asked = terminal.raw.count(b"(Pdb rank 1)")
    terminal.run_cell("%spawn debug t")
    terminal.wait_raw(b"(Pdb rank 1)", asked + 1)
    terminal.child.sendline("p bad")
    terminal.wait_raw(b"5\r\n")
    terminal.wait_raw(b"(Pdb rank 1)", asked + 2)
    prompt = f"In [{terminal.raw.count(b'In [') + 1}]:".encode()
    terminal.child.sendline("c")
    terminal.wait_raw(prompt)
    terminal.run_cell("%spawn stop t")
    assert "post-mortem of world 't' rank 1: ValueError: no" in terminal.raw.decode("utf-8", "replace")
