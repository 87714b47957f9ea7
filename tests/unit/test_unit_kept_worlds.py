"""One kept world, wherever its ranks are (``executors._kept``): one settings text and refusal, one lost
record, one registry, one backend rule; a world here and one on a cluster's nodes, made as data (their
processes and engines are the end-to-end tests' business)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fake_machine import machine

from nbspawn import _cuda
from nbspawn._options import Given
from nbspawn._request import RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec
from nbspawn.cluster._clusterworld import ClusterWorld
from nbspawn.cluster._plan import ClusterPlan, Node, backend_on_nodes
from nbspawn.errors import SpawnUsageError
from nbspawn.executors import _kept
from nbspawn.executors._world import World
from nbspawn.planning._kept_cell import as_before, check_settings


def here(tmp_path, name: str = "w") -> World:
    spec = RunSpec(
        run_id=name, nprocs=2, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path), env={"A": "1"}
    )
    return World(name=name, spec=spec, base_dir=str(tmp_path), asked_start_method="auto")


def on_nodes(tmp_path, name: str = "cw") -> ClusterWorld:
    nodes = [Node(i, f"n{i}", f"n{i}", None, i, [i], {"cpus": 2}) for i in range(2)]
    plan = ClusterPlan(
        client=SimpleNamespace(), nodes=nodes, ranks_per_node=2, master_addr="127.0.0.1", master_port=1, start_method="fork"
    )
    spec = RunSpec(
        run_id=name, nprocs=4, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path), env={"A": "1"}
    )
    asked = RunRequest.of(CellSource("pass"), cluster="rc", nodes=2, settings=Settings(nprocs="auto", given=Given(nprocs=True)))
    return ClusterWorld(name, spec, plan, asked, Settings())


@pytest.fixture
def registry() -> Iterator[None]:
    """The registry is the process's: a test leaves it as it found it."""
    worlds, lost = dict(_kept._worlds), dict(_kept._lost)
    yield
    _kept._worlds.clear(), _kept._worlds.update(worlds)
    _kept._lost.clear(), _kept._lost.update(lost)


def test_one_settings_text_and_one_refusal_for_a_world_here_and_on_nodes(tmp_path):
    """The same options, written the same way; a cluster world adds only its --nodes."""
    assert here(tmp_path).settings() == "-n 2 --start-method fork --backend gloo --env A=1"
    assert on_nodes(tmp_path).settings() == "--nodes 2 -n 2 --start-method fork --backend gloo --env A=1"
    three = RunRequest.of(CellSource("pass"), settings=Settings(nprocs=3, given=Given(nprocs=True)))
    for world, runs_with in [
        (here(tmp_path), "-n 2 --start-method fork --backend gloo --env A=1"),
        (on_nodes(tmp_path), "--nodes 2 -n 2 --start-method fork --backend gloo --env A=1"),
    ]:
        with pytest.raises(SpawnUsageError) as refused:
            check_settings(world, three, machine())
        assert str(refused.value) == (
            f"world {world.name!r} runs with {runs_with}; this cell asks for -n 3. "
            f"Leave those options out, or %spawn stop {world.name} first."
        )


def test_status_rows_have_the_same_columns_here_and_on_nodes(tmp_path):
    local, cluster = here(tmp_path).status(), on_nodes(tmp_path).status()
    assert set(cluster) - set(local) == {"kind"} and set(local) <= set(cluster)
    assert (local["start_method"], local["state"], cluster["start_method"], cluster["state"]) == (
        "fork",
        "starting",
        "fork",
        "starting",
    )


