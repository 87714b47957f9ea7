"""Where is every rank right now: ``%spawn where [RUN-ID|WORLD]``.

Each rank installed faulthandler at its start (``ranks._cell``, ``ranks._worldloop``, ``ranks/_program.py``)
for SIGUSR1 (``ranks._stackdump``): the dump is written in C, by the signal handler itself or, from
Python 3.11 on, where that handler can crash the rank, by a thread of the rank's own, so a rank
blocked in a collective still gives its stack.  Asking is: note how long each
rank's ``stacks.log`` is, signal the rank (its pid only, never its group: a DataLoader worker has no
handler and would die of it), wait until every file stops growing, read what was appended.

The main thread's frames are cut below the cell and written in its own lines (``Cell In[5], line 6``);
ranks at the same place are grouped, one line each: ``ranks 0,1,3: Cell In[5], line 6: dist.barrier()``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .. import _pids
from .._program import Program
from .._rankdir import COLLECTIVES
from .._source import STILL_STARTING, CellSource, main_thread_stack, program_stack, rewrite_notebook_frames
from ..errors import rank_spans
from ._opnames import P2P, called, same_call
from ._xray import XRay

ANSWER_WAIT = 2.0  # seconds for every rank's dump to arrive
SETTLED = 0.05  # a dump that has not grown for this long is whole


class Where(NamedTuple):
    """What a look at running ranks saw (``Executor.look``), by global rank: each one's stack dump (None:
    it could not be asked) and its recent collectives (the flight recorder's).  A node's agent sends
    the same two as ``cluster._wire.Where``."""

    stacks: dict[int, str | None]
    collectives: dict[int, list[dict[str, Any]]]


@dataclass(frozen=True)
class RankToAsk:
    rank: int
    pid: int | None
    stacks_path: str  # where its faulthandler writes (it exists once the handler is installed)
    node: str | None = None


def rank_stacks(ranks: list[RankToAsk], wait: float = ANSWER_WAIT) -> dict[int, str | None]:
    """Each rank's new dump (None: it could not be asked: not started, gone, or no handler yet)."""
    sizes: dict[int, int] = {}
    for asked in ranks:
        if asked.pid is None or not os.path.exists(asked.stacks_path):
            continue  # still starting: SIGUSR1 would kill it
        if _pids.recycled(asked.pid):
            continue  # reaped, its pid another process's now: SIGUSR1 would kill that one
        try:
            sizes[asked.rank] = os.path.getsize(asked.stacks_path)
            os.kill(asked.pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError, OSError):
            sizes.pop(asked.rank, None)
    paths = {asked.rank: asked.stacks_path for asked in ranks}
    grown = await_dumps({rank: (paths[rank], before) for rank, before in sizes.items()}, wait)
    found: dict[int, str | None] = {asked.rank: None for asked in ranks}
    for rank, before in sizes.items():
        if rank in grown:
            with open(paths[rank], "rb") as fh:
                fh.seek(before)
                found[rank] = fh.read().decode("utf-8", "replace")
    return found


def await_dumps(asked: dict[int, tuple[str, int]], wait: float) -> set[int]:
    """The ranks whose stacks file (``asked``: rank -> its path and size before it was asked) took a
    whole dump within ``wait`` seconds.  faulthandler writes a dump a line at a time, so a file that has
    grown is waited on until it has not grown for :data:`SETTLED`: one read (or a rank ended) while it
    still grows is a dump cut short, without the frames that say where the rank was."""
    grown: dict[int, tuple[int, float]] = {}
    until = time.monotonic() + wait
    while time.monotonic() < until:
        now = time.monotonic()
        for rank, (path, before) in asked.items():
            size = _size(path)
            if size > before and grown.get(rank, (0, 0.0))[0] != size:
                grown[rank] = (size, now)
        if len(grown) == len(asked) and all(now - at >= SETTLED for _size_, at in grown.values()):
            break
        time.sleep(0.01)
    return set(grown)


def rank_collectives(ranks: list[RankToAsk], dumps: dict[int, str | None], wait: float = 0.6) -> dict[int, list[dict[str, Any]]]:
    """Each answering rank's recent collectives (``ranks._watch`` writes them once it sees the dump),
    oldest first; a rank with no process group, or none written in time, is left out."""
    wanted = {
        asked.rank: (os.path.join(os.path.dirname(asked.stacks_path), COLLECTIVES), _size(asked.stacks_path))
        for asked in ranks
        if dumps.get(asked.rank)
    }
    found: dict[int, list[dict[str, Any]]] = {}
    until = time.monotonic() + wait
    while wanted and time.monotonic() < until:
        for rank, (path, size) in list(wanted.items()):
            try:
                with open(path, encoding="utf-8") as fh:
                    record = json.load(fh)
            except (OSError, ValueError):
                continue
            if int(record.get("asked", 0)) >= size:  # written after this very dump
                entries = [e for e in record.get("entries", []) if "op" in e]
                if entries:
                    found[rank] = entries
                del wanted[rank]
        if wanted:
            time.sleep(0.02)
    return found


def describe(
    ranks: list[RankToAsk],
    dumps: dict[int, str | None],
    cell: CellSource | None,
    program: Program | None = None,
    cell_numbers: dict[str, int] | None = None,
    idle: str = "",
    collectives: dict[int, list[dict[str, Any]]] | None = None,
) -> str:
    """Ranks at the same place grouped, each group's place on one line, then its stack.

    ``idle``: what a rank whose main thread is in no cell is doing (a kept world between cells)."""
    where: dict[str, list[int]] = {}
    for asked in ranks:
        dump = dumps.get(asked.rank)
        if dump is None:
            stack = "  (no answer: it is not running, or not yet listening)"
        elif program is not None:
            stack = program_stack(dump) or "  (no Python frames)"
        else:
            stack = main_thread_stack(dump, cell or CellSource(""))
            if stack == STILL_STARTING or not stack:
                stack = f"  ({idle})" if idle else STILL_STARTING
        stack = rewrite_notebook_frames(stack, cell_numbers or {})
        where.setdefault(stack, []).append(asked.rank)
    lines = []
    for stack, members in sorted(where.items(), key=lambda item: item[1][0]):
        head = f"rank {members[0]}" if len(members) == 1 else f"ranks {rank_spans(sorted(members))}"
        headline = _innermost(stack)
        positions = _merged(_position(collectives, r, stack) for r in members)
        lines.append(f"{head}: {headline}" + (f"  [{'; '.join(positions)}]" if positions else ""))
        if stack.strip().strip("()") != headline:
            lines.extend(stack.splitlines())
    return "\n".join(lines)


def _merged(positions: Iterable[str]) -> list[str]:
    """One position per collective: ranks that entered the same one at different times (on other
    nodes, say) read ``in barrier #1 for 3-4 s``, not as two places."""
    waits: dict[str, list[int]] = {}
    others: set[str] = set()
    for position in positions:
        found = re.fullmatch(r"(in \S+ #\d+) for (\d+) s", position)
        if found:
            waits.setdefault(found[1], []).append(int(found[2]))
        elif position:
            others.add(position)
    merged = {f"{head} for {min(s)}-{max(s)} s" if min(s) != max(s) else f"{head} for {s[0]} s" for head, s in waits.items()}
    return sorted(merged | others)


def _position(collectives: dict[int, list[dict[str, Any]]] | None, rank: int, stack: str) -> str:
    """How far the rank got: ``in barrier #3 for 41 s``, or ``after all_reduce #2``."""
    entries = (collectives or {}).get(rank)
    if not entries:
        return ""
    last = entries[-1]
    op = _waiting_in(stack, entries)
    current = _current(entries, op) if op is not None else None
    if current is not None:
        return f"in {op} #{_seq(current)} for {max(0.0, time.time() - float(current['issued'])):.0f} s"
    return f"after {_named(last)}"


def _innermost(stack: str) -> str:
    """Where the user's code is, in one line: its innermost cell frame and source line, and the library
    call it is in: ``Cell In[5], line 6: dist.barrier()  (in barrier, distributed_c10d.py)``."""
    rows = [row.strip() for row in stack.splitlines() if row.strip()]
    if not rows:
        return "?"
    if rows[-1].startswith("("):
        return rows[-1].strip("()")
    frames = [i for i, row in enumerate(rows) if row.startswith(("File ", "Cell ", "Cell,"))]
    ours = [i for i in frames if rows[i].startswith(("Cell ", "Cell,"))]
    at = ours[-1] if ours else frames[-1] if frames else len(rows) - 1
    source = rows[at + 1] if at + 1 < len(rows) and at + 1 not in frames else ""
    source = re.sub(r"\s{2,}#.*$", "", source)  # the line's code, without its trailing comment
    place = f"{rows[at]}: {source}" if source else rows[at]
    deeper = [rows[i] for i in frames if i > at]
    if deeper:  # faulthandler's form: File "/.../distributed_c10d.py", line 5356 in barrier
        last = deeper[-1]
        name = last.rsplit(" in ", 1)[-1] if " in " in last else ""
        file = last.split('"')[1].rsplit("/", 1)[-1] if '"' in last else ""
        place += f"  (in {name}, {file})" if name and file else ""
    return place


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- the verdict on a stopped run ---------------------------------------------------------------------

_C10D = "torch/distributed/distributed_c10d.py"

HANG_SUSPECT_AFTER = 10.0  # seconds in one collective before a rank is a hang suspect (at most: suspect_after)


def _seq(entry: dict[str, Any]) -> int:
    """The entry's number: a send or recv counts among the group's point-to-point ops, not its collectives."""
    return int(entry.get("p2p_seq") or 0) if _is_p2p(entry) else int(entry.get("seq") or 0)


def _is_p2p(entry: dict[str, Any]) -> bool:
    return called(str(entry.get("op", ""))) in P2P


def _named(entry: dict[str, Any]) -> str:
    return f"{called(str(entry.get('op', '')))} #{_seq(entry)}"


def suspect_after(entry: dict[str, Any] | None, run_timeout: float | None = None) -> float:
    """How long a rank must have waited in a collective before it is a hang suspect, not merely waiting
    for a straggler (a peer still loading its batch for a few seconds, on a slow GPU pair): at most
    :data:`HANG_SUSPECT_AFTER`; less where a timeout is short: a quarter of the collective's own
    (``timeout``, from its flight-recorder entry: torch's watchdog ends it there) and half of the run's
    ``--timeout`` (the user's word for too long)."""
    limits = [HANG_SUSPECT_AFTER]
    if entry is not None and entry.get("timeout"):
        limits.append(float(entry["timeout"]) / 4)
    if run_timeout:
        limits.append(run_timeout / 2)
    return min(limits)


def _collective(stack: str) -> str | None:
    """The torch.distributed call a rank is blocked in (its innermost frame in distributed_c10d.py)."""
    name = None
    for row in stack.splitlines():
        if _C10D in row and " in " in row:
            name = row.rsplit(" in ", 1)[-1].strip()
    return name


def _pending(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The NCCL collective a rank waits for: its oldest entry enqueued on the GPU and not completed.

    An NCCL collective returns once enqueued, so a rank stuck in one is not in ``distributed_c10d.py``
    but wherever it next waits for the GPU (``t.item()``, ``print(t)``, ``synchronize``); its flight
    recorder (NCCL's own) says which collective has not completed.  Only NCCL's entries are asked:
    their end is a CUDA event; gloo's state says nothing of the kind."""
    for entry in entries or []:
        if entry.get("backend") == "nccl" and entry.get("state") in ("scheduled", "started"):
            return entry
    return None


def _waiting_in(stack: str, entries: list[dict[str, Any]] | None) -> str | None:
    """The collective a rank is waiting in: the torch.distributed call its stack is in, else the NCCL
    collective that has not completed on its GPU (by the function that issued it)."""
    op = _collective(stack)
    if op is not None:
        return op
    pending = _pending(entries)
    return called(str(pending["op"])) if pending is not None else None


def _place(stack: str) -> str:
    """The user's line: ``Cell In[5], line 6: time.sleep(300)`` (without the library call it is in)."""
    return _innermost(stack).split("  (in ", 1)[0]


FINISHED = "finished the cell"  # the place of a rank that left the cell (a kept world's: back at its prompt)


@dataclass
class _Seen:
    """What one look at the ranks says of a hang."""

    waiting: dict[int, str]  # ranks in a collective long enough to be hang suspects -> its function
    entry: dict[int, dict[str, Any] | None]  # -> its flight-recorder entry, where known
    elsewhere: dict[int, str]  # ranks that have not entered it -> the user's line they are at
    ripe_at: float | None  # when the first collective waited in, but not yet long, makes a suspect


def _seen(
    stacks: dict[int, str],
    collectives: dict[int, list[dict[str, Any]]],
    now: float,
    run_timeout: float | None,
    at_stop: bool,
    finished: tuple[int, ...] = (),
) -> _Seen:
    """Which ranks wait in a collective, and which have not entered it.

    A rank in a collective for less than :func:`suspect_after` is neither (``at_stop``: the run was
    stopped, by its ``--timeout``, an interrupt or Stop; where each rank was is the evidence, however
    long it had waited).  A rank elsewhere has not entered the collective only if its own flight
    recorder does not say otherwise: a peer whose newest number on that group is as high has issued
    it (an NCCL collective returns once enqueued) and is no straggler to blame.

    ``finished``: ranks that have finished the cell (a fresh rank that ended, a kept world's back at
    its prompt): the commonest hang (``if rank != 1: dist.all_reduce(t)``, issue #57) is a rank that
    skipped the collective and went on.  One that has not entered the collective waited in, on a group
    it belongs to, never will: its place is :data:`FINISHED`."""
    seen = _Seen({}, {}, {}, None)
    for rank, stack in sorted(stacks.items()):
        if not stack.strip() or stack == STILL_STARTING:
            continue
        op = _waiting_in(stack, collectives.get(rank))
        if op is None:
            seen.elsewhere[rank] = _place(stack)
            continue
        entry = _current(collectives.get(rank), op)
        if entry is not None and entry.get("issued") and not at_stop:
            ripe_at = float(entry["issued"]) + suspect_after(entry, run_timeout)
            if now < ripe_at:
                seen.ripe_at = min(ripe_at, seen.ripe_at or ripe_at)
                continue
        seen.waiting[rank], seen.entry[rank] = op, entry
    known = next((e for e in seen.entry.values() if e is not None and not _is_p2p(e)), None)
    if known is not None:
        seen.elsewhere = {r: place for r, place in seen.elsewhere.items() if not _entered(collectives.get(r), known)}
    if seen.waiting:
        for rank in finished:
            if rank not in seen.waiting and rank not in seen.elsewhere and _skipped(collectives.get(rank), known, seen.entry):
                seen.elsewhere[rank] = FINISHED
    return seen


def _skipped(
    entries: list[dict[str, Any]] | None, known: dict[str, Any] | None, waited: dict[int, dict[str, Any] | None]
) -> bool:
    """Whether a rank that finished the cell left without entering the collective the others wait in:
    it has not issued it, and it is a member of its group (the default group's, or one its own recorder names)."""
    if known is None:
        return _world_wide(waited)
    if _entered(entries, known):
        return False
    return _world_wide({0: known}) or any(_group(e) == _group(known) for e in entries or [])


def _entered(entries: list[dict[str, Any]] | None, waited: dict[str, Any]) -> bool:
    """Whether a rank's flight recorder shows it issued the collective ``waited`` (or a later one) on its group."""
    group = _group(waited)
    numbers = [_seq(e) for e in entries or [] if _group(e) == group and not _is_p2p(e)]
    return bool(numbers) and max(numbers) >= _seq(waited)


def _group(entry: dict[str, Any]) -> str:
    """The process group of an entry: its name (``0``, ``1``: unique in a rank), else its description."""
    return str(entry.get("pg") or entry.get("group") or "")


def suspect_at(
    stacks: dict[int, str], collectives: dict[int, list[dict[str, Any]]] | None = None, run_timeout: float | None = None
) -> float | None:
    """When (``time.time()``) a collective some rank waits in has lasted long enough to make it a hang
    suspect, if it has not yet: when to look again.  None if no rank waits in one that is still young."""
    return _seen(stacks, collectives or {}, time.time(), run_timeout, at_stop=False).ripe_at


def hang_verdict(
    stacks: dict[int, str],
    collectives: dict[int, list[dict[str, Any]]] | None = None,
    now: float | None = None,
    sitting_out: str = "",
    run_timeout: float | None = None,
    at_stop: bool = False,
    nodes: dict[int, str] | None = None,
    finished: tuple[int, ...] = (),
) -> str | None:
    """One line saying why ranks that were stopped were stuck, from where each one was, or None.

    ``stacks``: each rank's main-thread stack when it was stopped (``main_thread_stack``'s form);
    ``collectives``: each rank's recent collectives (``rank_collectives``), when it has a process group.
    Ranks blocked in a collective while others never entered it are the classic hang; ranks blocked in
    different collectives, or in the same one with different shapes, are a mismatch.  ``sitting_out``
    (``RunSpec.sitting_out``: "ranks 1-3 do not run this cell (--on 0)") says which ranks were not asked
    to run the cell at all: a collective that waits for them waits for ranks that will never come.
    While the run goes on, a collective is a hang suspect once it is old (:func:`suspect_after`, with
    the run's ``run_timeout``); ``at_stop``: the run was stopped, and its ranks' places are the verdict's.
    ``nodes``: a cluster run's node of each rank ("node 13 (b13)"), named beside the ranks that never
    entered (on 16 nodes, which machine to look at is half the answer).  ``finished``: ranks that have
    finished the cell (``_seen``): one that skipped the collective is named as never having entered it.
    """
    now = time.time() if now is None else now
    verdict = _verdict(
        stacks,
        collectives or {},
        _seen(stacks, collectives or {}, now, run_timeout, at_stop, finished),
        now,
        bool(sitting_out),
        nodes or {},
    )
    return f"{verdict}; {sitting_out}" if verdict and sitting_out else verdict


def _verdict(
    stacks: dict[int, str],
    collectives: dict[int, list[dict[str, Any]]],
    seen: _Seen,
    now: float,
    others_out: bool,
    nodes: dict[int, str],
) -> str | None:
    waiting, elsewhere, entry = seen.waiting, seen.elsewhere, seen.entry
    if not waiting:
        return None
    named = {r: f"{op} #{_seq(e)}" if (e := entry[r]) is not None else op for r, op in waiting.items()}
    ops = sorted(set(waiting.values()))
    if len(ops) > 1:
        parts = []
        for op in ops:
            ranks = [r for r, o in waiting.items() if o == op]
            parts.append(f"{_ranks(ranks)} in {named[ranks[0]]} ({_place(stacks[ranks[0]])})")
        return "the ranks were in different collectives: " + "; ".join(parts)
    shapes = {r: e["sizes"] for r, e in entry.items() if e is not None}
    if len({json.dumps(v) for v in shapes.values()}) > 1:
        parts = [f"{_ranks(ranks)} {shape}" for shape, ranks in _by_place({r: str(v) for r, v in shapes.items()}).items()]
        return f"the ranks called {named[next(iter(waiting))]} with different shapes: " + "; ".join(parts)
    first = next(iter(waiting))
    issued = [float(e["issued"]) for e in entry.values() if e is not None and e.get("issued")]
    waited = f" for {max(0.0, now - min(issued)):.0f} s" if issued else ""
    at = f"{waited} at {_place(stacks[first])}"
    if not elsewhere:  # every rank that runs the cell is in it: stuck if it waits for ranks that do not run it
        return f"{_ranks(list(waiting))} waited in {named[first]}{at}" if others_out and _world_wide(entry) else None
    groups = _by_place(elsewhere)
    after = {r: f", after {_named(c[-1])}" if (c := collectives.get(r)) else "" for r in elsewhere}
    if len(groups) == 1:
        one = next(iter(elsewhere))
        subject = "it" if len(elsewhere) == 1 else "they"
        where_they_are = (
            f"{subject} {_at(next(iter(groups)), len(elsewhere))}{after[one] if len(set(after.values())) == 1 else ''}"
        )
    else:
        where_they_are = "; ".join(
            f"{_ranks(ranks)} {place if place == FINISHED else 'at ' + place}{after[ranks[0]]}" for place, ranks in groups.items()
        )
    on = sorted({nodes[r] for r in elsewhere if r in nodes})
    on_nodes = f" on {on[0]}" if len(on) == 1 else f" (on {', '.join(on)})" if on else ""
    return f"{_ranks(list(elsewhere))}{on_nodes} never entered {named[first]} ({where_they_are}); {_ranks(list(waiting))} waited in it{at}"


def _at(place: str, count: int) -> str:
    """Where ranks are, after their subject: ``is at Cell In[3], line 6: ...``, or ``finished the cell``."""
    if place == FINISHED:
        return FINISHED
    return f"{'is' if count == 1 else 'are'} at {place}"


def _world_wide(entries: dict[int, dict[str, Any] | None]) -> bool:
    """Whether the collective the ranks are in is on the default group (every rank of the world), as
    far as their flight recorders say: one on a group of their own (``new_group``) may be merely slow."""
    return all(e.get("group") in (None, "", "default_pg") for e in entries.values() if e is not None)


def _current(entries: list[dict[str, Any]] | None, op: str) -> dict[str, Any] | None:
    """The flight-recorder entry of the collective a rank is blocked in: the NCCL one not completed
    (:func:`_pending`), else its newest, if it is that op."""
    pending = _pending(entries)
    if pending is not None and same_call(op, str(pending.get("op", ""))):
        return pending
    return entries[-1] if entries and same_call(op, str(entries[-1].get("op", ""))) else None


def _by_place(places: dict[int, str]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for rank, place in places.items():
        grouped.setdefault(place, []).append(rank)
    return grouped


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_spans(sorted(ranks))}"


class Skipped(NamedTuple):
    """A collective that ranks which finished the cell never entered, while others waited in it."""

    text: str  # "rank 1 never entered all_reduce #1 (it finished the cell); rank 0 waited in it at Cell In[2], ..."
    collective: str  # "all_reduce #1"
    left: tuple[int, ...]  # the ranks that finished the cell without entering it
    waited: tuple[int, ...]  # those that entered it

    def notes(self) -> dict[int, str]:
        """What each one's chip says, as a hang's would."""
        left = {rank: f"never entered {self.collective} (it {FINISHED})" for rank in self.left}
        why = f"{_ranks(list(self.left))} {FINISHED} without entering it"
        return {**{rank: f"waited in {self.collective}; {why}" for rank in self.waited}, **left}


def left_without(xray: XRay | None, failed: int, finished: tuple[int, ...], traceback: str | None) -> Skipped | None:
    """Why rank ``failed`` failed in a collective, when ranks that ``finished`` the cell never entered it:
    ``rank 1 never entered all_reduce #1 (it finished the cell); rank 0 waited in it at Cell In[2], line
    6: dist.all_reduce(t)``.  gloo fails the waiting rank with "Connection closed by peer" the moment the
    rank that skipped the collective ends; the X-ray (read once the ranks are gone) says which it was.
    None when no collective ``failed`` entered was left that way."""
    for never in xray.never_entered if xray is not None else ():
        left = tuple(sorted(set(never.absent) & set(finished)))
        if failed not in never.entered or not left:
            continue
        group = f" ({never.group})" if never.group and never.group != "default_pg" else ""
        named = f"{called(never.op)} #{never.seq}{group}" if never.op != "a collective" else f"collective #{never.seq}{group}"
        subject = "it" if len(left) == 1 else "they"
        at = _place(traceback) if traceback and "Cell " in traceback else ""
        text = f"{_ranks(list(left))} never entered {named} ({subject} {FINISHED}); {_ranks(list(never.entered))} waited in it"
        return Skipped(text + (f" at {at}" if at else ""), named, left, tuple(never.entered))
    return None


def live_notes(
    stacks: dict[int, str],
    collectives: dict[int, list[dict[str, Any]]] | None = None,
    now: float | None = None,
    sitting_out: str = "",
    run_timeout: float | None = None,
    at_stop: bool = False,
    finished: tuple[int, ...] = (),
) -> dict[int, str]:
    """What each rank's chip says while a run seems hung (empty: nothing to say); ``at_stop``: where
    each was when the run was stopped, as the verdict (``hang_verdict(..., at_stop=True)``) says it.

    A rank in a collective that another rank has not entered: ``waiting in barrier #3 for 25 s; rank 2
    has not entered it``; that other rank: ``has not entered barrier #3 (Cell In[5], line 6)``.  With
    ``sitting_out`` (``--on``: "ranks 1-3 do not run this cell (--on 0)") ranks in a collective wait
    for ranks that do not run the cell, and their chips say so.  Only a collective waited in long
    enough is a hang suspect (:func:`suspect_after`): before, the others may be stragglers.  A rank that
    ``finished`` the cell without entering it: ``never entered barrier #3 (it finished the cell)``, and
    the ranks waiting: ``rank 2 finished the cell without entering it``.
    """
    collectives = collectives or {}
    now = time.time() if now is None else now
    seen = _seen(stacks, collectives, now, run_timeout, at_stop=at_stop, finished=finished)
    waiting, elsewhere = seen.waiting, list(seen.elsewhere)
    if not waiting or len(set(waiting.values())) > 1:
        return {}
    if not elsewhere and not (sitting_out and _world_wide(seen.entry)):
        return {}
    notes: dict[int, str] = {}
    left = sorted(r for r in elsewhere if seen.elsewhere[r] == FINISHED)
    behind = sorted(r for r in elsewhere if seen.elsewhere[r] != FINISHED)
    absent = [f"{_ranks(behind)} {'has' if len(behind) == 1 else 'have'} not entered it"] if behind else []
    absent += [f"{_ranks(left)} {FINISHED} without entering it"] if left else []
    absent += [sitting_out] if sitting_out else []
    for rank, op in waiting.items():
        entry = seen.entry[rank]
        name = f"{op} #{_seq(entry)}" if entry else op
        waited = f" for {max(0.0, now - float(entry['issued'])):.0f} s" if entry and entry.get("issued") else ""
        notes[rank] = f"waiting in {name}{waited}; " + "; ".join(absent)
    first = min(waiting)
    entry = seen.entry[first]
    name = f"{waiting[first]} #{_seq(entry)}" if entry else waiting[first]
    for rank in behind:
        notes[rank] = f"has not entered {name} ({_place(stacks[rank])})"
    for rank in left:
        notes[rank] = f"never entered {name} (it {FINISHED})"
    return notes


def where_now(
    ranks: list[RankToAsk],
    cell: CellSource | None,
    program: Program | None = None,
    cell_numbers: dict[str, int] | None = None,
    idle: str = "",
    wait: float = ANSWER_WAIT,
) -> str:
    """Ask these ranks where they are, and say it: ``%spawn where``, and the live view's Where button."""
    dumps = rank_stacks(ranks, wait=wait)
    collectives = rank_collectives(ranks, dumps) if program is None else {}  # a program's ranks keep none
    return describe(ranks, dumps, cell, program, cell_numbers, idle=idle, collectives=collectives)
