"""The kernel's reader of rank logs (nbspawn.events._streams), on real files: every line is either
shown or counted as skipped, exactly once, however reads, budgets and half-written lines fall."""

from __future__ import annotations

import os
import random

from nbspawn.events._streams import RankStreams


def _drain(events, shown: list[str], skipped: list[int]) -> None:
    for event in events:
        if event.kind == "skipped":
            skipped.append(event.value)
        elif event.kind == "stdout":
            shown.append(event.value)


def test_lines_shown_plus_lines_skipped_are_the_lines_written(tmp_path):
    for trial in range(200):
        rng = random.Random(trial)
        rank_dir = tmp_path / str(trial)
        rank_dir.mkdir()
        streams = RankStreams(0, str(rank_dir))
        shown: list[str] = []
        skipped: list[int] = []
        written = 0
        lines: dict[str, int] = {}
        with open(rank_dir / "stdout.log", "ab", buffering=0) as out:
            for _ in range(rng.randint(1, 30)):
                n = rng.randint(0, 400)
                batch = [f"line {written + i} {'x' * rng.randint(0, 50)}" for i in range(n)]
                lines.update((line, written + i) for i, line in enumerate(batch))
                data = "".join(line + "\n" for line in batch).encode()
                written += n
                cut = rng.randint(0, len(data)) if rng.random() < 0.4 else len(data)  # a line half-written
                out.write(data[:cut])
                _drain(streams.read(budget=rng.randint(10, 3000)), shown, skipped)
                out.write(data[cut:])
                _drain(streams.read(budget=rng.randint(10, 3000)), shown, skipped)
        _drain(streams.close(), shown, skipped)
        text = "".join(shown)
        assert text.count("\n") + sum(skipped) == written, trial
        # whole lines in order, none twice (a line whose rest was skipped is shown cut, then closed)
        numbers = [lines[line] for line in text.splitlines() if line in lines]
        assert numbers == sorted(set(numbers)), trial
        assert os.path.exists(rank_dir / "stdout.log")


def test_a_line_left_open_comes_before_what_the_rank_wrote_next_on_another_stream(tmp_path):
    """Under a budget the last line of a read waits for its end, but only when nothing was written
    after it: ``write("abc")`` then a display must read in that order (the display once came first)."""
    from nbspawn._rankdir import ORDER, ORDER_RECORD

    streams = RankStreams(0, str(tmp_path))
    (tmp_path / "stdout.log").write_bytes(b"abc")
    (tmp_path / "display.jsonl").write_bytes(b'{"kind": "data"}\n')
    (tmp_path / ORDER).write_bytes(ORDER_RECORD.pack(2, 3, 0, 0))  # the switch to display, after 3 bytes of stdout
    events = streams.read(budget=4096)
    assert [(e.kind, e.value) for e in events] == [("stdout", "abc"), ("display", {"kind": "data"})]
    assert streams.read(budget=4096) == []  # "abc" is not read again
    (tmp_path / "stdout.log").write_bytes(b"abcdef")  # a line still open at the end of a read waits
    assert streams.read(budget=4096) == []


def test_a_line_left_open_is_not_held_once_the_rank_switched_away_from_it(tmp_path):
    """The read that falls between the rank's switch record and its display's bytes (``_Ordered.write``
    writes the record first): the open line is whole as far as order goes, so it is shown now.  Held,
    it was read again next time after the display, which the record had already put first (the Colab
    job's test_a_line_left_open_comes_before_the_cells_value[widget], once, on a busy machine)."""
    from nbspawn._rankdir import ORDER, ORDER_RECORD

    streams = RankStreams(0, str(tmp_path))
    (tmp_path / "stdout.log").write_bytes(b"abc")
    (tmp_path / ORDER).write_bytes(ORDER_RECORD.pack(2, 3, 0, 0))  # the switch to display, its bytes not yet
    events = [(e.kind, e.value) for e in streams.read(budget=4096)]
    (tmp_path / "display.jsonl").write_bytes(b'{"kind": "data"}\n')
    events += [(e.kind, e.value) for e in streams.read(budget=4096)]
    assert events == [("stdout", "abc"), ("display", {"kind": "data"})]


def test_a_line_longer_than_the_budget_shows_its_end_marked_as_cut(tmp_path):
    """One line of 70,000 characters under a 32 KiB budget (a JSON dump printed whole): its end is
    shown, marked ``[…]``, where it once vanished whole (counted as one skipped line)."""
    from nbspawn.events._streams import CUT_LINE

    streams = RankStreams(0, str(tmp_path))
    (tmp_path / "stdout.log").write_bytes(("é" + "x" * 70_000 + "\nend\n").encode())
    events = streams.read(budget=32 * 1024)
    assert [e.kind for e in events] == ["stdout"]
    text = events[0].value
    assert text.startswith(CUT_LINE.decode()) and text.endswith("x\nend\n"), text[:40]
    assert 32 * 1024 - 8 <= len(text.encode()) <= 32 * 1024 + len(CUT_LINE)


def test_under_a_flood_a_line_cut_at_the_budgets_edge_is_still_skipped(tmp_path):
    """Most of what a read keeps is whole lines: the older one it starts inside is skipped and counted."""
    streams = RankStreams(0, str(tmp_path))
    (tmp_path / "stdout.log").write_bytes(b"".join(b"line %05d\n" % i for i in range(1000)))
    events = streams.read(budget=95)
    assert [(e.kind, e.value) for e in events] == [
        ("skipped", 992),
        ("stdout", "".join(f"line {i:05d}\n" for i in range(992, 1000))),
    ]
