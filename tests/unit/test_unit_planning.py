"""The planners (``nbspawn.planning``) without processes: a typed request (as the door makes it) and
this machine's, a world's or the nodes' facts become a plan (a frozen spec, its executor's kind, the
effects it needs), or one line of refusal.  Nothing is started: a fresh cell's and a program's plan is
carried out here (a port reserved, --share moved) but no rank started, a world and a cluster world are
made as data (their processes and engines are the end-to-end tests' business)."""

from __future__ import annotations

import os
from dataclasses import fields, replace
from types import SimpleNamespace
from typing import Any

import pytest
from fake_machine import KERNEL, TWO_NODES, machine

from nbspawn import _listen
from nbspawn._effects import carry_out
from nbspawn._options import Given
from nbspawn._program import read_program_line
from nbspawn._request import Cell, OnCluster, OnClusterWorld, OnWorld, RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn._spec import RunSpec
from nbspawn.cluster._clusterworld import ClusterWorld
from nbspawn.cluster._plan import ClusterPlan, Node
from nbspawn.errors import SpawnUsageError
from nbspawn.executors import _world as _world_executor
from nbspawn.executors._fresh import FreshRanks
from nbspawn.executors._kept import Lost
from nbspawn.executors._program import ProgramRanks
from nbspawn.executors._world import World
from nbspawn.planning import _world
from nbspawn.planning._cluster import plan_cluster_on, settled_for_nodes
from nbspawn.planning._cluster_world import cluster_world_cell, new_cluster_world
from nbspawn.planning._fresh import plan_fresh_cell, plan_program
from nbspawn.planning._kept_cell import check_settings
from nbspawn.planning._plans import NewClusterWorld, NewWorld
from nbspawn.planning._world import plan_world_cell_on


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
    check_settings(world, RunRequest.of(CellSource("pass"), settings=same), machine())
    with pytest.raises(SpawnUsageError, match=r"this cell asks for -n 3, --backend nccl\. Leave those"):
        check_settings(world, RunRequest.of(CellSource("pass"), settings=other), machine())


def test_a_cluster_worlds_auto_is_what_its_nodes_come_to(tmp_path):
    cworld = cluster_world(tmp_path)  # two nodes of 2 CPUs, no GPU: -n auto is 2 a node, --backend auto gloo
    auto = Settings(nprocs="auto", backend="auto", given=Given(nprocs=True, backend=True))
    big = machine(cpus=64, gpus=8)  # this machine: its facts do not count, the nodes' do
    check_settings(cworld, RunRequest.of(CellSource("pass"), settings=auto), big)
    with pytest.raises(SpawnUsageError, match=r"this cell asks for --nodes 1\. Leave"):
        check_settings(cworld, RunRequest(Cell(CellSource("pass")), OnClusterWorld("w", nodes=1)), machine())


# -- the world planners on fake facts: a world made as data, a machine told its facts, no process ------


def world_cell(source: str = "pass", *, on: frozenset[int] | None = None, **settings: Any) -> RunRequest:
    """A cell on world ``w`` as the door reads it (the options given are marked given)."""
    given = Given(**{k: True for k in ("nprocs", "start_method", "backend", "env") if k in settings})
    return RunRequest.of(CellSource(source), world="w", on=on, settings=Settings(**settings, given=given), namespace={"x": 1})


def test_a_new_world_is_planned_on_the_machines_facts(tmp_path):
    request = world_cell("y = x", nprocs="auto", backend="auto", log_dir=str(tmp_path))
    plan = plan_world_cell_on(request, request.work, request.target, None, None, machine(cpus=8))
    assert isinstance(plan.world, NewWorld) and plan.world.asked_start_method == "auto"
    spec = plan.world.spec
    assert (spec.nprocs, spec.start_method, spec.backend, spec.omp_threads) == (4, "fork", "gloo", 2)  # auto: 4 of 8 cores
    assert plan.part.run_dir.startswith(str(tmp_path)) and plan.part.run_id != spec.run_id  # beside the world's own
    assert plan.job.names is not None and plan.bound == {"y"}
    gpus = machine(cpus=32, gpus=2)  # one rank per GPU, on NCCL
    spec = plan_world_cell_on(request, request.work, request.target, None, None, gpus).world.spec  # type: ignore[union-attr]
    assert (spec.nprocs, spec.backend, spec.omp_threads) == (2, "nccl", 16)


