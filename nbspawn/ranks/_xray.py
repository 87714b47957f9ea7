"""In every rank: a bounded record of every collective of a run, for the collectives X-ray (issue #43).

torch's flight recorder keeps a ring of the last ``TORCH_FR_BUFFER_SIZE`` collectives of the rank (all
its process groups together); a collective that falls off the ring is gone.  :class:`Drainer` is a daemon
thread that empties the ring before it wraps.  Every :data:`POLL_EVERY` it counts the collectives its
groups have enqueued (each group's sequence number, :func:`sequence_counter`: ~1 µs), and it dumps the whole ring (torch
gives its entries no other way: ~15 µs an entry read back, measured unloaded) when it is nearly
full (and, for the live view, every :data:`LIVE_EVERY` at the most, never so often that those drains
take over :data:`LIVE_SHARE` of the rank's time): :data:`XRAY_FR_ENTRIES` less a headroom of :data:`HEADROOM_SECONDS` of collectives at the rate
seen (at least :data:`MIN_HEADROOM`).  So each entry is read about once (a drain costs the whole
ring, the rarer the cheaper), and nothing is lost unless more than the headroom comes while a poll
and a drain go by; what is lost anyway is counted (gaps in the recorder's ``record_id``), never
silently dropped.  Measured on this project's shared 2-core machine (load ~10): one rank doing
20,000 all_reduces at ~6,000 a second, and two ranks at ~1,800, lost none.

What is kept (:class:`CollectiveLog`), whatever the run's length:

* the first and the last :data:`KEPT_FULL` collectives in full (op, group, sequence number, sizes,
  dtypes, bytes, creation time);
* for every collective, counts and bytes by group and op, and the rank's issue-time stats;
* a timeline of creation times per group, by buckets of sequence numbers: one collective a bucket
  until a group has :data:`MAX_BUCKETS` of them, then pairs merged (2, 4, 8 … a bucket), so every rank
  buckets the same sequence numbers together and the ranks' mean arrival per bucket can be compared;
* how many point-to-point operations the recorder did not keep: under gloo torch records no send or
  recv, but each takes an ``op_id``, so a gap in a group's ``op_id`` is one.

The bound: 2 × 256 full entries (~150 KB in JSON), 64 groups × 4,096 buckets (~100 KB a busy group),
aggregates by (group, op): a few hundred KB in memory and on disk whatever the number of collectives.

Timing, measured with torch 2.13's CPU build: gloo's entries stay "scheduled" with no start or end
time, and its process groups accept no completion hook (``_register_on_completion_hook`` is NCCL's
only), so a rank's arrival is its entry's ``time_created_ns`` (wall clock, comparable across the ranks
of one machine); how long the others waited for the last is the difference, and each rank's next
issue bounds when it left.  NCCL's entries also carry started and completed times: they are kept.

torch keeps two recorders (:func:`recorders_of`): gloo writes the generic one, ProcessGroupNCCL its own.
A drain reads both, each numbering its entries apart (so a loss is counted per recorder); NCCL's only
once CUDA is initialized and from a device the rank holds a context on (``_devicememory.on_a_held_device``).
NCCL's sequence numbers count collectives only, so once its recorder has entries the live view's drains
come every :data:`LIVE_EVERY` whatever the count (its sends and receives move none).

The record is written to the rank's ``xray.json`` (``_rankdir.XRAY``), atomically, every
:data:`WRITE_EVERY` while it changes and at :meth:`Drainer.stop`.

Why the count is not asked of the recorder: torch's dump (``_dump_fr_trace``, either kind) walks the
recorder's maps of its groups' status and configuration without its lock, while the main thread adds
to them (a group's first collective, a new group: ``FlightRecorder::recordWithResetEnabled``,
``record_pg_ranks``, which take the lock the reader does not).  A rank crashed so once (SIGSEGV in this
thread's dump while the main thread ran DTensor's first ``scatter`` on a new mesh's group).  Polling
the dump 100 times a second was nearly all of the exposure; now only a drain dumps (for the live view
every :data:`LIVE_EVERY` at the most, a nearly full ring, the cell's start and end), a few hundred
times fewer.  Only dumping from the main thread would close it, and that thread is the one a hang
blocks.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import json
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, cast

from .._rankdir import XRAY, write_json
from . import _devicememory, _xray_values
from ._stackdump import HELPER_THREAD_BLOCKS

XRAY_FR_ENTRIES = 4096  # the recorder's ring while X-rayed (nbspawn's default is 256)
MIN_HEADROOM = 256  # entries a drain leaves free in the ring at the least
HEADROOM_SECONDS = 0.25  # and, at the rate collectives come, this long's worth
POLL_EVERY = 0.01  # seconds between looks at the groups' status
WRITE_EVERY = 2.0  # seconds between writes of the record while it changes
LIVE_EVERY = 2.0  # seconds between drains for the live view, at the most often (else only a nearly full ring drains)
LIVE_SHARE = 0.01  # and never so often that those drains take more than this share of the rank's time
KEPT_FULL = 256  # the first and the last collectives kept in full
MAX_BUCKETS = 4096  # a group's timeline buckets before pairs are merged
MAX_GROUPS = 64  # groups with a timeline; more are counted in the aggregates only
FORMAT = 1

DTYPE_BYTES = {
    "Bool": 1,
    "Byte": 1,
    "Char": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Short": 2,
    "Half": 2,
    "BFloat16": 2,
    "Int": 4,
    "Float": 4,
    "Long": 8,
    "Double": 8,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}


def entry_bytes(sizes: list[list[int]], dtypes: list[str]) -> int:
    """The bytes of the tensors an entry lists (an unknown dtype counts 4 bytes an element)."""
    total = 0
    for index, shape in enumerate(sizes):
        count = 1
        for dim in shape:
            count *= int(dim)
        total += count * DTYPE_BYTES.get(dtypes[index] if index < len(dtypes) else "", 4)
    return total


def kept(entry: dict[str, Any]) -> dict[str, Any]:
    """What the X-ray needs of one flight-recorder entry (its ``process_group`` is (name, description))."""
    name = str(entry.get("profiling_name", ""))
    backend, _, op = name.partition(":") if ":" in name else ("", "", name)
    group = entry.get("process_group") or ("", "")
    sizes = [list(shape) for shape in entry.get("input_sizes") or []]
    dtypes = list(entry.get("input_dtypes") or [])
    record = {
        "pg": str(group[0]),
        "group": str(group[-1]),
        "seq": int(entry.get("collective_seq_id") or 0),
        "p2p_seq": int(entry.get("p2p_seq_id") or 0),
        "op_id": int(entry.get("op_id") or 0),
        "op": op,  # "all_reduce"; NCCL's point-to-point: "send 0->1", "recv 1<-0" (group ranks)
        "backend": backend,
        "p2p": bool(entry.get("is_p2p")),
        "sizes": sizes,
        "dtypes": dtypes,
        "out_sizes": [list(shape) for shape in entry.get("output_sizes") or []],
        "bytes": entry_bytes(sizes, dtypes),
        "created_ns": int(entry.get("time_created_ns") or 0),
    }
    for key, short in (("time_discovered_started_ns", "started_ns"), ("time_discovered_completed_ns", "completed_ns")):
        if entry.get(key):
            record[short] = int(entry[key])
    return record


class _Group:
    """One process group's aggregates and timeline."""

    def __init__(self, desc: str, last_op_id: int = 0) -> None:
        self.desc = desc
        self.count = 0
        self.bytes = 0
        self.ops: dict[str, list[int]] = {}  # op -> [count, bytes]
        self.first_seq = 0
        self.last_seq = 0
        self.last_op_id = last_op_id  # where the record began: a kept world's group has a past
        self.broken = False  # records were lost since the last one: an op_id gap may be theirs
        self.unrecorded = 0  # op_ids the recorder skipped: gloo's sends and receives
        self.bucket = 1  # sequence numbers a timeline bucket holds (a power of two)
        self.buckets: dict[int, list[int]] = {}  # seq // bucket -> [count, sum of creation times (ns)]

    def add(self, record: dict[str, Any], timeline: bool) -> None:
        self.count += 1
        self.bytes += record["bytes"]
        op = record["op"].split(" ", 1)[0]
        counted = self.ops.setdefault(op, [0, 0])
        counted[0] += 1
        counted[1] += record["bytes"]
        if record["op_id"] > self.last_op_id + 1 and not self.broken:
            self.unrecorded += record["op_id"] - self.last_op_id - 1
        self.last_op_id = max(self.last_op_id, record["op_id"])
        self.broken = False
        if record["p2p"]:
            return
        self.first_seq = min(self.first_seq or record["seq"], record["seq"])
        self.last_seq = max(self.last_seq, record["seq"])
        if not timeline:
            return
        cell = self.buckets.setdefault(record["seq"] // self.bucket, [0, 0])
        cell[0] += 1
        cell[1] += record["created_ns"]
        if len(self.buckets) > MAX_BUCKETS:
            self._merge_pairs()

    def _merge_pairs(self) -> None:
        merged: dict[int, list[int]] = {}
        for key, (count, total) in self.buckets.items():
            cell = merged.setdefault(key // 2, [0, 0])
            cell[0] += count
            cell[1] += total
        self.bucket *= 2
        self.buckets = merged

    def as_json(self) -> dict[str, Any]:
        return {
            "desc": self.desc,
            "count": self.count,
            "bytes": self.bytes,
            "ops": self.ops,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "last_op_id": self.last_op_id,
            "unrecorded": self.unrecorded,
            "bucket": self.bucket,
            "buckets": [[key, count, total] for key, (count, total) in sorted(self.buckets.items())],
        }


class CollectiveLog:
    """The bounded record of one rank's collectives (see the module's docstring for the bound).

    ``since``: each group's op number (``op_id``) when the record began: in a kept world a cell's
    record holds that cell's collectives only, though the ring still holds earlier cells'."""

    def __init__(self, rank: int, kept_full: int = KEPT_FULL, since: dict[str, int] | None = None) -> None:
        self.rank = rank
        self.since = dict(since or {})
        self.kept_full = kept_full
        self.head: list[dict[str, Any]] = []
        self.tail: collections.deque[dict[str, Any]] = collections.deque(maxlen=kept_full)
        self.groups: dict[str, _Group] = {}
        self.count = 0
        self.lost = 0  # entries that fell off torch's ring before a drain read them
        self._broken = False  # some were lost: a group first seen after it has an uncertain start
        self.last_record_id: dict[str, int] = {}  # each recorder's (they number their entries apart)
        self.first_ns = 0
        self.last_ns = 0
        self.gap_max_ns = 0  # the longest time between two issues
        self.ranks: dict[str, list[int]] = {}  # group name -> its global ranks (from the recorder's pg_config)

    def add_entries(self, entries: Iterable[dict[str, Any]], recorder: str = "generic") -> int:
        """Adds the entries of ``recorder`` (torch's generic one, gloo's; or NCCL's: each numbers its
        entries from 0) not seen yet (by ``record_id``, oldest first); how many were new."""
        last = self.last_record_id.get(recorder, -1)
        fresh = sorted(
            (e for e in entries if int(e.get("record_id", -1)) > last and not self._before(e)),
            key=lambda e: int(e["record_id"]),
        )
        for entry in fresh:
            record_id = int(entry["record_id"])
            lost = 0
            if last >= 0 and record_id > last + 1:
                lost = record_id - last - 1
            elif last < 0 and record_id > 0 and not self.since:
                lost = record_id  # the ring had wrapped before the first drain
            if lost:
                self.lost += lost
                self._broken = True
                for group in self.groups.values():
                    group.broken = True
            last = self.last_record_id[recorder] = record_id
            self.add(kept(entry))
        return len(fresh)

    def _before(self, entry: dict[str, Any]) -> bool:
        """Whether an entry is from before the record began."""
        group = entry.get("process_group") or ("",)
        return int(entry.get("op_id") or 0) <= self.since.get(str(group[0]), 0)

    def add(self, record: dict[str, Any]) -> None:
        self.count += 1
        created = record["created_ns"]
        if self.last_ns and created > self.last_ns:
            self.gap_max_ns = max(self.gap_max_ns, created - self.last_ns)
        self.first_ns = self.first_ns or created
        self.last_ns = max(self.last_ns, created)
        group = self.groups.get(record["pg"])
        if group is None:
            group = self.groups[record["pg"]] = _Group(record["group"], self.since.get(record["pg"], 0))
            group.broken = self._broken  # a group first seen after a loss: its gap may be the loss
        group.add(record, timeline=len(self.groups) <= MAX_GROUPS)
        if len(self.head) < self.kept_full:
            self.head.append(record)
        else:
            self.tail.append(record)

    def note_config(self, pg_config: dict[str, Any]) -> None:
        """Each group's global ranks, from a dump's ``pg_config`` (name -> {"ranks": "[0, 1]"})."""
        for name, config in pg_config.items():
            try:
                self.ranks[str(name)] = [int(r) for r in json.loads(str(config.get("ranks", "[]")))]
            except (ValueError, TypeError, AttributeError):
                continue

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "rank": self.rank,
            "count": self.count,
            "lost": self.lost,
            "kept_full": self.kept_full,
            "issued": {"first_ns": self.first_ns, "last_ns": self.last_ns, "gap_max_ns": self.gap_max_ns},
            "groups": {name: group.as_json() for name, group in self.groups.items()},
            "group_ranks": self.ranks,
            "head": self.head,
            "tail": list(self.tail),
        }


class Recorder(NamedTuple):
    """One of torch's flight recorders, as the drainer asks it: its groups' status only, or everything
    (no stack traces), each a dump read back ({} while it can hold nothing)."""

    name: str
    status: Callable[[], dict[str, Any]]
    everything: Callable[[], dict[str, Any]]


def recorders_of(c10d: Any) -> list[Recorder]:
    """The rank's two flight recorders (``ranks._watch.recorders`` reads the same two for a hang):
    the generic one, which gloo and other CPU backends write, and ProcessGroupNCCL's own
    (``FlightRecorder<at::cuda::CUDAEvent>``, NCCL builds only), which it writes instead.  Pickled
    dumps, the cheaper of torch's two kinds to read back."""

    def generic(collectives: bool) -> Callable[[], dict[str, Any]]:
        return lambda: pickle.loads(c10d._dump_fr_trace(includeCollectives=collectives, includeStackTraces=False))  # noqa: S301 - torch's own dump, this process's

    def nccl(collectives: bool) -> Callable[[], dict[str, Any]]:
        return lambda: _nccl_dump(c10d, collectives)

    return [Recorder("generic", generic(False), generic(True)), Recorder("nccl", nccl(False), nccl(True))]


def _nccl_dump(c10d: Any, collectives: bool) -> dict[str, Any]:
    """NCCL's recorder, read from this helper thread without making a CUDA context it should not.

    Nothing before CUDA is initialized (no NCCL group can exist; and asking would initialize it on
    this thread, where nbspawn's queued ``set_device`` would then run: ``ranks._devicememory``).
    The dump asks each unfinished entry's CUDA events (``cudaEventQuery``), a runtime call that opens a
    context on the calling thread's device, 0 for a new thread: so the thread first makes its own a
    device the rank holds a context on (the fourth GPU review's U1)."""
    dump = getattr(c10d, "_dump_nccl_trace", None)  # looked up each time: a build without NCCL has none
    if dump is None:
        return {}
    with _devicememory.on_a_held_device() as held:
        if not held:
            return {}
        return cast(
            "dict[str, Any]",
            pickle.loads(dump(includeCollectives=collectives, includeStackTraces=False, onlyActive=False)),  # noqa: S301
        )


def sequence_counter() -> Callable[[], int]:
    """How to count the collectives (and point-to-point ops) this rank's groups have enqueued, without
    torch's dump (see the module's docstring): the sum of each group's sequence number, which gloo
    advances with each op as its recorder's ``last_enqueued_collective`` (checked: equal after
    collectives, a new group and sends).  Over-counting (a group of another backend) only drains sooner."""
    import torch.distributed.distributed_c10d as c10d_py

    world = c10d_py._world

    def count() -> int:
        total = 0
        young = []
        groups = list(world.pg_map)  # list(): one C call, under the GIL, whatever the main thread adds
        for pg in groups:
            seq = int(pg._get_sequence_number_for_group())  # type: ignore[attr-defined]  # (not in torch's stubs)
            total += seq
            if seq == 0:  # its first collective will insert its status
                young.append(id(pg))
        _groups.saw((len(groups), tuple(young)))
        return total

    count()  # this torch has what it needs, or the caller falls back to the recorder's status
    return count


class GroupsWatch:
    """When this rank's groups last changed in the way torch's dump cannot bear (the module's docstring:
    it walks the recorders' maps of groups without their lock): a group made, or a group's first
    collective (the one insert into its status map, just after its sequence number goes 0 -> 1).  Seen
    at each of the drainer's polls; a dump waits until they have been still for :data:`SETTLED` (the
    fourth GPU review's N-m1: narrowed, not closed; only torch taking its lock would close it).  The
    drainer's last drain, at the cell's end, does not wait: the main thread makes no group then."""

    def __init__(self) -> None:
        self._seen: Any = None
        self._changed = 0.0

    def saw(self, signature: Any) -> None:
        if signature != self._seen:
            self._seen, self._changed = signature, time.monotonic()

    def settled(self) -> bool:
        return time.monotonic() - self._changed >= SETTLED


# seconds the groups must have been still before the drainer (or a hang watch's look) dumps: group set-ups come
# in bursts (a device mesh's), and the first collective's insert follows its sequence number within microseconds;
# short, as a tight loop's ring (6,000 collectives a second here) must still be drained before it wraps
SETTLED = 0.25
_groups = GroupsWatch()  # this process's (its drainer's polls keep it)


def groups_settled() -> bool:
    """Whether a dump now is clear of the groups' set-up, as far as the drainer's polls have seen (with no
    drainer, nothing seen: True)."""
    return _groups.settled()


def enqueued_by_group(status: dict[str, Any]) -> dict[str, int]:
    """Each group's op number (``op_id``, collectives and point-to-point ops) enqueued so far."""
    found = {}
    for name, state in (status.get("pg_status") or {}).items():
        try:
            found[str(name)] = max(0, int(state.get("last_enqueued_collective", 0)))
        except (TypeError, ValueError, AttributeError):
            continue
    return found


def enqueued(status: dict[str, Any]) -> int:
    """Collectives (and point-to-point ops) enqueued so far, all groups together."""
    return sum(enqueued_by_group(status).values())


class Drainer:
    """The thread that empties torch's ring into a :class:`CollectiveLog` and writes it down."""

    def __init__(
        self,
        rank: int,
        path: str,
        c10d: Any = None,
        poll_every: float = POLL_EVERY,
        ring: int = XRAY_FR_ENTRIES,
        since: dict[str, int] | None = None,
        counter: Callable[[], int] | None = None,
    ) -> None:
        if c10d is None:
            import torch

            c10d = torch._C._distributed_c10d
        self.recorders = recorders_of(c10d)
        if counter is None:
            try:
                counter = sequence_counter()
            except Exception:  # no such call in this torch: the recorders' status, as before
                counter = lambda: sum(enqueued(self._status(r)) for r in self.recorders)  # noqa: E731
        self.count_now = counter
        # what the rings held before is not this record's (a kept world's earlier cells), unless ``since`` says
        # what to leave out ({}: everything in them is this record's, a program's from its first group)
        before: dict[str, int] = {} if since is None else since
        if since is None:
            for recorder in self.recorders:  # group names are the process's: one recorder's never clash with the other's
                before.update(enqueued_by_group(self._status(recorder)))
        self.log = CollectiveLog(rank, since=before)
        self.path = path
        self.poll_every = poll_every
        self.ring = ring
        self.rate = 0.0  # collectives a second, smoothed
        self.drained_at = 0  # enqueued count at the last drain
        with contextlib.suppress(Exception):
            self.drained_at = self.count_now()
        self.written_count = -1
        self.written_at = 0.0
        self.drains = 0
        self.drain_seconds = 0.0
        self.last_drain_cost = 0.0
        self.drained_when = time.monotonic()
        self._lock = threading.Lock()  # a drain at stop() and one on the thread never interleave
        self._stop = threading.Event()
        self._done = threading.Event()
        self._seen = (0, 0.0)  # enqueued, and when, at the last poll
        # NCCL's recorder had entries: its point-to-point ops move no group's sequence number (NCCL's counts
        # collectives only), so the live view's drains come on time, not on a changed count
        self._nccl_seen = False

    @staticmethod
    def _status(recorder: Recorder) -> dict[str, Any]:
        try:
            return recorder.status()
        except Exception:  # this torch cannot be asked: nothing known before
            return {}

    def start(self) -> None:
        # like ranks._watch: no threading.Thread.start(), which waits for the thread to be scheduled
        _thread.start_new_thread(self._loop, ())

    def _loop(self) -> None:
        # as ranks._watch's thread: SIGINT and SIGTERM stay the main thread's
        signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_THREAD_BLOCKS)
        try:
            self._seen = (0, time.monotonic())
            while not self._stop.wait(self.poll_every):
                with contextlib.suppress(Exception):  # never let this thread take the rank down
                    self._tick()
        finally:
            self._done.set()

    def _tick(self) -> None:
        now, count = time.monotonic(), self.count_now()
        seen, seen_at = self._seen
        if now > seen_at:
            self.rate = 0.7 * self.rate + 0.3 * max(0, count - seen) / (now - seen_at)
        self._seen = (count, now)
        due = count - self.drained_at >= self.drain_at() or self._live_drain_due(count, now)
        if due and _groups.settled():  # not while groups are being made (at most SETTLED late: see GroupsWatch)
            self.drain()
        if time.monotonic() - self.written_at >= WRITE_EVERY and self.written_count != self.log.count:
            self.write()

    def _live_drain_due(self, count: int, now: float) -> bool:
        """A drain for the live view: something new, :data:`LIVE_EVERY` since the last drain, and at
        least a hundred times the last drain's cost (a full ring takes ~60 ms to read back: then every
        6 s), so what the view costs the rank stays under :data:`LIVE_SHARE`."""
        new = count != self.drained_at or self._nccl_seen
        return new and now - self.drained_when >= max(LIVE_EVERY, self.last_drain_cost / LIVE_SHARE)

    def drain_at(self) -> int:
        """New entries that make a drain: as many as the ring holds, less what could come while a
        poll and a drain go by (a drain reads the whole ring, so the rarer the cheaper)."""
        headroom = max(MIN_HEADROOM, int(self.rate * HEADROOM_SECONDS))
        return max(1, self.ring - headroom)

    def drain(self) -> int:
        """Reads the ring; how many entries were new."""
        with self._lock:
            began = time.perf_counter()
            counted = self.count_now()  # before the dumps: what comes meanwhile is the next drain's
            dumps = []
            for recorder in self.recorders:
                try:
                    dumps.append((recorder.name, recorder.everything()))
                except Exception:  # noqa: S112 - one that cannot be read leaves the other's entries
                    continue
            self.drained_at = counted
            fresh = 0
            for name, dump in dumps:
                self.log.note_config(dump.get("pg_config") or {})
                fresh += self.log.add_entries(dump.get("entries") or [], recorder=name)
                self._nccl_seen = self._nccl_seen or (name == "nccl" and bool(dump.get("entries")))
            self.drains += 1
            self.last_drain_cost = time.perf_counter() - began
            self.drain_seconds += self.last_drain_cost
            self.drained_when = time.monotonic()
            return fresh

    def write(self) -> None:
        with self._lock:
            record = self.log.as_json()
            record["drains"] = self.drains
            record["drain_seconds"] = round(self.drain_seconds, 6)
            count = self.log.count
        if count == 0 and not self.log.ranks:  # no process group, no collective: nothing to draw, no file
            return
        try:
            write_json(self.path, record)
        except OSError:
            return
        self.written_count = count
        self.written_at = time.monotonic()

    def stop(self, timeout: float = 1.0) -> None:
        """The thread ended, a last drain, the record written: call it when the run's work is done (a
        collective that failed included: what the ranks did before it is the point)."""
        self._stop.set()
        self._done.wait(timeout)
        with contextlib.suppress(Exception):
            self.drain()
        self.write()


