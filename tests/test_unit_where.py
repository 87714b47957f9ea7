"""The hang verdict and the grouping of ``%spawn where``, from stacks as faulthandler and the cell-line
rewriting give them. No kernel, no processes."""

from __future__ import annotations

from nbspawn._source import STILL_STARTING
from nbspawn.events._where import SETTLED, RankToAsk, await_dumps, describe, hang_verdict, live_notes

BARRIER = (
    "  Cell In[3], line 4\n      dist.barrier()\n"
    '  File "/x/torch/distributed/c10d_logger.py", line 83 in wrapper\n'
    '  File "/x/torch/distributed/distributed_c10d.py", line 5356 in barrier'
)
SLEEP = "  Cell In[3], line 6\n      time.sleep(300)"
ALL_REDUCE = (
    '  Cell In[3], line 8\n      dist.all_reduce(t)\n  File "/x/torch/distributed/distributed_c10d.py", line 3000 in all_reduce'
)


def test_a_rank_that_never_entered_the_collective():
    assert hang_verdict({0: BARRIER, 1: BARRIER, 2: SLEEP, 3: BARRIER}) == (
        "rank 2 never entered barrier (it is at Cell In[3], line 6: time.sleep(300)); "
        "ranks 0-1,3 waited in it at Cell In[3], line 4: dist.barrier()"
    )


def test_ranks_elsewhere_in_several_places_are_each_named():
    other = "  Cell In[3], line 9\n      load()"
    verdict = hang_verdict({0: BARRIER, 1: SLEEP, 2: other, 3: SLEEP})
    assert verdict is not None
    assert verdict.startswith("ranks 1-3 never entered barrier (ranks 1,3 at Cell In[3], line 6: time.sleep(300); ")
    assert "rank 2 at Cell In[3], line 9: load()" in verdict


def test_different_collectives_are_a_mismatch():
    assert hang_verdict({0: ALL_REDUCE, 1: BARRIER}) == (
        "the ranks were in different collectives: rank 0 in all_reduce (Cell In[3], line 8: dist.all_reduce(t)); "
        "rank 1 in barrier (Cell In[3], line 4: dist.barrier())"
    )


def test_no_verdict_when_the_places_say_nothing():
    assert hang_verdict({0: BARRIER, 1: BARRIER}) is None  # all in it: stuck for another reason (a dead peer, slowness)
    assert hang_verdict({0: SLEEP, 1: SLEEP}) is None  # no collective
    assert hang_verdict({0: STILL_STARTING, 1: BARRIER}) is None  # a rank still starting is not evidence
    assert hang_verdict({}) is None


def test_where_groups_ranks_at_one_place_under_one_headline(tmp_path):
    asked = [RankToAsk(r, None, str(tmp_path / f"{r}.log")) for r in range(4)]
    dumps = {
        0: 'Current thread 0x01 (most recent call first):\n  File "/x/torch/distributed/distributed_c10d.py", line 5356 in barrier\n'
        '  File "<nbspawn-cell>", line 4 in <module>\n  File "/n/ranks/_cell.py", line 90 in execute_cell\n',
        1: None,
    }
    dumps[2] = dumps[0]
    dumps[3] = dumps[0]
    text = describe(asked, dumps, None)
    lines = text.splitlines()
    assert lines[0] == "ranks 0,2-3: Cell, line 4  (in barrier, distributed_c10d.py)"
    assert "rank 1: no answer: it is not running, or not yet listening" in text


# -- --on: ranks that do not run the cell ---------------------------------------------------------

OUT = "ranks 1-3 do not run this cell (--on 0)"


def test_a_collective_waiting_only_for_ranks_that_do_not_run_the_cell_is_a_hang_that_says_so():
    assert hang_verdict({0: BARRIER}, sitting_out=OUT) == (
        "rank 0 waited in barrier at Cell In[3], line 4: dist.barrier(); ranks 1-3 do not run this cell (--on 0)"
    )
    entries = {0: [{"op": "barrier", "seq": 3, "issued": 100.0, "sizes": []}]}
    assert hang_verdict({0: BARRIER}, entries, now=125.0, sitting_out=OUT) == (
        "rank 0 waited in barrier #3 for 25 s at Cell In[3], line 4: dist.barrier(); " + OUT
    )


def test_ranks_that_never_entered_are_told_apart_from_ranks_that_do_not_run_the_cell():
    verdict = hang_verdict({0: BARRIER, 1: SLEEP}, sitting_out="ranks 2-3 do not run this cell (--on 0-1)")
    assert verdict == (
        "rank 1 never entered barrier (it is at Cell In[3], line 6: time.sleep(300)); "
        "rank 0 waited in it at Cell In[3], line 4: dist.barrier(); ranks 2-3 do not run this cell (--on 0-1)"
    )


def test_no_collective_no_verdict_even_with_ranks_sitting_out():
    assert hang_verdict({0: SLEEP}, sitting_out=OUT) is None


