"""Fresh ranks of this machine, planned: a cell (its names handed over as its start method needs) or
a program, each a frozen spec (``_spec.build_spec``) in a :class:`~nbspawn.planning._plans.FreshPlan`;
the port, and ``--share``, are the plan's effects (``nbspawn._effects``)."""

from __future__ import annotations

from .._decide import decide_ranks
from .._machine import Machine
from .._program import ProgramLine, locate
from .._request import Cell, RunRequest
from .._source import CellSource
from .._spec import Handoff, build_spec
from ._plans import FreshPlan


def plan_program(request: RunRequest, line: ProgramLine) -> FreshPlan:
    """A program on every rank: its command line (read at the door) found here (a file or module of this machine)."""
    program = locate(line)
    settings = request.settings
    ranks = decide_ranks(settings, Machine.here(settings.env), program)
    return FreshPlan(build_spec(CellSource("", label=str(program)), settings, ranks, rich=request.rich, program=program))


def plan_fresh_cell(request: RunRequest, work: Cell) -> FreshPlan:
    """Fresh ranks for one cell: under fork they get the kernel's namespace as it is (copy-on-write),
    under spawn and forkserver the names the cell uses, pickled by value."""
    # the kernel's names are torch's objects: handing them over needs torch, imported when a cell is planned
    from ..handoff._names import check_shared_devices, pack_namespace, pick_shared
    from ..handoff._shm import new_run_prefix

    cell, share_names, out_names, settings = work.source, work.share, work.out, request.settings
    machine = Machine.here(settings.env)
    ranks = decide_ranks(settings, machine)  # first: the names are handed over as its start method needs
    shared = pick_shared(share_names, request.namespace, ranks.start_method)
    prefix = new_run_prefix() if out_names else None
    if ranks.start_method == "fork":
        handed = Handoff(request.namespace, None, out_names, prefix)
    else:
        payload = pack_namespace(cell.tree, request.namespace, request.hidden, shared)
        check_shared_devices(payload.shared or [], machine.visible_devices)
        handed = Handoff(None, payload, out_names, prefix)
    spec = build_spec(cell, settings, ranks, rich=request.rich, handed=handed, cell_numbers=request.cell_numbers)
    return FreshPlan(spec, share=tuple(shared.values()))
