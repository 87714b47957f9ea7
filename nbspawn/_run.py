"""The state of one run, shared by the launcher (which writes it) and the views (which read it).

It is also what users inspect afterwards: ``nbspawn.last_run()`` returns it, with every rank's exit
code or signal, duration, log paths and error.
"""

from __future__ import annotations

import codecs
import json
import os
import time
from dataclasses import dataclass, field

from ._spec import RunSpec
from .errors import RankFailure, SpawnError

STREAMS = ("stdout", "stderr")


@dataclass
class RankState:
    rank: int
    dir: str
    pid: int | None = None
    status: str = "starting"  # starting | running | done | failed | stopped
    exit_code: int | None = None  # negative: killed by that signal
    signal_name: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    failure: RankFailure | None = None

    @property
    def stdout_path(self) -> str:
        return os.path.join(self.dir, "stdout.log")

    @property
    def stderr_path(self) -> str:
        return os.path.join(self.dir, "stderr.log")

    @property
    def error_path(self) -> str:
        return os.path.join(self.dir, "error.json")

    @property
    def stacks_path(self) -> str:
        return os.path.join(self.dir, "stacks.log")

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    def read_error(self) -> dict | None:
        """The rank's error.json (torch elastic's layout, plus nbspawn's structured fields)."""
        try:
            with open(self.error_path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None


class _Tail:
    """Incremental reader of one log file: bytes land on disk losslessly, the view gets decoded text."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self, limit: int = 1 << 20) -> str:
        chunks = []
        total = 0
        while total < limit:
            data = os.read(self.fd, 1 << 16)
            if not data:
                break
            chunks.append(data)
            total += len(data)
        return self.decoder.decode(b"".join(chunks)) if chunks else ""

    def finish(self) -> str:
        text = self.read(limit=1 << 62) + self.decoder.decode(b"", final=True)
        os.close(self.fd)
        self.fd = -1
        return text


@dataclass
class Run:
    spec: RunSpec
    ranks: list[RankState] = field(default_factory=list)
    status: str = "starting"  # starting | running | succeeded | failed | timeout | interrupted | stopped
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    error: BaseException | None = None
    outputs: dict[str, list] = field(default_factory=dict)  # --out: name -> one value per rank
    _tails: dict[tuple[int, str], _Tail] = field(default_factory=dict, repr=False)

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def run_dir(self) -> str:
        return self.spec.run_dir

    @property
    def nprocs(self) -> int:
        return self.spec.nprocs

    @property
    def duration(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def prepare_logs(self) -> None:
        """Create ``<run-dir>/<rank>/`` and open a tail on each stream before any rank writes."""
        os.makedirs(self.spec.run_dir, exist_ok=True)
        for rank in range(self.spec.nprocs):
            state = RankState(rank=rank, dir=self.spec.rank_dir(rank))
            os.mkdir(state.dir)
            self.ranks.append(state)
            for stream in STREAMS:
                self._tails[rank, stream] = _Tail(os.path.join(state.dir, f"{stream}.log"))

    def read_new_output(self, final: bool = False) -> list[tuple[int, str, str]]:
        """Everything written since the last call, as (rank, stream, text), in rank order."""
        out = []
        for (rank, stream), tail in self._tails.items():
            if tail.fd < 0:
                continue
            text = tail.finish() if final else tail.read()
            if text:
                out.append((rank, stream, text))
        return out

    def close_logs(self) -> None:
        for tail in self._tails.values():
            if tail.fd >= 0:
                os.close(tail.fd)
                tail.fd = -1

    def raise_for_status(self) -> None:
        if self.error is not None:
            raise self.error

    def __repr__(self) -> str:
        ranks = ", ".join(f"{r.rank}:{r.status}" for r in self.ranks)
        took = f" in {self.duration:.2f}s" if self.duration is not None else ""
        return f"<nbspawn Run {self.run_id} {self.status}{took} [{ranks}] logs={self.run_dir}>"


__all__ = ["RankState", "Run", "SpawnError"]
