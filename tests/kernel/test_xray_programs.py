"""The collectives X-ray of a program (``%spawn -- train.py``), end to end in a real kernel: the
program's rank drains torch's flight recorder from the first process group the program makes
(``ranks._xray.begin_once_grouped``), however it ends, and the views show it as a cell's."""

from __future__ import annotations

import json
import re
import time

import pytest
from kernel_harness import execute, ok, rank_lines
from widget_harness import live_at_once, sort_out

from nbspawn.views._bundle import MIME
from nbspawn.views._widget import widget_available

pytestmark = pytest.mark.skipif(not widget_available(), reason="nbspawn/_static/widget.js is not built")

# an everyday script: its own group, rank 1 late to each all_reduce (by more than a loaded machine's other
# ranks ever lag: 0.15 s was not), then a broadcast; its group ended
STRAGGLER = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4, 8)
for _ in range(5):
    if dist.get_rank() == 1:
        time.sleep(0.6)
    dist.all_reduce(t)
dist.broadcast(t, 0)
print("sum", int(t[0, 0]))
dist.destroy_process_group()
"""

# rank 1 never comes to the barrier the others wait in
HANG = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(2))
if dist.get_rank() != 1:
    dist.barrier()
else:
    time.sleep(300)
"""


@pytest.fixture
def programs(kernel, tmp_path):
    (tmp_path / "straggler.py").write_text(STRAGGLER)
    (tmp_path / "hang.py").write_text(HANG)
    (tmp_path / "plain.py").write_text("print('no torch here')\n")
    return tmp_path


def spawn_program(kernel, line: str, timeout: float = 120):
    live_at_once(kernel)
    result = execute(kernel.client, f"%spawn {line}", timeout=timeout)
    return result, sort_out(result.outputs)


def test_a_scripts_collectives_and_its_straggler_in_the_saved_view(kernel, programs):
    result, run = spawn_program(kernel, f"-n 2 --view widget -- {programs / 'straggler.py'}")
    assert result.status == "ok", result.error_text
    assert run.frozen is not None
    words = run.frozen[MIME]["xray"]
    assert words is not None and words.startswith("6 collectives, "), words
    assert words.endswith("rank 1 is the straggler"), words
    assert '<div class="nbspawn-xray"' in run.frozen["text/html"]


def test_python_dash_c_and_the_text_view_say_it_in_words(kernel):
    code = "import torch, torch.distributed as dist; dist.init_process_group('gloo'); dist.all_reduce(torch.ones(3)); dist.destroy_process_group()"
    result = ok(kernel, f'%spawn -n 2 --view text -- python -c "{code}"')
    assert "collectives: 1 collective, " in result.stdout, result.stdout


def test_a_programs_hang_is_drawn_where_it_happened(kernel, programs):
    """In the background, stopped once ``%spawn where`` finds ranks 0 and 2 in the barrier: 3 ranks importing
    torch and making their group took more than 4 s on a loaded 2-core machine (a rehearsal's parallel
    phase), then about half of 12, and a --timeout counted from the run's start had found no rank there."""
    ok(kernel, f"%spawn --bg -n 3 --grace-period 2 -- {programs / 'hang.py'}")
    ok(kernel, "import json, nbspawn\nhung = nbspawn.last_run()")
    try:
        deadline = time.monotonic() + 120  # a hang guard
        while not re.search(
            r'^ranks 0,2: File "[^"]*/distributed_c10d\.py", line \d+ in barrier$',
            text := ok(kernel, "%spawn where").stdout,
            re.M,
        ):
            assert time.monotonic() < deadline, text
            time.sleep(0.3)
    finally:
        ok(kernel, "hung.stop(); hung._done.wait(60)")
    saved = ok(
        kernel,
        "from nbspawn.views._bundle import FrozenRun\nprint(json.dumps([hung.status, FrozenRun(hung, {}).record['xray']]))",
    ).stdout
    status, words = json.loads(saved)
    assert status == "stopped", status
    assert words is not None and "Ranks 0, 2 entered barrier #2; rank 1 never did" in words, (words, text)


def test_xray_off_and_a_program_without_a_group_record_nothing(kernel, programs):
    result, run = spawn_program(kernel, f"-n 2 --xray off --view widget -- {programs / 'straggler.py'}")
    assert result.status == "ok", result.error_text
    assert run.frozen is not None and run.frozen[MIME]["xray"] is None
    plain = ok(kernel, f"%spawn -n 2 --view text -- {programs / 'plain.py'}")
    assert rank_lines(plain.stdout, 0) == ["no torch here"] and "collectives:" not in plain.stdout
    # its rank never imported torch: the X-ray's wait for a group imports nothing
    probe = programs / "probe.py"
    probe.write_text("import sys\nprint('torch' in sys.modules)\n")
    assert rank_lines(ok(kernel, f"%spawn -n 1 --view text -- {probe}").stdout, 0) == ["False"]
