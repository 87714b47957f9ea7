"""A run's facts as one record (``views._messages.RunRecord``): what the live widget's header and rank
tabs draw while it runs (``views._widget``), and what the frozen bundle saves with the notebook when it
ends (``views._bundle``): the same record, made here once for both."""

from __future__ import annotations

from .._rankdir import DISPLAY_FILE, STDERR, STDOUT
from .._runstate import RankState, Run
from ..errors import RankExitedError, RankRaisedError, SpawnInterrupted, SpawnTimeoutError
from ..events._gpumemory import gpu_names
from ..events._gpumemory import totals as gpu_totals
from ._messages import GpuRecord, RankRecord, RunRecord
from ._sgr import ESCAPE

VERSION = 2  # the record's (and the saved bundle's) version, for a renderer that reads it


def rank_record(state: RankState, elided_lines: int = 0) -> RankRecord:
    failure = state.failure
    return {
        "rank": state.rank,
        "pid": state.pid,
        "status": state.status,
        "after": failure.after if failure and state.status == "failed_after" else None,
        "exit_code": None if state.lives_on else state.exit_code,  # a kept world's rank back at its prompt has no exit
        "signal": state.signal_name,
        "duration": state.duration,
        "summary": failure.summary if failure else None,
        "traceback": (failure.traceback or failure.stack) if failure else None,
        "elided_lines": elided_lines,
        "stdout_path": state.log_path(STDOUT),
        "stderr_path": state.log_path(STDERR),
        "display_path": state.log_path(DISPLAY_FILE),
        "node": state.node,
        # a rank that ran out of GPU memory: what each rank held on that GPU
        "note": failure.memory if failure and failure.exc_type and failure.memory else state.note,
        "prompt": state.prompt,
        "cpu": state.cpu_percent if state.status == "running" else None,
        "rss": state.rss if state.status == "running" else None,
        "peak_rss": state.peak_rss,
        "gpu": gpu_names(state.gpu),
        "gpu_allocated": sum(d.allocated for d in state.gpu) if state.gpu and state.status == "running" else None,
        "gpu_reserved": sum(d.reserved for d in state.gpu) if state.gpu and state.status == "running" else None,
        "peak_gpu_allocated": state.peak_gpu_allocated,
        "peak_gpu_reserved": state.peak_gpu_reserved,
    }


def _backend(run: Run) -> str:
    """The backend the ranks' group runs on: the one nbspawn made (``--backend``), else the one the
    cell made itself (``init_process_group("gloo")`` in it, or in the function ``nbspawn.spawn``
    runs), once its collectives are recorded; ``none`` while none is known."""
    if run.spec.backend != "none" or run.xray is None or not run.xray.backends:
        return run.spec.backend
    return ", ".join(run.xray.backends)


def run_record(run: Run, elided: dict[int, int] | None = None) -> RunRecord:
    """The run's facts; each rank's output tail lives in the bundle's text/html.  A cell on some ranks
    of a kept world (``--on``) is a run of those ranks: the others are not in it."""
    error = run.error
    root = error.root if isinstance(error, (RankRaisedError, RankExitedError)) else None
    summary = None
    if error is not None:
        report = str(error)
        summary = report.splitlines()[0] if report else type(error).__name__
    elided = elided or {}
    ranks = [state for state in run.ranks if run.spec.runs(state.rank)]  # --on: the ranks that run the cell
    return {
        "version": VERSION,
        "run_id": run.run_id,
        "nprocs": len(ranks) if run.ranks else run.nprocs,
        "start_method": run.spec.start_method,
        "program": str(run.spec.program) if run.spec.program is not None else None,
        "backend": _backend(run),
        # a cluster run: where each node keeps its ranks' logs (the kernel's directory has only copies of their errors)
        "log_dir": "; ".join(dict.fromkeys(run.node_log_dirs().values())) or run.run_dir,
        "started_at": run.started_at,
        "duration": run.duration,
        "status": run.status,
        "world": run.world,
        "world_cell": run.world_cell,
        "error": None
        if error is None
        else {
            "rank": root.rank if root else None,
            "summary": ESCAPE.sub("", summary or ""),
            "stopped_by": error.stopped_by if isinstance(error, SpawnInterrupted) and run.status == "stopped" else None,
            "verdict": error.verdict if isinstance(error, (SpawnInterrupted, SpawnTimeoutError)) else None,
            "cause": getattr(error, "cause", None),
        },
        "output_in": "text/html",
        "xray": run.xray.summary if run.xray is not None else None,
        "memory": None
        if run.memory is None
        else {"total": run.memory.total, "used": run.memory.used, "source": run.memory.source},  # type: ignore[typeddict-item]
        "memory_warning": run.memory_warning,
        "gpus": gpu_records(run, ranks),
        "ranks": [rank_record(state, elided.get(state.rank, 0)) for state in ranks],
    }


def gpu_records(run: Run, ranks: list[RankState]) -> list[GpuRecord]:
    """The GPUs the ranks used: what they reserved there now while any runs, else the most they
    held there together (in one sample: what the run needed of it)."""
    running = {state.rank: state.gpu for state in ranks if state.gpu and state.status == "running"}
    gpus = gpu_totals(running) if running else list(run.gpu_peaks.values())
    return [{"gpu": gpu.gpu, "name": gpu.name, "total": gpu.total, "reserved": gpu.reserved} for gpu in gpus]
