"""The one clash rule for a cell on a running world (``nbspawn._clash``), without processes: typed
values on both sides, so case, spaces and ``auto`` mean the same for every world."""

from __future__ import annotations

import pytest

from nbspawn._clash import Asked, Autos, Settled, refuse_clashes, world_clashes
from nbspawn.errors import SpawnUsageError
from nbspawn.planning._kept_cell import autos_for

WORLD = Settled(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"})
CLUSTER = Settled(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"}, nodes=2)


def never() -> int:
    raise AssertionError("auto is resolved only when a cell says auto")


def clashes(world: Settled, asked: Asked, auto_n: int | None = None, auto_backend: str | None = None) -> list[str]:
    return world_clashes(world, asked, Autos(auto_n, auto_backend))


@pytest.mark.parametrize("world", [WORLD, CLUSTER])
def test_what_the_world_already_is_is_no_clash(world):
    assert clashes(world, Asked()) == []
    assert clashes(world, Asked(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"})) == []
    assert clashes(world, Asked(start_method="auto")) == []  # auto: whatever the world started with


@pytest.mark.parametrize("world", [WORLD, CLUSTER])
def test_each_option_that_differs_is_named_as_the_user_would_write_it(world):
    asked = Asked(nprocs=3, start_method="spawn", backend="nccl", env={"A": "2", "B": "x"})
    assert clashes(world, asked) == ["-n 3", "--start-method spawn", "--backend nccl", "--env A=2 B=x"]
    assert clashes(world, Asked(env={})) == ["--env (none)"]


@pytest.mark.parametrize("world", [WORLD, CLUSTER])
def test_auto_is_what_it_comes_to_for_the_world(world):
    assert clashes(world, Asked(nprocs="auto"), auto_n=2) == []
    assert clashes(world, Asked(nprocs="auto"), auto_n=4) == ["-n auto (4)"]
    assert clashes(world, Asked(backend="auto"), auto_backend="gloo") == []
    assert clashes(world, Asked(backend="auto"), auto_backend="nccl") == ["--backend auto (nccl)"]


def test_an_auto_that_cannot_be_resolved_for_the_world_is_a_clash():
    def uneven() -> int:
        raise SpawnUsageError("-n auto: the nodes would run different numbers of ranks")

    autos = autos_for(Asked(nprocs="auto"), uneven, never)  # type: ignore[arg-type]
    assert autos == Autos(None, None)
    assert world_clashes(CLUSTER, Asked(nprocs="auto"), autos) == ["-n auto"]


def test_the_planner_asks_the_world_what_auto_comes_to_only_where_the_cell_says_auto():
    assert autos_for(Asked(nprocs=2, backend="gloo"), never, never) == Autos()  # type: ignore[arg-type]
    assert autos_for(Asked(nprocs="auto"), lambda: 4, never) == Autos(nprocs=4)  # type: ignore[arg-type]
    assert autos_for(Asked(backend="auto"), never, lambda: "nccl") == Autos(backend="nccl")


def test_nodes_clash_only_on_a_cluster_world():
    assert clashes(CLUSTER, Asked(nodes=2)) == []
    assert clashes(CLUSTER, Asked(nodes=1)) == ["--nodes 1"]
    assert clashes(WORLD, Asked(nodes=1)) == []  # a world here has no nodes (--nodes needs --cluster: refused before)


def test_the_refusal_is_one_line_that_says_how_to_go_on():
    refuse_clashes("w", "-n 2 --backend gloo", [])  # nothing to refuse
    with pytest.raises(SpawnUsageError) as err:
        refuse_clashes("w", "-n 2 --backend gloo", ["-n 3", "--backend nccl"])
    assert str(err.value) == (
        "world 'w' runs with -n 2 --backend gloo; this cell asks for -n 3, --backend nccl. "
        "Leave those options out, or %spawn stop w first."
    )
