"""In the kernel: which engines are which nodes, and everything checked before a cluster run starts.

One round trip asks every engine (``_agent.probe``); engines are grouped by node, the kernel's own
node first if it is one of them, then in the order of their lowest engine id, so node order is
stable from cell to cell.  Each node's lowest engine is its agent.  A mismatch of versions, a
missing program, an unreachable node 0 or a rank count the nodes disagree on is a short error naming
the node, before anything starts.
"""

from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

from .. import _cuda
from .._decide import auto_nprocs
from .._options import StartMethod
from .._program import ProgramLine
from ..errors import SpawnUsageError
from . import _agent, _batch, _net

PROBE_TIMEOUT = 15.0

_cluster_clients: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# What the engines said, per client, while its engines stay the same: a later cell asks nothing
# (node 0's agent holds the next run's port open, and says which it is when a run ends).
_known: weakref.WeakKeyDictionary[Any, tuple[tuple, dict[int, dict]]] = weakref.WeakKeyDictionary()


@dataclass
class Node:
    index: int
    name: str  # what tells nodes apart (the hostname, or NBSPAWN_NODE in tests)
    hostname: str
    address: str | None
    agent: int  # the engine that runs the node's ranks
    engines: list[int]
    facts: dict[str, Any] = field(repr=False, default_factory=dict)
    gpus: int = 0  # the node's GPUs, from what every engine on it sees
    cuda_visible: str | None = None  # what its ranks get as CUDA_VISIBLE_DEVICES (None: the agent's own)

    @property
    def label(self) -> str:
        return f"node {self.index} ({self.name})"


