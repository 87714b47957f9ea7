"""In every rank of an X-rayed cell: the calls the cell made to ``torch.distributed``, and with ``--xray
values`` each one's small tensors before and after, for teaching (issue #43, item 3).

torch's flight recorder (``ranks._xray``) keeps what the backend ran, never what the cell called: gloo
runs a ``reduce_scatter`` of four chunks as four all_reduces, and records no send or receive at all.
So for the cell's duration the Python collective functions of ``torch.distributed`` (:data:`WRAPPED`)
are replaced by wrappers that write each call down, with when it began and returned (``time.time_ns``,
the recorder's clock: the kernel finds the collectives the backend ran inside a call by their creation
times, ``events._xray``, issue #57).  With ``values`` they also copy their tensors' values (``.tolist()``,
for a tensor of :data:`MAX_ELEMENTS` or fewer; a bigger one: its shape and dtype only) before the call
and after it.  :func:`end` puts the originals back and writes the record to ``xray_values.json``
(``_rankdir.XRAY_VALUES``).  Only the package's names are replaced, not ``distributed_c10d``'s: the
calls written down are the cell's (``dist.all_reduce``; FSDP's ``dist.all_gather_into_tensor`` too),
not those torch makes inside its own functions (``all_gather_object``'s ``all_gather``); a name
imported before the cell (``from torch.distributed import all_reduce`` in the kernel, then forked) is
the original, not recorded.

Each call is numbered per process group (its ``group`` argument, the default group when None): every
member rank calls a group's collectives in the same order, so the kernel lines them up by (group,
number) (``events._xray_values``).  Sends and receives are numbered apart, per (group, peer): a rank's
k-th send to a peer pairs with the peer's k-th receive from it.

Bounded: the first :data:`MAX_CALLS` calls of the cell, :data:`MAX_TENSORS` tensors of a list, and
:data:`MAX_NUMBERS` numbers in all; past those, calls are counted only.  An async call
(``async_op=True``, ``isend``, ``irecv``) has its output read when its work completes (a callback on
its future); where its work has no future, its inputs only are kept, and the record says so.

A CUDA tensor is never read at the call: ``.tolist()`` would make the rank's CPU wait for its stream,
so a receive posted before a collective its sender must pass first would never let the rank reach
that collective (NCCL completes a work's future once enqueued and runs its callbacks at once; the
fourth GPU review's N3).  Its values are copied instead, without blocking, into pinned host memory on
the stream the call's result is ordered on (the caller's; an async work's callback runs on streams
that wait for the work), and read at :func:`end`, once the copy is done: a copy still waiting then
(a collective that never completed) leaves the call's shape and dtype, and says so.

Never the user's failure: whatever recording raises is swallowed, and the call goes on as torch's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .._rankdir import XRAY_VALUES, write_json

MAX_CALLS = 200  # calls recorded a cell, at the most
MAX_ELEMENTS = 64  # a tensor with more has its shape recorded, not its values
MAX_TENSORS = 64  # tensors of one list argument recorded (all_gather's output list ...)
MAX_NUMBERS = 32_768  # numbers recorded a cell, all calls together
COPIES_WAIT = 2.0  # seconds end() waits, all copies together, for CUDA copies still on their way
FORMAT = 1

# op -> (the argument read before the call, the argument read after it, what else is said of it)
WRAPPED: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "all_reduce": ("tensor", "tensor", ("op",)),
    "broadcast": ("tensor", "tensor", ("src",)),
    "reduce": ("tensor", "tensor", ("dst", "op")),
    "all_gather": ("tensor", "tensor_list", ()),
    "all_gather_into_tensor": ("input_tensor", "output_tensor", ()),
    "reduce_scatter": ("input_list", "output", ("op",)),
    "reduce_scatter_tensor": ("input", "output", ("op",)),
    "all_to_all_single": ("input", "output", ()),
    "all_to_all": ("input_tensor_list", "output_tensor_list", ()),
    "gather": ("tensor", "gather_list", ("dst",)),
    "scatter": ("scatter_list", "tensor", ("src",)),
    "barrier": (None, None, ()),
    "send": ("tensor", None, ("dst",)),
    "isend": ("tensor", None, ("dst",)),
    "recv": (None, "tensor", ("src",)),
    "irecv": (None, "tensor", ("src",)),
}
SENDS = frozenset({"send", "isend"})
RECEIVES = frozenset({"recv", "irecv"})


class ValuesLog:
    """One rank's record of its cell's collectives, their small tensors' values before and after."""

    def __init__(self, rank: int, dist: Any, values: bool = True) -> None:
        self.rank = rank
        self.dist = dist
        self.values = values  # --xray values: the tensors' values too, not only the calls
        self.calls: list[dict[str, Any]] = []
        self.beyond = 0  # calls past MAX_CALLS: counted, not recorded
        self.numbers = 0  # numbers recorded so far (MAX_NUMBERS)
        self.counters: dict[tuple[Any, ...], int] = {}
        self.groups: dict[str, dict[str, Any]] = {}  # name -> its global ranks and description
        self._names: dict[int, str] = {}  # id(group) -> its name
        # CUDA tensors' values on their way to host memory: (the record they go in, the copy, its event)
        self.copies: list[tuple[dict[str, Any], Any, Any]] = []

    # -- what one call was -------------------------------------------------------------------------

    def before(self, op: str, bound: _Bound) -> dict[str, Any] | None:
        """The call's record, its inputs read (None past the bound, or for a rank not in the group)."""
        if len(self.calls) >= MAX_CALLS:
            self.beyond += 1
            return None
        c10d = self.dist.distributed_c10d
        group = bound.get("group")
        if group is not None and c10d._rank_not_in_group(group):
            return None
        name = self._group_name(group)
        call: dict[str, Any] = {"op": op, "group": name}
        read_in, _read_out, said = WRAPPED[op]
        for key in said:
            value = self._said(key, bound, group)
            if value is not None:
                call["reduce_op" if key == "op" else key] = value
        if op in SENDS or op in RECEIVES:
            peer = call.get("dst" if op in SENDS else "src")
            counter: tuple[Any, ...] = (name, op in SENDS, peer)
        else:
            counter = (name,)
        self.counters[counter] = call["seq"] = self.counters.get(counter, 0) + 1
        if read_in is not None and self.values:
            call["in"] = self.snapshot(bound.get(read_in))
        call["t0"] = time.time_ns()  # last: the snapshot's copy is not the call's
        self.calls.append(call)  # now: a call that never returns (a hang) is written down with its inputs
        return call

    def after(self, call: dict[str, Any], op: str, bound: _Bound, result: Any) -> None:
        """Its outputs, read once the call returned (an async one's when its work completes)."""
        call["t1"] = time.time_ns()
        read_out = WRAPPED[op][1]
        if op == "recv" and call.get("src") is None and isinstance(result, int):
            call["src"] = result  # a receive from any source: the sender
        if read_out is None or not self.values:
            return
        asynchronous = op in ("isend", "irecv") or bool(bound.get("async_op"))
        if not asynchronous:
            call["out"] = self.snapshot(bound.get(read_out))
            return
        if result is None:
            return
        try:
            future = result.get_future()
            future.then(functools.partial(self._completed, call, bound.get(read_out)))
        except Exception:
            call["note"] = "async: its work has no future to read the output from"

    def _completed(self, call: dict[str, Any], value: Any, _future: Any) -> None:
        with contextlib.suppress(Exception):
            call["out"] = self.snapshot(value)

    def _said(self, key: str, bound: _Bound, group: Any) -> Any:
        """A source or destination (a global rank), or a reduction's name ("sum")."""
        if key == "op":
            op = bound.get("op")
            if op is None:
                return "sum"
            return str(getattr(op, "name", op)).rsplit(".", 1)[-1].lower()
        value = bound.get(key)
        in_group = bound.get(f"group_{key}")
        if value is None and in_group is not None and group is not None:
            with contextlib.suppress(Exception):
                value = self.dist.get_global_rank(group, in_group)
        return int(value) if isinstance(value, int) else None

    def _group_name(self, group: Any) -> str:
        c10d = self.dist.distributed_c10d
        if group is None:
            group = c10d._get_default_group()
        name = self._names.get(id(group))
        if name is None:
            try:
                name = str(c10d._get_process_group_name(group))
            except Exception:
                name = "?"
            self._names[id(group)] = name
            described: dict[str, Any] = {}
            with contextlib.suppress(Exception):
                described["ranks"] = [int(r) for r in self.dist.get_process_group_ranks(group)]
            with contextlib.suppress(Exception):
                described["desc"] = str(group.group_desc)
            self.groups[name] = described
        return name

    # -- a tensor, or a list of them ----------------------------------------------------------------

    def snapshot(self, value: Any) -> Any:
        """A tensor as {"shape", "dtype", "values"} (values for a small one only); a list of tensors as a
        list of those; anything else as None."""
        if isinstance(value, (list, tuple)):
            return [self._tensor(item) for item in value[:MAX_TENSORS]]
        return self._tensor(value)

    def _tensor(self, tensor: Any) -> dict[str, Any] | None:
        shape = getattr(tensor, "shape", None)
        if shape is None or not hasattr(tensor, "numel"):
            return None
        found: dict[str, Any] = {"shape": [int(d) for d in shape], "dtype": str(tensor.dtype).removeprefix("torch.")}
        count = int(tensor.numel())
        if count <= MAX_ELEMENTS and self.numbers + count <= MAX_NUMBERS:
            with contextlib.suppress(Exception):  # a meta or sparse tensor, a dtype .tolist() cannot read
                if getattr(tensor, "is_cuda", False):
                    self.copies.append(_copy_to_host(found, tensor))
                else:
                    values = tensor.detach().tolist()
                    found["values"] = _plain(values) if tensor.is_complex() else values
                self.numbers += count
        return found

    def read_copies(self, wait: float = COPIES_WAIT) -> None:
        """The CUDA tensors' values, from their copies once done (waiting ``wait`` seconds at the most,
        all of them together: never for good, as a copy behind a collective that never completed would)."""
        import time

        deadline = time.monotonic() + wait
        copies, self.copies = self.copies, []
        for found, host, done in copies:
            while not done.query() and time.monotonic() < deadline:
                time.sleep(0.005)
            if done.query():
                values = host.tolist()
                found["values"] = _plain(values) if host.is_complex() else values
            else:
                found["note"] = "its values had not reached host memory when the cell ended"

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "rank": self.rank,
            "max_calls": MAX_CALLS,
            "max_elements": MAX_ELEMENTS,
            "values": self.values,
            "beyond": self.beyond,
            "groups": self.groups,
            "calls": self.calls,
        }


