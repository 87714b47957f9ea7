"""The hang verdict and the grouping of ``%spawn where``, from stacks as faulthandler and the cell-line
rewriting give them. No kernel, no processes."""

from __future__ import annotations

import os
import subprocess
import sys

from nbspawn._options import Settings
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


def test_on_a_cluster_the_verdict_names_the_node_of_the_ranks_that_never_entered():
    nodes = {r: f"node {r // 2} (b{r // 2})" for r in range(4)}
    assert hang_verdict({0: BARRIER, 1: BARRIER, 2: SLEEP, 3: BARRIER}, nodes=nodes) == (
        "rank 2 on node 1 (b1) never entered barrier (it is at Cell In[3], line 6: time.sleep(300)); "
        "ranks 0-1,3 waited in it at Cell In[3], line 4: dist.barrier()"
    )
    verdict = hang_verdict({0: SLEEP, 1: BARRIER, 2: SLEEP, 3: BARRIER}, nodes=nodes)
    assert verdict is not None and verdict.startswith("ranks 0,2 (on node 0 (b0), node 1 (b1)) never entered barrier")


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


def test_a_dump_still_being_written_is_waited_on_until_whole(tmp_path, monkeypatch):
    """faulthandler writes a line at a time; a rank preempted between two lines has grown its file but
    not finished (what a fresh-clone CI run caught on 2026-11-26: the kernel sent SIGTERM after the first line, and the
    error lost where the rank was). The wait ends only once the file has stopped growing.  The writer's
    pieces come SETTLED / 2 apart, and the wait here is for 1 s of no growth: a writer thread kept off a
    core for 50 ms beside three test workers is no dump "whole" (the rule is the same at either length)."""
    import threading

    import nbspawn.events._where

    monkeypatch.setattr(nbspawn.events._where, "SETTLED", 1.0)

    path = tmp_path / "stacks.log"
    path.write_text("earlier dump\n")
    before = path.stat().st_size
    lines = ["Thread 0x1 (most recent call first):\n", '  File "a.py", line 1 in f\n', '  File "b.py", line 2 in all_reduce\n']
    writer = threading.Thread(target=_write_in_pieces, args=(path, lines, SETTLED / 2))
    writer.start()
    answered = await_dumps({3: (str(path), before)}, wait=30.0)  # ends once settled; 30 s only for a hang
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


# -- stragglers are not hangs (issue 41, L2) --------------------------------------------------------


def test_a_collective_entered_a_moment_ago_is_no_hang_but_an_old_one_is():
    """Kaggle's 2xT4: rank 0 waits at loss.item() for an all_reduce rank 1 will issue once its batch is
    loaded.  One second into it that is a straggler, not a hang; ten seconds into it, a suspect."""
    collectives = {0: [_nccl(6, "completed", 90.0), _nccl(7, "scheduled", 100.0)], 1: [_nccl(6, "completed", 90.0)]}
    stacks = {0: ITEM, 1: SLEEP}
    assert hang_verdict(stacks, collectives, now=101.0) is None
    assert live_notes(stacks, collectives, now=101.0) == {}
    assert hang_verdict(stacks, collectives, now=111.0) == (
        "rank 1 never entered all_reduce #7 (it is at Cell In[3], line 6: time.sleep(300), after all_reduce #6); "
        "rank 0 waited in it for 11 s at Cell In[4], line 5: print(t.item())"
    )
    assert live_notes(stacks, collectives, now=111.0)[1] == "has not entered all_reduce #7 (Cell In[3], line 6: time.sleep(300))"
    gloo = {
        0: [{"op": "barrier", "seq": 2, "issued": 100.0, "sizes": []}],
        1: [{"op": "barrier", "seq": 1, "issued": 90.0, "sizes": []}],
    }
    assert hang_verdict({0: BARRIER, 1: SLEEP}, gloo, now=102.0) is None  # a stack in the collective too
    assert hang_verdict({0: BARRIER, 1: SLEEP}, gloo, now=112.0) is not None


def test_a_stopped_runs_verdict_says_where_the_ranks_were_however_short_the_wait():
    """--timeout, an interrupt or Stop decided the run had gone on too long: the places are the verdict."""
    collectives = {0: [_nccl(7, "scheduled", 100.0)], 1: [_nccl(6, "completed", 90.0)]}
    verdict = hang_verdict({0: ITEM, 1: SLEEP}, collectives, now=101.0, at_stop=True)
    assert verdict is not None and verdict.startswith("rank 1 never entered all_reduce #7")


