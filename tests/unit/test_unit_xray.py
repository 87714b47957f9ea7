"""The collectives X-ray's analysis (events._xray) on records captured from real gloo runs, and the
rank-side record's bounds (ranks._xray.CollectiveLog).

``tests/unit/xray_records/`` holds what ``tests/xray_ranks.py`` wrote with torch 2.13 (CPU) on 4 gloo ranks:
``story`` (every kind of collective, rank 3 sleeping 30 ms before each of 10 all_reduces, a send and
recv 0 -> 1, then rank 1 calling all_gather where the others call all_reduce) and ``hang`` (rank 3
never enters a barrier).  tests/kernel/test_xray_ranks.py makes them again, live.
"""

from __future__ import annotations

import json
from pathlib import Path

from xray_samples import nccl_dump

from nbspawn.events._xray import analyse, sentence
from nbspawn.ranks._xray import KEPT_FULL, MAX_BUCKETS, CollectiveLog, entry_bytes, kept

RECORDS = Path(__file__).parent / "xray_records"


def records(name: str) -> dict[int, dict]:
    return {int(path.stem): json.loads(path.read_text()) for path in sorted((RECORDS / name).glob("*.json"))}


def test_story_lines_up_every_collective_by_group_and_sequence_number():
    xray = analyse(records("story"))
    assert xray.ranks == (0, 1, 2, 3)
    assert xray.count == 18
    assert [c.seq for c in xray.collectives] == list(range(1, 19))
    assert all(len(c.arrivals) == 4 for c in xray.collectives)
    ops = [c.op for c in xray.collectives]
    assert ops[:13] == ["all_reduce"] * 13
    # gloo has no reduce_scatter of a tensor: torch runs it as an all_reduce of the whole input
    assert ops[13:17] == ["broadcast", "all_gather", "all_reduce", "barrier"]
    assert xray.collectives[15].sizes == ((8,),)
    assert xray.bytes == 4 * (13 * 128 + 128 + 128 + 32) + 3 * 128 + 128  # input bytes, every rank's


def test_story_names_rank_3_the_straggler_in_words():
    xray = analyse(records("story"))
    assert xray.straggler == 3
    sleeping = [c for c in xray.collectives if 4 <= c.seq <= 13]
    assert all(c.last == 3 for c in sleeping)
    assert all(0.02 < c.late_s < 0.2 for c in sleeping)  # it slept 30 ms before each
    assert all(c.waits_s[3] == 0 and min(c.waits_s.values()) == 0 for c in sleeping)
    assert xray.last_at[3] >= 10
    assert "18 collectives, 8.3 KB moved; rank 3 arrived last at" in xray.summary
    assert "rank 3 is the straggler" in xray.summary


def test_story_finds_the_mismatched_collective():
    (mismatch,) = analyse(records("story")).mismatches
    assert (mismatch.pg, mismatch.seq) == ("0", 18)
    assert mismatch.text == "rank 1 called all_gather [4, 8] where ranks 0, 2, 3 called all_reduce [4, 8] at #18"
    assert sentence(mismatch.text) in analyse(records("story")).summary


def test_story_counts_the_sends_and_receives_gloo_does_not_record():
    xray = analyse(records("story"))
    assert xray.unrecorded == {0: 1, 1: 1}
    assert xray.pairs == () and xray.unpaired == ()
    assert xray.lost == {}
    assert xray.never_entered == ()


def test_hang_names_the_collective_a_rank_never_entered():
    xray = analyse(records("hang"))
    (never,) = xray.never_entered
    assert (never.seq, never.op, never.entered, never.absent) == (2, "barrier", (0, 1, 2), (3,))
    assert never.text == "ranks 0, 1, 2 entered barrier #2; rank 3 never did"
    assert xray.straggler is None  # one collective all four entered: too few to blame anyone
    assert sentence(never.text) in xray.summary


