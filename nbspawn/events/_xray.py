"""What the ranks did together: their collectives records (``ranks._xray``) read side by side.

:func:`analyse` is pure: it takes each rank's record (the JSON of its ``xray.json``, read by
:func:`read_records`) and returns an :class:`XRay`; it starts nothing and knows nothing of the views
that draw it (``views._xray_html``).

* **Aligned:** a collective is one (process group, sequence number): every member rank numbers its
  group's collectives alike.  The records' full entries (each rank's first and last collectives) are
  lined up into :class:`Collective` marks; the rest is in each rank's timeline buckets.
* **Who came last:** a rank's arrival is its entry's creation time (gloo records no other: see
  ``ranks._xray``).  The last to arrive is the one the others waited for; its lateness is its arrival
  minus the mean arrival of the others (how long they waited, on average).  Over the whole run it is
  counted from the timelines: per bucket of sequence numbers, each rank's mean arrival (exact while a
  group has ≤ 4,096 collectives, one a bucket; past that, a bucket's means).  *The straggler* is named
  only when it is consistent and large (issue #57: a 3 ms lead over three collectives is a scheduler's
  jitter, not a slow rank): last at :data:`STRAGGLER_MIN_COUNT` collectives or more and at more than
  half of those compared, on average :data:`STRAGGLER_MIN_LATE` or later, and the others' waiting for it
  (its lateness summed) is :data:`STRAGGLER_MIN_SHARE` or more of the time the collectives spanned
  (the first arrival to the last): a delay the run would notice.  Who came last, and by how much, is
  said only then.
* **Clocks:** the ranks of one machine share its wall clock.  Across nodes each node's clock would be
  offset first: all ranks leave a collective at nearly the same moment, so the per-node median of
  (next issue − the collective's last arrival) over many collectives estimates the offset, or the
  kernel measures it when the node's agent starts (a round trip); not done here, a single machine.
* **Mismatches:** ranks that called different ops (or different input shapes or dtypes, for ops whose
  inputs are alike on every rank) at one sequence number; found in the full entries, which every rank
  keeps for its first and last :data:`~nbspawn.ranks._xray.KEPT_FULL`, so the one that broke a run
  (the last) is always among them.
* **Never entered:** a group's collective some members entered and another did not (its last
  sequence number is lower): a hang, or a rank that left.
* **Point to point:** NCCL records sends and receives ("send 0->1", "recv 1<-0", group ranks): a
  rank's k-th send to a peer pairs with the peer's k-th receive from it.  gloo records neither: each
  rank's count of them is reported (:attr:`XRay.unrecorded`), from the cell's own calls where the rank
  wrote them down (else from the op numbers they took, which a kept world's next cell would have
  counted as its own: issue #57, item 4).
* **The calls the cell made:** the backend may run one call as several collectives (gloo: a
  ``reduce_scatter`` of four chunks as four all_reduces, a ``reduce_scatter_tensor`` as one).  Each
  rank writes its calls down with when each began and returned (``ranks._xray_values``); the
  collectives its recorder created in that window, on the call's group, are the call's.  Such a call is
  drawn as one collective, named as called, numbered by its first collective (torch's numbering, as
  every other place numbers them), and what the backend ran under it is said (:attr:`Collective.ran`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._rankdir import XRAY
from ._opnames import same_call
from ._xray_values import ValueRow

# seconds: a rank last by less, on average, is not called the straggler: a busy core's scheduler slice
# (Linux's CFS: a few ms) keeps a rank off it that long with nothing wrong with the rank
STRAGGLER_MIN_LATE = 0.005
STRAGGLER_MIN_COUNT = 4  # nor one last at fewer collectives than this (a group's first is not compared)
STRAGGLER_MIN_SHARE = 0.1  # nor one the others waited for less than this share of the collectives' span
# ops whose input shapes may differ between ranks, rightly: only their op is compared
UNEVEN_OPS = frozenset({"all_to_all", "alltoall", "alltoall_base", "gather", "scatter", "all_to_all_single", "coalesced"})


@dataclass(frozen=True)
class Arrival:
    rank: int
    created_ns: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class Collective:
    """One collective, its marks lined up across the ranks whose records hold it in full."""

    pg: str
    group: str
    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    bytes: int
    arrivals: tuple[Arrival, ...]
    last: int | None  # the rank the others waited for (None: one rank's mark only)
    late_s: float  # its arrival minus the others' mean arrival
    waits_s: Mapping[int, float] = field(default_factory=dict)  # each rank: last arrival minus its own
    # a call the backend ran as other collectives: theirs (ops as recorded, and torch's numbers), () otherwise
    ran: tuple[str, ...] = ()
    seqs: tuple[int, ...] = ()
    backend: str = ""


@dataclass(frozen=True)
class Call:
    """A call the cell made to torch.distributed, and the collectives the backend ran under it."""

    group: str  # its process group's name
    number: int  # its number among the group's calls in the cell, as every rank counts them
    op: str  # as called: "reduce_scatter"
    seqs: tuple[int, ...]  # torch's sequence numbers of the collectives run under it
    ran: tuple[str, ...]  # their ops, as the recorder names them


@dataclass(frozen=True)
class Mismatch:
    pg: str
    group: str
    seq: int
    calls: tuple[tuple[tuple[int, ...], str], ...]  # (ranks, "all_reduce [4, 8]"), most ranks first
    text: str


@dataclass(frozen=True)
class NeverEntered:
    pg: str
    group: str
    seq: int
    op: str
    entered: tuple[int, ...]
    absent: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class P2PPair:
    pg: str
    src: int  # global ranks
    dst: int
    sizes: tuple[tuple[int, ...], ...]
    send_ns: int
    recv_ns: int


@dataclass(frozen=True)
class XRay:
    ranks: tuple[int, ...]
    count: int  # collectives (group, sequence number) any rank entered
    bytes: int  # input bytes of every rank's collectives together
    collectives: tuple[Collective, ...]  # those held in full, by first arrival
    last_at: Mapping[int, int]  # rank -> how many collectives it arrived last at (timeline buckets)
    mean_late_s: Mapping[int, float]  # rank -> how late, on average, where it was last
    straggler: int | None
    mismatches: tuple[Mismatch, ...]
    never_entered: tuple[NeverEntered, ...]
    pairs: tuple[P2PPair, ...]
    unpaired: tuple[str, ...]  # sends or receives with no partner in the records
    unrecorded: Mapping[int, int]  # rank -> point-to-point ops its recorder did not keep (gloo)
    lost: Mapping[int, int]  # rank -> entries lost off torch's ring before they were read
    summary: str
    # --xray values: each collective's small tensors before and after (events._xray_values.line_up), and
    # the most calls a rank made past the first ones it recorded
    values: tuple[ValueRow, ...] = ()
    values_beyond: int = 0
    backends: tuple[str, ...] = ()  # those the recorded collectives ran on ("gloo"): a cell's own group's
    calls: tuple[Call, ...] = ()  # the cell's calls whose collectives were found (those held in full)

    @property
    def numbers(self) -> dict[tuple[str, int], int]:
        """(group, call number) -> torch's number of the call's first collective: how the values table
        numbers a call, as the drawing, the verdicts and Where? do."""
        return {(call.group, call.number): call.seqs[0] for call in self.calls}


def read_records(rank_dirs: Mapping[int, str]) -> dict[int, dict[str, Any]]:
    """Each rank's record (rank -> the JSON of its ``xray.json``), for the ranks that wrote one; a
    record half written or unreadable is left out (its rank then has no lane)."""
    records: dict[int, dict[str, Any]] = {}
    for rank, rank_dir in rank_dirs.items():
        try:
            with open(os.path.join(rank_dir, XRAY), encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records[rank] = record
    return records


def analyse(
    records: Mapping[int, Mapping[str, Any]], in_flight: bool = False, calls: Mapping[int, Mapping[str, Any]] | None = None
) -> XRay:
    """The ranks' records (rank -> its ``xray.json``, read back) side by side.  ``in_flight``: the
    ranks are still running, so no collective is called never entered (those not entered by all are
    on their way).  ``calls``: each rank's record of the cell's calls (``ranks._xray_values``), where
    it wrote one: a call the backend ran as other collectives is drawn as the call."""
    ranks = tuple(sorted(records))
    members = _members(records)
    full = _full_entries(records)
    made = _calls(records, calls or {})
    collectives = tuple(
        sorted(
            _as_called((_collective(key, marks) for key, marks in full.items() if not _is_p2p(marks)), made, full),
            key=_first_arrival,
        )
    )
    # a call the backend ran as several collectives is one arrival: its first collective's
    under = {(call.group, seq) for call in made if _redrawn(call) for seq in call.seqs[1:]}
    last_at, late_sums = _lateness(records, members, under)
    mean_late = {rank: late_sums[rank] / last_at[rank] for rank in last_at if last_at[rank]}
    straggler = _straggler(last_at, mean_late, _span_s(full)) if len(ranks) > 1 else None
    count = sum(_collectives_in(records, pg) for pg in members) - sum(len(c.seqs) - 1 for c in made if _redrawn(c))
    total_bytes = sum(int(group.get("bytes", 0)) for rec in records.values() for group in rec.get("groups", {}).values())
    mismatches = tuple(m for m in (_mismatch(key, marks) for key, marks in sorted(full.items())) if m is not None)
    never = () if in_flight else tuple(_never_entered(records, members, full))
    pairs, unpaired = _pairs(records, members)
    unrecorded = {rank: _unrecorded(rec, (calls or {}).get(rank)) for rank, rec in records.items()}
    lost = {rank: int(rec.get("lost", 0)) for rank, rec in records.items()}
    xray = XRay(
        ranks=ranks,
        count=count,
        bytes=total_bytes,
        collectives=collectives,
        last_at=dict(last_at),
        mean_late_s=mean_late,
        straggler=straggler,
        mismatches=mismatches,
        never_entered=never,
        pairs=tuple(pairs),
        unpaired=tuple(unpaired),
        unrecorded={rank: n for rank, n in unrecorded.items() if n},
        lost={rank: n for rank, n in lost.items() if n},
        summary="",
        backends=tuple(
            sorted(
                {
                    str(e["backend"])
                    for rec in records.values()
                    for e in [*rec.get("head", []), *rec.get("tail", [])]
                    if e.get("backend")
                }
            )
        ),
        calls=tuple(made),
    )
    return XRay(**{**xray.__dict__, "summary": summary(xray)})


def _straggler(last_at: Mapping[int, int], mean_late: Mapping[int, float], span_s: float) -> int | None:
    """The rank the others consistently waited long for (the module's rule), or None."""
    counted = sum(last_at.values())
    if not counted:
        return None
    top = max(last_at, key=lambda rank: (last_at[rank], -rank))
    late = mean_late.get(top, 0.0)
    consistent = last_at[top] >= STRAGGLER_MIN_COUNT and last_at[top] * 2 > counted
    large = late >= STRAGGLER_MIN_LATE and (not span_s or last_at[top] * late >= STRAGGLER_MIN_SHARE * span_s)
    return top if consistent and large else None


def _span_s(full: Mapping[tuple[str, int], Mapping[int, Mapping[str, Any]]]) -> float:
    """Seconds from the first arrival at a collective held in full to the last (0: fewer than two)."""
    times = [int(e["created_ns"]) for marks in full.values() for e in marks.values() if e.get("created_ns")]
    return (max(times) - min(times)) / 1e9 if len(times) > 1 else 0.0


def summary(xray: XRay) -> str:
    """The run in words: "412 collectives, 38 MB moved; rank 3 arrived last at 390 of them, 14 ms late
    on average: rank 3 is the straggler", then what went wrong, a sentence each.  Who came last is said
    only of a straggler: of a few collectives, or by a few milliseconds, it is noise a learner would read
    as meaning (issue #57)."""
    parts = [
        f"{xray.count} collective{'s' if xray.count != 1 else ''}, {_size(xray.bytes)} moved" if xray.count else "no collectives"
    ]
    if xray.straggler is not None:
        top = xray.straggler
        late_ms = xray.mean_late_s.get(top, 0.0) * 1000
        text = f"rank {top} arrived last at {xray.last_at[top]} of them, {late_ms:.0f} ms late on average"
        parts[0] += "; " + text + f": rank {top} is the straggler"
    sentences = [parts[0]]
    sentences += _ran_as(xray.collectives)
    sentences += [m.text for m in xray.mismatches]
    sentences += [n.text for n in xray.never_entered]
    if xray.pairs:
        sentences.append(f"{len(xray.pairs)} send/recv pair{'s' if len(xray.pairs) != 1 else ''}")
    sentences += list(xray.unpaired)
    if xray.unrecorded:
        listed = ", ".join(f"rank {rank}: {n}" for rank, n in sorted(xray.unrecorded.items()))
        sentences.append(f"point-to-point ops the recorder does not keep (gloo's sends and receives): {listed}")
    if xray.lost:
        listed = ", ".join(f"rank {rank}: {n}" for rank, n in sorted(xray.lost.items()))
        sentences.append(f"collectives lost before they were read: {listed}")
    return ". ".join(sentence(text) for text in sentences)


def _ran_as(collectives: Iterable[Collective]) -> list[str]:
    """What the backend ran under the calls it did not run as called: "gloo ran reduce_scatter #1 as 4
    all_reduces"; many alike, once: "gloo ran each of 12 reduce_scatter_tensor calls as an all_reduce"."""
    alike: dict[tuple[str, str, str], list[int]] = {}
    for collective in collectives:
        if collective.ran:
            alike.setdefault((collective.backend or "the backend", collective.op, ran_text(collective.ran)), []).append(
                collective.seq
            )
    said = []
    for (backend, op, ran), seqs in alike.items():
        said.append(
            f"{backend} ran {op} #{seqs[0]} as {ran}"
            if len(seqs) == 1
            else f"{backend} ran each of {len(seqs)} {op} calls as {ran}"
        )
    return said


def ran_text(ran: Iterable[str]) -> str:
    """``("all_reduce",) * 4`` -> "4 all_reduces"; ``("all_reduce",)`` -> "an all_reduce"."""
    counts: dict[str, int] = {}
    for op in ran:
        counts[op] = counts.get(op, 0) + 1
    parts = [f"{n} {op}s" if n > 1 else f"{'an' if op[:1] in 'aeiou' else 'a'} {op}" for op, n in counts.items()]
    return " and ".join(parts)


def sentence(text: str) -> str:
    """``text`` as a sentence of the summary: its first letter a capital ("rank 3 never did" -> "Rank 3 never did")."""
    return text[:1].upper() + text[1:]


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.0f} {unit}" if count >= 10 * scale else f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _ranks_text(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    return ("rank " if len(listed) == 1 else "ranks ") + ", ".join(str(rank) for rank in listed)


