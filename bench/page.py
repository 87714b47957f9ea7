"""The page under a flood, in a real browser: long tasks and Stop latency against the issue's targets.

Runs the flood, Stop and collectives tests of tests/browser/test_output_view.py (JupyterLab 4 and
Notebook 7 in Debian's Chromium; 16 ranks printing as fast as they can, or running 10,000 all_reduces
with the live X-ray open) with NBSPAWN_PAGE_TARGETS=1, so they assert the targets (no main-thread task
over 100 ms; another cell typed into during the flood takes its 27 characters within 5 s; Stop ends
the run within 1 s of the click), and prints what each measured, with the machine's load beside it: on
2 cores the flood itself takes both.  These wall-clock figures are the bench's: the test suite asserts
only what the page did (its CPU time, every character arriving, the run stopped), issue #55.

    .venv/bin/python bench/page.py [--reps 2] [-k stop]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1, help="runs of each test (default 1)")
    parser.add_argument("-k", dest="only", default="flood or stop or collectives", help="which of them (pytest -k; default: all)")
    args = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    status = 0
    for rep in range(args.reps):
        load = Path("/proc/loadavg").read_text().split()[0]
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "tests/browser/test_output_view.py", "-k", args.only, "-s", "-q", "-p", "no:cacheprovider"],
            cwd=REPO, env={**os.environ, "NBSPAWN_PAGE_TARGETS": "1"}, capture_output=True, text=True,
        )  # fmt: skip
        status = status or done.returncode
        for line in done.stdout.splitlines():
            # a line may follow pytest's progress marks (".nb7: Stop during ...")
            if found := re.match(r"[.sFE]*((lab|nb7): (16-rank flood|Stop during|16 ranks x 10,000 collectives).*)", line):
                front, _, what = found.group(1).partition(": ")
                rows.append((f"{rep + 1}", front, f"{what}  (load {load})"))
        for line in done.stdout.splitlines()[-3:]:
            print(line, file=sys.stderr)
    print("run  front  measured")
    for rep, front, what in rows:
        print(f"{rep:<4} {front:<6} {what}")
    return status


if __name__ == "__main__":
    sys.exit(main())