def test_a_mismatch_of_shapes_alone_is_found_and_one_of_uneven_ops_is_not():
    story = records("story")
    story[2]["head"][0]["sizes"] = [[4, 9]]
    (mismatch,) = [m for m in analyse(story).mismatches if m.seq == 1]
    assert mismatch.text == "rank 2 called all_reduce [4, 9] where ranks 0, 1, 3 called all_reduce [4, 8] at #1"
    for rank in story:
        story[rank]["head"][0]["op"] = "all_to_all"
    assert not [m for m in analyse(story).mismatches if m.seq == 1]


def nccl_p2p(record_id: int, name: str, sizes: list[list[int]]) -> dict:
    """An entry as NCCL's recorder dumps a point-to-point op (no NCCL here to record one: the names
    follow torch's flight_recorder analyzer, "nccl:send 1->2", "nccl:recv 3<-0", group ranks)."""
    return {
        "record_id": record_id,
        "process_group": ("1", "pair"),
        "collective_seq_id": 0,
        "p2p_seq_id": record_id + 1,
        "op_id": record_id + 1,
        "profiling_name": name,
        "time_created_ns": 1_000_000 * (record_id + 1),
        "input_sizes": sizes,
        "input_dtypes": ["Float"],
        "output_sizes": sizes,
        "is_p2p": True,
        "state": "completed",
        "time_discovered_started_ns": 5,
        "time_discovered_completed_ns": 7,
    }


def test_nccl_sends_pair_with_receives_in_global_ranks():
    sender, receiver = CollectiveLog(rank=2), CollectiveLog(rank=3)
    sender.note_config({"1": {"ranks": "[2, 3]"}})
    receiver.note_config({"1": {"ranks": "[2, 3]"}})
    sender.add_entries([nccl_p2p(0, "nccl:send 0->1", [[3]]), nccl_p2p(1, "nccl:send 0->1", [[5]])])
    receiver.add_entries([nccl_p2p(0, "nccl:recv 1<-0", [[3]])])
    assert sender.head[0]["started_ns"] == 5 and sender.head[0]["completed_ns"] == 7
    xray = analyse({2: sender.as_json(), 3: receiver.as_json()})
    assert [(p.src, p.dst, p.sizes) for p in xray.pairs] == [(2, 3, ((3,),))]
    assert xray.unpaired == ("rank 2 sent to rank 3 once more than rank 3 received",)


def gloo_entry(record_id: int, seq: int, op_id: int | None = None, created: int = 0) -> dict:
    return {
        "record_id": record_id,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "op_id": seq if op_id is None else op_id,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": created or 1_000 * seq,
        "input_sizes": [[16]],
        "input_dtypes": ["Float"],
        "is_p2p": False,
    }


def test_the_log_stays_bounded_over_200_000_collectives():
    log = CollectiveLog(rank=0)
    seq = 0
    for start in range(0, 200_000, 1000):  # as drains do: a ring's worth at a time
        entries = [gloo_entry(start + i, start + i + 1) for i in range(1000)]
        seq = start + 1000
        assert log.add_entries(entries) == 1000
        assert log.add_entries(entries) == 0  # the same ring read again adds nothing
    group = log.groups["0"]
    assert log.count == group.count == group.last_seq == seq
    assert len(log.head) == KEPT_FULL and len(log.tail) == KEPT_FULL
    assert log.head[0]["seq"] == 1 and log.tail[-1]["seq"] == seq
    assert MAX_BUCKETS // 2 <= len(group.buckets) <= MAX_BUCKETS
    assert group.bucket == 64  # a power of two: every rank buckets the same numbers together
    assert sum(count for count, _total in group.buckets.values()) == seq
    assert group.ops == {"all_reduce": [seq, seq * 64]}
    assert len(json.dumps(log.as_json())) < 400_000


def test_the_log_counts_what_fell_off_the_ring_and_the_ops_it_never_held():
    log = CollectiveLog(rank=0)
    log.add_entries([gloo_entry(3, 4), gloo_entry(4, 5)])  # the ring had wrapped: records 0-2 gone
    log.add_entries([gloo_entry(9, 10, op_id=11)])  # 5-8 gone, and op 10 with them or never recorded
    assert log.lost == 3 + 4
    assert log.groups["0"].unrecorded == 0  # an op_id gap beside lost records may be theirs: not counted
    log.add_entries([gloo_entry(10, 11, op_id=13)])  # nothing lost: op 12 was never recorded (a gloo send)
    assert log.groups["0"].unrecorded == 1