def test_how_old_a_suspect_is_follows_the_timeouts():
    from nbspawn.events._where import HANG_SUSPECT_AFTER, suspect_after

    assert suspect_after(None) == HANG_SUSPECT_AFTER == 10.0
    assert suspect_after({"timeout": 600.0}) == 10.0  # NCCL's ten minutes
    assert suspect_after({"timeout": 20.0}) == 5.0  # a group made with a 20 s timeout: a quarter of it
    assert suspect_after({"timeout": 600.0}, run_timeout=8.0) == 4.0  # --timeout 8: half of it
    stacks = {0: ITEM, 1: SLEEP}
    short = {0: [{**_nccl(7, "scheduled", 100.0), "timeout": 20.0}], 1: []}
    assert hang_verdict(stacks, short, now=104.0) is None and hang_verdict(stacks, short, now=105.0) is not None
    assert hang_verdict(stacks, {0: [_nccl(7, "scheduled", 100.0)], 1: []}, now=104.0, run_timeout=8.0) is not None


def test_a_look_at_a_young_wait_says_when_to_look_again():
    import time

    from nbspawn.events._where import suspect_at

    now = time.time()
    young = {0: [_nccl(7, "scheduled", now - 1.0)], 1: []}
    assert abs((suspect_at({0: ITEM, 1: SLEEP}, young) or 0) - (now + 9.0)) < 0.01
    assert suspect_at({0: ITEM, 1: SLEEP}, {0: [_nccl(7, "scheduled", now - 60.0)], 1: []}) is None  # a suspect already
    assert suspect_at({0: SLEEP, 1: SLEEP}, {}) is None


def test_a_peer_that_issued_the_collective_has_entered_it():
    """NCCL's calls return once enqueued: rank 1 issued all_reduce #7 and went on (to its loader); its
    recorder says so (its newest number on the group is 7), so it is not the rank that never entered."""
    collectives = {0: [_nccl(7, "scheduled", 100.0)], 1: [_nccl(7, "completed", 100.5)], 2: [_nccl(6, "completed", 90.0)]}
    stacks = {0: ITEM, 1: SLEEP, 2: SLEEP}
    verdict = hang_verdict(stacks, collectives, now=130.0)
    assert verdict is not None and verdict.startswith("rank 2 never entered all_reduce #7"), verdict
    notes = live_notes(stacks, collectives, now=130.0)
    assert notes[0] == "waiting in all_reduce #7 for 30 s; rank 2 has not entered it" and 1 not in notes
    on_another_group = {0: [_nccl(7, "scheduled", 100.0)], 1: [{**_nccl(9, "completed", 100.5), "pg": "1"}]}
    assert "rank 1 never entered all_reduce #7" in (hang_verdict({0: ITEM, 1: SLEEP}, on_another_group, now=130.0) or "")
    entered = {0: [_nccl(7, "scheduled", 100.0)], 1: [_nccl(8, "scheduled", 101.0)]}
    assert hang_verdict({0: ITEM, 1: SLEEP}, entered, now=130.0) is None


# -- NCCL's recorded names are not torch.distributed's (issue 41, M2) -------------------------------


def test_an_nccl_barrier_is_found_in_its_recorder_under_all_reduce_barrier():
    """ProcessGroupNCCL records barrier() as ``nccl:all_reduce_barrier``: the stack's ``barrier`` is that
    entry (its number, how long), and a rank at t.item() with it pending is in ``barrier``."""
    stacks = {0: BARRIER, 1: SLEEP}
    collectives = {0: [_nccl(3, "scheduled", 100.0, op="all_reduce_barrier")], 1: [_nccl(2, "completed", 90.0)]}
    assert hang_verdict(stacks, collectives, now=130.0) == (
        "rank 1 never entered barrier #3 (it is at Cell In[3], line 6: time.sleep(300), after all_reduce #2); "
        "rank 0 waited in it for 30 s at Cell In[3], line 4: dist.barrier()"
    )
    assert hang_verdict({0: ITEM, 1: SLEEP}, collectives, now=130.0).startswith("rank 1 never entered barrier #3")  # type: ignore[union-attr]


