"""Kept worlds on a cluster: ranks on several nodes that run cell after cell.

    %%spawn --cluster rc --world w -n 2 --backend gloo     # 2 ranks on each node, kept
    import torch, torch.distributed as dist
    model = torch.nn.Linear(4, 4)

    %%spawn --world w                                       # the same ranks, on the same nodes
    print(dist.get_rank(), model.weight.sum())

A cluster world is a local kept world on each node (``_nodeworld``), with global ranks and one
process group across the nodes.  In the kernel, :class:`ClusterWorld` remembers where it lives, and
each cell is a cluster run (:class:`ClusterWorldCell`, the cluster executor with ``keeps_ranks``):
one ``apply`` per node's agent, one view, the one supervisor and the world failure policy, so a
failed cell interrupts the others and the world survives when every rank comes back; a rank or node
that dies loses it everywhere.

The ipyparallel client is not thread-safe, and it is the user's.  Only the kernel's main thread
uses it (a cell, a stop).  Between cells the nodes must still hear that the kernel lives (engines
outlive kernels; an agent that hears nothing for a few seconds stops its worlds): a thread of the
kernel sends that heartbeat through a *companion* client of its own, connected to the same
controller, never through the user's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from .._request import RunRequest, Settings
from .._runstate import Run
from .._spec import RunSpec
from ..executors import _world as _local_worlds
from ..handoff._names import names_bound
from . import _contact, _nodeworld, _wire
from ._executor import ClusterRanks
from ._plan import ClusterPlan, companion_client

STOP_TIMEOUT = 15.0  # how long a node's agent may take to stop its ranks of a world

_worlds: dict[str, ClusterWorld] = {}


@dataclass(frozen=True)
class LostWorld:
    """A cluster world that was lost: why, and how it was asked for (the next cell naming it starts
    it again so, with whatever options that cell gives itself)."""

    why: str
    cluster: str  # the kernel variable holding the client
    nodes: int | None
    settings: Settings


_lost: dict[str, LostWorld] = {}


@dataclass
class ClusterWorld:
    """Where a kept world lives: its nodes and agents, what each of its cells sends them."""

    name: str
    spec: RunSpec  # its first cell's: ranks, backend, environment
    cluster: ClusterPlan
    asked: RunRequest  # its first cell's request: how to start it again if it is lost
    node_settings: Settings  # what each node's ranks were started with
    state: str = "starting"  # starting | idle | running | lost | stopped
    cells: int = 0
    pids: list[int | None] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    lost_because: str | None = None
    owned: set[str] = field(default_factory=set)  # names its cells bind: the world's own, never sent again

    @property
    def agents(self) -> list[int]:
        return [node.agent for node in self.cluster.nodes]

    def settings(self) -> str:
        env = " ".join(f"--env {k}={v}" for k, v in self.spec.env.items())
        text = f"{len(self.cluster.nodes)} nodes x -n {self.cluster.ranks_per_node} --backend {self.spec.backend}"
        return text + (f" {env}" if env else "")

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": f"cluster world {len(self.cluster.nodes)} nodes/{self.spec.backend}",
            "ranks": self.spec.nprocs,
            "pids": [p for p in self.pids if p] if self.state not in ("stopped", "lost") else [],
            "state": self.state,
            "cells": self.cells,
            "start_method": self.cluster.start_method,
            "backend": self.spec.backend,
            "age": time.time() - self.started_at,
            "logs": ", ".join(f"{n.hostname}:{os.path.dirname(self.spec.run_dir)}" for n in self.cluster.nodes),
        }

    def where(self) -> str:
        """Where every rank is now, between cells: each node's agent looks at its own ranks."""
        from ..events._where import RankToAsk, describe

        client = self.cluster.client
        pending = {node.index: client[node.agent].apply_async(_nodeworld.where_here, self.name) for node in self.cluster.nodes}
        stacks: dict[int, str | None] = {}
        collectives: dict[int, list[dict[str, Any]]] = {}
        silent = []
        for index, result in pending.items():
            try:
                answer: _wire.Where = result.get(timeout=STOP_TIMEOUT)
            except Exception:
                silent.append(self.cluster.nodes[index].label)
                continue
            stacks.update(answer["stacks"])
            collectives.update(answer["collectives"])
        ranks = [RankToAsk(r, None, "", self.cluster.node_of(r).label) for r in range(self.spec.nprocs)]
        text = describe(ranks, stacks, None, idle="idle: waiting for the next cell", collectives=collectives)
        text += f"\n({', '.join(silent)} did not answer)" if silent else ""
        return f"world {self.name!r} ({self.state}, {self.cells} cells, on a cluster):\n{text}"

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Every node's ranks of the world leave; nothing of it is left on any node."""
        if self.state == "stopped":
            return
        self._stop_nodes(timeout)
        if self.state != "lost":
            self.state = "stopped"

    def lose(self, why: str) -> None:
        self.state, self.lost_because = "lost", why
        _worlds.pop(self.name, None)
        asked = self.asked
        assert asked.cluster is not None  # a cluster world was asked for on a cluster
        _lost[self.name] = LostWorld(why, asked.cluster, asked.nodes, asked.settings)
        self._stop_nodes()

    def _stop_nodes(self, timeout: float = STOP_TIMEOUT) -> None:
        _worlds.pop(self.name, None)
        _heartbeat.forget(self)
        client = self.cluster.client
        pending = []
        for agent in self.agents:
            with contextlib.suppress(Exception):  # an engine that is gone took its ranks with it
                pending.append(client[agent].apply_async(_nodeworld.stop_world, self.name))
        for result in pending:
            with contextlib.suppress(Exception):
                result.get(timeout=timeout)