def record_path(rank_dir: str) -> str:
    return os.path.join(rank_dir, XRAY)


_current: Drainer | None = None  # this rank's, while a cell runs X-rayed
# a program's drainer is started, or the program ends: one at a time; re-entrant, as end() is also
# SIGTERM's last words, which may come while the main thread holds it (N-m8)
_starting = threading.RLock()
_ended = threading.Event()  # end() was called: a program's waiting thread (begin_once_grouped) stops
_program_rank: tuple[int, str] | None = None  # a program's rank and its directory (begin_once_grouped)


def ring_entries(environ: Mapping[str, str]) -> int:
    """The recorder's ring as this rank's torch sizes it (a user's own setting wins over nbspawn's)."""
    for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if key in environ:
            with contextlib.suppress(ValueError):
                return int(environ[key])
    return XRAY_FR_ENTRIES


def begin(rank: int, rank_dir: str, values: bool = False) -> None:
    """The cell's collectives are recorded from now on (its process group is made): the drainer
    thread starts, and torch.distributed's functions are wrapped (``ranks._xray_values``): the calls
    the cell made, with ``values`` (``--xray values``) their tensors' values; :func:`end` writes both down."""
    global _current
    end()
    with contextlib.suppress(Exception):  # no recorder in this torch: no X-ray, never a failed rank
        drainer = Drainer(rank, record_path(rank_dir), ring=ring_entries(os.environ))
        drainer.start()
        _current = drainer
    _xray_values.begin(rank, rank_dir, values)  # the cell's calls always, their values with --xray values


