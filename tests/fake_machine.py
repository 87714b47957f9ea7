"""A machine's facts given instead of probed (``nbspawn._machine.Machine``), and a spec planned on them:
what a unit test of a planner needs, with no GPU, no monkeypatch and no process."""

from __future__ import annotations

from typing import Any

from nbspawn._decide import decide_ranks
from nbspawn._machine import Machine, Told
from nbspawn._program import Program
from nbspawn._request import Settings
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec, build_spec

# a CPU machine where fork is safe, with a loopback interface, on a torch whose recorder is TORCH_FR_*
PLAIN = Told(
    start_methods=("fork", "spawn", "forkserver"), fork_blocker=None, openmp_started=False, gpus=0, cpus=8,
    loopback="lo", recorder_renamed=True,
)  # fmt: skip


def machine(environ: dict[str, str] | None = None, user_env: dict[str, str] | None = None, **told: Any) -> Machine:
    """A machine with ``PLAIN``'s facts but those ``told``, the kernel's environment ``environ`` and the
    cell's ``--env`` ``user_env``."""
    return Machine(dict(user_env or {}), dict(environ or {}), Told(**{**PLAIN, **told}))  # type: ignore[typeddict-item]


def spec_on(settings: Settings, on: Machine, program: Program | None = None, **build: Any) -> RunSpec:
    """The spec a planner makes of ``settings`` on machine ``on`` (its ranks decided, then built)."""
    ranks = decide_ranks(settings, on, program)
    return build_spec(CellSource("pass"), settings, ranks, rich=False, program=program, **build)