def test_verdicts_name_the_function_the_user_called():
    from nbspawn.events._where import called

    assert called("_all_gather_base") == "all_gather_into_tensor"
    assert called("_reduce_scatter_base") == "reduce_scatter_tensor"
    assert called("all_reduce_barrier") == "barrier"
    assert called("send 0->1") == "send" and called("recv 1<-0") == "recv"
    assert called("all_reduce") == "all_reduce"
    gather = (
        "  Cell In[3], line 5\n      dist.all_gather_into_tensor(out, t)\n"
        '  File "/x/torch/distributed/distributed_c10d.py", line 4410 in all_gather_into_tensor\n'
        '  File "/x/torch/distributed/distributed_c10d.py", line 4330 in all_gather_single'
    )
    collectives = {0: [_nccl(4, "scheduled", 100.0, op="_all_gather_base")], 1: [_nccl(3, "completed", 90.0)]}
    verdict = hang_verdict({0: gather, 1: SLEEP}, collectives, now=130.0) or ""
    assert verdict.startswith("rank 1 never entered all_gather_single #4") and "for 30 s" in verdict, verdict
    verdict = hang_verdict({0: ITEM, 1: SLEEP}, collectives, now=130.0) or ""
    assert verdict.startswith("rank 1 never entered all_gather_into_tensor #4") and "_all_gather_base" not in verdict, verdict


def test_a_send_is_numbered_among_point_to_point_ops():
    send = {**_nccl(0, "scheduled", 100.0, op="send 0->1"), "p2p_seq": 2}
    notes = live_notes({0: ITEM, 1: SLEEP}, {0: [send], 1: []}, now=130.0)
    assert notes[0] == "waiting in send #2 for 30 s; rank 1 has not entered it", notes


# -- what a rank writes down of its recorders (issue 41, M1, M3) --------------------------------------


def _recorded(seq: int, state: str, group: str = "0") -> dict:
    """One entry as torch's NCCL flight recorder dumps it (``_dump_nccl_trace_json``)."""
    return {
        "profiling_name": "nccl:all_reduce",
        "collective_seq_id": seq,
        "process_group": [group, "default_pg"],
        "time_created_ns": seq * 10**9,
        "state": state,
        "timeout_ms": 600000,
        "input_sizes": [[1]],
    }


def test_the_first_stuck_collective_is_kept_though_twelve_were_enqueued_after_it_began():
    """A loop with no sync goes on enqueuing after all_reduce #3 stuck: the 8 newest are #5-#12, all
    pending behind it.  #3 is what the rank waits for, and is kept."""
    import json
    import types

    from nbspawn.ranks._watch import KEPT, collected, recorders

    def kept(entries: list[dict]) -> list[dict]:
        c10d = types.SimpleNamespace(
            _dump_nccl_trace_json=lambda collectives, only_active: json.dumps({"entries": entries}),
            _dump_fr_trace_json=lambda includeCollectives: json.dumps({"entries": []}),
        )
        return collected(recorders(c10d, cuda_initialized=True))

    stuck_at_3 = [_recorded(seq, "completed" if seq < 3 else "scheduled") for seq in range(1, 13)]
    written = kept(stuck_at_3)
    assert [e["seq"] for e in written] == [3, *range(13 - KEPT, 13)]
    assert written[0]["timeout"] == 600.0 and written[0]["pg"] == "0"
    assert hang_verdict({0: ITEM, 1: SLEEP}, {0: written, 1: []}, now=100.0).startswith("rank 1 never entered all_reduce #3")  # type: ignore[union-attr]
    other_group = [*stuck_at_3, {**_recorded(2, "scheduled", group="1"), "time_created_ns": 2 * 10**9 + 1}]
    assert [(e["pg"], e["seq"]) for e in kept(other_group)][:2] == [("1", 2), ("0", 3)]  # oldest first, one per group
    assert [e["seq"] for e in kept([_recorded(seq, "completed") for seq in range(1, 13)])] == list(range(13 - KEPT, 13))


