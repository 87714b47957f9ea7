"""What the kernel and a node's agent say to each other, typed: one module owns the wire.

The kernel sends each node's agent a :class:`Job` (the same for every node) and a :class:`Spot` (where
the node's ranks sit in the world) through ipyparallel's ``apply``.  While the node's ranks run, the
agent publishes *batches* as ipyparallel data messages, keyed :func:`batch_key` (``nbspawn000000012``)
so the kernel reads them in order; each batch is a list of entries:

    ("started", [(rank, pid), ...], run_dir)   the node's ranks are up (first entry of the first batch)
    ("o", rank, stream, text)                   text a rank wrote (stdout or stderr)
    ("i", rank, item)                           a display item, already converted
    ("s", rank, lines)                          lines of a rank dropped from the batch (its log has them)
    ("c", rank, Costs)                          what a rank costs, as the node's agent sampled it (about once a second)
    ("e", rank, EndRecord)                      a rank ended

Ranks are global.  The agent's ``apply`` returns an :class:`Answer`, with the last batch in it.

Asked where its ranks are (a signal: the kernel reaches a busy engine no other way), an agent
publishes a :class:`Where` under its own key, :func:`where_key` (``nbspawnwhere3``: the third time it
was asked), outside the sequence of batches, so any thread of the kernel can take it.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from .._program import ProgramLine
from .._request import Settings
from .._source import CellSource

PUBLISH_EVERY = 0.1  # the whole cluster sends at most 10 batches a second: each node 1 / (0.1 x nodes)


class Job(TypedDict):
    run_id: str
    cell: CellSource
    program: ProgramLine | None  # the words after --, read at the door; the node finds what they name
    names: bytes  # the kernel names the cell uses, pickled once (nbspawn.handoff._names.pickle_names)
    out_names: list[str]
    settings: Settings  # the node's own: ranks per node, its share of the image budget, ...
    rich: bool
    cwd: str  # the kernel's working directory, where the node runs if it has it
    publish_every: float  # seconds between two batches of this node
    on: list[int] | None  # a kept world's cell: --on, the global ranks that run it (None: all)


class Spot(TypedDict):
    index: int  # the node's rank (GROUP_RANK)
    nnodes: int
    offset: int  # its first global rank
    world_size: int
    master_addr: str
    master_port: int
    cuda_visible: str | None  # the node's GPUs for its ranks (the union of its engines'), None: as the agent has it


class Costs(TypedDict):
    """A rank's figures on its node (``executors._resourcewatch``): the kernel's copy of its state's."""

    cpu: float | None
    rss: int | None
    peak_rss: int | None
    gpu: list[dict[str, Any]]  # events._gpumemory.DeviceHeld's fields, each device's peaks this run's
    warning: str | None  # the node's memory (or a GPU's) running out, said once (the node's run's memory_warning)
    # sent with its end (before its "e"): killed for memory, or out of GPU memory, in the node's words
    # ("killed for memory at 5.1 GB; 12.5 GB of this machine's 12.7 GB was in use")
    memory: str | None


class EndRecord(TypedDict):
    exit_code: int
    error: dict[str, Any] | None  # error.json's contents (nbspawn._errorfile)
    stacks: str  # its stacks.log, cut to what is sent
    tail: str | None  # a program's last words when it left no error record
    xray: str | None  # its collectives record (xray.json, ranks._xray) as it wrote it: the kernel lines the nodes' up
    ended_at: float | None
    died: bool  # the process ended (a fresh rank always; a kept world's rank only when the world is lost)


Started = tuple[Literal["started"], list[tuple[int, int | None]], str]
Output = tuple[Literal["o"], int, str, str]
Item = tuple[Literal["i"], int, dict[str, Any]]
Skipped = tuple[Literal["s"], int, int]
Cost = tuple[Literal["c"], int, Costs]
Ended = tuple[Literal["e"], int, EndRecord]
Entry = Started | Output | Item | Skipped | Cost | Ended
Batch = list[Entry]


class Answer(TypedDict):
    last_seq: int  # batches published before the final one
    final: Batch
    outputs: dict[str, list[Any]]  # --out values of the node's ranks
    missing: list[tuple[int, str]]
    run_dir: str
    status: str
    next_port: int | None  # node 0: the port held for the next run's TCPStore
    lost: str | None  # a kept world's cell: why the node's part of the world was lost (None: it lives on)


def batch_key(seq: int) -> str:
    return f"nbspawn{seq:09d}"


class Where(TypedDict):
    stacks: dict[int, str | None]  # global rank -> its dump (None: it could not be asked)
    collectives: dict[int, list[dict[str, Any]]]  # global rank -> its recent collectives (the flight recorder's)


WHERE_PREFIX = "nbspawnwhere"


def where_key(asked: int) -> str:
    return f"{WHERE_PREFIX}{asked}"