@dataclass
class ClusterPlan:
    client: Any  # ipyparallel.Client
    nodes: list[Node]
    ranks_per_node: int
    master_addr: str
    master_port: int
    start_method: str
    notes: tuple[str, ...] = ()  # what the run says about how it was planned (--backend auto passed over GPUs)

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    def node_of(self, rank: int) -> Node:
        return self.nodes[rank // self.ranks_per_node]

    def ranks_of(self, index: int) -> range:
        """The global ranks of node ``index``."""
        return range(index * self.ranks_per_node, (index + 1) * self.ranks_per_node)

    def describe(self) -> str:
        """One line: the node order, agents and addresses, as the run will use them (and listen on:
        node 0's store is bound to MASTER_ADDR, each node's gloo/NCCL sockets to its interface)."""
        parts = []
        for node in self.nodes:
            first, last = self.ranks_of(node.index)[0], self.ranks_of(node.index)[-1]
            ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
            parts.append(f"{node.label} {node.address or '-'} engine {node.agent}: {ranks}")
        head = (
            f"nbspawn: {len(self.nodes)} nodes x {self.ranks_per_node} ranks, MASTER_ADDR {self.master_addr}:{self.master_port}, "
            "listening on the node addresses below only"  # the store on node 0's, gloo/NCCL on each node's interface
        )
        return head + "; " + "; ".join(parts)


def resolve_client(name: str, namespace: dict[str, Any]) -> tuple[Any, list[int]]:
    """``--cluster NAME``: a connected ``ipyparallel.Client``, a ``Cluster``, or a ``DirectView``
    (then only its engines); returns the client and the engine ids to use."""
    hint = f"connect one first, e.g. {name} = ipp.Cluster(n=2).start_and_connect_sync()"
    if name not in namespace:
        raise SpawnUsageError(f"--cluster {name}: no such name in this kernel; {hint}")
    value = namespace[name]
    ipp = sys.modules.get("ipyparallel")
    if ipp is None:
        raise SpawnUsageError(f"--cluster {name}: a {type(value).__name__}, not an ipyparallel Client or Cluster; {hint}")
    targets: Any = None
    if isinstance(value, ipp.Cluster):
        client = _cluster_clients.get(value)
        if client is None:
            try:
                client = value.connect_client_sync()
            except Exception as err:
                raise SpawnUsageError(f"--cluster {name}: cannot connect to its controller ({err}); is it started?") from None
            _cluster_clients[value] = client
        _batch.wait_for_engines(name, value, client)  # a batch job may still be queued: say so, wait
    elif isinstance(value, ipp.Client):
        client = value
    elif isinstance(value, ipp.DirectView):
        client, targets = value.client, value.targets
    else:
        raise SpawnUsageError(
            f"--cluster {name}: a {type(value).__name__}, not an ipyparallel Client, Cluster or DirectView; {hint}"
        )
    if getattr(client, "_closed", False):
        raise SpawnUsageError(f"--cluster {name}: its client is closed; connect again")
    ids = list(client.ids)
    if targets is not None and targets != "all":
        wanted = {targets} if isinstance(targets, int) else set(targets)
        ids = [i for i in ids if i in wanted]
    if not ids:
        raise SpawnUsageError(f"--cluster {name}: no engines are registered yet; start some, or wait: {name}.wait_for_engines(n)")
    return client, ids


def controller_host(client: Any) -> str | None:
    """Where the kernel reaches the controller: a hint for engines that cannot tell themselves."""
    return _net.url_host(str(getattr(client, "_config", {}).get("registration", "") or ""))


def probe(client: Any, ids: list[int], program: ProgramLine | None, start_method: StartMethod) -> dict[int, dict]:
    """Every engine's facts, in one round trip; an engine that cannot answer is a short error."""
    cwd = os.getcwd()
    hint = controller_host(client)
    pending = {i: client[i].apply_async(_agent.probe, cwd, program, start_method, hint) for i in ids}
    facts: dict[int, dict] = {}
    for engine, result in pending.items():
        try:
            facts[engine] = result.get(timeout=PROBE_TIMEOUT)
        except Exception as err:
            raise SpawnUsageError(_probe_failure(engine, err)) from None
    return facts


def _probe_failure(engine: int, err: BaseException) -> str:
    kind = getattr(err, "ename", type(err).__name__)
    value = getattr(err, "evalue", str(err))
    if kind in ("ModuleNotFoundError", "ImportError"):
        return f"engine {engine} cannot import nbspawn ({value}): install the same nbspawn, torch and Python on every node"
    if kind == "TimeoutError":
        return f"engine {engine} did not answer within {PROBE_TIMEOUT:g} s: it is busy with another task, or gone"
    return f"engine {engine} could not be asked about its node: {kind}: {value}"


def known_facts(client: Any, ids: list[int], start_method: StartMethod) -> dict[int, dict]:
    """The engines' facts from an earlier cell if nothing changed since, else asked again."""
    key = (tuple(ids), start_method, os.getcwd())
    known = _known.get(client)
    if known is not None and known[0] == key:
        return known[1]
    facts = probe(client, ids, None, start_method)
    _known[client] = (key, facts)
    return facts


def remember_port(client: Any, agent: int, port: int | None) -> None:
    """After a run: the port node 0's agent holds for the next one (None: ask again next time)."""
    known = _known.get(client)
    if known is None:
        return
    if port is None:
        del _known[client]
    else:
        known[1][agent]["port"] = port


@dataclass(frozen=True)
class Kernel:
    """The kernel's own side of a cluster run's facts: its node (the first, where it has engines), the
    versions every node must match, and its working directory (each node's agent starts there)."""

    node: str
    versions: dict[str, str]
    cwd: str

    @classmethod
    def here(cls) -> Kernel:
        return cls(_net.node_name(), _agent.versions(), os.getcwd())


def group_nodes(facts: dict[int, dict], here: str) -> list[Node]:
    """Engines grouped by node: the kernel's node (``here``) first, then by lowest engine id; agent = lowest id."""
    by_name: dict[str, list[int]] = {}
    for engine in sorted(facts):
        by_name.setdefault(facts[engine]["node"], []).append(engine)
    order = sorted(by_name, key=lambda name: (name != here, min(by_name[name])))
    nodes = []
    for index, name in enumerate(order):
        engines = by_name[name]
        agent = engines[0]
        info = facts[agent]
        gpus, visible = gpus_of(agent, [facts[engine] for engine in engines])
        nodes.append(Node(index, name, info["hostname"], info["address"], agent, engines, info, gpus, visible))
    return nodes


def gpus_of(agent: int, engine_facts: list[dict]) -> tuple[int, str | None]:
    """A node's GPU count and its ranks' CUDA_VISIBLE_DEVICES, from all its engines (a scheduler may
    bind one GPU per engine): never one engine's own view alone.  Engines that could not count the
    machine's GPUs (no NVML, no driver /proc entries) count as what they see."""
    physical = engine_facts[0].get("physical_gpus")
    if physical is None:
        physical = max(int(f.get("gpus", 0)) for f in engine_facts)
    gpus, visible = _cuda.node_gpus([f.get("cuda_visible") for f in engine_facts], int(physical))
    agent_sees = engine_facts[0].get("cuda_visible")
    return gpus, None if visible == agent_sees else visible


def check_nodes(nodes: list[Node], mine: dict[str, str]) -> None:
    """Same Python, torch and nbspawn everywhere (and as this kernel's, ``mine``); the program exists."""
    for node in nodes:
        for what, version in mine.items():
            theirs = node.facts.get(what)
            if theirs != version:
                raise SpawnUsageError(
                    f"{node.label} has {what} {theirs}, this kernel has {version}: "
                    "install the same Python, torch and nbspawn on every node"
                )
        if node.facts.get("problem"):
            raise SpawnUsageError(f"{node.label}: {node.facts['problem']}")


def ranks_per_node(nodes: list[Node], nprocs: int | str) -> int:
    """``-n M`` is per node; ``auto``: one per GPU of each node, else up to 4 CPU ranks (all equal)."""
    if nprocs != "auto":
        return int(nprocs)
    counts = {node.label: auto_nprocs(node.gpus, node.facts["cpus"]) for node in nodes}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"{label}: {n}" for label, n in counts.items())
        raise SpawnUsageError(f"-n auto: the nodes would run different numbers of ranks ({said}); give -n")
    return next(iter(counts.values()))