def _call_text(op: str, sizes: tuple[tuple[int, ...], ...]) -> str:
    shapes = " ".join(str(list(shape)) for shape in sizes)
    return f"{op} {shapes}".rstrip()


def _collectives_in(records: Mapping[int, Mapping[str, Any]], pg: str) -> int:
    """A group's collectives in the records: from the first sequence number any rank recorded (a kept
    world's later cell starts past 1) to the last."""
    groups = [rec["groups"][pg] for rec in records.values() if pg in rec.get("groups", {})]
    last = max((int(g.get("last_seq", 0)) for g in groups), default=0)
    firsts = [int(g.get("first_seq", 1) or 1) for g in groups if int(g.get("last_seq", 0))]
    return last - min(firsts) + 1 if last and firsts else 0


def _members(records: Mapping[int, Mapping[str, Any]]) -> dict[str, tuple[int, ...]]:
    """Each group's member ranks: from the recorders' pg_config where it says, else the ranks whose
    records name the group."""
    members: dict[str, set[int]] = {}
    for rank, record in records.items():
        for pg, group in record.get("groups", {}).items():
            members.setdefault(pg, set()).add(rank)
            if isinstance(group, Mapping) and group.get("desc") == "default_pg":
                # every rank is in the default group, those that recorded none of its collectives too (a
                # rank that never came to the first barrier); gloo's recorder names its config "", not "0"
                members[pg].update(records)
        for pg, listed in (record.get("group_ranks") or {}).items():
            if listed and pg in members:
                members[pg].update(int(r) for r in listed)
    return {pg: tuple(sorted(ranks)) for pg, ranks in members.items()}