def test_a_lost_world_is_remembered_where_it_ran_and_started_again_so(tmp_path, registry):
    local, cluster = here(tmp_path), on_nodes(tmp_path)
    _kept.keep(local)
    _kept.keep(cluster)
    assert _kept.running("w", World) is local and _kept.running("w", ClusterWorld) is None
    assert set(_kept.every_world()) == {"w", "cw"} and set(_kept.worlds(ClusterWorld)) == {"cw"}
    assert not _kept.on_a_cluster("w") and _kept.on_a_cluster("cw")

    local.lose("rank 1 died (SIGKILL)")
    cluster.lose("node 1 was lost")  # its agents are asked to stop their ranks: this client has none
    assert (local.state, local.lost_because, cluster.state) == ("lost", "rank 1 died (SIGKILL)", "lost")
    assert _kept.every_world() == {}
    assert _kept.lost("w", on_cluster=True) is None and _kept.lost("cw", on_cluster=False) is None
    assert not _kept.on_a_cluster("w") and _kept.on_a_cluster("cw")  # its next cell goes to the cluster again

    bare = RunRequest.of(CellSource("pass"), world="w")
    again_here = as_before(bare, _kept.lost("w", on_cluster=False))  # type: ignore[arg-type]
    assert (again_here.cluster, again_here.nodes, again_here.settings.nprocs, again_here.settings.start_method) == (
        None,
        None,
        2,
        "auto",  # as the user asked for it, resolved again
    )
    assert again_here.settings.backend == "gloo" and again_here.settings.env == {"A": "1"}
    again_there = as_before(bare, _kept.lost("cw", on_cluster=True))  # type: ignore[arg-type]
    assert (again_there.cluster, again_there.nodes, again_there.settings.nprocs) == ("rc", 2, "auto")

    assert _kept.stop(["w", "cw"]) == ["w", "cw"]  # a lost world stopped: forgotten, wherever it ran
    assert _kept.lost("w") is None and _kept.lost("cw") is None and not _kept.on_a_cluster("cw")
    with pytest.raises(SpawnUsageError, match="no kept world named 'w'"):
        _kept.stop(["w"])


def test_importing_the_cluster_worlds_registers_nothing():
    """A cluster world joins the one registry when its first cell starts it, not by an import."""
    code = (
        "from nbspawn.executors import _kept\n"
        "import nbspawn.cluster._clusterworld, nbspawn.planning._cluster_world\n"
        "print(len(_kept._worlds), len(_kept._lost), len(_kept._at_exit))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "0", "0"]


def node(index: int, gpus: int) -> Node:
    return Node(index, f"n{index}", f"n{index}", None, index, [index], {}, gpus=gpus)


@pytest.mark.parametrize(
    ("per_node", "gpus", "backend"),
    [(2, [2, 2], "nccl"), (2, [2, 4], "nccl"), (2, [2, 1], "gloo"), (2, [0, 4], "gloo"), (1, [0, 0], "gloo")],
)
def test_a_clusters_backend_is_the_one_rule_over_its_nodes(per_node, gpus, backend):
    """--backend auto on nodes: nccl only where every node has a GPU per rank, and the same note as here."""
    chosen, note = backend_on_nodes([node(i, n) for i, n in enumerate(gpus)], "auto", per_node)
    assert chosen == backend
    here_chosen, here_note = _cuda.resolve_backend("auto", per_node, min(gpus))
    assert chosen == here_chosen and (note is None) == (here_note is None)
    if note is not None:
        fewest = gpus.index(min(gpus))
        assert note == (
            f"nbspawn: --backend auto uses gloo: {per_node} ranks and {min(gpus)} GPU on node {fewest} (n{fewest}) "
            "(nccl needs a GPU of its own per rank)."
        )


def test_nccl_on_nodes_names_the_node_short_of_gpus():
    with pytest.raises(SpawnUsageError, match=r"^--backend nccl needs one GPU per rank: 3 ranks, 2 GPUs on node 1 \(n1\)$"):
        backend_on_nodes([node(0, 4), node(1, 2)], "nccl", 3)
    with pytest.raises(SpawnUsageError, match=r"needs CUDA GPUs and none is on node 0 \(n0\); use --backend gloo"):
        backend_on_nodes([node(0, 0), node(1, 2)], "nccl", 1)
