"""A cluster run: the same cell (or program) on several nodes, each node's ranks started by its agent.

In the kernel this is one more executor under the one supervisor: every rank of every node is a rank
of the kernel's :class:`~nbspawn._runstate.Run`, numbered globally, and the failure policy, views and
errors are the ones a local run has.  What differs is how ranks are seen and reached:

* each node's agent (``nbspawn.cluster._agent.run_node``, an ipyparallel ``apply``) runs the node's
  ranks with the local launcher and sends what they report as data messages; :meth:`read_output`
  turns them back into the events a local run reads from its log files, and a rank's end (exit code,
  error record, stack dump, collectives record for the X-ray) is written to the kernel's copy of its
  directory, where the supervisor (and ``Run.read_xray``) reads it as it reads a local rank's;
* stopping is asked per node with a signal through ipyparallel's nanny (:meth:`signal_ranks`): the
  agent stops its ranks as the local policy does;
* a node whose engine dies fails the run at once, naming the node; a heartbeat tells agents the
  kernel is alive (engines outlive kernels).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

from .. import _errorfile
from .._errorfile import ErrorRecord
from .._rankdir import XRAY, write_whole
from .._runstate import Run
from .._spec import RunSpec
from ..events._streams import Event
from ..events._where import RankToAsk, Where, describe
from ..executors._base import CLUSTER_POLL_MAX, Executor, RankEnd, Supervision
from ..executors._supervisor import supervises_here
from ..handoff._names import Outputs
from . import _agent, _batch, _contact, _wire
from ._plan import ClusterPlan, hold, release, remember_port

FINAL_WAIT = 10.0  # after its ranks ended, how long a node's agent may take to clean up and answer


class ClusterRanks(Executor):
    """The executor of a cluster run: every node's ranks, started and reported by the nodes' agents."""

    supervision = Supervision(remote=True, poll_max=CLUSTER_POLL_MAX)  # a node's news (a failure above all) acted on soon

    def __init__(self, spec: RunSpec, cluster: ClusterPlan, job: _wire.Job, port_book: Any = None) -> None:
        self.spec = spec
        self.cluster = cluster
        self.job = job
        # the user's client, where the engines' facts (node 0's next port) are kept; a background
        # run's own client (``cluster.client``) is closed with it
        self.port_book = port_book if port_book is not None else cluster.client
        self.run: Run | None = None
        self.results: dict[int, Any] = {}  # node index -> its agent's AsyncResult
        self.inboxes: dict[int, dict] = {}  # node index -> the data dict ipyparallel fills
        self.next_seq: dict[int, int] = {}
        self.jobs = _batch.JobLook()  # the nodes' batch jobs, asked once if their ranks are killed
        self.answered: dict[int, _wire.Answer | None] = {}  # node index -> run_node's result (None: lost), once handled
        self.asked: set[int] = set()  # nodes told to stop
        # nodes whose agent said its ranks started; a signal for another waits until it does (below)
        self.begun: set[int] = set()
        self.held: dict[int, list[int]] = {}
        self.ends: dict[int, RankEnd] = {}  # reported by its node, not yet reaped
        self.reported: set[int] = set()
        self.pipes: list[tuple[int, int]] = []  # per rank: readable when its end (or its node's answer) came
        self.pipes_lock = threading.Lock()
        self.last_beat = 0.0
        self.look_lock = threading.Lock()

    # -- Executor ---------------------------------------------------------------------------------

    def start(self, run: Run) -> list[int]:
        self.run = run
        if run.background:
            hold(self.port_book, run.run_id)
        for state in run.ranks:
            state.node = self.cluster.node_of(state.rank).label
        self.pipes = [os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC) for _ in run.ranks]
        run.counts_batches(len(self.cluster.nodes))
        try:
            for node in self.cluster.nodes:
                spot: _wire.Spot = {
                    "index": node.index,
                    "nnodes": len(self.cluster.nodes),
                    "offset": self.cluster.ranks_of(node.index).start,
                    "world_size": self.cluster.world_size,
                    "master_addr": self.cluster.master_addr,
                    "master_port": self.cluster.master_port,
                    "cuda_visible": node.cuda_visible,
                }
                result = self._call_agent(node.agent, spot)
                result.add_done_callback(self._wake(node.index))
                self.results[node.index] = result
                self.inboxes[node.index] = result.metadata["data"]
                self.next_seq[node.index] = 0
        except BaseException:  # the run is given up: no waiting for the agents to begin
            self._send_signal(signal.SIGINT, [node.agent for node in self.cluster.nodes if node.index in self.results])
            raise
        self.last_beat = time.monotonic()
        return [0] * len(run.ranks)

    def _call_agent(self, agent: int, spot: _wire.Spot) -> Any:
        """The node's part of the run, asked of its agent (an ``AsyncResult``)."""
        return self.cluster.client[agent].apply_async(_agent.run_node, self.job, spot)

    def waitables(self, rank: int) -> list[Any]:
        return [self.pipes[rank][0]] if self.spec.runs(rank) else []  # --on: the others sit the cell out

    def ended(self, rank: int, ready: Any) -> RankEnd | None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.pipes[rank][0], 64)
        return self.ends.pop(rank, None)  # None: woken because its node answered, read next

    def announcement(self) -> str:
        return self.cluster.describe()

    def where(self, run: Run, wait: float) -> str | None:
        """Every running rank's stack, each node's agent looking at its own, grouped as one."""
        running = [s.rank for s in run.ranks if s.status == "running"]
        stacks, collectives = self.look(run, running, wait)
        asked = [RankToAsk(r, run.ranks[r].pid, "", run.ranks[r].node) for r in running]
        text = describe(asked, stacks, run.spec.cell, run.spec.program, run.spec.cell_numbers, collectives=collectives)
        silent = sorted({run.ranks[r].node or "" for r in running if r not in stacks})
        return text + (f"\n({', '.join(silent)}: no answer in time)" if silent else "")

    def look(self, run: Run, ranks: list[int], wait: float) -> Where:
        """Each node's agent is asked (a signal) and looks at its own ranks (``_agent.look``).

        The supervising thread asks through the run's client; another thread (``%spawn where`` on a
        background run, in the kernel's main thread) through the user's, which is that thread's.
        One look at a time: the agents' answers share one key space."""
        with self.look_lock:
            return self._look(run, ranks, wait)

    def _look(self, run: Run, ranks: list[int], wait: float) -> Where:
        asked = sorted({self.cluster.node_of(r).index for r in ranks} - set(self.answered))
        if not asked:
            return Where({}, {})
        for index in asked:
            for key in [k for k in list(self.inboxes[index]) if k.startswith(_wire.WHERE_PREFIX)]:
                self.inboxes[index].pop(key, None)  # an answer to an earlier question
        supervising = supervises_here(run) if run.background else True
        client = self.cluster.client if supervising else self.port_book
        agents = [self.cluster.nodes[i].agent for i in asked]
        registered = set(client.ids)
        client.send_signal(int(_contact.WHERE_SIGNAL), targets=[a for a in agents if a in registered], block=False)
        answers: dict[int, _wire.Where] = {}
        until = time.monotonic() + max(wait, _agent.LOOK_WAIT) + 1.0  # the agents look, then answer
        while len(answers) < len(asked) and time.monotonic() < until:
            for index in asked:
                for key in [k for k in list(self.inboxes[index]) if k.startswith(_wire.WHERE_PREFIX)]:
                    answers[index] = self.inboxes[index].pop(key)
            if len(answers) < len(asked):
                if supervising:
                    self._heartbeat()  # the agents must not take this wait for the kernel's death
                time.sleep(0.01)
        stacks: dict[int, str | None] = {}
        collectives: dict[int, list[dict[str, Any]]] = {}
        wanted = set(ranks)
        for answer in answers.values():
            stacks.update({int(r): d for r, d in answer["stacks"].items() if int(r) in wanted})
            collectives.update({int(r): c for r, c in answer["collectives"].items() if int(r) in wanted})
        return Where(stacks, collectives)

    def signal_ranks(self, ranks: list[int], pids: list[int], sig: int) -> None:
        """One request per node: SIGINT interrupts (a second one kills), SIGTERM stops as a failure does.

        A node whose agent has not said its ranks started gets it once it has: before, the engine
        ignores SIGINT (ipykernel's, between tasks) or the agent is still unpacking the cell, and
        the kernel's interrupt of a world cell that another node failed at once was lost, or ended
        the agent's task and with it the node's part of the world."""
        if sig == signal.SIGUSR1:
            return  # each agent asks its own ranks for their stacks before stopping them
        wanted = signal.SIGINT if sig in (signal.SIGINT, signal.SIGKILL) else _contact.STOP_SIGNAL
        nodes = sorted({self.cluster.node_of(r).index for r in ranks} - set(self.answered))
        self.asked.update(nodes)
        for index in set(nodes) - self.begun:
            self.held.setdefault(index, []).append(wanted)
        if ready := [i for i in nodes if i in self.begun]:
            self._send_signal(wanted, [self.cluster.nodes[i].agent for i in ready])

    def _began(self, index: int) -> None:
        """The node's agent supervises its ranks now: what it was sent meanwhile goes to it, in order."""
        self.begun.add(index)
        for sig in self.held.pop(index, []):
            self._send_signal(sig, [self.cluster.nodes[index].agent])

    def read_output(self, run: Run, final: bool = False, budget: int | None = None) -> list[Event]:
        """What the agents sent (each read its ranks within the view's budget, as a local run does)."""
        return self._read(final)

    def _read(self, final: bool) -> list[Event]:
        events: list[Event] = []
        self._heartbeat()
        deadline = time.monotonic() + FINAL_WAIT
        while True:
            for node in self.cluster.nodes:
                if node.index not in self.answered:
                    self._drain(node.index, events)
                    if self.results[node.index].ready():
                        self._answered(node.index, events)
            if not final or len(self.answered) == len(self.cluster.nodes):
                return events
            if time.monotonic() > deadline:
                for index in set(range(len(self.cluster.nodes))) - set(self.answered):
                    self._lost(index, f"its agent did not finish within {FINAL_WAIT:g} s of its ranks")
                    self.answered[index] = None
                return events
            self._heartbeat()
            time.sleep(0.01)

    def outputs(self, run: Run) -> Outputs:
        values: dict[str, list[Any]] = {name: [] for name in self.spec.out_names}
        missing: list[tuple[int, str]] = []
        for node in self.cluster.nodes:
            answer = self.answered.get(node.index)
            if answer is None:
                continue
            missing.extend((int(rank), str(name)) for rank, name in answer["missing"])
            for name, kept in values.items():
                kept.extend(answer["outputs"].get(name, [None] * self.cluster.ranks_per_node))
        return Outputs(values, missing)

    def cleanup(self, lose: bool) -> None:
        """Every agent has answered (its ranks reaped, its engine idle again); close what is ours."""
        if len(self.answered) < len(self.cluster.nodes):
            self.signal_ranks(list(range(self.cluster.world_size)), [], signal.SIGINT)
            self._read(final=True)
        with self.pipes_lock:
            for read, write in self.pipes:
                os.close(read)
                os.close(write)
            self.pipes = []
        if self.port_book is not self.cluster.client:
            with contextlib.suppress(Exception):
                self.cluster.client.close()
        if self.run is not None and self.run.background:
            release(self.port_book, self.run.run_id)

    # -- what the agents say ----------------------------------------------------------------------

    def _wake(self, index: int) -> Any:
        """For ipyparallel's IO thread: the node's agent answered; wake the supervisor now."""
        ranks = self.cluster.ranks_of(index)

        def wake(_result: Any) -> None:
            with self.pipes_lock:  # never a descriptor cleanup closed (its number may be reused)
                for read_write in self.pipes[ranks.start : ranks.stop]:
                    with contextlib.suppress(OSError):
                        os.write(read_write[1], b"w")

        return wake

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self.last_beat >= _contact.HEARTBEAT_EVERY:
            self.last_beat = now
            targets = [n.agent for n in self.cluster.nodes if n.index not in self.answered]
            self._send_signal(_contact.HEARTBEAT_SIGNAL, targets)

    def _send_signal(self, sig: int, agents: list[int]) -> None:
        """To the agents still registered: an engine that died is unregistered (a signal to it would
        raise) before its result says so, which loses its node."""
        registered = set(self.cluster.client.ids)
        targets = [agent for agent in agents if agent in registered]
        if targets:
            self.cluster.client.send_signal(int(sig), targets=targets, block=False)

    def _drain(self, index: int, events: list[Event], until: int | None = None) -> None:
        """The node's batches that have arrived, in order (``until``: wait for those before it)."""
        inbox = self.inboxes[index]
        waited_until = time.monotonic() + 2.0
        while True:
            batch: _wire.Batch | None = inbox.pop(_wire.batch_key(self.next_seq[index]), None)
            if batch is not None:
                self.next_seq[index] += 1
                assert self.run is not None  # started
                self.run.batch_from(index)
                self._apply(index, batch, events)
                continue
            if until is None or self.next_seq[index] >= until or time.monotonic() > waited_until:
                return
            time.sleep(0.005)  # the result came before the last data message: both are on their way

    def _apply(self, index: int, batch: _wire.Batch, events: list[Event]) -> None:
        assert self.run is not None  # started
        node = self.cluster.nodes[index]
        for entry in batch:
            if entry[0] == "o":
                events.append(Event(entry[1], entry[2], entry[3]))
            elif entry[0] == "i":
                events.append(Event(entry[1], "item", entry[2]))
            elif entry[0] == "s":
                events.append(Event(entry[1], "skipped", entry[2]))
            elif entry[0] == "c":
                events.append(Event(entry[1], "costs", entry[2]))
            elif entry[0] == "e":
                self._ended(entry[1], entry[2])
            elif entry[0] == "started":
                _, pids, run_dir = entry
                self._began(index)
                for rank, pid in pids:
                    state = self.run.ranks[rank]
                    state.pid = pid
                    state.remote_dir = f"{node.hostname}:{run_dir}/{rank}"

    def _ended(self, rank: int, record: _wire.EndRecord) -> None:
        """The kernel's copy of the rank's end, where the supervisor reads a local rank's."""
        if rank in self.reported:
            return
        assert self.run is not None  # started
        state = self.run.ranks[rank]
        error = ErrorRecord.from_json(record["error"])
        if error is None and record["tail"]:
            error = ErrorRecord(exc_type=None, message=None, traceback=record["tail"])
        if (error is None or error.exc_type is None) and int(record["exit_code"] or 0) < 0:
            error = self._killed_with_its_job(rank) or error
        if error is not None:
            _errorfile.write(state.error_path, error)
        if record["stacks"]:
            with open(state.stacks_path, "w", encoding="utf-8") as fh:
                fh.write(record["stacks"])
        if record.get("xray"):  # its collectives, where Run.read_xray reads a local rank's
            write_whole(os.path.join(state.dir, XRAY), record["xray"] or "")
        self.reported.add(rank)
        self.ends[rank] = RankEnd(int(record["exit_code"] or 0), died=bool(record.get("died", True)))
        os.write(self.pipes[rank][1], b"x")

    def _killed_with_its_job(self, rank: int) -> ErrorRecord | None:
        """A rank killed by a signal on a node whose batch job has ended (``scancel``, its time
        limit): the node was lost, as Slurm says, not stopped by a peer (the ranks alone cannot tell)."""
        node = self.cluster.node_of(rank)
        ended = self.jobs.ended(node.facts.get("batch_job"))
        return ErrorRecord("NodeLost", f"{node.label} was lost: {_batch.lost_words(ended)}", None) if ended else None

    def _answered(self, index: int, events: list[Event]) -> None:
        """The node's agent returned: its last batches, its ``--out`` values; or it was lost."""
        result = self.results[index]
        try:
            answer: _wire.Answer = result.get(0)
        except Exception as err:  # EngineError, RemoteError, ...: the node is lost
            self._drain(index, events)
            self.answered[index] = None
            if index == 0:
                remember_port(self.port_book, self.cluster.nodes[0].agent, None)
            why = getattr(err, "ename", type(err).__name__)
            text = getattr(err, "evalue", "") or str(err)
            if why == "EngineError" or "EngineError" in type(err).__name__:
                self._lost(
                    index,
                    f"its engine {self.cluster.nodes[index].agent} died ({text.strip().splitlines()[0] if text.strip() else why})",
                )
            else:
                self._lost(index, f"its agent failed: {why}: {text}".rstrip(": "))
            return
        self._drain(index, events, until=int(answer["last_seq"]))
        self._apply(index, answer["final"], events)
        self.answered[index] = answer
        if index == 0 and answer["next_port"] is not None:  # a kept world's later cells take no new port
            remember_port(self.port_book, self.cluster.nodes[0].agent, answer["next_port"])
        self._lost(index, "its agent ended without reporting every rank")

    def _lost(self, index: int, why: str) -> None:
        """Every rank of the node not yet reported ends now; unless the node was asked to stop, each
        carries the node's loss as its error (the root cause, if nothing failed before)."""
        node = self.cluster.nodes[index]
        for rank in self.cluster.ranks_of(index):
            if rank in self.reported:
                continue
            error = None if index in self.asked else ErrorRecord("NodeLost", f"{node.label} was lost: {why}", None)
            record: _wire.EndRecord = {
                "exit_code": -signal.SIGKILL,
                "error": error.to_json() if error else None,
                "stacks": "",
                "tail": None,
                "ended_at": time.time(),
                "died": True,
                "xray": None,
            }
            self._ended(rank, record)
