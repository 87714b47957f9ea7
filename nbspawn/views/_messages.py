"""What the kernel and the browser say to each other, typed: the run record (docs/run-bundle.md),
the live widget's traits and messages, the status comm's data, and a cell's runs after a reload.

The TypeScript side's twin is ``labextension/src/messages.ts`` (``IRunRecord``, ``IWidgetState``,
``IOutputMessage``, ``IReplayMessage``, ``IWhereMessage``, ``WidgetRequest``, ``IRunStatus`` (here ``StatusMessage``),
``ILiveInfo``, the ``nbspawn.active`` messages): a field changed here is changed there too.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

from .._runstate import RankStatus, RunStatus

# a display item (nbspawn.events._display): {"kind", "id", "mime", "value", "text", "meta", "wait"}
DisplayItem = dict[str, Any]
OutputChunk = list[Any]  # [stream, text] or ["display", item]
RankChunk = list[Any]  # [rank, stream, text] or [rank, "display", item]: a list, cut in place while batched


class RankRecord(TypedDict):
    rank: int
    pid: int | None
    status: RankStatus  # never absent: a rank that sits a cell out (--on) is not in its record
    after: int | None  # failed_after: the rank whose failure came first (its chip reads "after rank 2")
    exit_code: int | None
    signal: str | None
    duration: float | None
    summary: str | None
    traceback: str | None
    elided_lines: int
    stdout_path: str | None
    stderr_path: str | None
    display_path: str | None
    node: str | None  # a cluster run's rank: "node 1 (hostb)"; its log paths are then host:path
    # while it runs and looks hung: "waiting in barrier #3 for 25 s; rank 2 has not entered it"; a rank
    # stopped in a hang keeps where it was then ("has not entered barrier #3 (Cell In[5], line 6: ...)")
    note: str | None
    prompt: str | None  # at a prompt now: "pdb" (its note: "at a breakpoint (Pdb, cell line 4)") or "input"
    # what it costs (its children included), sampled about once a second: CPU now (percent of one core,
    # while it runs), resident memory now and its peak in the run, in bytes; None where not sampled (a bundle from before; a cluster's ranks: their node's agent samples them)
    cpu: float | None
    rss: int | None
    peak_rss: int | None
    # on the GPUs it used (its own record, ``ranks._devicememory``): which ("GPU 0"), what its torch has
    # allocated and reserved there now (while it runs), and the most of each in the run; None: no GPU used
    gpu: str | None
    gpu_allocated: int | None
    gpu_reserved: int | None
    peak_gpu_allocated: int | None
    peak_gpu_reserved: int | None


class RunErrorRecord(TypedDict):
    rank: int | None  # the root cause's rank, if a rank failed first
    summary: str
    stopped_by: str | None  # a stopped run: what stopped it ("%spawn stop", "run.stop()", "Stop button")
    # a run stopped (timeout, interrupt, Stop) while hung: why, the banner's line ("rank 1 never entered barrier #1 ...")
    verdict: str | None
    # a rank failed because a peer skipped a collective and finished the cell: the summary leads with that
    # peer ("rank 1 never entered all_reduce #1 ..."), not with the failed rank the banner would name first
    cause: str | None


class MemoryRecord(TypedDict):
    """The machine's memory (or its container's limit, the tighter) at the last sample, in bytes."""

    total: int
    used: int  # by everything under it, the kernel and the ranks included
    source: Literal["machine", "container"]


class GpuRecord(TypedDict):
    """One GPU the ranks used: what their torch reserved on it (now while they run, else the most
    they held there together, in one sample) of its total, in bytes."""

    gpu: str  # "GPU 0"
    name: str  # "Tesla T4"
    total: int
    reserved: int


class RunHeader(TypedDict):
    version: int
    run_id: str
    nprocs: int
    start_method: str
    program: str | None  # a program's run: its command line (start method and backend are the program's own)
    backend: str
    log_dir: str
    started_at: float
    duration: float | None
    status: RunStatus
    world: str | None
    world_cell: int | None
    error: RunErrorRecord | None
    output_in: Literal["text/html", ""]
    xray: str | None  # the collectives X-ray in words (its drawing is in the text/html, or the widget's xray_html)
    memory: MemoryRecord | None
    memory_warning: str | None  # said once, when the ranks brought the memory in use (or a GPU's) near its end
    gpus: list[GpuRecord]  # the GPUs the ranks used ([] for none)


class RunRecord(RunHeader):
    ranks: list[RankRecord]


class LiveHeader(RunHeader):
    elapsed: float  # seconds since the run started
    stopping: bool  # Stop was heard


class WidgetState(TypedDict):
    """The live widget's synced traits."""

    header: LiveHeader
    ranks: list[RankRecord]
    error: RunErrorRecord | None
    xray_html: str  # the collectives X-ray's drawing (static HTML and SVG), "" until there is one


class OutputMessage(TypedDict):
    """Kernel -> browser, at most ten a second: new output, and lines of a rank the kernel skipped."""

    type: Literal["output"]
    chunks: list[RankChunk]
    elided: dict[str, int]


class ReplayMessage(TypedDict):
    """Kernel -> browser: everything the kernel kept, for a ``replay`` request."""

    type: Literal["replay"]
    tails: dict[str, list[OutputChunk]]
    order: str  # whose chunk comes next, in arrival order (``_tail.order_runs``)
    elided: dict[str, int]


class WhereMessage(TypedDict):
    """Kernel -> browser, for a ``where`` request: every rank's stack now, grouped (``%spawn where``)."""

    type: Literal["where"]
    text: str


Request = Literal["replay", "stop", "where"]


def widget_request(content: object) -> Request | None:
    """Browser -> kernel (a widget custom message ``{"type": "replay" | "stop" | "where"}``); None: not ours."""
    kind = content.get("type") if isinstance(content, dict) else None
    return kind if kind in get_args(Request) else None


class StatusMessage(TypedDict):
    """``nbspawn.status`` comm data (the JupyterLab toolbar item)."""

    run_id: str
    status: RunStatus  # running while the run is active, then its final status
    nprocs: int
    running: list[int]


class LiveInfo(TypedDict):
    """The live display's ``application/vnd.nbspawn.live+json`` (docs/run-bundle.md §3): what a page
    that cannot get the widget's model needs to follow the run (``ILiveInfo`` in messages.ts)."""

    run_id: str
    model_id: str  # the widget's comm id
    display_id: str  # its update_display_data is the run's end
    started_at: float
    nprocs: int
    log_dir: str


class ActiveRequest(TypedDict, total=False):
    """Browser -> kernel: the ``nbspawn.active`` comm's open data (``IActiveRequest``)."""

    have: list[str]  # run ids whose frozen run the page already shows: their bundle is not sent
    only: list[str]  # only these runs (by run id); all when absent


class ActiveRun(TypedDict):
    """One cell's latest run, as the kernel remembers it for a page loaded later (``IActiveRun``)."""

    cell_id: str  # the notebook cell's id (the execute_request's ``metadata.cellId``)
    run_id: str
    execution_count: int | None  # the prompt the cell ran under
    status: Literal["running", "ended"]
    live: LiveInfo | None  # the live display, while it is shown
    frozen: dict[str, Any] | None  # the frozen run's mime bundle, once ended (None: the page has it)


class ActiveRunsMessage(TypedDict):
    """Kernel -> browser: the ``nbspawn.active`` comm's one message (then the page closes the comm)."""

    type: Literal["active"]
    runs: list[ActiveRun]
