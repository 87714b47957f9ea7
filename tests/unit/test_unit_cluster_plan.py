"""A cluster run planned from what its engines said (``planning._cluster.plan_cluster_on``), on fake
engines' facts: no controller, no engine, no network namespace, no root.  The facts are what
``cluster._agent.probe`` answers; the kernel's side (its node, versions, directory) is given too."""

from __future__ import annotations

from typing import Any

import pytest
from fake_machine import KERNEL, TWO_NODES, engine

from nbspawn._request import OnCluster, RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn.errors import SpawnUsageError
from nbspawn.planning._cluster import plan_cluster_on


def plan(facts: dict[int, dict], *, nodes: int | None = None, source: str = "print(1)", **settings: Any):
    request = RunRequest.of(CellSource(source), cluster="rc", nodes=nodes, settings=Settings(**settings))
    return plan_cluster_on(request, request.work, OnCluster("rc", nodes), object(), facts, KERNEL)


def test_ranks_per_node_on_two_nodes_make_one_world_stored_on_node_0():
    run = plan(TWO_NODES, nprocs=2, backend="gloo")
    spec, nodes, job = run.spec, run.nodes, run.job
    assert [(n.index, n.name, n.agent, n.engines) for n in nodes.nodes] == [(0, "a", 0, [0, 1]), (1, "b", 2, [2, 3])]
    assert (spec.nprocs, spec.world_size, spec.nnodes, spec.backend) == (4, 4, 2, "gloo")
    assert (spec.master_addr, spec.master_port) == ("10.0.0.1", 29511)  # node 0's address and the port its agent holds
    assert job["settings"].nprocs == 2 and job["settings"].start_method == "auto" and job["cwd"] == "/home/me/project"
    assert job["settings"].pdb is False and job["settings"].timeout is None  # the kernel keeps them


def test_the_kernels_node_comes_first_whatever_the_engine_ids():
    facts = {0: engine("b"), 1: engine("a"), 2: engine("a")}
    assert [n.name for n in plan(facts, nprocs=1).nodes.nodes] == ["a", "b"]


def test_auto_is_one_rank_per_gpu_and_nccl_when_every_node_has_them():
    facts = {0: engine("a", gpus=2), 1: engine("b", gpus=2)}
    run = plan(facts, nprocs="auto", backend="auto")
    assert (run.nodes.ranks_per_node, run.spec.nprocs, run.spec.backend) == (2, 4, "nccl")


def test_auto_over_uneven_nodes_is_refused_naming_each():
    facts = {0: engine("a", cpus=8), 1: engine("b", cpus=2)}
    with pytest.raises(SpawnUsageError, match=r"different numbers of ranks \(node 0 \(a\): 4, node 1 \(b\): 2\)"):
        plan(facts, nprocs="auto")


def test_the_node_with_fewest_gpus_decides_the_backend_and_is_named():
    facts = {0: engine("a", gpus=2), 1: engine("b", gpus=1)}
    run = plan(facts, nprocs=2, backend="auto")
    assert run.spec.backend == "gloo" and "on node 1 (b)" in run.spec.notes[0]


def test_a_node_on_other_versions_is_refused():
    facts = {0: engine("a"), 1: engine("b", torch="2.12.0")}
    with pytest.raises(SpawnUsageError, match=r"node 1 \(b\) has torch 2.12.0, this kernel has 2.13.0"):
        plan(facts, nprocs=1)


def test_more_nodes_than_the_cluster_has_are_refused():
    with pytest.raises(SpawnUsageError, match="--nodes 3: the cluster has 2 node"):
        plan(TWO_NODES, nodes=3, nprocs=1)


def test_nodes_limits_the_run_to_the_first_ones():
    run = plan(TWO_NODES, nodes=1, nprocs=3)
    assert (run.spec.nprocs, run.spec.nnodes, len(run.nodes.nodes)) == (3, 1, 1)


def test_node_0_without_a_reachable_address_is_refused_unless_every_node_is_one_machine():
    facts = {0: engine("a", address=""), 1: engine("b")}
    facts[0]["address"] = None
    with pytest.raises(SpawnUsageError, match="no address the other nodes can reach"):
        plan(facts, nprocs=1)
    same = {0: {**facts[0], "machine": "one"}, 1: {**facts[1], "machine": "one"}}
    assert plan(same, nprocs=1).spec.master_addr == "127.0.0.1"


def test_the_image_budget_is_shared_by_the_nodes_and_every_other_option_reaches_them():
    run = plan(TWO_NODES, nprocs=1, max_image_kb=4000, grace_period=7.5, xray="values")
    node = run.job["settings"]
    assert (node.max_image_kb, node.grace_period, node.xray) == (2000, 7.5, "values")