def _copy_to_host(found: dict[str, Any], tensor: Any) -> tuple[dict[str, Any], Any, Any]:
    """A CUDA tensor's values on their way to pinned host memory, ordered on the current stream, which
    the CPU does not wait for; with the event that says they have arrived."""
    import torch

    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor.detach(), non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return found, host, done


def _plain(values: Any) -> Any:
    """``.tolist()``'s numbers as JSON takes them (a complex number as its text)."""
    if isinstance(values, list):
        return [_plain(v) for v in values]
    if isinstance(values, complex):
        return str(values)
    return values


class _Bound:
    """A call's arguments by name, read from its positional and keyword arguments (no
    ``inspect.Signature.bind``: ~10 µs a call)."""

    __slots__ = ("args", "kwargs", "positions")

    def __init__(self, positions: dict[str, int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.positions, self.args, self.kwargs = positions, args, kwargs

    def get(self, name: str) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        index = self.positions.get(name)
        return self.args[index] if index is not None and index < len(self.args) else None


_current: ValuesLog | None = None  # this rank's, while a cell with --xray values runs
_path: str = ""
_originals: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}  # name replaced -> (torch's, the wrapper)


class _Inside(threading.local):
    depth = 0  # a wrapped call made from within another (never recorded twice)


_inside = _Inside()


def _wrapper(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    positions = {name: index for index, name in enumerate(inspect.signature(original).parameters)}

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        log = _current
        if log is None or _inside.depth:
            return original(*args, **kwargs)
        if len(log.calls) >= MAX_CALLS:  # past the bound: counted only, at the least cost
            log.beyond += 1
            return original(*args, **kwargs)
        bound = _Bound(positions, args, kwargs)
        call = None
        with contextlib.suppress(Exception):
            call = log.before(op, bound)
        _inside.depth = 1
        try:
            result = original(*args, **kwargs)
        except BaseException:
            if call is not None:
                call["raised"], call["t1"] = True, time.time_ns()
            raise
        finally:
            _inside.depth = 0
        if call is not None:
            with contextlib.suppress(Exception):
                log.after(call, op, bound, result)
        return result

    recorded.__nbspawn_xray_values__ = True  # type: ignore[attr-defined]
    return recorded


def without_wrappers(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """A rank's traceback as it reads without nbspawn: the frames of the wrapper each call to
    ``torch.distributed`` goes through (``recorded``, between the user's line and torch's) left out."""
    return [frame for frame in frames if frame.filename != __file__]


def begin(rank: int, rank_dir: str, values: bool = True) -> None:
    """From now on the cell's calls to torch.distributed are written down, with ``values`` their small
    tensors' values too (its process group is made); :func:`end` writes them and puts torch's functions back."""
    global _current, _path
    end()
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        for op in WRAPPED:
            original = getattr(dist, op, None)
            if original is None or getattr(original, "__nbspawn_xray_values__", False):
                continue
            wrapper = _wrapper(op, original)
            _originals[op] = (original, wrapper)
            setattr(dist, op, wrapper)
        _current, _path = ValuesLog(rank, dist, values), os.path.join(rank_dir, XRAY_VALUES)


def end() -> None:
    """The cell is over, however: torch's functions back as they were, the record written (atomically).
    Once; a no-op when nothing was recorded."""
    global _current
    log, _current = _current, None
    with contextlib.suppress(Exception):
        import sys

        dist = sys.modules.get("torch.distributed")
        while _originals:
            op, (original, wrapper) = _originals.popitem()
            if dist is not None and getattr(dist, op, None) is wrapper:  # a name the cell set itself stays its own
                setattr(dist, op, original)
    if log is None:
        return
    with contextlib.suppress(Exception):
        log.read_copies()
    with contextlib.suppress(Exception):
        write_json(_path, log.as_json())
