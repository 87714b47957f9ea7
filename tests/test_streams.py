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
