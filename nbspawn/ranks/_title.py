"""A rank's name where ``ps``, ``top`` and ``py-spy`` look: ``nbspawn rank 2 of 4 [world w]``.

A rank is forked or spawned from the kernel, so without this it reads as one more
``ipykernel_launcher`` (fork) or ``multiprocessing`` child (spawn, forkserver), and a user looking
for what is spinning cannot tell a rank from a kernel.  ``setproctitle`` rewrites the command line
(``/proc/<pid>/cmdline``, what ``ps`` shows) and the thread name (``comm``, what ``top`` shows), as
Python alone cannot.
"""

from __future__ import annotations

import setproctitle


def rank_title(rank: int, world_size: int, world: str | None = None, program: str | None = None) -> str:
    """``nbspawn rank RANK of WORLD_SIZE``, then the kept world's name or the program the rank runs."""
    title = f"nbspawn rank {rank} of {world_size}"
    if world:
        title += f" [world {world}]"
    if program:
        title += f": {program}"
    return title


def name_process(title: str) -> None:
    """Show ``title`` for this process in ``ps`` (its whole command line) and ``top`` (its name)."""
    setproctitle.setproctitle(title)