def test_entry_bytes_and_what_is_kept_of_an_entry():
    assert entry_bytes([[4, 8], [2]], ["Float", "BFloat16"]) == 128 + 4
    assert entry_bytes([[]], ["Long"]) == 8  # a scalar
    record = kept(gloo_entry(0, 7))
    assert (record["pg"], record["group"], record["seq"], record["op"], record["backend"]) == (
        "0",
        "default_pg",
        7,
        "all_reduce",
        "gloo",
    )
    assert record["bytes"] == 64 and "started_ns" not in record  # gloo records no start or end


def test_a_kept_worlds_later_cell_records_its_own_collectives_only():
    earlier = [gloo_entry(i, i + 1) for i in range(5)]  # the ring still holds the last cell's
    log = CollectiveLog(rank=0, since={"0": 5})
    log.add_entries([*earlier, gloo_entry(5, 6), gloo_entry(6, 7, op_id=8)])
    assert [r["seq"] for r in log.head] == [6, 7]
    assert log.lost == 0  # the ring's older records are not lost ones
    assert log.groups["0"].unrecorded == 1  # op 7, a send or recv of this cell
    assert analyse({0: log.as_json()}).count == 2  # #6 and #7, not the world's seven


def test_a_collective_not_yet_entered_by_all_while_the_ranks_run_is_in_flight_not_a_hang():
    hang = records("hang")
    assert analyse(hang).never_entered  # the run is over: rank 3 never entered
    live = analyse(hang, in_flight=True)
    assert live.never_entered == () and "never" not in live.summary


def test_a_rank_that_recorded_nothing_never_entered_the_default_groups_first_collective():
    """Rank 1 never came to the first barrier: its record has no group, and gloo's recorder names the
    default group's config "" where its entries say "0" (records as torch 2.13 wrote them)."""
    rank0 = {
        "rank": 0,
        "groups": {
            "0": {"desc": "default_pg", "count": 1, "bytes": 0, "ops": {"barrier": [1, 0]}, "first_seq": 1, "last_seq": 1}
        },
        "group_ranks": {"": [0, 1]},
        "head": [],
        "tail": [],
    }
    rank1 = {"rank": 1, "groups": {}, "group_ranks": {"": [0, 1]}, "head": [], "tail": []}
    xray = analyse({0: rank0, 1: rank1})
    assert [(n.entered, n.absent, n.seq) for n in xray.never_entered] == [((0,), (1,), 1)]
    assert xray.summary == "1 collective, 0 B moved. Rank 0 entered a collective #1; rank 1 never did"


def test_in_a_kept_worlds_later_cell_the_collective_never_entered_keeps_torchs_number_and_its_name():
    """Issue #57, item 1: the world's 46th collective, the first of this cell, which rank 1 skipped (it
    finished the cell): rank 1's record of the cell has no group, so the collective is not "#1" (its last
    number, 0, plus one) but the cell's own first, named as the op it is, as Where? and the chips name it."""
    entry = {"pg": "0", "group": "default_pg", "seq": 46, "op": "all_reduce", "sizes": [[3]], "created_ns": 1}
    group = {"desc": "default_pg", "count": 1, "bytes": 12, "ops": {"all_reduce": [1, 12]}, "first_seq": 46, "last_seq": 46}
    rank0 = {"rank": 0, "groups": {"0": group}, "group_ranks": {"": [0, 1]}, "head": [entry], "tail": []}
    rank1 = {"rank": 1, "groups": {}, "group_ranks": {"": [0, 1]}, "head": [], "tail": []}
    (never,) = analyse({0: rank0, 1: rank1}).never_entered
    assert (never.seq, never.op, never.entered, never.absent) == (46, "all_reduce", (0,), (1,))
    assert never.text == "rank 0 entered all_reduce #46; rank 1 never did"


