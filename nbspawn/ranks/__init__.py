"""What runs inside the rank processes: the code here is imported by ranks, not by views.

* ``_cell``: a fresh rank's entry point: environment, pdeathsig, signals, the cell, ``error.json``;
* ``_world``: a kept world's rank, which runs cell after cell from a pipe;
* ``_program``: the first thing a program's rank runs (by path, so it imports nothing of nbspawn);
* ``_capture``: what a rank writes and in which order: fd capture, ``order.bin``, ``display()``
  and widgets recorded in ``display.jsonl``.
"""
