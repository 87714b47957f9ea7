"""``--on RANKS`` without processes: the spec says which ranks run a cell and what the others are
called where a hang is explained, ``--out`` gives None for the others, and the doors refuse ``--on``
where it means nothing, each in one line. No kernel, no processes."""

from __future__ import annotations

import inspect
import pickle
from dataclasses import replace

import pytest
from IPython.core.error import UsageError

from nbspawn._api import launch
from nbspawn._dispatch import refuse_combinations
from nbspawn._magic import SpawnMagics, _parsed
from nbspawn._options import Settings
from nbspawn._rankdir import OUT
from nbspawn._request import RunRequest
from nbspawn._source import CellSource
from nbspawn._spec import Placement, RunSpec
from nbspawn.handoff._names import receive_outputs
from nbspawn.ranks._worldloop import WorldJob


def spec(on: frozenset[int] | None, nprocs: int = 4, rank_offset: int = 0, world_size: int = 0) -> RunSpec:
    place = replace(Placement.alone(), rank_offset=rank_offset, world_size=world_size)
    return RunSpec(
        run_id="r",
        nprocs=nprocs,
        start_method="fork",
        backend="gloo",
        cell=CellSource("pass"),
        run_dir="/tmp/x",
        on_ranks=on,
        placement=place,
    )


def test_the_spec_says_which_ranks_run_the_cell():
    assert [spec(None).runs(r) for r in range(4)] == [True] * 4
    assert [spec(frozenset({0, 2})).runs(r) for r in range(4)] == [True, False, True, False]
    # a node of a cluster world: its ranks are global ranks rank_offset..
    node = spec(frozenset({4}), nprocs=2, rank_offset=4, world_size=6)
    assert [node.runs(r) for r in range(2)] == [True, False]


@pytest.mark.parametrize(
    ("on", "nprocs", "said"),
    [
        (None, 4, ""),
        (frozenset({0}), 4, "ranks 1-3 do not run this cell (--on 0)"),
        (frozenset({0, 1, 3}), 4, "rank 2 does not run this cell (--on 0-1,3)"),
        (frozenset({1}), 3, "ranks 0,2 do not run this cell (--on 1)"),
    ],
)
def test_the_ranks_sitting_a_cell_out_are_named(on, nprocs, said):
    assert spec(on, nprocs).sitting_out() == said


def test_a_job_knows_its_ranks_and_travels_whole():
    job = WorldJob(CellSource("pass"), "/tmp/x", "r", asked=Settings(grace_period=1.0), on=frozenset({1}))
    assert [job.runs(r) for r in range(3)] == [False, True, False]
    assert pickle.loads(pickle.dumps(job)).on == frozenset({1})
    assert WorldJob(CellSource("pass"), "/tmp/x", "r", asked=Settings(grace_period=1.0)).runs(7)


def test_out_gives_none_for_ranks_that_did_not_run(tmp_path):
    from nbspawn.handoff import _shm

    dirs: list[str | None] = []
    for rank in range(3):
        d = tmp_path / str(rank)
        d.mkdir()
        if rank != 1:
            (d / OUT).write_bytes(_shm.dumps({"values": {"v": rank * 10}}))
        dirs.append(str(d) if rank != 1 else None)
    assert receive_outputs(dirs, ("v",)) == ({"v": [0, None, 20]}, [])


def test_on_without_a_world_is_refused_saying_why():
    with pytest.raises(
        Exception, match=r"^--on needs --world NAME: .*a fresh cell's ranks are all new.*--ranks shows only some"
    ) as caught:
        refuse_combinations(RunRequest.of(CellSource("pass"), on=frozenset({0})))
    assert "\n" not in str(caught.value)
    refuse_combinations(RunRequest.of(CellSource("pass"), on=frozenset({0}), world="w"))  # with a world: fine


def test_a_programs_parser_refuses_on():
    with pytest.raises(UsageError, match="--on does not apply to a program: a program runs on every rank it starts"):
        _parsed(SpawnMagics._program_form, "-n 2 --on 0")


def test_launch_takes_on_as_the_magic_does():
    assert "on" in inspect.signature(launch).parameters
    assert "\n    on: with --world: only these ranks run the cell" in (launch.__doc__ or "")
