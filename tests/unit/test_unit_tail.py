"""What the kernel keeps of a rank's output (nbspawn/views/_tail.py): a bar being drawn stays where the
live view shows it, below what was written meanwhile, and where it finishes it stays (issue 17, item 11)."""

from __future__ import annotations

from nbspawn.events._display import WIDGET_MIME
from nbspawn.views._bundle import entries_html
from nbspawn.views._tail import Display, Line, OutputTail, merged_chunks, merged_order, order_runs, run_tails, widget_running


def _bar(value: int, high: int = 10, style: str = "") -> dict:
    tree = {
        "type": "box",
        "dir": "row",
        "children": [
            {"type": "text", "value": "epoch"},
            {"type": "progress", "value": value, "min": 0, "max": high, "bar_style": style},
        ],
    }
    return {"kind": "data", "id": "widget:m1", "mime": WIDGET_MIME, "value": tree, "text": f"{value}/{high}"}


def _shown(tail: OutputTail) -> list[str]:
    return [e.plain if isinstance(e, Line) else f"bar {e.item['text']}" for e in tail.entries.values()]


def test_widget_running_mirrors_the_browser():
    assert widget_running(_bar(3)["value"])
    assert not widget_running(_bar(10)["value"])
    assert not widget_running(_bar(3, style="danger")["value"])
    assert not widget_running({"type": "text", "value": "x"}) and not widget_running(None)


def test_a_widget_bar_floats_while_driven_and_stays_where_it_finished():
    tail = OutputTail()
    tail.add("stdout", "starting\n")
    tail.display(_bar(0))
    assert _shown(tail) == ["starting", "bar 0/10"]  # displayed, not yet driven: in place
    tail.add("stdout", "before the first update\n")
    tail.display({**_bar(1), "kind": "update"})
    assert _shown(tail) == ["starting", "before the first update", "bar 1/10"]  # driven: at the bottom
    tail.add("stdout", "halfway\n")
    assert _shown(tail)[-2:] == ["halfway", "bar 1/10"]  # stays below what is printed meanwhile
    tail.display({**_bar(10, style="success"), "kind": "update"})
    tail.add("stdout", "done\n")
    assert _shown(tail) == ["starting", "before the first update", "halfway", "bar 10/10", "done"]
    chunks = tail.chunks()
    assert chunks[-2][0] == "display" and chunks[-2][1]["kind"] == "data" and chunks[-1] == ["stdout", "done\n"]


def test_an_unfinished_bar_is_frozen_below_the_lines_printed_after_its_last_redraw():
    tail = OutputTail()
    tail.add("stderr", "\rtrain 10%")
    tail.add("stderr", "\rtrain 20%")
    tail.display({"kind": "data", "id": None, "mime": "text/plain", "value": "a table", "text": "a table"})
    tail.add("stdout", "step 1\nstep 2\n")
    assert _shown(tail) == ["bar a table", "step 1", "step 2", "train 20%"]
    html = entries_html(list(tail.entries.values()))
    assert html.endswith('<span data-s="e">train 20%</span>')  # the frozen bundle: last, still open


def test_updates_of_other_displays_stay_in_place():
    tail = OutputTail()
    tail.display({"kind": "data", "id": "x", "mime": "image/png", "value": "AAAA", "text": ""})
    tail.add("stdout", "after\n")
    tail.display({"kind": "update", "id": "x", "mime": "image/png", "value": "BBBB", "text": ""})
    entries = list(tail.entries.values())
    assert isinstance(entries[0], Display) and entries[0].item["value"] == "BBBB"


def test_two_bars_keep_the_order_they_became_bars_and_trimming_forgets_them():
    tail = OutputTail(limit=3)
    tail.add("stderr", "\rA 1%")
    tail.add("stderr", "\rA 2%")
    tail.display(_bar(0))
    tail.display({**_bar(1), "kind": "update"})
    tail.add("stderr", "\rA 3%")
    assert _shown(tail) == ["A 3%", "bar 1/10"]
    for i in range(5):
        tail.add("stdout", f"l{i}\n")
    assert _shown(tail) == ["l4", "A 3%", "bar 1/10"] and tail.elided_lines == 4
    tail.clear()
    tail.add("stdout", "x\n")
    assert _shown(tail) == ["x"]


# -- the order the ranks printed in (issue 26, item 5) ----------------------------------------------


def _merged(tails: dict[int, OutputTail]) -> list[tuple[int, str]]:
    outputs = {rank: list(tail.entries.values()) for rank, tail in tails.items()}
    at = dict.fromkeys(outputs, 0)
    merged = []
    for rank in merged_order(outputs):
        entry = outputs[rank][at[rank]]
        at[rank] += 1
        merged.append((rank, entry.plain if isinstance(entry, Line) else f"display {entry.item['text']}"))
    return merged