def test_the_flight_recorders_are_on_in_every_torch_unless_the_user_sized_them():
    """torch before the FlightRecorder rename read only TORCH_NCCL_TRACE_BUFFER_SIZE, default 0 (off);
    torch after it warns on every rank when the old name is set, so it gets only the new one."""
    from nbspawn.ranks._watch import FR_ENTRIES, recorder_env

    before: dict[str, str] = {}
    recorder_env(before, renamed=False)
    assert before == {"TORCH_FR_BUFFER_SIZE": FR_ENTRIES, "TORCH_NCCL_TRACE_BUFFER_SIZE": FR_ENTRIES}
    after: dict[str, str] = {}
    recorder_env(after, renamed=True)
    assert after == {"TORCH_FR_BUFFER_SIZE": FR_ENTRIES}
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        for renamed in (False, True):
            theirs = {key: "2000"}
            recorder_env(theirs, renamed=renamed)
            assert theirs == {key: "2000"}


def test_a_rank_of_this_torch_prints_no_recorder_deprecation_warning():
    """A real process of the installed torch: the recorder's variable is the one it reads, and a gloo
    collective there (which sizes the recorder) writes no warning of an old variable name."""
    code = (
        "import os, torch, torch.distributed as dist\n"
        "from nbspawn.ranks._watch import recorder_env\n"
        "recorder_env(os.environ)\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='0')\n"
        "store = dist.TCPStore('127.0.0.1', 0, 1, True)\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, store=store)\n"
        "dist.all_reduce(torch.ones(1))\n"
        "dist.destroy_process_group()\n"
        "print(sorted(k for k in os.environ if k.endswith('BUFFER_SIZE')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("BUFFER_SIZE")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "deprecated" not in done.stderr, done.stderr
    assert "TORCH_FR_BUFFER_SIZE" in done.stdout


def test_the_hang_watch_looks_again_when_a_young_wait_is_old_enough():
    """Looks back off (3 s of quiet, then 6, 12...); a look that finds rank 0 eight seconds into an
    all_reduce rank 1 has not issued looks again when it is 10 s old, not 6 s later."""
    import time
    import types

    from nbspawn._source import CELL_FILENAME, CellSource
    from nbspawn.executors._hangwatch import HANG_FIRST_LOOK, NOTE_REFRESH, STACK_DUMP_WAIT, HangWatch

    def dump(line: int) -> str:
        return f'Current thread 0x1 (most recent call first):\n  File "{CELL_FILENAME}", line {line} in <module>\n'

    built = time.time()  # rank 0 entered all_reduce #7 8 s before this; it turns 10 s old at built + 2
    collectives = {0: [_nccl(7, "scheduled", built - 8.0)], 1: [_nccl(6, "completed", built - 9.0)]}
    spec = types.SimpleNamespace(
        cell=CellSource("x = 1\n" * 6), program=None, sitting_out=lambda: "", asked=Settings(timeout=None)
    )
    ranks = [types.SimpleNamespace(rank=r, note=None, status="running") for r in (0, 1)]
    told: list[str | None] = []
    executor = types.SimpleNamespace(
        supervision=types.SimpleNamespace(watches_hangs=True),
        look=lambda run, running, wait: ({0: dump(5), 1: dump(6)}, collectives),
    )
    watch = HangWatch(
        types.SimpleNamespace(spec=spec, ranks=ranks, nodes=dict),  # type: ignore[arg-type]
        types.SimpleNamespace(hang_noticed=lambda run, verdict: told.append(verdict)),  # type: ignore[arg-type]
        executor,  # type: ignore[arg-type]
    )
    watch.quiet_since -= HANG_FIRST_LOOK
    looked_from = time.time()
    watch.quiet([0, 1], stopping=False)
    looked_by = time.time()
    assert told == [None] and [r.note for r in ranks] == [None, None]  # a straggler's wait, so far
    # when it turns 10 s old, plus a look's dump wait (not 6 s later), counted from the look's own clock: the
    # bounds come from when the look began and ended, however long this machine kept the test off a core
    ripe_in = lambda at: max(NOTE_REFRESH, built + 2.0 - at + STACK_DUMP_WAIT)  # noqa: E731
    assert ripe_in(looked_by) - 0.01 <= watch.hang_look_after <= ripe_in(looked_from) + 0.01, watch.hang_look_after
    watch.quiet_since -= watch.hang_look_after
    time.sleep(max(0.0, built + 2.1 - time.time()))  # the all_reduce is past 10 s old now
    watch.quiet([0, 1], stopping=False)
    assert told[-1] is not None and told[-1].startswith("rank 1 never entered all_reduce #7"), told


def test_a_rank_that_finished_the_cell_without_entering_the_collective_is_named_as_never_entering_it():
    """Issue #57, item 1: ``if rank != 1: dist.all_reduce(t)``: rank 1 went on and finished the cell (a kept
    world's rank is back at its prompt) while rank 0 waits.  Rank 1 has no stack in the cell to show, yet it
    is the cause: the verdict and both chips say so, in torch's numbering with the op's name."""
    entries = {0: [{"op": "all_reduce", "seq": 46, "pg": "0", "group": "default_pg", "issued": 100.0, "sizes": [[3]]}]}
    assert hang_verdict({0: ALL_REDUCE}, entries, now=115.0, at_stop=True, finished=(1,)) == (
        "rank 1 never entered all_reduce #46 (it finished the cell); "
        "rank 0 waited in it for 15 s at Cell In[3], line 8: dist.all_reduce(t)"
    )
    assert hang_verdict({0: ALL_REDUCE}, entries, now=115.0, at_stop=True) is None  # without the finished rank: no cause
    notes = live_notes({0: ALL_REDUCE}, entries, now=115.0, finished=(1,))
    assert notes == {
        0: "waiting in all_reduce #46 for 15 s; rank 1 finished the cell without entering it",
        1: "never entered all_reduce #46 (it finished the cell)",
    }


def test_a_finished_rank_that_entered_the_collective_or_is_not_in_its_group_is_not_blamed():
    waited = {"op": "all_reduce", "seq": 46, "pg": "0", "group": "default_pg", "issued": 100.0, "sizes": [[3]]}
    entered = {0: [waited], 1: [{**waited, "issued": 99.0}]}  # NCCL: rank 1 enqueued it and went on
    assert live_notes({0: ALL_REDUCE}, entered, now=115.0, finished=(1,)) == {}
    subgroup = {**waited, "pg": "1", "group": "pairs", "seq": 2}
    others = {0: [subgroup], 1: [{**waited, "seq": 45}]}  # rank 1's recorder has no collective of group "1"
    assert hang_verdict({0: ALL_REDUCE}, others, now=115.0, at_stop=True, finished=(1,)) is None
    member = {0: [subgroup], 1: [{**subgroup, "seq": 1}]}  # a member that left after the group's #1
    assert hang_verdict({0: ALL_REDUCE}, member, now=115.0, at_stop=True, finished=(1,)) == (
        "rank 1 never entered all_reduce #2 (it finished the cell, after all_reduce #1); "
        "rank 0 waited in it for 15 s at Cell In[3], line 8: dist.all_reduce(t)"
    )


def test_stop_does_not_look_for_a_hang_while_every_rank_is_writing():
    """Issue #57, item 11: the look before stopping asks every rank for its stack and collectives (0.2-0.3 s
    under a 16-rank flood, before Stop could interrupt anyone).  A rank that wrote output within the last
    half second is not blocked in a collective: with every rank writing, nothing is asked; with one quiet
    (it may wait in a barrier while another prints), every rank is, as the verdict needs all their places."""
    import time
    import types

    from nbspawn._source import CellSource
    from nbspawn.executors._hangwatch import HangWatch

    looked: list[list[int]] = []
    spec = types.SimpleNamespace(cell=CellSource("x = 1\n"), program=None, sitting_out=lambda: "", asked=Settings(timeout=None))
    ranks = [types.SimpleNamespace(rank=r, note=None, status="running", prompt=None) for r in (0, 1)]
    executor = types.SimpleNamespace(
        supervision=types.SimpleNamespace(watches_hangs=True),
        look=lambda run, running, wait: (looked.append(list(running)), ({}, {}))[1],
    )
    watch = HangWatch(
        types.SimpleNamespace(spec=spec, ranks=ranks, nodes=dict),  # type: ignore[arg-type]
        types.SimpleNamespace(hang_noticed=lambda run, verdict: None),  # type: ignore[arg-type]
        executor,  # type: ignore[arg-type]
    )
    now = time.monotonic()
    watch.rank_wrote(0, now)
    watch.rank_wrote(1, now)
    watch.look_before_stopping([0, 1])
    assert looked == []
    watch.rank_wrote(1, now - 2.0)  # rank 1 has been quiet for 2 s
    watch.look_before_stopping([0, 1])
    assert looked == [[0, 1]]