def backend_on_nodes(nodes: list[Node], name: str, per_node: int) -> tuple[str, str | None]:
    """``--backend`` (read at the door) on these nodes: the one rule (``_cuda.resolve_backend``) for
    ``per_node`` ranks over the node with the fewest GPUs, which it names; and its note, if any."""
    fewest = min(nodes, key=lambda node: node.gpus)
    return _cuda.resolve_backend(name, per_node, fewest.gpus, where=f"on {fewest.label}")


def master_address(nodes: list[Node]) -> str:
    """Node 0's address the others can reach: never loopback, unless every node is this one machine."""
    first = nodes[0]
    if first.address:
        return first.address
    if len({node.facts.get("machine") for node in nodes}) == 1:
        return "127.0.0.1"  # one machine, no other interface: loopback is the right answer
    raise SpawnUsageError(
        f"{first.label} has no address the other nodes can reach (only loopback); "
        "give it a network interface, or put another node first with --nodes"
    )


def engine_facts(client: Any, ids: list[int], program: ProgramLine | None, start_method: StartMethod) -> dict[int, dict]:
    """What each engine says of its node (``_agent.probe``): asked now for a program (it is found on each
    node), else as an earlier cell heard it while nothing changed."""
    return probe(client, ids, program, start_method) if program is not None else known_facts(client, ids, start_method)


def plan_nodes(
    client: Any, facts: dict[int, dict], kernel: Kernel, *, nodes: int | None, nprocs: int | str, backend: str,
) -> tuple[ClusterPlan, str]:  # fmt: skip
    """From the engines' facts: choose the nodes and check them; the plan and the backend to use.
    Asks nothing (a unit test gives it facts)."""
    found = group_nodes(facts, kernel.node)
    if nodes is not None:
        if nodes > len(found):
            have = "; ".join(f"{n.label}: engines {','.join(map(str, n.engines))}" for n in found)
            raise SpawnUsageError(f"--nodes {nodes}: the cluster has {len(found)} node(s) ({have})")
        found = found[:nodes]
    check_nodes(found, kernel.versions)
    per_node = ranks_per_node(found, nprocs)
    chosen_backend, note = backend_on_nodes(found, backend, per_node)
    methods = {node.facts["start_method"] for node in found}
    return (
        ClusterPlan(
            client=client,
            nodes=found,
            ranks_per_node=per_node,
            master_addr=master_address(found),
            master_port=int(found[0].facts["port"]),
            start_method="/".join(sorted(methods)),
            notes=(note,) if note else (),
        ),
        chosen_backend,
    )


def companion_client(client: Any) -> Any:
    """A second client of the controller ``client`` is connected to, for nbspawn's own threads."""
    import ipyparallel as ipp

    config = dict(client._config)
    for key in ("control", "task", "mux", "iopub", "notification", "registration", "broadcast"):
        value = config.get(key)
        if isinstance(value, str) and "://" in value:  # the client turned ports into urls: back to ports
            config[key] = int(value.rsplit(":", 1)[1])
    return ipp.Client(config)


# controllers whose engines a background run holds, by registration url -> its run id: engines run
# one task at a time, so another cluster run there would wait for it, the kernel held meanwhile
_busy: dict[str, str] = {}


def controller_key(client: Any) -> str:
    return str(getattr(client, "_config", {}).get("registration", id(client)))


def refuse_if_busy(client: Any) -> None:
    """A cluster run cannot start where a background run holds the engines: said, not waited for."""
    run_id = _busy.get(controller_key(client))
    if run_id is not None:
        raise SpawnUsageError(
            f"the cluster's engines run background run {run_id} until it ends (an engine runs one task at a "
            f"time): wait for it (run.wait()), or %spawn stop {run_id}"
        )


def hold(client: Any, run_id: str) -> None:
    _busy[controller_key(client)] = run_id


def release(client: Any, run_id: str) -> None:
    if _busy.get(controller_key(client)) == run_id:
        del _busy[controller_key(client)]
