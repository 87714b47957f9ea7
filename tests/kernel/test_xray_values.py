"""``--xray values`` end to end: real gloo ranks record each collective's small tensors before and after
(ranks._xray_values), the kernel lines them up (run.xray.values), in a notebook's cell and through
launch()."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from kernel_harness import ok

from nbspawn import launch
from nbspawn._rankdir import XRAY_VALUES
from nbspawn.views._xray_values_html import values_html

pytest.importorskip("torch.distributed")

TEACHING = """\
import torch, torch.distributed as dist
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
out = torch.zeros(2)
dist.reduce_scatter_tensor(out, torch.arange(8.0))
dist.all_reduce(torch.zeros(1000))
work = dist.all_reduce(torch.ones(2), async_op=True)
work.wait()
"""


def values_of(side) -> list:
    return side["values"] if isinstance(side, dict) and "values" in side else side


@pytest.mark.timeout(180)
def test_a_cell_shows_each_ranks_values_before_and_after_its_collectives(kernel):
    ok(kernel, f"%%spawn -n 4 --backend gloo --xray values --view text\n{TEACHING}")
    said = ok(
        kernel,
        "import json, nbspawn\n"
        "rows = nbspawn.last_run().xray.values\n"
        "print(json.dumps([[r.op, r.seq, {k: v for k, v in r.inputs.items()}, {k: v for k, v in r.outputs.items()}] for r in rows]))\n",
    ).stdout
    rows = json.loads(said)
    assert [(op, seq) for op, seq, _in, _out in rows] == [
        ("all_reduce", 1),
        ("reduce_scatter_tensor", 2),  # gloo runs it as an all_reduce: the row names the call the cell made
        ("all_reduce", 3),
        ("all_reduce", 4),
    ]
    (_, _, inputs, outputs) = rows[0]
    assert {int(r): values_of(v) for r, v in inputs.items()} == {0: [1.0], 1: [2.0], 2: [3.0], 3: [4.0]}
    assert {int(r): values_of(v) for r, v in outputs.items()} == {key: [10.0] for key in range(4)}
    scattered = {int(r): values_of(v) for r, v in rows[1][3].items()}
    assert scattered == {r: [4.0 * 2 * r, 4.0 * (2 * r + 1)] for r in range(4)}  # 4 ranks' arange(8) summed, sliced
    big = rows[2][2]["0"]
    assert big == {"shape": [1000], "dtype": "float32"}  # its shape only
    assert {int(r): values_of(v) for r, v in rows[3][3].items()} == {key: [4.0, 4.0] for key in range(4)}  # async, waited


@pytest.mark.timeout(180)
def test_launch_xray_on_writes_no_values_and_values_are_drawn(tmp_path):
    run = launch(
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n",
        nprocs=2,
        backend="gloo",
        xray="on",
        log_dir=str(tmp_path),
    )
    assert run.xray is not None and run.xray.count == 1 and run.xray.values == ()
    # the calls are written down (what the cell called, and when: issue #57), not their values
    for state in run.ranks:
        with open(os.path.join(state.dir, XRAY_VALUES), encoding="utf-8") as fh:
            record = json.load(fh)
        (call,) = record["calls"]
        assert record["values"] is False and call["op"] == "all_reduce" and "in" not in call and "out" not in call, record
        assert 0 < call["t0"] <= call["t1"], call
    run = launch(
        "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\n",
        nprocs=2,
        backend="gloo",
        xray="values",
        log_dir=str(tmp_path),
    )
    assert run.xray is not None and len(run.xray.values) == 1
    page = values_html(run.xray.values)
    assert "<b>all_reduce #1</b>" in page and page.count(">[2]<") == 2


@pytest.mark.timeout(240)
def test_a_kept_worlds_next_cell_has_torchs_own_functions_back(tmp_path):
    body = "import torch, torch.distributed as dist\ndist.all_reduce(torch.ones(1))\nprint(hasattr(dist.all_reduce, '__nbspawn_xray_values__'))\n"
    try:
        first = launch(body, nprocs=2, backend="gloo", world="xv", xray="values", log_dir=str(tmp_path))
        second = launch(body, world="xv", xray="off")  # an X-rayed cell has them wrapped again, for its calls
    finally:
        from nbspawn import stop

        stop("xv")
    assert first.xray is not None and len(first.xray.values) == 1
    assert second.xray is None
    read = [Path(state.stdout_path).read_text().split() for state in (first.ranks[0], second.ranks[0])]
    assert read == [["True"], ["False"]]


EVERY_KIND = """\
import torch, torch.distributed as dist
r = dist.get_rank()
dist.broadcast(torch.tensor([float(r)]), 2)
dist.all_gather([torch.zeros(1) for _ in range(4)], torch.tensor([r * 1.0]))
dist.gather(torch.tensor([r + 0.5]), [torch.zeros(1) for _ in range(4)] if r == 0 else None, dst=0)
dist.scatter(torch.zeros(1), [torch.tensor([i * 10.0]) for i in range(4)] if r == 1 else None, src=1)
dist.all_to_all_single(torch.zeros(4), torch.arange(4.0) + 10 * r)
pair = dist.new_group([0, 1])
if r < 2:
    dist.all_reduce(torch.tensor([5.0 + r]), group=pair, op=dist.ReduceOp.MAX)
if r == 0:
    dist.send(torch.tensor([7.0]), 1)
    dist.isend(torch.tensor([8.0]), 1).wait()
elif r == 1:
    dist.recv(torch.zeros(1), 0)
    dist.irecv(torch.zeros(1), 0).wait()
dist.barrier()
"""


@pytest.mark.timeout(180)
def test_every_kind_of_call_a_subgroup_and_sends(tmp_path):
    run = launch(EVERY_KIND, nprocs=4, backend="gloo", xray="values", log_dir=str(tmp_path))
    assert run.xray is not None
    rows = {(row.op, row.group if row.group != "0" else "", row.seq): row for row in run.xray.values}

    def said(row, side):
        return {rank: values_of(value) for rank, value in getattr(row, side).items()}

    assert said(rows["broadcast", "", 1], "outputs") == {r: [2.0] for r in range(4)}
    assert rows["broadcast", "", 1].detail == "src 2"
    assert said(rows["all_gather", "", 2], "outputs")[3] == [
        {"shape": [1], "dtype": "float32", "values": [float(r)]} for r in range(4)
    ]
    assert said(rows["gather", "", 3], "outputs") == {
        0: [{"shape": [1], "dtype": "float32", "values": [r + 0.5]} for r in range(4)],
        1: None,
        2: None,
        3: None,
    }
    assert said(rows["scatter", "", 4], "outputs") == {r: [10.0 * r] for r in range(4)}
    assert said(rows["all_to_all_single", "", 5], "outputs")[2] == [2.0, 12.0, 22.0, 32.0]
    (subgroup,) = [row for row in run.xray.values if row.group not in ("", "0") and row.op == "all_reduce"]
    assert (subgroup.seq, subgroup.detail, said(subgroup, "outputs")) == (1, "max", {0: [6.0], 1: [6.0]})
    sent = [row for row in run.xray.values if row.op == "send/recv"]
    assert [(row.detail, said(row, "inputs"), said(row, "outputs")) for row in sent] == [
        ("0→1", {0: [7.0]}, {1: [7.0]}),
        ("0→1", {0: [8.0]}, {1: None}),  # gloo's irecv has no future: its output is not read, and it says so
    ]
    assert any("no future" in note for note in sent[1].notes)
    assert rows["barrier", "", 6].inputs == {r: None for r in range(4)}
