"""What a redraw of a progress bar costs the kernel, early and late in a long run (issue 30).

Feeds 20,000 ``\\r`` redraws of a bar, coloured (several SGR codes a frame, as tqdm(colour=...), rich,
Lightning and HF bars print them) and plain, through the kernel-side tail of one rank
(``nbspawn.views._tail.OutputTail.add``), and prints the cost per redraw in each window of redraws and
the kept line's length: flat when the tail keeps the style in force, growing when it keeps the codes'
history.  Then what freezing the line into the saved HTML costs.  With ``--kernel``, also the
kernel's own CPU time for a ``%%spawn -n 2 --view widget`` cell whose ranks each draw a bar of N
flushed redraws 0.5 ms apart, through a real ipykernel (bench/launch.py's ``Kernel``), plain and
coloured.

    .venv/bin/python bench/tail.py [--redraws 20000] [--windows 5] [--kernel 3000,12000]

To compare with another checkout, run it with that checkout first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbspawn
from nbspawn.views._bundle import line_html
from nbspawn.views._tail import Line, OutputTail


def coloured(i: int) -> str:
    done = i % 40
    return (
        f"\r\x1b[1mepoch {i // 1000}\x1b[22m \x1b[38;2;{i % 256};100;50m{'█' * done}\x1b[39m"
        f"\x1b[38;5;240m{'━' * (40 - done)}\x1b[0m \x1b[32m{i}\x1b[0m"
    )


def plain(i: int) -> str:
    done = i % 40
    return f"\repoch {i // 1000} {'█' * done}{'━' * (40 - done)} {i}"


def run(frame: object, redraws: int, windows: int) -> tuple[list[tuple[int, float, int]], float]:
    """(redraws so far, µs per redraw in the window, kept line's length) per window; freezing's ms."""
    tail = OutputTail()
    step = redraws // windows
    rows = []
    i = 0
    for _ in range(windows):
        start = time.process_time()
        for _ in range(step):
            tail.add("stderr", frame(i))  # type: ignore[operator]
            i += 1
        spent = time.process_time() - start
        (line,) = tail.entries.values()
        assert isinstance(line, Line)
        rows.append((i, spent / step * 1e6, len(line.text)))
    start = time.process_time()
    line_html(line)
    return rows, (time.process_time() - start) * 1e3


KERNEL_SETUP = "%load_ext nbspawn\n%config SpawnMagics.live_after = 0\n"
# a pause between redraws, as a real bar has: the kernel then reads them a few at a time (a burst
# written at once is read as one chunk, which hides what each redraw costs)
KERNEL_CELL = """%%spawn -n 2 --view widget
import sys, time
{frame}
for i in range({redraws}):
    print(frame(i), end="", file=sys.stderr, flush=True)
    time.sleep(0.0005)
print(file=sys.stderr)
"""


def kernel_rows(counts: list[int]) -> list[tuple[str, int, float]]:
    """(bar, redraws per rank, the kernel's CPU seconds for the cell) through a real kernel."""
    import inspect

    import psutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from launch import Kernel

    kernel = Kernel(timeout=600)
    rows = []
    try:
        kernel.run(KERNEL_SETUP)
        process = psutil.Process(kernel.pid)
        for count in counts:
            for name, frame in (("plain", plain), ("coloured", coloured)):
                source = inspect.getsource(frame).replace(f"def {name}(", "def frame(")
                before = sum(process.cpu_times()[:2])
                kernel.run(KERNEL_CELL.format(frame=source, redraws=count))
                rows.append((name, count, sum(process.cpu_times()[:2]) - before))
    finally:
        kernel.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redraws", type=int, default=20_000)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--kernel", default="", help="redraws per rank through a real kernel, comma-separated (e.g. 3000,12000)")
    args = parser.parse_args()
    print(f"nbspawn from {nbspawn.__file__}")
    print(f"{'bar':<9} {'redraws':>8} {'µs/redraw':>10} {'kept chars':>11}")
    for name, frame in (("plain", plain), ("coloured", coloured)):
        rows, freeze_ms = run(frame, args.redraws, args.windows)
        for upto, cost, kept in rows:
            print(f"{name:<9} {upto:>8} {cost:>10.1f} {kept:>11}")
        print(f"{name:<9} {'frozen':>8} {freeze_ms:>9.2f}ms")
    if args.kernel:
        print(f"\n{'bar':<9} {'redraws':>8} {'kernel CPU s':>13}   (%%spawn -n 2 --view widget, a real kernel)")
        for name, count, cpu in kernel_rows([int(n) for n in args.kernel.split(",")]):
            print(f"{name:<9} {count:>8} {cpu:>13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
