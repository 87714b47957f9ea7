"""Micro-benchmark: what sending the cell's definitions by value to a rank's children costs.

    python bench/children.py             # 2000 reps of each row
    python bench/children.py --reps 500

A rank's ``ForkingPickler`` (every multiprocessing and torch.multiprocessing queue, every spawn and
forkserver start) gets a ``reducer_override`` (``nbspawn.ranks._children``): called for every object
it pickles but atoms (ints, floats, strings), it returns at once for anything that is not a function
or class of ``__main__``.  Rows: containers of Python objects (the worst case: one call per
container; a tensor is a handful of objects, its data goes through torch's reducers unchanged, and
pickling one here would leave a descriptor per call in the resource sharer), and a cell's class by
value (what a worker's start carries; it cannot be pickled at all without the override).  Columns: microseconds per ``ForkingPickler.dumps``, median of 5 rounds,
without and with the override, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from multiprocessing.reduction import ForkingPickler

import torch

from nbspawn.ranks import _children

# a class of the rank's __main__, as a cell would define it
Squares = type("Squares", (torch.utils.data.Dataset,), {"__module__": "__main__", "__len__": lambda self: 8})


def per_call_us(obj: object, reps: int) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            ForkingPickler.dumps(obj)
        rounds.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2000)
    reps = parser.parse_args().reps
    rows = {
        "list of 1000 floats": [float(i) for i in range(1000)],
        "list of 100 small tuples": [(i, str(i), float(i)) for i in range(100)],
        "dict of 100 lists of 10 ints": {str(i): list(range(10)) for i in range(100)},
    }
    before = {name: per_call_us(obj, reps) for name, obj in rows.items()}
    _children.install({})
    after = {name: per_call_us(obj, reps) for name, obj in rows.items()}
    print(f"{'what is pickled':32} {'without us':>11} {'with us':>9} {'ratio':>6}")
    for name in rows:
        print(f"{name:32} {before[name]:11.1f} {after[name]:9.1f} {after[name] / before[name]:6.2f}")
    cls_us = per_call_us(Squares, max(1, reps // 20))
    print(f"{'a cell class, by value':32} {'(fails)':>11} {cls_us:9.1f}")


if __name__ == "__main__":
    main()
