"""What each rank holds on its GPU (issue #44), from the rank's own thread (``ranks._devicememory``)
through the kernel's sampler to the live widget, the saved view, ``run.ranks`` and a CUDA
out-of-memory error's account — on a machine with no GPU.

This machine has no GPU, so the cell stands one in for the rank's thread (``tests/stand_in_gpu.py``: what
it asks of ``torch.cuda``) and raises torch's own ``OutOfMemoryError`` with CUDA's
message.  Everything after those calls is nbspawn's real path.  The same figures on a real GPU, with
nothing stood in, are ``tests/gpu/test_cuda.py``'s (``test_each_ranks_gpu_memory_is_live_and_its_peak_saved``,
``test_a_cuda_out_of_memory_names_the_rank_its_gpu_and_what_each_rank_held``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kernel_harness import ok, run, until_flag
from stand_in_gpu import GB, STAND_IN, TOTAL
from widget_harness import live_states, spawn_widget

from nbspawn._rankdir import DEVICE_MEMORY
from nbspawn.views._bundle import MIME
from nbspawn.views._widget import widget_available


def holds(seen: Path) -> str:
    """Rank 0 peaks first, rank 1 last, never at once (a barrier between): each rank's peak is its own, the
    GPU's the most held together.  Both hold their last figures until the test has seen them together live
    (``seen``), not for a fixed 2 s in which a loaded kernel had to sample them. Rank 0 passes the barrier
    only once its record says it dropped (its thread writes on its own timer, once a second): rank 1's 2.3 GB
    written while rank 0's record still said 1.3 was 3.6 GB held together in one sample (the Colab job,
    2026-12-03)."""
    return STAND_IN + (
        "import contextlib, json, torch.distributed as dist\n"
        f"_held(*([{GB} + 300_000_000] * 2 if rank == 0 else [2 * {GB}] * 2))\n"
        "time.sleep(2)\n"
        f"if rank == 0:\n    _held({GB}, {GB})\n"
        f"    mine = os.path.join(os.path.dirname(os.environ['TORCHELASTIC_ERROR_FILE']), {DEVICE_MEMORY!r})\n"
        "    for _ in range(2400):\n"
        "        with contextlib.suppress(OSError, ValueError):  # not yet written, or being written\n"
        f"            if [d['reserved'] for d in json.load(open(mine))['devices']] == [{GB}]:\n"
        "                break\n"
        "        time.sleep(0.05)\n"
        "dist.barrier()\n"
        f"if rank == 1:\n    _held(2 * {GB} + 300_000_000, 2 * {GB} + 300_000_000)\n"
        f"{until_flag(seen)}\n"
    )


def _last_held(outputs: list[dict]) -> dict[int, int]:
    """What each rank's GPU record said it reserved, in the newest live update that carried any."""
    carried = [u["ranks"] for u in live_states(outputs) if u.get("ranks") and any(r.get("gpu_reserved") for r in u["ranks"])]
    return {r["rank"]: r["gpu_reserved"] for r in carried[-1]} if carried else {}


OUT_OF_MEMORY = (
    STAND_IN
    + f"""\
import json
_held((rank + 1) * {GB}, (rank + 1) * {GB})
if rank == 0:
    time.sleep(60)
# rank 1 raises once rank 0's thread has written its 1 GB (on its own timer, once a second: a fixed 1.5 s
# was all it had)
theirs = os.path.join(os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])), "0", {DEVICE_MEMORY!r})
for _ in range(2400):
    with contextlib.suppress(OSError, ValueError):  # not yet written, or being written
        if [d["reserved"] for d in json.load(open(theirs))["devices"]] == [{GB}]:
            break
    time.sleep(0.05)
_held(2_500_000_000, 2_500_000_000)  # what rank 1 holds as it raises: its last record is written then, not a second later
raise torch.OutOfMemoryError(
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 3.17 GiB of which 212.00 MiB is free."
)
"""
)