def test_merged_order_is_the_order_the_ranks_printed_in_not_their_positions():
    tails = run_tails([0, 1])
    tails[1].add("stdout", "b0\nb1\n")
    tails[1].add("stdout", "b2\n")
    tails[0].add("stdout", "a0\na1\n")
    tails[0].display({"kind": "data", "id": None, "mime": "text/plain", "value": "fig", "text": "fig"})
    tails[1].add("stderr", "b3\n")
    assert _merged(tails) == [(1, "b0"), (1, "b1"), (1, "b2"), (0, "a0"), (0, "a1"), (0, "display fig"), (1, "b3")]
    outputs = {rank: list(tail.entries.values()) for rank, tail in tails.items()}
    assert order_runs(merged_order(outputs)) == "1*3,0*3,1"
    # what a saved run keeps of each rank (its newest entries) merges the same way
    assert merged_order({0: outputs[0][1:], 1: outputs[1][2:]}) == [1, 0, 0, 1]


def test_a_line_is_placed_when_it_starts_and_a_bar_where_it_was_last_drawn():
    tails = run_tails([0, 1])
    tails[0].add("stdout", "a line begun ")
    tails[0].add("stderr", "\rtrain 10%")
    tails[1].add("stdout", "b0\n")
    tails[0].add("stdout", "and ended\n")  # continues its line, placed when it began
    tails[0].add("stderr", "\rtrain 20%")  # a bar redrawn: at the end, below b0, as the live view shows it
    assert _merged(tails) == [(0, "a line begun and ended"), (1, "b0"), (0, "train 20%")]


def test_a_tail_alone_numbers_its_own_entries_and_no_output_merges_to_nothing():
    alone = OutputTail()
    alone.add("stdout", "x\ny\n")
    assert [e.seq for e in alone.entries.values()] == [0, 1]
    assert merged_order({}) == [] and order_runs([]) == ""


def test_order_runs_writes_runs_of_one_rank_short_and_never_longer_than_one_rank_an_entry():
    assert order_runs([1, 1, 1, 0, 2, 2]) == "1*3,0,2*2"
    assert order_runs([0, 1, 0, 1]) == "0,1,0,1"
    for ranks in ([12] * 2, [3] * 10, [0, 1] * 5, [1000] * 3 + [7]):
        assert len(order_runs(ranks)) <= sum(len(str(r)) + 1 for r in ranks)


def test_merged_chunks_join_only_what_no_other_rank_came_between():
    tails = run_tails([0, 1])
    tails[0].add("stdout", "a0\na1\n")
    tails[1].add("stdout", "b0\n")
    tails[0].add("stdout", "a2\n")
    outputs = {rank: list(tail.entries.values()) for rank, tail in tails.items()}
    chunks, order = merged_chunks(outputs)
    assert chunks == {0: [["stdout", "a0\na1\n"], ["stdout", "a2\n"]], 1: [["stdout", "b0\n"]]}
    assert order == [0, 1, 0]
    assert tails[0].chunks() == [["stdout", "a0\na1\na2\n"]]  # one rank alone: joined as before


def test_the_saved_size_of_a_record_is_what_indented_json_takes_counted_without_making_it():
    import json

    from nbspawn.views._bundle import _saved_size

    def as_nbformat_writes_it(record):  # the definition: nbformat indents one space a level, ~six levels deep
        text = json.dumps(record, indent=1, ensure_ascii=False)
        return len(text.encode("utf-8", "surrogatepass")) + 6 * text.count("\n")

    ranks = [
        {"rank": r, "status": "done", "summary": None, "traceback": "é\n\u2603", "tags": [], "where": {"a": [1, {}]}}
        for r in range(3)
    ]
    records = [
        {},
        {"ranks": []},
        {"run_id": "x", "ranks": ranks, "error": {"summary": "a\nb", "parts": [[1], [[]]]}},
        {"t": (1, 2)},
    ]
    for record in records:
        assert _saved_size(record) == as_nbformat_writes_it(record), record


def test_the_saved_share_gives_a_quiet_ranks_room_to_the_loud_and_sizes_only_what_it_could_keep(monkeypatch):
    """A frozen view's budget (views._bundle._share): each rank's newest entries in an equal share, a
    quiet rank's unused room going to the loud ones, and no entry sized (drawn as HTML) that could not
    be kept: a 16-rank flood had 32,000 sized at Stop for 0.18 s (issue #57)."""
    from nbspawn.views import _bundle

    tails = {rank: OutputTail(limit=5000) for rank in range(3)}
    tails[0].add("stdout", "only line\n")
    for rank in (1, 2):
        tails[rank].add("stdout", "".join(f"rank {rank} line {i:04d}\n" for i in range(3000)))
    sized: list[int] = []
    size = _bundle._size
    monkeypatch.setattr(_bundle, "_size", lambda entry: sized.append(1) or size(entry))
    outputs, left_out = _bundle._share(tails, 30_000)
    assert [e.plain for e in outputs[0]] == ["only line"] and left_out[0] == 0
    kept = {rank: len(outputs[rank]) for rank in (1, 2)}
    per_line = size(outputs[1][0]) + 2
    # the loud ones share what the quiet one left: more than a third each, all of it nearly
    assert all(n * per_line > 30_000 // 3 for n in kept.values()), kept
    assert sum(n * per_line for n in kept.values()) > 30_000 - 3 * per_line - 100, kept
    assert all(outputs[rank][-1].plain == f"rank {rank} line 2999" for rank in (1, 2))  # the newest
    assert all(left_out[rank] == 3000 - kept[rank] for rank in (1, 2))
    assert len(sized) <= sum(kept.values()) + 1 + 2 * 2, (len(sized), kept)  # a look past each share at most