def begin_once_grouped(rank: int, rank_dir: str, poll_every: float = 0.02) -> None:
    """A program's collectives are recorded from its first process group on (``%spawn -- train.py``:
    the program makes its group when it chooses).  A thread waits until the program's own
    ``torch.distributed`` is initialized, a dictionary lookup every ``poll_every``; it never imports
    torch itself, so a program that makes no group pays nothing else.  The drainer then takes the ring
    from its start (a collective issued while the thread slept is still in it), and :func:`end`
    writes it down as a cell's."""
    global _program_rank
    _program_rank = (rank, rank_dir)
    _thread.start_new_thread(_wait_for_a_group, (rank, rank_dir, poll_every))


def _wait_for_a_group(rank: int, rank_dir: str, poll_every: float) -> None:
    global _current
    signal.pthread_sigmask(signal.SIG_BLOCK, HELPER_THREAD_BLOCKS)  # the program's signals stay its main thread's
    while not _ended.wait(poll_every):
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        try:
            grouped = c10d is not None and bool(c10d.is_initialized())
        except Exception:  # noqa: S112 - a module still being imported: the next look
            continue
        if not grouped:
            continue
        with _starting, contextlib.suppress(Exception):  # no recorder in this torch: no X-ray, never a failed rank
            if not _ended.is_set():
                drainer = Drainer(rank, record_path(rank_dir), ring=ring_entries(os.environ), since={})
                drainer.start()
                _current = drainer
        return


def end() -> None:
    """The cell is over, however (returned, raised, stopped by SIGTERM): the last drain, the record
    written, torch's functions given back.  Once; a no-op when nothing was recorded."""
    global _current
    _ended.set()  # a program's waiting thread starts no drainer from now on
    with _starting:
        drainer, _current = _current, None
    if drainer is not None:
        with contextlib.suppress(Exception):
            drainer.stop()
    elif _program_rank is not None and "torch.distributed.distributed_c10d" in sys.modules:
        with contextlib.suppress(Exception):  # a program quicker than the wait for its group: its ring read once
            rank, rank_dir = _program_rank
            once = Drainer(rank, record_path(rank_dir), ring=ring_entries(os.environ), since={})
            once.drain()
            once.write()
    _xray_values.end()