@pytest.mark.skipif(not widget_available(), reason="nbspawn/_static/widget.js is not built")
def test_each_ranks_gpu_memory_is_live_its_peak_saved_and_a_full_gpu_warned(kernel, tmp_path):
    seen = tmp_path / "seen"

    def look(outputs: list[dict]) -> None:
        if outputs[-1]["msg_type"] == "comm_msg" and _last_held(outputs) == {0: GB, 1: 2 * GB + 300_000_000}:
            seen.touch()

    result, widget = spawn_widget(kernel, holds(seen), options="-n 2 --backend gloo", seen=look)
    assert result.status == "ok", result.error_text
    # live: while they ran, each rank's record carried its GPU and what torch held there then
    live = [u["ranks"] for u in widget.updates if u.get("ranks") and any(r.get("gpu_allocated") for r in u["ranks"])]
    assert live, "no live update carried the ranks' GPU memory"
    assert all(r["gpu"] == "GPU 0" for r in live[-1] if r["status"] == "running"), live[-1]
    held = {r["rank"]: r["gpu_reserved"] for ranks in live for r in ranks if r.get("gpu_reserved")}
    assert held == {0: GB, 1: 2 * GB + 300_000_000}, held  # the last figures each rank's record had while it ran
    # saved: each rank's peak is torch's (a fresh run: its peak counters began with it), the GPU against its total
    frozen = widget.frozen
    assert frozen is not None
    ranks = frozen[MIME]["ranks"]
    assert [r["peak_gpu_allocated"] for r in ranks] == [GB + 300_000_000, 2 * GB + 300_000_000], ranks
    assert [r["gpu_allocated"] for r in ranks] == [None, None]  # nothing "now" in a saved view
    assert frozen[MIME]["gpus"] == [{"gpu": "GPU 0", "name": "Stand-in GPU", "total": TOTAL, "reserved": 3_300_000_000}]
    # the ranks held 3 GB of 3.4 together: said once, while the run went on
    warning = frozen[MIME]["memory_warning"] or ""
    assert re.match(
        r"GPU 0 is nearly full: the ranks' torch reserved 3\.\d GB of its 3\.4 GB, rank 1 the most \(2\.\d GB\)", warning
    ), warning
    html = frozen["text/html"]
    assert "GPU 0 peak 1.3 GB (1.3 GB reserved)" in html and "GPU 0 peak 2.3 GB (2.3 GB reserved)" in html
    assert "GPU 0 3.3 GB of 3.4 GB" in html  # the most they held together, not their peaks' 3.6 GB: those never met
    # the Python result says the same
    said = ok(kernel, "r = nbspawn.last_run()\nprint([(s.peak_gpu_allocated, [d.gpu for d in s.gpu]) for s in r.ranks])").stdout
    assert said.strip() == str([(GB + 300_000_000, ["GPU 0"]), (2 * GB + 300_000_000, ["GPU 0"])])


def test_a_cuda_out_of_memory_names_the_rank_its_gpu_and_what_each_rank_held(kernel):
    result = run(kernel, f"%%spawn -n 2 --backend gloo\n{OUT_OF_MEMORY}", timeout=120)
    assert result.status == "error"
    said = result.error_text
    assert "rank 1 (pid" in said and "OutOfMemoryError: CUDA out of memory." in said, said
    account = "rank 1 ran out of memory on GPU 0 (Stand-in GPU, 3.4 GB): rank 0 held 1.0 GB, rank 1 2.5 GB (reserved by torch; 3.5 GB in all)"
    assert account in said, said
    record = ok(kernel, "r = nbspawn.last_run()\nprint(r.ranks[1].failure.memory)").stdout.strip()
    assert record == account


def test_a_rank_that_used_no_gpu_writes_no_gpu_record_and_its_record_says_none(kernel):
    result, widget = spawn_widget(kernel, "import torch, time\nx = torch.ones(1000)\ntime.sleep(1.5)\n", options="-n 2")
    assert result.status == "ok", result.error_text
    assert widget.frozen is not None
    assert all(r["gpu"] is None and r["peak_gpu_allocated"] is None for r in widget.frozen[MIME]["ranks"])
    assert widget.frozen[MIME]["gpus"] == []
    files = ok(kernel, "import os\nprint([os.path.exists(s.files.device_memory) for s in nbspawn.last_run().ranks])").stdout
    assert files.strip() == "[False, False]"
    assert not re.search(r"GPU \d", widget.frozen["text/html"])
