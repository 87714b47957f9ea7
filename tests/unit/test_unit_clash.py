"""The one clash rule for a cell on a running world (``nbspawn._clash``), without processes: typed
values on both sides, so case, spaces and ``auto`` mean the same for every world."""

from __future__ import annotations

import pytest

from nbspawn._clash import Asked, Settled, refuse_clashes, world_clashes
from nbspawn.errors import SpawnUsageError

WORLD = Settled(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"})
CLUSTER = Settled(nprocs=2, start_method="fork", backend="gloo", env={"A": "1"}, nodes=2)


def never() -> int:
    raise AssertionError("auto is resolved only when a cell says auto")


def clashes(world: Settled, asked: Asked, auto_n: object = never, auto_backend: object = None) -> list[str]:
    return world_clashes(world, asked, auto_n, auto_backend or (lambda n: never()))  # type: ignore[arg-type]


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
    assert clashes(world, Asked(nprocs="auto"), auto_n=lambda: 2) == []
    assert clashes(world, Asked(nprocs="auto"), auto_n=lambda: 4) == ["-n auto (4)"]
    assert clashes(world, Asked(backend="auto"), auto_backend=lambda n: "gloo") == []
    assert clashes(world, Asked(backend="auto"), auto_backend=lambda n: "nccl" if n == 2 else "none") == ["--backend auto (nccl)"]


def test_an_auto_that_cannot_be_resolved_for_the_world_is_a_clash():
    def uneven() -> int:
        raise SpawnUsageError("-n auto: the nodes would run different numbers of ranks")

    assert clashes(CLUSTER, Asked(nprocs="auto"), auto_n=uneven) == ["-n auto"]


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