def test_a_lost_world_starts_again_as_it_ran_deciding_auto_on_the_facts_now(tmp_path):
    lost = Lost("rank 1 died", Settings(nprocs=2, start_method="auto", backend="gloo", env={"A": "1"}, log_dir=str(tmp_path)))
    request = world_cell(timeout=5.0)
    blocked = machine(cpus=4, fork_blocker="CUDA is initialized in this kernel")  # since it was lost
    plan = plan_world_cell_on(request, request.work, request.target, None, lost, blocked)
    spec = plan.world.spec  # type: ignore[union-attr]
    assert (spec.nprocs, spec.start_method, spec.backend, spec.env) == (2, "forkserver", "gloo", {"A": "1"})
    assert plan.part.asked.timeout == 5.0  # the cell's own option stands
    assert plan.part.notes[-1].startswith(
        "nbspawn: world 'w' was lost (rank 1 died); this cell starts a new one with its settings "
        "(-n 2 --start-method forkserver --backend gloo --env A=1)"
    )


def test_a_cell_on_a_running_world_takes_the_worlds_spec_and_brings_its_own_options(tmp_path):
    world = local_world(tmp_path)
    request = world_cell("y = x", on=frozenset({1}), ranks=frozenset({1}), timeout=3.0, nprocs=2, env={"A": "1"})
    plan = plan_world_cell_on(request, request.work, request.target, world, None, machine())
    assert plan.world is world and plan.part.notes == ()
    assert (plan.part.on_ranks, plan.part.shown_ranks, plan.part.asked.timeout) == ({1}, {1}, 3.0)
    assert os.path.dirname(plan.part.run_dir) == os.path.dirname(world.spec.run_dir)  # the world's cells side by side
    assert (plan.job.on, plan.job.asked, plan.job.run_dir) == ({1}, plan.part.asked, plan.part.run_dir)
    with pytest.raises(SpawnUsageError, match=r"this cell asks for -n 3\. Leave"):
        plan_world_cell_on(world_cell(nprocs=3), Cell(CellSource("pass")), OnWorld("w"), world, None, machine())
    with pytest.raises(SpawnUsageError, match="--on: rank 2 does not exist in world 'w' of 2 ranks"):
        plan_world_cell_on(
            world_cell(on=frozenset({2})), Cell(CellSource("pass")), OnWorld("w", frozenset({2})), world, None, machine()
        )


@pytest.mark.parametrize(("cpus", "refused"), [(8, False), (2, True)])
def test_auto_on_a_running_world_is_counted_on_the_facts_of_its_machine(tmp_path, cpus, refused):
    """A world of 4 ranks: a later cell's -n auto is 4 on 8 cores, 2 on 2 (refused, naming what it came to)."""
    world = World(name="w", spec=replace(local_world(tmp_path).spec, nprocs=4), base_dir=str(tmp_path))
    request = world_cell(nprocs="auto")
    if not refused:
        plan_world_cell_on(request, request.work, request.target, world, None, machine(cpus=cpus))
        return
    with pytest.raises(SpawnUsageError, match=r"this cell asks for -n auto \(2\)\. Leave"):
        plan_world_cell_on(request, request.work, request.target, world, None, machine(cpus=cpus))


def test_every_setting_given_on_a_worlds_later_cell_reaches_its_ranks(tmp_path):
    """The twin of the cluster guard below, for a world here: every option the cell gives (but the four
    that define the world, its own) reaches the job its ranks are sent, as it was given."""
    world = local_world(tmp_path)
    cell = Settings(
        nprocs=2, start_method="fork", backend="gloo", accelerator="none", env={"A": "1"}, timeout=9.0, grace_period=0.5,
        log_dir="/tmp/logs", ranks=frozenset({1}), max_saved_kb=7, max_image_kb=100, pdb=True, rank_niceness=4,
        xray="values", given=ALL,
    )  # fmt: skip
    unset = [f.name for f in fields(Settings) if getattr(cell, f.name) == getattr(Settings(), f.name)]
    assert not unset, f"give {unset} a value of their own here, so the test sees them reach the ranks"
    request = RunRequest.of(CellSource("pass"), world="w", settings=cell)
    plan = plan_world_cell_on(request, request.work, request.target, world, None, machine())
    reached = {f.name: getattr(plan.job.asked, f.name) for f in fields(Settings)}
    assert reached == {f.name: getattr(cell, f.name) for f in fields(Settings)}


