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

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from .._clash import Settled, fixed_of
from .._machine import Machine
from .._request import RunRequest, Settings
from .._runstate import Run
from .._spec import RunSpec
from ..executors import _kept
from ..executors._kept import KeptWorld, Lost
from ..handoff._names import names_bound
from . import _contact, _nodeworld, _wire
from ._executor import ClusterRanks
from ._plan import ClusterPlan, backend_on_nodes, companion_client, ranks_per_node, resolve_client

STOP_TIMEOUT = 15.0  # how long a node's agent may take to stop its ranks of a world


@dataclass
class ClusterWorld(KeptWorld):
    """A kept world on a cluster's nodes: its nodes and agents, what each of its cells sends them."""

    on_cluster: ClassVar[bool] = True
    stop_wait: ClassVar[float] = STOP_TIMEOUT  # a node's agent stops its ranks of the world
    exit_wait: ClassVar[float] = 3.0  # the kernel shuts down: else the agents stop its ranks once they hear nothing

    # spec: its first cell's: ranks, backend, environment
    cluster: ClusterPlan
    asked: RunRequest  # its first cell's request: how to start it again if it is lost
    node_settings: Settings  # what each node's ranks were started with
    pids: list[int | None] = field(default_factory=list)

    @property
    def agents(self) -> list[int]:
        return [node.agent for node in self.cluster.nodes]

    def settled(self) -> Settled:
        cluster = self.cluster
        return Settled(
            nprocs=cluster.ranks_per_node,
            start_method=cluster.start_method,
            backend=self.spec.backend,
            env=self.spec.env,
            nodes=len(cluster.nodes),
            others=fixed_of(self.spec.asked),
        )

    def auto_nprocs(self, here: Machine) -> int:  # its nodes' facts, as they reported them when it started
        return ranks_per_node(self.cluster.nodes, "auto")

    def auto_backend(self, nprocs: int, here: Machine) -> str:
        return backend_on_nodes(self.cluster.nodes, "auto", nprocs)[0]

    def place_clashes(self, request: RunRequest) -> list[str]:
        """``--cluster`` naming another controller's engines than the world's."""
        if request.cluster is not None:
            client, _ids = resolve_client(request.cluster, request.namespace)
            if client is not self.cluster.client:
                return [f"--cluster {request.cluster} (another controller's engines)"]
        return []

    def lost_record(self, why: str | None) -> Lost:
        """How it was asked for: the next cell naming it starts it again so, with whatever options that
        cell gives itself (its -n auto is what auto comes to on the nodes then)."""
        asked = self.asked
        assert asked.cluster is not None  # a cluster world was asked for on a cluster
        return Lost(why, asked.settings, asked.cluster, asked.nodes)

    def pids_now(self) -> list[int]:
        return [p for p in self.pids if p]

    def logs(self) -> str:
        return ", ".join(f"{n.hostname}:{os.path.dirname(self.spec.run_dir)}" for n in self.cluster.nodes)

    def status(self) -> dict[str, Any]:
        row = super().status()
        return {"name": row.pop("name"), "kind": f"cluster world {len(self.cluster.nodes)} nodes/{self.spec.backend}", **row}

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
        return f"world {self.name!r} ({self.state}, {self.cells} cell{'s' if self.cells != 1 else ''}, on a cluster):\n{text}"

    def describe(self, expression: str) -> list[dict[str, Any]]:
        """``%spawn show WORLD NAME``: each node's agent asks its own ranks (as a world here is asked),
        the answers in global rank order; a node that cannot answer is one line naming it."""
        from ..errors import SpawnUsageError
        from ..executors._show import check_showable

        check_showable(self.name, self.state, expression)
        client = self.cluster.client
        pending = {
            node.index: client[node.agent].apply_async(_nodeworld.describe_here, self.name, expression)
            for node in self.cluster.nodes
        }
        answers: list[dict[str, Any]] = []
        for index, result in pending.items():
            try:
                answers.extend(result.get(timeout=STOP_TIMEOUT))
            except Exception as err:
                why = (getattr(err, "evalue", "") or str(err)).strip().splitlines()
                raise SpawnUsageError(
                    f"{self.cluster.nodes[index].label} could not show {expression}: {why[0] if why else type(err).__name__}"
                ) from None
        return sorted(answers, key=lambda answer: answer["rank"])

    def end(self) -> None:
        self.leave(self.stop_wait)  # a node's agent ends its ranks when asked: as a stop does

    def leave(self, wait: float) -> None:
        """Every node's ranks of the world leave; nothing of it is left on any node."""
        _heartbeat.forget(self)
        client = self.cluster.client
        pending = []
        for agent in self.agents:
            with contextlib.suppress(Exception):  # an engine that is gone took its ranks with it
                pending.append(client[agent].apply_async(_nodeworld.stop_world, self.name))
        for result in pending:
            with contextlib.suppress(Exception):
                result.get(timeout=wait)


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
            _kept.keep(world)
            _heartbeat.keep(world)
        world.state = "running"
        world.cells += 1
        world.owned.update(names_bound(self.spec.cell.tree))  # from now on, whatever the cell does
        run.ran_on_world(world.name, world.cells)
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
