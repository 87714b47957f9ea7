"""``--xray values``' pure parts: a rank's tensors as recorded (ranks._xray_values.ValuesLog.snapshot),
the ranks' records lined up (events._xray_values.line_up) and the table drawn
(views._xray_values_html.values_html).  The ranks' recording itself, live: tests/kernel/test_xray_values.py."""

from __future__ import annotations

import html
import re

import torch

from nbspawn.events._xray_values import ValueRow, beyond, line_up
from nbspawn.ranks._xray_values import MAX_ELEMENTS, MAX_NUMBERS, ValuesLog
from nbspawn.views._xray_values_html import MAX_BYTES, number, side_text, values_html


def t(*values: float) -> dict:
    return {"shape": [len(values)], "dtype": "float32", "values": list(values)}


def rank_record(rank: int, calls: list[dict], beyond: int = 0) -> dict:
    return {"format": 1, "rank": rank, "beyond": beyond, "groups": {"0": {"ranks": [0, 1, 2, 3]}}, "calls": calls}


def four_ranks() -> dict[int, dict]:
    """What 4 gloo ranks write for: all_reduce of [rank + 1]; reduce_scatter_tensor of arange(8); a
    send 0 -> 1; a broadcast from 2."""
    records = {}
    for rank in range(4):
        calls = [
            {"op": "all_reduce", "group": "0", "seq": 1, "reduce_op": "sum", "in": t(rank + 1.0), "out": t(10.0)},
            {
                "op": "reduce_scatter_tensor",
                "group": "0",
                "seq": 2,
                "reduce_op": "sum",
                "in": t(*[float(i) for i in range(8)]),
                "out": t(8.0 * rank, 4.0 * (2 * rank + 1)),
            },
        ]
        if rank == 0:
            calls.append({"op": "send", "group": "0", "seq": 1, "dst": 1, "in": t(7.0)})
        if rank == 1:
            calls.append({"op": "recv", "group": "0", "seq": 1, "src": 0, "out": t(7.0)})
        calls.append({"op": "broadcast", "group": "0", "seq": 3, "src": 2, "in": t(float(rank)), "out": t(2.0)})
        records[rank] = rank_record(rank, calls)
    return records


def test_an_all_reduce_lines_up_each_ranks_input_and_output():
    rows = line_up(four_ranks())
    first = rows[0]
    assert (first.op, first.seq, first.detail) == ("all_reduce", 1, "sum")
    assert {rank: side["values"] for rank, side in first.inputs.items()} == {0: [1.0], 1: [2.0], 2: [3.0], 3: [4.0]}
    assert {rank: side["values"] for rank, side in first.outputs.items()} == {key: [10.0] for key in range(4)}


def test_a_reduce_scatter_shows_the_slice_each_rank_got_and_a_send_its_receive():
    rows = line_up(four_ranks())
    assert [row.op for row in rows] == ["all_reduce", "reduce_scatter_tensor", "send/recv", "broadcast"]
    scattered = rows[1]
    assert {rank: side["values"] for rank, side in scattered.outputs.items()} == {
        0: [0.0, 4.0],
        1: [8.0, 12.0],
        2: [16.0, 20.0],
        3: [24.0, 28.0],
    }
    pair = rows[2]
    assert (pair.detail, dict(pair.inputs), dict(pair.outputs)) == ("0→1", {0: t(7.0)}, {1: t(7.0)})
    assert rows[3].detail == "src 2"


def test_ranks_that_called_different_ops_at_one_number_are_all_shown():
    records = four_ranks()
    records[1]["calls"][0]["op"] = "all_gather"
    records[1]["calls"][0]["raised"] = True
    row = line_up(records)[0]
    assert row.op == "all_reduce/all_gather" and row.notes == ("rank 1 raised",)
    assert len(row.inputs) == 4


def test_beyond_is_the_most_calls_a_rank_did_not_record():
    assert beyond({0: rank_record(0, [], beyond=3), 1: rank_record(1, [], beyond=5)}) == 5
    assert beyond({}) == 0


# -- a rank's tensors as recorded ------------------------------------------------------------------


def test_a_small_tensor_is_recorded_by_value_a_big_one_by_shape_only():
    log = ValuesLog(0, dist=None)
    small = log.snapshot(torch.arange(float(MAX_ELEMENTS)))
    assert small["shape"] == [MAX_ELEMENTS] and small["values"] == [float(i) for i in range(MAX_ELEMENTS)]
    big = log.snapshot(torch.zeros(MAX_ELEMENTS + 1))
    assert big == {"shape": [MAX_ELEMENTS + 1], "dtype": "float32"}
    assert log.snapshot([torch.ones(1, 2, dtype=torch.int64), torch.tensor([True])]) == [
        {"shape": [1, 2], "dtype": "int64", "values": [[1, 1]]},
        {"shape": [1], "dtype": "bool", "values": [True]},
    ]
    assert log.snapshot(torch.tensor([1 + 2j]))["values"] == ["(1+2j)"]  # JSON has no complex number
    assert log.snapshot(None) is None and log.snapshot(3) is None


