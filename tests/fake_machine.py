"""A machine's facts given instead of probed (``nbspawn._machine.Machine``), a spec planned on them, and a
cluster's engines' facts (what ``cluster._agent.probe`` answers) with the kernel's side: what a unit test of
a planner needs, with no GPU, no monkeypatch, no process, no controller and no network namespace."""

from __future__ import annotations

from typing import Any

from nbspawn._decide import decide_ranks
from nbspawn._machine import Machine, Told
from nbspawn._program import Program
from nbspawn._request import Settings
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec, build_spec
from nbspawn.cluster._plan import Kernel

# a CPU machine where fork is safe, with a loopback interface, on a torch whose recorder is TORCH_FR_*,
# and no TPU (torch_xla not installed)
PLAIN = Told(
    start_methods=("fork", "spawn", "forkserver"), fork_blocker=None, openmp_started=False, gpus=0, cpus=8,
    loopback="lo", recorder_renamed=True, tpu_chips=0, xla_installed=False,
)  # fmt: skip


def machine(environ: dict[str, str] | None = None, user_env: dict[str, str] | None = None, **told: Any) -> Machine:
    """A machine with ``PLAIN``'s facts but those ``told``, the kernel's environment ``environ`` and the
    cell's ``--env`` ``user_env``."""
    return Machine(dict(user_env or {}), dict(environ or {}), Told(**{**PLAIN, **told}))  # type: ignore[typeddict-item]


def spec_on(settings: Settings, on: Machine, program: Program | None = None, **build: Any) -> RunSpec:
    """The spec a planner makes of ``settings`` on machine ``on`` (its ranks decided, then built)."""
    ranks = decide_ranks(settings, on, program)
    return build_spec(CellSource("pass"), settings, ranks, rich=False, program=program, **build)


# -- a cluster's engines, as they answer the probe -----------------------------------------------------

VERSIONS = {"python": "3.11.7", "torch": "2.13.0", "nbspawn": "0.1.0"}
KERNEL = Kernel(node="a", versions=VERSIONS, cwd="/home/me/project")


def engine(node: str, *, address: str | None = None, port: int = 29500, gpus: int = 0, cpus: int = 8, **more: Any) -> dict:
    """One engine's answer to the probe, as ``_agent.probe`` makes it."""
    return {
        "node": node, "hostname": f"{node}.cluster", "machine": f"boot-{node}", "pid": 100, **VERSIONS,
        "address": address or f"10.0.0.{ord(node) - 96}", "port": port, "gpus": gpus, "physical_gpus": gpus,
        "cuda_visible": None, "cpus": cpus, "cwd": "/home/me/project", "start_method": "fork", "problem": None,
        "batch_job": None, **more,
    }  # fmt: skip


TWO_NODES = {0: engine("a", port=29511), 1: engine("a"), 2: engine("b"), 3: engine("b")}
