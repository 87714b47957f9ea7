"""What the batch scheduler says of the job that holds a cluster's engines (Slurm, through ``scontrol``).

Two moments need its word, because what the kernel sees alone misleads:

* A job cancelled (``scancel``), out of time or on a failed node has Slurm signal every process of the
  job: the ranks end "killed by SIGTERM" as if a peer's failure had stopped them.  The kernel asks
  the job's state once per node and run, and names the node as lost with Slurm's reason.
* A job still queued has registered no engines: ``%%spawn --cluster cluster`` (an ``ipp.Cluster``
  started with ``start_cluster_sync()``) waits for the engines it asked for, saying the job's state
  and Slurm's reason for it (``PENDING (Resources)``), until they come or the cell is interrupted.

Only Slurm is asked (its client is on the login node the kernel runs on); any other scheduler's
engines are waited for all the same, without a reason.  A missing or silent ``scontrol`` is no answer,
never an error.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import SpawnUsageError

JOB_ENV = "SLURM_JOB_ID"  # what a process of a Slurm job has in its environment
SCONTROL_TIMEOUT = 3.0
# a job in any other state has ended (CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, FAILED, COMPLETED...)
LIVE = frozenset({"RUNNING", "PENDING", "CONFIGURING", "SUSPENDED", "RESIZING", "REQUEUED", "REQUEUE_HOLD", "SIGNALING"})
POLL = 0.5  # how often the engines are counted while they are waited for
ASK_EVERY = 2.0  # how often Slurm is asked meanwhile


class JobState(NamedTuple):
    job: str
    state: str  # Slurm's JobState: RUNNING, PENDING, CANCELLED...
    reason: str  # Slurm's Reason: Resources, Priority, ... ("" for None)

    @property
    def ended(self) -> bool:
        return self.state not in LIVE

    def words(self) -> str:
        """``Slurm job 7 is PENDING (Resources)``."""
        return f"Slurm job {self.job} is {self.state}" + (f" ({self.reason})" if self.reason else "")


def job_here() -> str | None:
    """In an engine: the Slurm job that holds it (None outside one)."""
    return os.environ.get(JOB_ENV) or None


SETTLE = 3.0  # how long a job seen COMPLETING (scancel's signals under way) is asked again for how it ended


def job_state(job: str, settle: float = SETTLE) -> JobState | None:
    """Slurm's state of ``job`` (None: no ``scontrol``, no answer, or a job it no longer knows).  A job
    COMPLETING (its processes being signalled: the moment its ranks die) is asked again, up to
    ``settle`` seconds, for the state it ends in (CANCELLED, TIMEOUT, ...)."""
    state = _ask_scontrol(job)
    deadline = time.monotonic() + settle
    while state is not None and state.state == "COMPLETING" and time.monotonic() < deadline:
        time.sleep(0.2)
        state = _ask_scontrol(job) or state
    return state


def _ask_scontrol(job: str) -> JobState | None:
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "-o", str(job)], check=False, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_job(job, done.stdout) if done.returncode == 0 else None


def parse_job(job: str, text: str) -> JobState | None:
    """``scontrol show job -o``'s line: its JobState and Reason."""
    state = re.search(r"\bJobState=(\S+)", text)
    if state is None:
        return None
    reason = re.search(r"\bReason=(\S+)", text)
    why = reason.group(1) if reason else ""
    return JobState(str(job), state.group(1), "" if why in ("None", "(null)") else why)


def lost_words(state: JobState) -> str:
    """Why a node of an ended job was lost: ``its Slurm job 7 was CANCELLED``."""
    return f"its Slurm job {state.job} was {state.state}" + (f" ({state.reason})" if state.reason else "")


class JobLook:
    """Each job's state asked once (a run's end: every rank of the node killed at once asks one)."""

    def __init__(self, ask: Callable[[str], JobState | None] = job_state) -> None:
        self._ask = ask
        self._seen: dict[str, JobState | None] = {}

    def ended(self, job: str | None) -> JobState | None:
        """The state of ``job`` if it has ended (None: running, unknown, or no job)."""
        if not job:
            return None
        if job not in self._seen:
            self._seen[job] = self._ask(job)
        state = self._seen[job]
        return state if state is not None and state.ended else None


def asked_engines(cluster: Any) -> tuple[int, list[str]]:
    """How many engines an ``ipp.Cluster`` asked for (its engine sets still running), and the batch
    jobs that hold them (a launcher's ``job_id``)."""
    n, jobs = 0, []
    for launcher in getattr(cluster, "engines", {}).values():
        if getattr(launcher, "state", "running") != "running":
            continue
        n += int(getattr(launcher, "n", 0) or 0)
        job = getattr(launcher, "job_id", None)
        if job:
            jobs.append(str(job))
    return n, jobs


def wait_for_engines(
    name: str,
    cluster: Any,
    client: Any,
    *,
    say: Callable[[str], None] = print,
    ask: Callable[[str], JobState | None] = job_state,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until ``cluster``'s engines have all registered with ``client``: say what keeps them (a line
    each time it changes). Raises ``SpawnUsageError`` when their job has ended, or when the cell is
    interrupted (nothing was started)."""
    asked, jobs = asked_engines(cluster)
    if not asked or len(client.ids) >= asked:
        return
    said, last_ask, states = "", -ASK_EVERY, []
    try:
        while len(client.ids) < asked:
            if clock() - last_ask >= ASK_EVERY:
                last_ask = clock()
                states = [s for s in (ask(job) for job in jobs) if s is not None]
                for state in states:
                    if state.ended:
                        raise SpawnUsageError(
                            f"--cluster {name}: its engines' {state.words()} and will not start them; "
                            f"start them again: {name}.start_engines_sync()"
                        )
            why = "; ".join(s.words() for s in states) or "their launcher has not started them yet"
            line = f"nbspawn: waiting for the engines of {name} ({len(client.ids)} of {asked} registered): {why}"
            if line != said:
                say(line)
                said = line
            sleep(POLL)
    except KeyboardInterrupt:
        why = "; ".join(s.words() for s in states)
        raise SpawnUsageError(
            f"--cluster {name}: interrupted while waiting for its engines ({len(client.ids)} of {asked} registered"
            + (f"; {why}" if why else "")
            + f"); nothing was started. {name}.stop_engines_sync() takes them out of the queue"
        ) from None