def test_the_drainers_poll_never_asks_torchs_dump_only_its_drains_do(tmp_path):
    """torch's dump walks the recorder's maps without its lock while the main thread adds to them (a
    rank crashed so once, in the drain thread's dump): the poll counts the groups' sequence numbers
    instead, and only a drain dumps."""
    from nbspawn.ranks._xray import Drainer

    dumps: list[bool] = []
    enqueued = {"n": 0}

    def dump(includeCollectives: bool, includeStackTraces: bool) -> bytes:
        import pickle

        dumps.append(includeCollectives)
        return pickle.dumps({"pg_status": {"0": {"last_enqueued_collective": enqueued["n"]}}, "entries": []})

    fake = type("C10d", (), {"_dump_fr_trace": staticmethod(dump)})
    drainer = Drainer(0, str(tmp_path / "xray.json"), c10d=fake, ring=4096, since={}, counter=lambda: enqueued["n"])
    for _ in range(500):  # 5 s of polls with nothing new
        drainer._tick()
    assert dumps == []
    enqueued["n"] = 4000  # nearly a ring's worth: a drain
    drainer._tick()
    assert dumps == [True] and drainer.drained_at == 4000


def test_an_nccl_runs_collectives_are_read_from_nccls_own_recorder(tmp_path, monkeypatch):
    """ProcessGroupNCCL records into its own flight recorder, not the generic one gloo writes (the
    fourth GPU review's N1: the X-ray of an NCCL run was empty).  The drainer reads both, numbering
    each one's records apart; it reads NCCL's only once CUDA is initialized, from a thread whose
    device it first makes one the rank holds a context on (GPU 1 here, not the thread's default 0);
    the two ranks' records line up 20 collectives on NCCL, and a gloo group's beside them."""
    import contextlib
    import pickle
    import types

    from nbspawn.ranks import _devicememory
    from nbspawn.ranks._xray import Drainer

    logs = {}
    for rank in (0, 1):
        asked_on: list[int] = []
        current = {"device": 0}

        @contextlib.contextmanager
        def device(index: int, current=current):
            before, current["device"] = current["device"], index
            yield
            current["device"] = before

        def nccl(
            includeCollectives: bool, includeStackTraces: bool, onlyActive: bool, rank=rank, asked_on=asked_on, current=current
        ) -> bytes:
            asked_on.append(current["device"])
            return nccl_dump(rank, 20, 10**18)

        def generic(includeCollectives: bool, includeStackTraces: bool, rank=rank) -> bytes:
            # a gloo group beside it: records 0-4 of the generic recorder, numbered as NCCL's first ones are
            entries = [gloo_entry(i, i + 1, created=10**18 + 100_000 * i) for i in range(5)] if includeCollectives else []
            for entry in entries:
                entry["process_group"] = ("1", "cpu_pg")
            return pickle.dumps({"pg_config": {"1": {"ranks": "[0, 1]"}}, "pg_status": {}, "entries": entries})

        fake = types.SimpleNamespace(_dump_fr_trace=generic, _dump_nccl_trace=nccl)
        cuda = None  # CUDA not initialized yet: NCCL's recorder is not asked
        monkeypatch.setattr(_devicememory, "initialized_cuda", lambda: cuda)
        drainer = Drainer(rank, str(tmp_path / f"{rank}.json"), c10d=fake, since={}, counter=lambda: 0)
        drainer.drain()
        assert asked_on == [] and drainer.log.count == 5
        cuda = types.SimpleNamespace(device_count=lambda: 2, holds_context=lambda index: index == 1, device=device)
        drainer.drain()
        assert asked_on == [1], "NCCL's recorder read on a device without the rank's context"
        assert drainer.log.count == 25 and drainer.log.lost == 0
        assert drainer.log.last_record_id == {"generic": 4, "nccl": 19}
        drainer.drain()  # read again: nothing new, from either
        assert drainer.log.count == 25
        assert drainer._nccl_seen  # the live view drains NCCL's on time (its sends move no sequence number)
        drainer.write()
        logs[rank] = json.loads((tmp_path / f"{rank}.json").read_text())
    xray = analyse(logs)
    assert xray.count == 25 and xray.backends == ("gloo", "nccl")
    nccl = [c for c in xray.collectives if c.pg == "0"]
    assert len(nccl) == 20 and all(c.op == "all_reduce" and c.last == 1 for c in nccl)
    assert xray.summary.startswith("25 collectives"), xray.summary
    first = next(r for r in logs[0]["head"] if r["backend"] == "nccl")
    assert (first["started_ns"], first["completed_ns"]) == (10**18 + 60_000, 10**18 + 90_000)