def test_a_later_cell_on_a_cluster_world_is_planned_from_the_world_as_data(tmp_path):
    """As the dispatch sends it: a later cell names the world only (``--cluster`` is the world's)."""
    cworld = replace(cluster_world(tmp_path), node_settings=Settings(nprocs=2, start_method="fork", backend="gloo"))
    settings = Settings(timeout=4.0, xray="values")
    cell = RunRequest.of(CellSource("y = x"), world="w", on=frozenset({0, 3}), settings=settings, namespace={"x": 1})
    request = cell.placed(None, None)
    plan = cluster_world_cell(request, request.work, request.target, cworld, machine(), cwd="/home/me/project")
    assert plan.world is cworld and (plan.spec.nprocs, plan.spec.asked.timeout, plan.spec.on_ranks) == (4, 4.0, {0, 3})
    job = plan.job
    assert (job["cwd"], job["on"], job["settings"].nprocs, job["settings"].xray) == ("/home/me/project", [0, 3], 2, "values")
    assert job["settings"].timeout is None and job["names"]  # the kernel keeps the time; x is sent by value
    share = RunRequest.of(CellSource("pass"), world="w", share=("x",), namespace={"x": 1}).placed(None, None)
    with pytest.raises(SpawnUsageError, match="--share does not work on a cluster"):
        cluster_world_cell(share, share.work, share.target, cworld, machine(), cwd="/")


def test_a_new_cluster_world_is_the_cluster_run_planned_on_its_nodes_facts():
    request = RunRequest.of(CellSource("print(1)"), world="w", cluster="rc", settings=Settings(nprocs=2, backend="gloo"))
    fresh = plan_cluster_on(request, request.work, OnCluster("rc"), object(), TWO_NODES, KERNEL)
    plan = new_cluster_world("w", fresh, request, frozenset({3}), ("nbspawn: world 'w' was lost",))
    assert isinstance(plan.world, NewClusterWorld) and plan.world.spec.nprocs == 4 and plan.world.asked is request
    assert (plan.spec.on_ranks, plan.job["on"], plan.spec.notes[-1]) == ({3}, [3], "nbspawn: world 'w' was lost")
    assert plan.world.node_settings.nprocs == 2  # each node's ranks
    with pytest.raises(SpawnUsageError, match="--on: rank 4 does not exist in world 'w' of 4 ranks"):
        new_cluster_world("w", fresh, request, frozenset({4}), ())


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


def test_a_spec_is_constructed_in_one_place():
    """Every planner (fresh cells, programs, worlds, a cluster run's kernel, a node's agent) makes its
    spec through ``_spec.spec_of``: a ``RunSpec(...)`` written anywhere else is a second, hand-built
    constructor that a new field of the spec would miss."""
    import ast
    import pathlib

    import nbspawn

    root = pathlib.Path(nbspawn.__file__).parent
    where = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for call in ast.walk(node):
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "RunSpec":
                        where.append(f"{path.relative_to(root)}:{node.name}")
    assert where == ["_spec.py:spec_of"]


@pytest.mark.parametrize(
    ("xray", "program", "expected"),
    [
        ("on", None, (True, False)),
        ("values", None, (True, True)),
        ("off", None, (False, False)),
        ("values", "train.py", (True, False)),  # a Python program: from its first group, no values
        ("on", "/bin/true", (False, False)),  # an executable: nothing of nbspawn's runs in it
    ],
)
def test_one_x_ray_rule_for_a_fresh_cell_a_program_and_a_worlds_cell(tmp_path, monkeypatch, xray, program, expected):
    from nbspawn._program import locate
    from nbspawn._spec import cell_xray

    if program == "train.py":
        (tmp_path / "train.py").write_text("pass\n")
        monkeypatch.chdir(tmp_path)
    found = locate(read_program_line([program])) if program else None
    assert cell_xray(Settings(xray=xray), found) == expected
    spec = RunSpec(run_id="r", nprocs=1, start_method="spawn", backend="none", cell=CellSource("pass"), run_dir="/x")
    spec = replace(spec, asked=Settings(xray=xray), program=found)
    assert (spec.xrayed, spec.xray_values) == expected  # the spec's answer is the rule's