@atexit.register
def _stop_all_at_exit() -> None:
    """Kernel shutdown: every cluster world's ranks leave now (else their agents, hearing no more
    heartbeats, stop them a few seconds later)."""
    for world in list(_worlds.values()):
        with contextlib.suppress(Exception):
            world.stop(timeout=3.0)


def worlds() -> dict[str, ClusterWorld]:
    """The cluster worlds of this kernel, by name."""
    return dict(_worlds)


def running(name: str) -> ClusterWorld | None:
    """The cluster world ``name`` if it runs."""
    return _worlds.get(name)


def lost(name: str) -> LostWorld | None:
    """How the cluster world ``name`` was asked for, if it was lost: its next cell starts it again so."""
    return _lost.get(name)


def is_cluster_world(name: str) -> bool:
    """A kept world on a cluster, or one lost there (its next cell starts it there again)."""
    return name in _worlds or name in _lost


def stop(names: list[str] | None = None) -> list[str]:
    """Stop these cluster worlds (all, if None); names that are not cluster worlds are not ours."""
    chosen = [n for n in (names or list(_worlds)) if n in _worlds or n in _lost]
    for name in chosen:
        _lost.pop(name, None)
        if name in _worlds:
            _worlds[name].stop()
    return chosen


# %spawn status, where and stop, and nbspawn.worlds(), find these through the local registry
_local_worlds.keep_elsewhere(_local_worlds.WorldsElsewhere(worlds, is_cluster_world, stop))


class ClusterWorldCell(ClusterRanks):
    """One cell on a cluster world: the cluster executor, over ranks that outlive the cell."""

    supervision = replace(ClusterRanks.supervision, keeps_ranks=True)

    def __init__(self, spec: RunSpec, cluster: ClusterPlan, job: _wire.Job, world: ClusterWorld, first: bool) -> None:
        super().__init__(spec, cluster, job)
        self.world = world
        self.first = first
        self.failing: set[int] = set()  # nodes that reported a failed rank: they interrupt their own ranks

    def start(self, run: Run) -> list[int]:
        world = self.world
        if self.first:
            _worlds[world.name] = world
            _lost.pop(world.name, None)
            _heartbeat.keep(world)
        world.state = "running"
        world.cells += 1
        world.owned.update(names_bound(self.spec.cell.parse()))  # from now on, whatever the cell does
        run.world, run.world_cell = world.name, world.cells
        try:
            return super().start(run)
        except BaseException:
            self.world.lose("its cell could not be sent to every node")
            raise

    def announcement(self) -> str:
        return super().announcement() if self.first else ""  # the node order, said when the world starts

    def _call_agent(self, agent: int, spot: _wire.Spot) -> Any:
        return self.cluster.client[agent].apply_async(_nodeworld.run_world_cell, self.job, spot, self.world.name, self.first)

    def signal_ranks(self, ranks: list[int], pids: list[int], sig: int) -> None:
        """An interrupt after a failure goes to the other nodes only: a node whose rank failed is
        already interrupting its own ranks (a second interrupt there would lose its part)."""
        if sig == signal.SIGINT:
            ranks = [r for r in ranks if self.cluster.node_of(r).index not in self.failing]
        if ranks:
            super().signal_ranks(ranks, pids, sig)

    def _ended(self, rank: int, record: _wire.EndRecord) -> None:
        if record["error"] is not None and record["exit_code"]:
            self.failing.add(self.cluster.node_of(rank).index)
        super()._ended(rank, record)

    def cleanup(self, lose: bool) -> None:
        super().cleanup(lose)
        world = self.world
        assert self.run is not None  # started
        world.pids = [state.pid for state in self.run.ranks]
        lost = [a["lost"] for a in self.answered.values() if a is not None and a.get("lost")]
        if lose or lost or None in self.answered.values():
            world.lose(self.run.world_lost or (lost[0] if lost and lost[0] else "a node was lost"))
        else:
            world.state = "idle"


class _Heartbeat:
    """The kernel's heartbeat to the agents of its cluster worlds, between cells, from a thread that
    uses a companion client (the user's is not thread-safe)."""

    def __init__(self) -> None:
        self.worlds: dict[str, ClusterWorld] = {}
        self.companions: dict[int, Any] = {}  # id(user's client) -> the companion client
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def keep(self, world: ClusterWorld) -> None:
        client = world.cluster.client
        if id(client) not in self.companions:
            self.companions[id(client)] = companion_client(client)  # in the main thread: it may take a moment
        with self.lock:
            self.worlds[world.name] = world
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._beat, name="nbspawn-cluster-heartbeat", daemon=True)
            self.thread.start()

    def forget(self, world: ClusterWorld) -> None:
        with self.lock:
            self.worlds.pop(world.name, None)
            users = {id(w.cluster.client) for w in self.worlds.values()}
            for key in [k for k in self.companions if k not in users]:
                with contextlib.suppress(Exception):
                    self.companions.pop(key).close()

    def _beat(self) -> None:
        while True:
            with self.lock:
                if not self.worlds:
                    return
                for world in self.worlds.values():
                    companion = self.companions.get(id(world.cluster.client))
                    if companion is not None:
                        with contextlib.suppress(Exception):  # an engine that died is no longer registered
                            alive = [agent for agent in world.agents if agent in set(companion.ids)]
                            companion.send_signal(int(_contact.HEARTBEAT_SIGNAL), targets=alive, block=False)
            time.sleep(_contact.HEARTBEAT_EVERY)


_heartbeat = _Heartbeat()