def test_live_notes_name_the_ranks_that_do_not_run_the_cell():
    assert live_notes({0: BARRIER, 1: BARRIER}) == {}  # all in it, nobody absent: nothing to say
    notes = live_notes({0: BARRIER}, sitting_out=OUT)
    assert notes == {0: "waiting in barrier; ranks 1-3 do not run this cell (--on 0)"}
    notes = live_notes({0: BARRIER, 1: SLEEP}, sitting_out="rank 2 does not run this cell (--on 0-1)")
    assert notes[0] == "waiting in barrier; rank 1 has not entered it; rank 2 does not run this cell (--on 0-1)"
    assert notes[1] == "has not entered barrier (Cell In[3], line 6: time.sleep(300))"


def test_a_collective_on_a_group_of_the_running_ranks_alone_is_not_blamed_on_the_others():
    """``new_group([0, 1])`` in a cell ``--on 0,1``: both in it for a while is slowness, not a hang
    (the flight recorder says which group: ``default_pg`` is every rank of the world)."""
    out = "ranks 2-3 do not run this cell (--on 0-1)"
    sub = {r: [{"op": "barrier", "seq": 1, "issued": 100.0, "sizes": [], "group": "undefined"}] for r in (0, 1)}
    assert hang_verdict({0: BARRIER, 1: BARRIER}, sub, now=110.0, sitting_out=out) is None
    assert live_notes({0: BARRIER, 1: BARRIER}, sub, now=110.0, sitting_out=out) == {}
    world = {r: [{"op": "barrier", "seq": 4, "issued": 100.0, "sizes": [], "group": "default_pg"}] for r in (0, 1)}
    assert hang_verdict({0: BARRIER, 1: BARRIER}, world, now=110.0, sitting_out=out) == (
        "ranks 0-1 waited in barrier #4 for 10 s at Cell In[3], line 4: dist.barrier(); " + out
    )
    assert live_notes({0: BARRIER, 1: BARRIER}, world, now=110.0, sitting_out=out)[1] == "waiting in barrier #4 for 10 s; " + out


def test_ranks_in_one_collective_entered_at_different_times_read_as_one_place():
    from nbspawn.events._where import _merged

    assert _merged(["in barrier #1 for 3 s", "in barrier #1 for 4 s", "in barrier #1 for 3 s"]) == ["in barrier #1 for 3-4 s"]
    assert _merged(["in barrier #1 for 3 s", "", "after all_reduce #2"]) == ["after all_reduce #2", "in barrier #1 for 3 s"]
    assert _merged(["in barrier #1 for 3 s", "in barrier #2 for 3 s"]) == ["in barrier #1 for 3 s", "in barrier #2 for 3 s"]


# -- NCCL: a collective returns once enqueued (issue 25, item 3) ----------------------------------

ITEM = "  Cell In[4], line 5\n      print(t.item())"


def _nccl(seq: int, state: str, issued: float = 100.0, op: str = "all_reduce") -> dict:
    """One entry as ranks._watch.summary writes it from NCCL's own flight recorder."""
    return {
        "seq": seq,
        "p2p_seq": 0,
        "op": op,
        "backend": "nccl",
        "group": "default_pg",
        "sizes": [[1]],
        "issued": issued,
        "state": state,
    }


def test_an_nccl_rank_waiting_at_item_is_in_the_collective_its_recorder_has_not_completed():
    """Rank 0's all_reduce #5 was enqueued and never completed (rank 1 never called it); rank 0's
    Python is at t.item(), not in distributed_c10d.py.  Its flight recorder says where it waits."""
    collectives = {0: [_nccl(4, "completed", 90.0), _nccl(5, "scheduled", 100.0)], 1: [_nccl(4, "completed", 90.0)]}
    stacks = {0: ITEM, 1: SLEEP}
    assert hang_verdict(stacks, collectives, now=130.0) == (
        "rank 1 never entered all_reduce #5 (it is at Cell In[3], line 6: time.sleep(300), after all_reduce #4); "
        "rank 0 waited in it for 30 s at Cell In[4], line 5: print(t.item())"
    )
    notes = live_notes(stacks, collectives, now=130.0)
    assert notes == {
        0: "waiting in all_reduce #5 for 30 s; rank 1 has not entered it",
        1: "has not entered all_reduce #5 (Cell In[3], line 6: time.sleep(300))",
    }


def test_the_oldest_incomplete_nccl_collective_is_the_one_waited_in():
    """A rank may have queued more after the stuck one: the stuck one is the oldest not completed."""
    collectives = {0: [_nccl(5, "scheduled", 100.0), _nccl(6, "scheduled", 101.0)], 1: [_nccl(4, "completed")]}
    verdict = hang_verdict({0: ITEM, 1: SLEEP}, collectives, now=110.0)
    assert verdict is not None and "never entered all_reduce #5" in verdict and "for 10 s" in verdict


def test_completed_nccl_collectives_and_gloo_states_are_no_evidence():
    """Every collective completed: the ranks are merely elsewhere.  A gloo entry's state is not a
    CUDA event's: never read as waiting."""
    done = {0: [_nccl(5, "completed")], 1: [_nccl(5, "completed")]}
    assert hang_verdict({0: ITEM, 1: SLEEP}, done) is None and live_notes({0: ITEM, 1: SLEEP}, done) == {}
    gloo = {0: [{**_nccl(5, "scheduled"), "backend": "gloo"}], 1: []}
    assert hang_verdict({0: ITEM, 1: SLEEP}, gloo) is None


