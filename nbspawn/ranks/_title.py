"""A rank's name where ``ps``, ``top`` and ``py-spy`` look: ``nbspawn rank 2 of 4 [run 20261127-195138-3f9a1c]``
or ``nbspawn rank 2 of 4 [world w]``.

A rank is forked or spawned from the kernel, so without this it reads as one more
``ipykernel_launcher`` (fork) or ``multiprocessing`` child (spawn, forkserver), and a user looking
for what is spinning cannot tell a rank from a kernel.  ``setproctitle`` rewrites the command line
(``/proc/<pid>/cmdline``, what ``ps`` shows) and the thread name (``comm``, what ``top`` shows), as
Python alone cannot.  A fresh run's ranks name their run: two runs of one kernel (a background run and
the cell after it) would otherwise read the same; a kept world's name is already one of a kind.
"""

from __future__ import annotations

import setproctitle


def rank_title(
    rank: int, world_size: int, world: str | None = None, program: str | None = None, run_id: str | None = None
) -> str:
    """``nbspawn rank RANK of WORLD_SIZE``, then the kept world's name (or else the run's id), then the
    program the rank runs."""
    title = f"nbspawn rank {rank} of {world_size}"
    if world:
        title += f" [world {world}]"
    elif run_id:
        title += f" [run {run_id}]"
    if program:
        title += f": {program}"
    return title


def name_process(title: str) -> None:
    """Show ``title`` for this process in ``ps`` (its whole command line) and ``top`` (its name)."""
    setproctitle.setproctitle(title)
