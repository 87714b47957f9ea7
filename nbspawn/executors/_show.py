"""``%spawn show WORLD NAME``: what a name holds on each rank of a kept world (issue #43, item 4).

One more job on the world's rank loop, as ``%spawn debug``'s post-mortem is (supervised as a cell,
with no view): each rank writes down what the name holds there (``ranks._describe``) and the kernel
reads the ranks' answers back, in rank order, for ``views._shards_html`` to draw.  Nothing of the
world changes: no name is bound, no collective runs, the cell count stays.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from typing import Any

from .._rankdir import DESCRIBED
from .._spec import new_run_id
from ..errors import SpawnUsageError
from ..ranks._worldloop import WorldJob
from ..views._protocol import RunView
from . import _kept, _registry, _world
from ._supervisor import execute

USAGE = "%spawn show WORLD NAME"
EXPRESSION = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")  # model.lin.weight, seq.0.weight (a Sequential's layer)


def check_expression(expression: str) -> None:
    """A name or a dotted path (``model.lin.weight``), else one line saying so."""
    if not EXPRESSION.match(expression):
        raise SpawnUsageError(f"{USAGE}: {expression!r} is not a name (a name, or a dotted path such as model.lin.weight)")


def check_showable(world_name: str, state: str, expression: str) -> None:
    """A world here or on a cluster can be shown between cells only: one line saying why not."""
    if state == "running":
        raise SpawnUsageError(f"world {world_name!r} is running a cell now: show {expression} once it is over")
    if state in ("lost", "stopped"):
        raise SpawnUsageError(f"world {world_name!r} is {state}: nothing of it is left to show")


def describe_on_world(world_name: str, expression: str) -> list[dict[str, Any]]:
    """Each rank's description of ``expression`` (a name or a dotted path) on the world named: a
    usage error, said in one line, for a world that is not here, busy or lost, or a malformed name."""
    check_expression(expression)
    worlds = _kept.worlds(_world.World)
    world = worlds.get(world_name)
    if world is None:
        known = ", ".join(sorted(worlds)) or "none"
        raise SpawnUsageError(f"no kept world named {world_name!r} on this machine (kept worlds: {known})")
    check_showable(world_name, world.state, expression)
    _world.lose_if_a_rank_died(world)
    run_id = new_run_id()
    spec = world.spec.with_job(run_id, os.path.join(world.base_dir, run_id))
    job = WorldJob(  # (a cluster node's part of a world: its ranks' directories are by global rank)
        world.spec.cell,
        spec.run_dir,
        run_id,
        asked=replace(spec.asked, xray="off"),
        describe=expression,
        rank_offset=spec.rank_offset,
    )
    before = _registry.last_run()
    try:
        run = execute(spec, RunView(), _world.WorldCell(world, job))
    finally:
        _registry.began(before)  # nbspawn.last_run() is still the user's last cell
    if run.error is not None:
        raise SpawnUsageError(f"world {world_name!r} could not show {expression}: {str(run.error).splitlines()[0]}")
    answers = []
    for state in run.ranks:
        try:
            with open(os.path.join(state.dir, DESCRIBED), encoding="utf-8") as fh:
                answers.append({"rank": state.rank, **json.load(fh)})
        except (OSError, ValueError):
            answers.append({"rank": state.rank, "missing": "this rank gave no answer"})
    return answers
