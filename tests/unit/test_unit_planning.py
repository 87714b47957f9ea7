"""The planners (``nbspawn.planning``) without processes: a typed request (as the door makes it) and
this machine's, a world's or the nodes' facts become a plan (a frozen spec, its executor's kind, the
effects it needs), or one line of refusal.  Nothing is started: a fresh cell's and a program's plan is
carried out here (a port reserved, --share moved) but no rank started, a world and a cluster world are
made as data (their processes and engines are the end-to-end tests' business)."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import pytest

from nbspawn import _listen
from nbspawn._effects import carry_out
from nbspawn._options import Given
from nbspawn._program import read_program_line
from nbspawn._request import Cell, OnClusterWorld, RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec
from nbspawn.cluster._clusterworld import ClusterWorld
from nbspawn.cluster._plan import ClusterPlan, Node
from nbspawn.errors import SpawnUsageError
from nbspawn.executors import _world as _world_executor
from nbspawn.executors._fresh import FreshRanks
from nbspawn.executors._program import ProgramRanks
from nbspawn.executors._world import World
from nbspawn.planning import _world
from nbspawn.planning._cluster import settled_for_nodes
from nbspawn.planning._fresh import plan_fresh_cell, plan_program
from nbspawn.planning._kept_cell import check_settings


def test_a_fresh_cell_is_planned_from_typed_settings(tmp_path):
    names = {"x": 1}
    settings = Settings(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"}, timeout=3.0, log_dir=str(tmp_path))
    request = RunRequest.of(CellSource("y = x"), settings=settings, namespace=names, out=("y",))
    spec, executor = carry_out(plan_fresh_cell(request, request.work))
    _listen.release(spec.master_port)
    assert isinstance(executor, FreshRanks) and executor.spec is spec
    assert (spec.nprocs, spec.start_method, spec.backend, spec.env, spec.asked.timeout) == (2, "fork", "gloo", {"A": "1"}, 3.0)
    assert spec.namespace is names and spec.namespace_payload is None  # fork: the kernel's own names
    assert spec.out_names == ("y",) and spec.shm_prefix  # --out: a place for the values to come back
    assert spec.run_dir.startswith(str(tmp_path))


def test_a_fresh_cell_under_spawn_is_sent_the_names_it_uses_by_value(tmp_path):
    settings = Settings(nprocs=1, start_method="spawn", log_dir=str(tmp_path))
    request = RunRequest.of(CellSource("print(x)"), settings=settings, namespace={"x": 1, "unused": 2})
    spec, _ = carry_out(plan_fresh_cell(request, request.work))
    _listen.release(spec.master_port)
    assert spec.namespace is None and spec.namespace_payload is not None


def test_ranks_shown_are_checked_against_the_runs_size_by_its_planner(tmp_path):
    settings = Settings(nprocs=2, ranks=frozenset({5}), log_dir=str(tmp_path / "logs"))
    with pytest.raises(SpawnUsageError, match=r"--ranks: rank 5 does not exist in a run of 2 ranks \(0-1\)"):
        plan_fresh_cell(RunRequest(Cell(CellSource("pass")), settings=settings), Cell(CellSource("pass")))
    assert not (tmp_path / "logs").exists()


def test_a_program_is_planned_as_a_new_process_per_rank(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    settings = Settings(nprocs=2, log_dir=str(tmp_path))
    line = read_program_line(["train.py", "--lr", "0.1"])
    spec, executor = carry_out(plan_program(RunRequest.of(line, settings=settings), line))
    _listen.release(spec.master_port)
    assert isinstance(executor, ProgramRanks)
    assert (spec.nprocs, spec.start_method, spec.backend, spec.asked.pdb) == (2, "spawn", "none", False)
    assert spec.program is not None and "train.py" in str(spec.program)


@pytest.mark.parametrize(
    ("on", "shown", "expected"),
    [(None, None, None), (frozenset({0, 1, 2, 3}), None, None), (frozenset({0, 2}), frozenset({2}), frozenset({0, 2}))],
)
def test_a_cells_ranks_on_a_world(on, shown, expected):
    assert _world.cell_ranks(on, shown, 4, "w") == expected


def test_ranks_shown_must_run_the_cell_and_exist_in_the_world():
    with pytest.raises(SpawnUsageError, match=r"--ranks 1: rank 1 does not run this cell \(--on 0\)"):
        _world.cell_ranks(frozenset({0}), frozenset({1}), 4, "w")
    with pytest.raises(SpawnUsageError, match="--on: rank 4 does not exist in world 'w' of 4 ranks"):
        _world.cell_ranks(frozenset({4}), None, 4, "w")


def local_world(tmp_path) -> World:
    spec = RunSpec(
        run_id="w", nprocs=2, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path), env={"A": "1"}
    )
    return World(name="w", spec=spec, base_dir=str(tmp_path))


def cluster_world(tmp_path) -> ClusterWorld:
    nodes = [Node(i, f"n{i}", f"n{i}", None, i, [i], {"cpus": 2}) for i in range(2)]
    plan = ClusterPlan(
        client=SimpleNamespace(), nodes=nodes, ranks_per_node=2, master_addr="127.0.0.1", master_port=1, start_method="fork"
    )
    spec = RunSpec(
        run_id="w", nprocs=4, start_method="fork", backend="gloo", cell=CellSource("pass"), run_dir=str(tmp_path), env={"A": "1"}
    )
    return ClusterWorld("w", spec, plan, RunRequest.of(CellSource("pass"), cluster="rc"), Settings())


ALL = Given(nprocs=True, start_method=True, backend=True, env=True)


@pytest.mark.parametrize("which", ["local", "cluster"])
def test_a_world_that_runs_is_checked_by_the_one_rule(tmp_path, which):
    """The same typed cell on a world here and on a cluster world of the same settings: one answer."""
    same = Settings(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"}, given=ALL)
    other = Settings(nprocs=3, backend="nccl", given=Given(nprocs=True, backend=True))
    world = local_world(tmp_path) if which == "local" else cluster_world(tmp_path)
    check_settings(world, RunRequest.of(CellSource("pass"), settings=same))
    with pytest.raises(SpawnUsageError, match=r"this cell asks for -n 3, --backend nccl\. Leave those"):
        check_settings(world, RunRequest.of(CellSource("pass"), settings=other))


def test_a_cluster_worlds_auto_is_what_its_nodes_come_to(tmp_path):
    cworld = cluster_world(tmp_path)  # two nodes of 2 CPUs, no GPU: -n auto is 2 a node, --backend auto gloo
    auto = Settings(nprocs="auto", backend="auto", given=Given(nprocs=True, backend=True))
    check_settings(cworld, RunRequest.of(CellSource("pass"), settings=auto))
    with pytest.raises(SpawnUsageError, match=r"this cell asks for --nodes 1\. Leave"):
        check_settings(cworld, RunRequest(Cell(CellSource("pass")), OnClusterWorld("w", nodes=1)))


def test_every_setting_given_in_the_kernel_reaches_a_clusters_nodes():
    """A cluster run's nodes start their ranks with the kernel's settings: every one reaches them as it
    was given (--xray once did not: the nodes' settings were written field by field), but what the kernel
    settles for the nodes or keeps for itself."""
    kernel = Settings(
        nprocs=3,
        start_method="forkserver",
        backend="gloo",
        accelerator="none",
        env={"A": "1"},
        timeout=9.0,
        grace_period=0.5,
        log_dir="/tmp/logs",
        ranks=frozenset({1}),
        max_saved_kb=7,
        max_image_kb=100,
        pdb=True,
        rank_niceness=4,
        xray="values",
        given=Given(nprocs=True, env=True),
    )
    unset = [f.name for f in fields(Settings) if getattr(kernel, f.name) == getattr(Settings(), f.name)]
    assert not unset, f"give {unset} a value of their own here, so the test sees them reach the nodes"
    node = settled_for_nodes(kernel, ranks_per_node=2, start_method="spawn", backend="nccl", nodes=4)
    settled = {
        "nprocs": 2,
        "start_method": "spawn",
        "backend": "nccl",
        "max_image_kb": 25,
        "timeout": None,
        "ranks": None,
        "pdb": False,
    }
    reached = {f.name: getattr(node, f.name) for f in fields(Settings)}
    assert reached == {f.name: settled.get(f.name, getattr(kernel, f.name)) for f in fields(Settings)}


def test_run_ids_are_never_the_same_twice_even_when_chance_repeats_itself(monkeypatch):
    """A kept world's cells share one directory: two of its cells in one second once drew the same
    id (16 random bits) and the second could not write its logs.  Chance repeating is forced here."""
    from nbspawn import _spec

    draws = iter(["abcdef", "abcdef", "abcdef", "123456"])
    monkeypatch.setattr(_spec.secrets, "token_hex", lambda n: next(draws))
    monkeypatch.setattr(_spec.time, "strftime", lambda fmt: "20261126-035250")
    first, second = _spec.new_run_id(), _spec.new_run_id()
    assert (first, second) == ("20261126-035250-abcdef", "20261126-035250-123456")


def test_each_executor_says_once_how_the_supervisor_treats_its_ranks():
    """Kept worlds' ranks outlive the cell wherever they run (a node's part of a world too: it once
    lost its keep and its ranks were killed at a failure); a node's agent watches closely and leaves
    hang looks to the kernel; a cluster's ranks are remote."""
    from nbspawn.cluster import _agent, _nodeworld
    from nbspawn.cluster._clusterworld import ClusterWorldCell
    from nbspawn.cluster._executor import ClusterRanks

    keeps = {
        cls: cls.supervision.keeps_ranks
        for cls in (
            FreshRanks,
            ProgramRanks,
            _world_executor.WorldCell,
            _nodeworld._NodeWorldCell,
            ClusterRanks,
            ClusterWorldCell,
        )
    }
    assert keeps == {
        FreshRanks: False,
        ProgramRanks: False,
        _world_executor.WorldCell: True,
        _nodeworld._NodeWorldCell: True,
        ClusterRanks: False,
        ClusterWorldCell: True,
    }
    agents = (_agent._NodeCellRanks, _agent._NodeProgramRanks, _nodeworld._NodeWorldCell)
    assert all(not cls.supervision.watches_hangs and cls.supervision.poll_max < FreshRanks.supervision.poll_max for cls in agents)
    assert (
        ClusterRanks.supervision.remote
        and ClusterWorldCell.supervision.remote
        and not _nodeworld._NodeWorldCell.supervision.remote
    )