def _full_entries(records: Mapping[int, Mapping[str, Any]]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    found: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for rank, record in records.items():
        for entry in [*record.get("head", []), *record.get("tail", [])]:
            if entry.get("p2p"):
                continue
            found.setdefault((str(entry["pg"]), int(entry["seq"])), {})[rank] = entry
    return found


def _is_p2p(marks: Mapping[int, Mapping[str, Any]]) -> bool:
    return any(entry.get("p2p") for entry in marks.values())


def _shape(entry: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in shape) for shape in entry.get("sizes", []))


def _collective(key: tuple[str, int], marks: Mapping[int, Mapping[str, Any]]) -> Collective:
    arrivals = tuple(
        Arrival(rank, int(e["created_ns"]), str(e["op"]), _shape(e), tuple(e.get("dtypes", [])))
        for rank, e in sorted(marks.items())
    )
    first = marks[min(marks)]
    last: int | None = None
    late = 0.0
    waits: dict[int, float] = {}
    if len(arrivals) > 1:
        latest = max(arrivals, key=lambda a: a.created_ns)
        last = latest.rank
        others = [a.created_ns for a in arrivals if a.rank != last]
        late = (latest.created_ns - sum(others) / len(others)) / 1e9
        waits = {a.rank: (latest.created_ns - a.created_ns) / 1e9 for a in arrivals}
    return Collective(
        key[0],
        str(first.get("group", "")),
        key[1],
        str(first["op"]),
        _shape(first),
        int(first.get("bytes", 0)),
        arrivals,
        last,
        late,
        waits,
    )