def test_no_drain_while_the_ranks_groups_are_being_made(tmp_path, monkeypatch):
    """torch's dump walks its maps of groups without their lock: the drainer waits until no group was
    made, nor had its first collective, for a moment (the fourth GPU review's N-m1), then drains."""
    import pickle

    from nbspawn.ranks import _xray
    from nbspawn.ranks._xray import Drainer, GroupsWatch

    dumps: list[bool] = []
    enqueued = {"n": 0}

    def dump(includeCollectives: bool, includeStackTraces: bool) -> bytes:
        dumps.append(includeCollectives)
        return pickle.dumps({"pg_status": {}, "entries": []})

    watch = GroupsWatch()
    monkeypatch.setattr(_xray, "_groups", watch)
    fake = type("C10d", (), {"_dump_fr_trace": staticmethod(dump)})
    drainer = Drainer(0, str(tmp_path / "xray.json"), c10d=fake, ring=4096, since={}, counter=lambda: enqueued["n"])
    watch.saw((2, (1,)))  # a second group, made just now, its first collective to come
    enqueued["n"] = 4000  # a ring's worth: a drain is due
    drainer._tick()
    assert dumps == [] and not _xray.groups_settled()
    watch._changed -= _xray.SETTLED  # still since
    drainer._tick()
    assert dumps == [True] and _xray.groups_settled()


def _paced(count: int, every_ms: float, late_ms: float, ranks: int = 2, slow: int = 1):
    """``count`` all_reduces ``every_ms`` apart on ``ranks`` ranks, rank ``slow`` ``late_ms`` late to each."""
    from xray_samples import entry

    logs = {rank: CollectiveLog(rank=rank) for rank in range(ranks)}
    for rank, log in logs.items():
        late = int(late_ms * 1e6) if rank == slow else 0
        log.add_entries(
            [entry(seq - 1, "all_reduce", 10**9 + int(seq * every_ms * 1e6) + late, seq) for seq in range(1, count + 1)]
        )
    return analyse({rank: log.as_json() for rank, log in logs.items()})


def test_a_straggler_is_named_only_when_consistent_and_large_beside_the_collectives_time():
    """Issue #57, item 3: the reduce_scatter cell (4 collectives, 3 ms), a DDP world's first cell (3), a single
    all_reduce: millisecond leads over a few collectives are a scheduler's jitter.  Named: last at 4 or
    more and more than half of them, 5 ms or more late, the others' waiting 10 % or more of the collectives' span."""
    for count, every, late in ((1, 10, 3), (3, 10, 3), (4, 1, 3)):  # too few
        few = _paced(count, every, late)
        assert few.straggler is None and "arrived last" not in few.summary and "straggler" not in few.summary, few.summary
    assert _paced(20, 10, 3).straggler is None  # consistent, but within a scheduler's slice
    assert _paced(20, 1000, 40).straggler is None  # 40 ms late each second: 4 % of the time, the run would not notice
    named = _paced(20, 100, 40)  # 40 ms late every 100 ms
    assert named.straggler == 1
    assert (
        named.summary
        == "20 collectives, 21 MB moved; rank 1 arrived last at 19 of them, 40 ms late on average: rank 1 is the straggler"
    )