def test_every_nccl_rank_in_the_same_incomplete_collective_is_no_verdict():
    """All ranks have #5 in flight: the GPUs are busy (or a peer died), nothing says who is missing."""
    busy = {0: [_nccl(5, "scheduled")], 1: [_nccl(5, "started")]}
    assert hang_verdict({0: ITEM, 1: ITEM}, busy) is None


def test_where_says_how_long_an_nccl_rank_has_waited(tmp_path):
    asked = [RankToAsk(0, None, str(tmp_path / "0.log"))]
    dump = 'Thread 0x1 (most recent call first):\n  File "<nbspawn-cell>", line 5 in <module>\n'
    text = describe(asked, {0: dump}, None, collectives={0: [_nccl(4, "completed"), _nccl(5, "scheduled", issued=0.0)]})
    assert "in all_reduce #5 for" in text


def test_nccl_collectives_are_read_from_nccls_own_flight_recorder():
    """ProcessGroupNCCL records into its own recorder (_dump_nccl_trace_json), not the generic one
    gloo uses (_dump_fr_trace_json): reading only the generic one left collectives.json empty under
    NCCL (issue 25, item 2).  This CPU torch has no NCCL: the module is stood in for by its two
    functions; the real module gives the generic one alone."""
    import types

    import torch

    from nbspawn.ranks._watch import recorders, summary

    c10d = types.SimpleNamespace(
        _dump_nccl_trace_json=lambda collectives, only_active: f"nccl {collectives} {only_active}",
        _dump_fr_trace_json=lambda includeCollectives: f"generic {includeCollectives}",
    )
    assert [dump() for dump in recorders(c10d, cuda_initialized=True)] == ["nccl True False", "generic True"]
    assert [dump() for dump in recorders(c10d, cuda_initialized=False)] == ["generic True"]  # no NCCL group without CUDA
    real = torch._C._distributed_c10d
    assert len(recorders(real, cuda_initialized=True)) == 1 + hasattr(real, "_dump_nccl_trace_json")
    entry = summary({"profiling_name": "nccl:all_reduce", "collective_seq_id": 5, "state": "scheduled", "time_created_ns": 2e9})
    assert (entry["op"], entry["backend"], entry["seq"], entry["state"], entry["issued"]) == (
        "all_reduce",
        "nccl",
        5,
        "scheduled",
        2.0,
    )


# -- await_dumps: a dump is read whole ------------------------------------------------------------


def _write_in_pieces(path, pieces, gap):
    import time

    for piece in pieces:
        time.sleep(gap)
        with open(path, "a") as fh:
            fh.write(piece)


def test_a_dump_still_being_written_is_waited_on_until_whole(tmp_path):
    """faulthandler writes a line at a time; a rank preempted between two lines has grown its file but
    not finished (what a fresh-clone CI run caught on 2026-11-26: the kernel sent SIGTERM after the first line, and the
    error lost where the rank was). The wait ends only once the file has stopped growing."""
    import threading

    path = tmp_path / "stacks.log"
    path.write_text("earlier dump\n")
    before = path.stat().st_size
    lines = ["Thread 0x1 (most recent call first):\n", '  File "a.py", line 1 in f\n', '  File "b.py", line 2 in all_reduce\n']
    writer = threading.Thread(target=_write_in_pieces, args=(path, lines, SETTLED / 2))
    writer.start()
    answered = await_dumps({3: (str(path), before)}, wait=2.0)
    read_then = path.read_text()[before:]  # what the kernel reads the moment the wait ends
    writer.join()
    assert answered == {3}
    assert read_then == "".join(lines)


def test_a_rank_that_never_answers_is_left_out_after_the_wait(tmp_path):
    quiet, answers = tmp_path / "quiet.log", tmp_path / "answers.log"
    quiet.write_text("")
    answers.write_text("")
    _write_in_pieces(answers, ["dump\n"], 0)
    assert await_dumps({0: (str(quiet), 0), 1: (str(answers), 0)}, wait=0.3) == {1}


def test_a_collectives_record_cut_short_by_a_kill_is_removed_once_the_run_is_over(tmp_path):
    """A rank stopped at its timeout may die between writing collectives.json.tmp and renaming it."""
    from nbspawn._rankdir import COLLECTIVES, remove_partial_writes

    killed, fine = tmp_path / "0", tmp_path / "1"
    killed.mkdir()
    fine.mkdir()
    (killed / (COLLECTIVES + ".tmp")).write_text('{"asked": 1, "entr')
    (fine / COLLECTIVES).write_text('{"asked": 1, "entries": []}')
    remove_partial_writes([str(killed), str(fine), str(tmp_path / "never-made")])
    assert sorted(p.name for p in killed.iterdir()) == []
    assert sorted(p.name for p in fine.iterdir()) == [COLLECTIVES]  # a whole record is a log the rank keeps
