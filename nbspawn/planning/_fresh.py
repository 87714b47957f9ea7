"""Fresh ranks of this machine, planned: a cell (its names handed over as its start method needs) or
a program, each a frozen spec (``_spec.build_spec``) in a :class:`~nbspawn.planning._plans.FreshPlan`;
the port, and ``--share``, are the plan's effects (``nbspawn._effects``)."""

from __future__ import annotations

from .._program import ProgramLine, locate
from .._request import Cell, RunRequest
from .._source import CellSource
from .._spec import Handoff, build_spec
from ._plans import FreshPlan


def plan_program(request: RunRequest, line: ProgramLine, rich: bool) -> FreshPlan:
    """A program on every rank: its command line (read at the door) found here (a file or module of this machine)."""
    program = locate(line)
    return FreshPlan(build_spec(CellSource("", label=str(program)), request.settings, rich=rich, program=program))


def plan_fresh_cell(request: RunRequest, work: Cell, rich: bool) -> FreshPlan:
    """Fresh ranks for one cell: under fork they get the kernel's namespace as it is (copy-on-write),
    under spawn and forkserver the names the cell uses, pickled by value."""
    # the kernel's names are torch's objects: handing them over needs torch, imported when a cell is planned
    from ..handoff._names import pack_namespace, pick_shared
    from ..handoff._shm import new_run_prefix

    cell, share_names, out_names = work.source, work.share, work.out
    shared: dict[str, object] = {}

    def handoff(method: str) -> Handoff:
        shared.update(pick_shared(share_names, request.namespace, method))
        prefix = new_run_prefix() if out_names else None
        if method == "fork":
            return Handoff(request.namespace, None, out_names, prefix)
        return Handoff(None, pack_namespace(cell.tree, request.namespace, request.hidden, shared), out_names, prefix)

    spec = build_spec(cell, request.settings, rich=rich, handoff=handoff, cell_numbers=request.cell_numbers)
    return FreshPlan(spec, share=tuple(shared.values()))
