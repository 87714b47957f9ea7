"""A node's part of a kept world on a cluster: what the agent keeps between cells.

A cluster world is a local kept world on every node (``nbspawn.executors._world.World``, the same
rank loop, the same :class:`~nbspawn.executors._world.WorldCell` executor and failure policy), whose
ranks are numbered globally and share one process group across the nodes.  The kernel calls, on each
node's agent:

* :func:`run_world_cell` for every cell: the first one starts the node's ranks (and node 0's agent
  hosts the world's TCPStore, which lives as long as the world); every one hands the cell to them
  and relays what they report, as :func:`nbspawn.cluster._agent.run_node` does for a fresh run;
* :func:`where_here` and :func:`describe_here` between cells (``%spawn where``, ``%spawn show WORLD NAME``);
* :func:`stop_world` when the world is stopped or lost.

Engines outlive kernels.  Between cells no ``apply`` runs, so a thread of the agent (started with
the node's first world) watches the kernel's heartbeat, which the kernel keeps sending while it has
a world here: silence for :data:`~nbspawn.cluster._contact.HEARTBEAT_LOST` seconds and the node's
worlds are stopped, leaving nothing running.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace

from .. import _listen
from .._decide import decide_ranks
from .._machine import Machine
from .._spec import build_spec
from ..executors import _kept, _world
from ..executors._base import NODE_AGENT
from ..executors._world import WorldCell
from . import _agent, _contact, _wire

_cell_running = threading.Event()  # a cell's apply watches the heartbeat itself
_watcher: threading.Thread | None = None
_lock = threading.Lock()  # a cell, a stop and the watcher never change the node's worlds at once


class _NodeWorldCell(WorldCell):
    """A cell on the node's part of a world, watched closely (a stop from the kernel within 50 ms)."""

    # a world's ranks still outlive the cell, and make their own directories as they begin it
    supervision = replace(NODE_AGENT, keeps_ranks=True, ranks_make_their_dirs=True)


def run_world_cell(job: _wire.Job, node: _wire.Spot, name: str, first: bool) -> _wire.Answer:
    """Hand one cell to this node's ranks of world ``name`` (started first if ``first``); relay what
    they report; answer as :func:`~nbspawn.cluster._agent.run_node` does, with the world's fate."""
    import cloudpickle

    from ..executors._supervisor import execute
    from ..handoff._shm import Payload, forget_arrivals, new_run_prefix
    from ..ranks._worldloop import WorldJob

    with _contact.node_run():
        forget_arrivals()
        with _lock:
            _cell_running.set()
            try:
                world, next_port = _world_for(job, node, name, first)
                view = _agent.RelayView(
                    node["offset"],
                    job["rich"],
                    job["publish_every"],
                    _contact.publisher(),
                    alive=lambda r: world.processes[r].is_alive(),
                )
                out_names = tuple(job["out_names"])
                names = cloudpickle.loads(job["names"]) if job["names"] else {}
                run_id = job["run_id"]
                spec = world.spec.with_job(  # the kernel keeps the time, and stops every node at once
                    run_id,
                    f"{world.base_dir}/{run_id}",
                    cell=job["cell"],
                    out_names=out_names,
                    shm_prefix=new_run_prefix() if out_names else None,
                    rich=job["rich"],
                    on_ranks=frozenset(job["on"]) if job["on"] is not None else None,
                    # the cell's options, settled for the nodes in the kernel (no time limit or --pdb on a node)
                    asked=job["settings"],
                )
                cell = WorldJob(
                    job["cell"], spec.run_dir, run_id, Payload(names), out_names, spec.shm_prefix,
                    asked=spec.asked, rank_offset=node["offset"], on=spec.on_ranks,
                )  # fmt: skip
                with _agent.working_directory(job["cwd"]):
                    run = execute(spec, view, _NodeWorldCell(world, cell))
            finally:
                _cell_running.clear()
        return _agent.answer(run, view, node, next_port, lost=run.world_lost)


def _world_for(job: _wire.Job, node: _wire.Spot, name: str, first: bool) -> tuple[_world.World, int | None]:
    """The node's ranks of the world: started now for its first cell (node 0's agent hosts its store
    and holds a new port for the next fresh run), else the ones kept."""
    world = _kept.worlds(_world.World).get(name)
    if not first:
        if world is None or world.state in ("lost", "stopped"):
            raise RuntimeError(
                f"this node no longer has ranks of world {name!r} (its engine restarted, or the kernel went silent)"
            )
        return world, None
    if world is not None:  # a part left by a kernel that died, under the same name: not this world
        _stop_here(name)
    settings, placement = _agent.node_placement(job, node)
    with _agent.working_directory(job["cwd"]):
        ranks = decide_ranks(settings, Machine.here(settings.env))
        spec = build_spec(job["cell"], settings, ranks, rich=job["rich"], run_id=job["run_id"], placement=placement)
    world = _world.start_world(name, spec)  # node 0's world hosts its store, for its life, once its ranks are forked
    next_port = _listen.reserve(spec.master_addr) if node["index"] == 0 else None  # the next fresh run's, told to the kernel
    _watch_the_kernel()
    return world, next_port


def where_here(name: str) -> _wire.Where:
    """Where this node's ranks of world ``name`` are, between cells (``%spawn where``)."""
    from .._rankdir import RankDir
    from ..events._where import RankToAsk

    world = _kept.worlds(_world.World).get(name)
    if world is None:
        return {"stacks": {}, "collectives": {}}
    offset = world.spec.rank_offset
    ranks = [RankToAsk(offset + r, pid, RankDir(world.spec.rank_dir(r)).stacks) for r, pid in enumerate(world.pids)]
    return _agent.look(ranks, program=False)


def describe_here(name: str, expression: str) -> list[dict]:
    """What ``expression`` holds on this node's ranks of world ``name`` (``%spawn show``), each answer
    numbered by its global rank; a world that is not here, busy or lost is the usage error it is locally."""
    from ..executors._show import describe_on_world

    with _lock:
        world = _kept.worlds(_world.World).get(name)
        offset = world.spec.rank_offset if world is not None else 0
        return [{**answer, "rank": answer["rank"] + offset} for answer in describe_on_world(name, expression)]


def stop_world(name: str) -> bool:
    """Stop this node's ranks of world ``name`` (nothing of them is left); False if it had none."""
    with _lock:
        return _stop_here(name)


def _stop_here(name: str) -> bool:
    had = name in _kept.worlds(_world.World)
    if had:
        with contextlib.suppress(Exception):
            _kept.stop([name])
    return had


def _watch_the_kernel() -> None:
    """One thread per agent while it has worlds: a kernel silent between cells loses them all."""
    global _watcher
    if _watcher is not None and _watcher.is_alive():
        return
    _watcher = threading.Thread(target=_watch, name="nbspawn-world-watch", daemon=True)
    _watcher.start()


def _watch() -> None:
    while _kept.worlds(_world.World):
        time.sleep(_contact.HEARTBEAT_EVERY)
        if _cell_running.is_set() or not _contact.kernel_silent():
            continue
        with _lock:
            if _cell_running.is_set():
                continue
            for name in list(_kept.worlds(_world.World)):
                _stop_here(name)