def test_a_cells_own_variables_are_the_same_for_every_kind_of_rank():
    """A fresh rank and a kept world's set them as each cell begins (``ranks._cell.begin_cell``), a
    program's rank starts with them: the same function, so a later cell's are its own."""
    from nbspawn._program import locate
    from nbspawn._spec import cell_env

    spec = RunSpec(run_id="r", nprocs=2, start_method="fork", backend="none", cell=CellSource("pass"), run_dir="/runs/r")
    assert cell_env(spec.asked, spec.rank_dir(1)) == {"TORCHELASTIC_ERROR_FILE": "/runs/r/1/error.json"}
    # a cell's rank (fresh, or a world's, whose start is its first cell's) has them from begin_cell only, so a
    # world's later cell that does not set one never reads its first cell's
    assert "TORCHELASTIC_ERROR_FILE" not in spec.own_env(1)
    program = replace(spec, program=locate(read_program_line(["/bin/true"])))
    assert program.own_env(1)["TORCHELASTIC_ERROR_FILE"] == "/runs/r/1/error.json"  # a program's rank begins no cell


def test_a_variable_a_later_cell_does_not_set_is_as_it_was_before_any_cell_set_it():
    """A kept world's rank: cell 1 sets X (over the kernel's), cell 2 sets it again, cell 3 does not:
    it reads the kernel's value again, never cell 2's; Y, which only cell 2 set, is gone after it."""
    from nbspawn.ranks._cell import CellVariables

    environ = {"X": "kernel", "PATH": "/bin"}
    cells = CellVariables()
    cells.set({"X": "1"}, environ)
    assert environ == {"X": "1", "PATH": "/bin"}
    cells.set({"X": "2", "Y": "y"}, environ)
    assert environ == {"X": "2", "Y": "y", "PATH": "/bin"}
    cells.set({}, environ)
    assert environ == {"X": "kernel", "PATH": "/bin"}


def test_a_row_that_defines_a_world_is_checked_kept_and_restored_by_its_row_alone(tmp_path, monkeypatch):
    """A world-defining option needs no place in the clash rule, the settings text, a lost world's
    record or its restart: ``--timeout`` stands in for a new such row here (it is a cell's own option)."""
    from nbspawn import _clash, _options
    from nbspawn.planning import _kept_cell

    defining = (*_options.WORLD_DEFINING, "timeout")
    for module in (_options, _kept_cell):
        monkeypatch.setattr(module, "WORLD_DEFINING", defining)
    monkeypatch.setattr(_clash, "OTHERS", ("timeout",))
    world = local_world(tmp_path)
    world = World(name="w", spec=replace(world.spec, asked=Settings(timeout=5.0)), base_dir=str(tmp_path))
    assert world.settings() == "-n 2 --start-method fork --backend gloo --env A=1 --timeout 5.0"
    same = RunRequest.of(CellSource("pass"), world="w", settings=Settings(timeout=5.0, given=Given(timeout=True)))
    check_settings(world, same, machine())
    other = RunRequest.of(CellSource("pass"), world="w", settings=Settings(timeout=7.0, given=Given(timeout=True)))
    with pytest.raises(SpawnUsageError, match=r"this cell asks for --timeout 7\.0\. Leave those"):
        check_settings(world, other, machine())
    lost = world.lost_record("rank 0 died")
    assert lost.settings.timeout == 5.0
    assert _kept_cell.as_before(RunRequest.of(CellSource("pass"), world="w"), lost).settings.timeout == 5.0
    assert _kept_cell.as_before(other, lost).settings.timeout == 7.0  # the cell's own, given
