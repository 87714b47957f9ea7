"""``%spawn debug [NAME|RUN-ID] [RANK]``: debug a rank after the fact, from a later cell.

* On a kept world (``NAME``): a post-mortem of the last failure a rank kept (``ranks._worldloop``
  keeps a failed cell's exception, as ``sys.last_traceback`` is kept for IPython's ``%debug``).  It
  is one more job on the world's rank loop, supervised as a cell is: the rank's pdb prompts come
  through this cell's stdin (the prompt desk), at the failed cell's own lines; the others answer at
  once.  Without a rank: the root cause of the world's last failed cell.
* On a background run (``RUN-ID``): attach to its ranks waiting at a prompt (``PromptDesk.attach``).

The grammar: a last word that is a number is the RANK; a word before it names the world or run.  So
``%spawn debug 1`` is rank 1 of whatever there is to debug, and a world named by digits is reached
as ``%spawn debug 7 0`` (its rank given): which form is meant never depends on what exists.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .._runstate import Run
from .._spec import new_run_id
from ..errors import SpawnUsageError
from ..events._prompts import stdin_answerable
from ..ranks._worldloop import WorldJob
from ..views._protocol import RunView
from . import _kept, _world
from ._prompting import attachable, waiting_runs
from ._supervisor import execute

USAGE = "%spawn debug [NAME|RUN-ID] [RANK]"
NOTHING = (
    "nothing to debug: no kept world keeps a failure and no background run waits at a prompt "
    "(%spawn debug opens the post-mortem of a --world cell that failed, or attaches to a --bg run's rank at a breakpoint)"
)


def parse_debug_words(words: list[str]) -> tuple[str | None, int | None]:
    """(world or run named, rank) of ``%spawn debug``'s words: a last word that is a number is the rank."""
    rest = list(words)
    rank = None
    if rest and rest[-1].isdigit():
        rank = int(rest.pop())
    if len(rest) > 1:
        raise SpawnUsageError(f"{USAGE}: one world or run and one rank at most, not {' '.join(words)!r}")
    return (rest[0] if rest else None), rank


def debug(words: list[str], view: RunView) -> tuple[Run | None, str]:
    """Debug what ``words`` name: (the post-mortem's run, or None for an attach; what to print)."""
    target, rank = parse_debug_words(words)
    runs, worlds = waiting_runs(), _kept.worlds(_world.World)
    if target is None:
        if len(runs) > 1:
            raise SpawnUsageError(f"background runs {', '.join(sorted(runs))} wait at prompts: say which ({USAGE})")
        if runs:
            target = next(iter(runs))
        else:
            failed = {name: w for name, w in worlds.items() if w.kept}
            if not failed:
                raise SpawnUsageError(NOTHING)
            target = max(failed, key=lambda name: max(k.time for k in failed[name].kept.values()))
    desk = attachable(target)
    if desk is not None:
        return None, desk.attach(rank)
    if target in worlds:
        return post_mortem(worlds[target], rank, view), ""
    known = [*worlds, *runs]
    raise SpawnUsageError(
        f"no kept world or background run named {target!r}" + (f" (there are: {', '.join(known)})" if known else "")
    )


def default_rank(world: _world.World) -> int:
    """The rank to debug on ``world`` when none is named: the root cause (the earliest failure) of its
    last failed cell."""
    last = max(k.cell_no for k in world.kept.values())
    return min((k for k in world.kept.values() if k.cell_no == last), key=lambda k: k.time).rank


def post_mortem(world: _world.World, rank: int | None, view: RunView) -> Run:
    """The post-mortem job on ``world``'s rank, supervised as a cell (its error, if any, is the run's)."""
    name = world.name
    if not world.kept:
        raise SpawnUsageError(f"no failure kept on world {name!r}: none of its cells has raised since it started")
    if rank is None:
        rank = default_rank(world)
    if rank >= world.spec.nprocs:
        raise SpawnUsageError(f"world {name!r} has ranks 0-{world.spec.nprocs - 1}, not {rank}")
    kept = world.kept.get(rank)
    if kept is None:
        which = ", ".join(
            f"rank {k.rank} ({k.summary}, {k.cell.label})" for k in sorted(world.kept.values(), key=lambda k: k.rank)
        )
        raise SpawnUsageError(f"no failure kept on world {name!r} rank {rank}: {which} keep one")
    if not stdin_answerable():
        raise SpawnUsageError(
            "%spawn debug needs a frontend that answers input(): this cell was sent without stdin "
            "(allow_stdin false: nbclient, nbconvert, papermill)"
        )
    _world.lose_if_a_rank_died(world)  # a rank that died since is said now, the world cleaned up
    run_id = new_run_id()
    spec = world.spec.with_job(run_id, os.path.join(world.base_dir, run_id), cell=kept.cell, shown_ranks=frozenset({rank}))
    job = WorldJob(
        kept.cell, spec.run_dir, run_id, asked=replace(spec.asked, xray="off"), debug=rank, cell_numbers=kept.cell_numbers
    )
    print(f"post-mortem of world {name!r} rank {rank}: {kept.summary} ({kept.cell.label})")
    return execute(spec, view, _world.WorldCell(world, job))


def waiting_lines() -> list[str]:
    """What ``%spawn status`` adds: each background run's rank at a prompt, and how to attach."""
    return [
        f"rank {rank} of {run_id} is {note.split(';', 1)[0]}: run `%spawn debug {run_id}` to attach"
        for run_id, notes in waiting_runs().items()
        for rank, note in sorted(notes.items())
    ]