def test_a_cells_numbers_are_bounded_in_all():
    log = ValuesLog(0, dist=None)
    for _ in range(MAX_NUMBERS // MAX_ELEMENTS):
        assert "values" in log.snapshot(torch.ones(MAX_ELEMENTS))
    assert "values" not in log.snapshot(torch.ones(1))  # the budget is spent: shapes only from now on


# -- the table ------------------------------------------------------------------------------------


def test_numbers_are_short():
    assert [number(v) for v in (10.0, 3.14159265, 1e-5, -2.5, 7, True, float("nan"), 123456.7)] == [
        "10",
        "3.142",
        "1e-05",
        "-2.5",
        "7",
        "True",
        "nan",
        "1.235e+05",
    ]


def test_a_long_list_has_an_ellipsis_and_a_big_tensor_its_shape():
    assert side_text(t(*range(64))) == "[0, 1, 2, 3, 4, 5, …, 63]"
    assert side_text({"shape": [1024, 1024], "dtype": "float32"}) == "⟨1024×1024 float32⟩"
    assert side_text([t(1.0), t(2.0)]) == "[1], [2]"


def test_the_table_has_a_line_per_collective_then_each_ranks_input_arrow_output():
    page = values_html(line_up(four_ranks()))
    assert page.startswith('<div class="nbspawn-xray-values"') and "<script" not in page.lower()
    first = re.search(r"<tr><td[^>]*><b>all_reduce #1</b>.*?</tr>((?:<tr><td[^>]*>rank.*?</tr>)+)", page)
    assert first is not None
    lines = re.findall(r"<tr>(.*?)</tr>", first.group(1))
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", line) for line in lines]
    assert cells == [[f"rank {r}", f"[{r + 1}]", "→", "[10]"] for r in range(4)]
    assert "[0, 4]" in page and "[24, 28]" in page  # each rank's slice of the reduce_scatter


def test_what_ranks_and_torch_name_is_escaped():
    row = ValueRow(
        "<img src=x onerror=alert(1)>", 1, {0: t(1.0)}, {0: {"shape": [2], "dtype": "<b>"}}, group="<g>", notes=('a"b',)
    )
    page = values_html([row])
    assert "<img" not in page and "<b>" not in page.replace("<b>" + html.escape(row.op), "")
    assert html.escape(row.op) in page and "&lt;g&gt;" in page and "⟨2 &lt;b&gt;⟩" in page


def test_the_table_is_bounded_and_says_what_it_leaves_out():
    records = {
        rank: rank_record(
            rank,
            [{"op": "all_reduce", "group": "0", "seq": s, "in": t(*range(64)), "out": t(*range(64))} for s in range(1, 201)],
            beyond=50,
        )
        for rank in range(8)
    }
    rows = line_up(records)
    assert len(rows) == 200
    page = values_html(rows, beyond=beyond(records))
    assert len(page.encode()) <= MAX_BYTES
    shown = page.count("<b>all_reduce #")
    assert 0 < shown < 200 and f"{200 - shown} more collectives not shown" in page
    assert "50 more were not recorded" in page


def test_nothing_to_show_is_no_table():
    assert values_html([]) == ""


class _OnAGpu:
    """What ``ValuesLog`` asks of a CUDA tensor (``is_cuda``, its shape, dtype, size); reading its values
    at the call (``tolist``) is what made an NCCL rank wait for its stream: refused here."""

    is_cuda = True

    def __init__(self, values: list[float]) -> None:
        self._values = torch.tensor(values)
        self.shape, self.dtype = self._values.shape, self._values.dtype

    def numel(self) -> int:
        return self._values.numel()

    def tolist(self) -> list[float]:
        raise AssertionError("a CUDA tensor read at the call: the rank's CPU waits for its stream")

    def detach(self) -> _OnAGpu:
        return self


class _Copy:
    """A copy to host memory on its way: done after ``after`` looks (never, if None)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.looks = after, 0

    def query(self) -> bool:
        self.looks += 1
        return self.after is not None and self.looks > self.after


def test_a_cuda_tensor_is_copied_without_waiting_and_read_at_the_cells_end(monkeypatch):
    """The fourth GPU review's N3: never ``.tolist()`` at the call; a non-blocking copy, read at the end
    once done; one still on its way when the cell ends (behind a collective that never completed)
    leaves its shape, and says so, after a bounded wait."""
    from nbspawn.ranks import _xray_values

    copies = {"done": _Copy(after=3), "never": _Copy(after=None)}
    started = []

    def copy_to_host(found, tensor):
        started.append(found)
        which = "done" if len(started) == 1 else "never"
        return found, tensor._values.clone(), copies[which]

    monkeypatch.setattr(_xray_values, "_copy_to_host", copy_to_host)
    log = ValuesLog(0, dist=None)
    received, hung = log.snapshot(_OnAGpu([1.0, 2.0])), log.snapshot(_OnAGpu([5.0]))
    assert received == {"shape": [2], "dtype": "float32"} and hung == {"shape": [1], "dtype": "float32"}
    assert len(log.copies) == 2 and log.numbers == 3
    log.read_copies(wait=0.2)
    assert received == {"shape": [2], "dtype": "float32", "values": [1.0, 2.0]}
    assert hung == {"shape": [1], "dtype": "float32", "note": "its values had not reached host memory when the cell ended"}
    assert log.copies == [] and copies["never"].looks >= 2