def _first_arrival(collective: Collective) -> int:
    return min(a.created_ns for a in collective.arrivals)


def _lateness(
    records: Mapping[int, Mapping[str, Any]],
    members: Mapping[str, tuple[int, ...]],
    under: Iterable[tuple[str, int]] = (),
) -> tuple[dict[int, int], dict[int, float]]:
    """Per rank: at how many collectives it arrived last, and its lateness summed there (seconds),
    from every group's timeline, re-bucketed to the coarsest bucket any member used."""
    last_at = dict.fromkeys(records, 0)
    late_sums = dict.fromkeys(records, 0.0)
    skipped = set(under)  # (group, seq): collectives run under a call whose first stands for it
    for pg, ranks in members.items():
        present = [rank for rank in ranks if rank in records and pg in records[rank].get("groups", {})]
        if len(present) < 2 or len(present) < len(ranks):
            continue
        groups = {rank: records[rank]["groups"][pg] for rank in present}
        coarse = max(int(group.get("bucket", 1)) for group in groups.values())
        timelines: dict[int, dict[int, list[int]]] = {}
        for rank, group in groups.items():
            ratio = coarse // int(group.get("bucket", 1))
            line = timelines[rank] = {}
            for key, count, total in group.get("buckets", []):
                cell = line.setdefault(int(key) // ratio, [0, 0])
                cell[0] += int(count)
                cell[1] += int(total)
        # the record's first collective on a group measures when each rank began (a fork's start, a kept world's
        # cell reaching each rank), not how slow one is: not counted while buckets hold a collective each
        first = min(int(group.get("first_seq", 0) or 0) for group in groups.values())
        for key in set.intersection(*(set(line) for line in timelines.values())):
            if coarse == 1 and (key == first or (pg, key) in skipped):
                continue
            counts = {timelines[rank][key][0] for rank in present}
            if len(counts) != 1:
                continue  # a bucket some rank has not finished: compared once it has
            count = counts.pop()
            means = {rank: timelines[rank][key][1] / count for rank in present}
            last = max(present, key=lambda rank: means[rank])
            others = [means[rank] for rank in present if rank != last]
            last_at[last] += count
            late_sums[last] += count * (means[last] - sum(others) / len(others)) / 1e9
    return last_at, late_sums


def _mismatch(key: tuple[str, int], marks: Mapping[int, Mapping[str, Any]]) -> Mismatch | None:
    if len(marks) < 2:
        return None
    ops = {str(e["op"]) for e in marks.values()}
    compare_shapes = not (ops & UNEVEN_OPS)
    calls: dict[tuple[Any, ...], list[int]] = {}
    for rank, entry in sorted(marks.items()):
        signature = (
            (str(entry["op"]), _shape(entry), tuple(entry.get("dtypes", []))) if compare_shapes else (str(entry["op"]), (), ())
        )
        calls.setdefault(signature, []).append(rank)
    if len(calls) == 1:
        return None
    ordered = sorted(calls.items(), key=lambda item: (-len(item[1]), item[1]))
    described = tuple((tuple(ranks), _call_text(sig[0], sig[1]) + _dtype_note(sig, ordered)) for sig, ranks in ordered)
    majority, *minority = described
    group = str(next(iter(marks.values())).get("group", ""))
    said = "; ".join(f"{_ranks_text(ranks)} called {call}" for ranks, call in minority)
    text = f"{said} where {_ranks_text(majority[0])} called {majority[1]} at #{key[1]}" + (
        f" ({group})" if group and group != "default_pg" else ""
    )
    return Mismatch(key[0], group, key[1], described, text)


def _dtype_note(signature: tuple[Any, ...], ordered: list[tuple[tuple[Any, ...], list[int]]]) -> str:
    """The dtypes, said only where they are what differs."""
    same_calls = {(sig[0], sig[1]) for sig, _ranks in ordered}
    if len(same_calls) == len(ordered) or not signature[2]:
        return ""
    return " " + "/".join(str(d).lower() for d in signature[2])


def _never_entered(
    records: Mapping[int, Mapping[str, Any]],
    members: Mapping[str, tuple[int, ...]],
    full: Mapping[tuple[str, int], Mapping[int, Mapping[str, Any]]],
) -> list[NeverEntered]:
    found = []
    for pg, ranks in sorted(members.items()):
        last = {rank: int(records.get(rank, {}).get("groups", {}).get(pg, {}).get("last_seq", 0)) for rank in ranks}
        top = max(last.values(), default=0)
        absent = tuple(rank for rank in ranks if last[rank] < top)
        if not absent:
            continue
        # a kept world's later cell: a rank that issued nothing in it has last 0, yet the cell's first is past 1
        firsts = [_first_seq(records.get(rank, {}), pg) for rank in ranks if last[rank]]
        seq = max(min(last[rank] for rank in absent) + 1, min(firsts, default=1))
        entered = tuple(rank for rank in ranks if last[rank] >= seq)
        marks = full.get((pg, seq), {})
        op = str(next(iter(marks.values()))["op"]) if marks else "a collective"
        group = str(next(iter(marks.values())).get("group", "")) if marks else ""
        where = f" ({group})" if group and group != "default_pg" else ""
        text = f"{_ranks_text(entered)} entered {op} #{seq}{where}; {_ranks_text(absent)} never did"
        found.append(NeverEntered(pg, group, seq, op, entered, absent, text))
    return found


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _calls(records: Mapping[int, Mapping[str, Any]], calls: Mapping[int, Mapping[str, Any]]) -> list[Call]:
    """The cell's collective calls with the collectives the backend ran under each, lined up across the
    ranks by (group, call number): the first rank (lowest) whose record holds them says which."""
    found: dict[tuple[str, int], Call] = {}
    for rank in sorted(calls):
        entries: dict[str, list[tuple[int, int, str]]] = {}
        for entry in [*records.get(rank, {}).get("head", []), *records.get(rank, {}).get("tail", [])]:
            if not entry.get("p2p") and entry.get("created_ns"):
                entries.setdefault(str(entry["pg"]), []).append((int(entry["created_ns"]), int(entry["seq"]), str(entry["op"])))
        for call in calls[rank].get("calls") or []:
            if not isinstance(call, Mapping) or str(call.get("op")) in _P2P_CALLS or not call.get("t0") or not call.get("t1"):
                continue
            key = (str(call.get("group", "")), int(call.get("seq", 0) or 0))
            if key in found:
                continue
            t0, t1 = int(call["t0"]), int(call["t1"])
            under = sorted((seq, op) for created, seq, op in entries.get(key[0], []) if t0 <= created <= t1)
            if under:
                found[key] = Call(key[0], key[1], str(call["op"]), tuple(s for s, _ in under), tuple(o for _, o in under))
    return sorted(found.values(), key=lambda call: (call.group, call.number))


_P2P_CALLS = frozenset({"send", "isend", "recv", "irecv"})


def _redrawn(call: Call) -> bool:
    """Whether the backend ran a call as something else: as several collectives, or as another one
    (gloo's reduce_scatter_tensor: an all_reduce), which is then said; a mere other name for the same
    collective (``all_gather_into_tensor`` recorded as ``all_gather``) is not."""
    return len(call.seqs) > 1 or not same_call(call.op, call.ran[0])


def _as_called(
    collectives: Iterable[Collective], made: Iterable[Call], full: Mapping[tuple[str, int], Mapping[int, Mapping[str, Any]]]
) -> list[Collective]:
    """The collectives named as the cell called them, those a call ran under it made one, with what
    the backend ran (:func:`_redrawn`)."""
    shown = {(c.pg, c.seq): c for c in collectives}
    for call in made:
        if not _redrawn(call):
            first_seq = (call.group, call.seqs[0])
            if first_seq in shown and shown[first_seq].op != call.op:
                shown[first_seq] = replace(shown[first_seq], op=call.op)
            continue
        under = [shown.pop((call.group, seq)) for seq in call.seqs if (call.group, seq) in shown]
        if not under:
            continue
        first = under[0]
        marks = full.get((call.group, first.seq), {})
        backend = next((str(e.get("backend")) for e in marks.values() if e.get("backend")), "")
        shown[(call.group, first.seq)] = Collective(
            first.pg,
            first.group,
            first.seq,
            call.op,
            first.sizes,
            sum(c.bytes for c in under),
            first.arrivals,
            first.last,
            first.late_s,
            first.waits_s,
            ran=call.ran,
            seqs=call.seqs,
            backend=backend,
        )
    return list(shown.values())


def _unrecorded(record: Mapping[str, Any], calls: Mapping[str, Any] | None) -> int:
    """A rank's sends and receives its recorder did not keep (gloo's): from the cell's calls where it
    wrote them down, less those the recorder has (NCCL's); else the op numbers they took (``ranks._xray``)."""
    groups = record.get("groups", {}).values()
    if calls is None:
        return sum(int(g.get("unrecorded", 0)) for g in groups)
    made = sum(1 for call in calls.get("calls") or [] if isinstance(call, Mapping) and str(call.get("op")) in _P2P_CALLS)
    kept = sum(int(g.get("ops", {}).get(op, [0])[0]) for g in groups for op in ("send", "recv"))
    return max(0, made - kept)


def _first_seq(record: Mapping[str, Any], pg: str) -> int:
    group = record.get("groups", {}).get(pg, {})
    return int(group.get("first_seq", 1) or 1)


def _pairs(records: Mapping[int, Mapping[str, Any]], members: Mapping[str, tuple[int, ...]]) -> tuple[list[P2PPair], list[str]]:
    """NCCL's recorded sends and receives paired: (group, src, dst) in order on both sides."""
    sends: dict[tuple[str, int, int], list[Mapping[str, Any]]] = {}
    recvs: dict[tuple[str, int, int], list[Mapping[str, Any]]] = {}
    for _rank, record in sorted(records.items()):
        group_ranks = {str(pg): [int(r) for r in listed] for pg, listed in (record.get("group_ranks") or {}).items()}
        for entry in [*record.get("head", []), *record.get("tail", [])]:
            if not entry.get("p2p"):
                continue
            kind, _, peers = str(entry["op"]).partition(" ")
            listed = group_ranks.get(str(entry["pg"])) or list(members.get(str(entry["pg"]), ()))
            try:
                if kind == "send":
                    src, dst = (int(p) for p in peers.split("->"))
                elif kind == "recv":
                    dst, src = (int(p) for p in peers.split("<-"))
                else:
                    continue
                src, dst = (listed[src], listed[dst]) if listed else (src, dst)
            except (ValueError, IndexError):
                continue
            (sends if kind == "send" else recvs).setdefault((str(entry["pg"]), src, dst), []).append(entry)
    pairs: list[P2PPair] = []
    unpaired: list[str] = []
    for key in sorted(set(sends) | set(recvs)):
        out, into = sends.get(key, []), recvs.get(key, [])
        for sent, received in zip(out, into, strict=False):
            pairs.append(P2PPair(key[0], key[1], key[2], _shape(sent), int(sent["created_ns"]), int(received["created_ns"])))
        if len(out) > len(into):
            unpaired.append(
                f"rank {key[1]} sent to rank {key[2]} {_times(len(out) - len(into))} more than rank {key[2]} received"
            )
        elif len(into) > len(out):
            unpaired.append(
                f"rank {key[2]} received from rank {key[1]} {_times(len(into) - len(out))} more than rank {key[1]} sent"
            )
    return pairs, unpaired