def _gloo_entry(record_id: int, op: str, created_ns: int, seq: int) -> dict:
    return {
        "record_id": record_id,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "gloo:" + op,
        "time_created_ns": created_ns,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "is_p2p": False,
    }


def _called(rank: int, *calls: tuple[str, int, int, int]) -> dict:
    """A rank's record of the cell's calls (ranks._xray_values, no values): (op, number, t0, t1)."""
    made = [{"op": op, "group": "0", "seq": number, "t0": t0, "t1": t1} for op, number, t0, t1 in calls]
    return {"format": 1, "rank": rank, "values": False, "calls": made, "groups": {}}


def test_a_call_the_backend_ran_as_several_collectives_is_drawn_and_counted_as_the_call():
    """Issue #57, item 2: gloo runs a reduce_scatter of 4 chunks as 4 all_reduces, and a
    reduce_scatter_tensor as one: the X-ray shows the calls made, numbered by torch's first, and says
    what gloo ran under them; an all_reduce called as itself is left as it is."""
    logs = {rank: CollectiveLog(rank=rank) for rank in range(2)}
    for rank, log in logs.items():
        base = 10**9 + rank * 1000
        log.add_entries([_gloo_entry(i, "all_reduce", base + i * 100, i + 1) for i in range(4)])  # reduce_scatter
        log.add_entries([_gloo_entry(4, "all_reduce", base + 10_000, 5)])  # reduce_scatter_tensor
        log.add_entries([_gloo_entry(5, "all_reduce", base + 20_000, 6)])  # all_reduce
    calls = {
        rank: _called(
            rank,
            ("reduce_scatter", 1, 10**9 - 1, 10**9 + 5_000),
            ("reduce_scatter_tensor", 2, 10**9 + 9_000, 10**9 + 12_000),
            ("all_reduce", 3, 10**9 + 19_000, 10**9 + 22_000),
        )
        for rank in logs
    }
    records = {rank: log.as_json() for rank, log in logs.items()}
    as_run = analyse(records)
    assert as_run.count == 6 and [c.op for c in as_run.collectives] == ["all_reduce"] * 6  # no calls known: what gloo ran
    xray = analyse(records, calls=calls)
    assert [(c.op, c.seq, c.ran, c.seqs) for c in xray.collectives] == [
        ("reduce_scatter", 1, ("all_reduce",) * 4, (1, 2, 3, 4)),
        ("reduce_scatter_tensor", 5, ("all_reduce",), (5,)),
        ("all_reduce", 6, (), ()),
    ]
    assert xray.count == 3 and xray.numbers == {("0", 1): 1, ("0", 2): 5, ("0", 3): 6}
    # who came last is counted by the call too: rank 1, 1 µs behind at each, at #5 and #6 (#1 is the cell's
    # first, which says when each rank began; #2-#4 ran under the reduce_scatter #1 stands for)
    assert xray.last_at == {0: 0, 1: 2} and as_run.last_at == {0: 0, 1: 5}
    assert xray.summary == (
        "3 collectives, 192 B moved. Gloo ran reduce_scatter #1 as 4 all_reduces. Gloo ran reduce_scatter_tensor #5 as an all_reduce"
    )


def test_sends_and_receives_are_counted_in_the_cell_that_made_them():
    """Issue #57, item 4: gloo records no send or receive, and a kept world's cell of sends only was
    counted by the op numbers they took, found in the next cell.  From the cell's calls: its own."""
    sends = _called(0, ("send", 1, 1, 2), ("send", 2, 3, 4))
    sends["calls"][0]["op"] = sends["calls"][1]["op"] = "send"
    record = {"rank": 0, "groups": {"0": {"desc": "default_pg", "count": 1, "unrecorded": 2, "ops": {}}}, "head": [], "tail": []}
    assert analyse({0: record}).unrecorded == {0: 2}  # no calls: the op numbers' gap (the next cell's)
    assert analyse({0: record}, calls={0: _called(0)}).unrecorded == {}  # the next cell made none itself
    assert analyse({0: record}, calls={0: sends}).unrecorded == {0: 2}
