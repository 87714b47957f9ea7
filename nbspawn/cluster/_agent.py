"""What runs on a node: one engine per node is its agent, and runs nbspawn's own local launcher there.

The kernel calls two functions on engines through ipyparallel's ``apply``:

* :func:`probe` on every engine, before anything starts: which node it is on, its versions, an
  address other nodes can reach it at, its GPUs and cores, and whether the program exists there;
* :func:`run_node` on each node's agent: the node's ranks are started and supervised by the same
  supervisor and failure policy as a local run (``nbspawn.executors``), with a :class:`RelayView`
  that sends what the ranks report to the kernel as ipyparallel data messages (batched, at most
  ``1 / publish_every`` a second), never through the engine's stdout.

The kernel reaches a busy engine only with signals (``_contact``: stop, heartbeat, where).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import os
import platform
import socket
import time
from collections.abc import Iterator
from typing import Any

from .. import _listen
from .._options import StartMethod
from .._program import ProgramLine
from .._rankdir import XRAY
from .._request import Settings
from .._runstate import RankState, Run
from .._spec import Placement
from ..errors import SpawnOutputError
from ..events._where import RankToAsk, rank_collectives, rank_stacks
from ..executors._base import NODE_AGENT
from ..executors._fresh import FreshRanks
from ..executors._program import ProgramRanks
from ..views._protocol import RunView
from . import _batch, _contact, _net, _wire

LOOK_WAIT = 1.5  # the longest an agent waits for its ranks' dumps when asked where they are
READ_BUDGET = 32 * 1024  # bytes of each stream of each rank read per poll, as the live widget reads
BATCH_CHARS = 64 * 1024  # most text of one rank in one batch; older lines are counted, not sent
STACKS_SENT = 64 * 1024
XRAY_SENT = 4 * 1024 * 1024  # a rank's X-ray record is bounded (ranks._xray: a few hundred KB); past this it stays

_store: Any = None  # node 0's TCPStore of the last run


def versions() -> dict[str, str]:
    """What must be the same on every node and in the kernel."""
    import torch

    from .._version import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "nbspawn": __version__}


def probe(kernel_cwd: str, program: ProgramLine | None, start_method: StartMethod, controller_hint: str | None) -> dict:
    """This engine's node and what the kernel must check before the run (one round trip)."""
    import torch

    from .. import _cuda
    from .._decide import choose_start_method
    from .._machine import Machine
    from ..errors import SpawnUsageError

    _contact.install_handlers()
    here = Machine.here()
    visible = os.environ.get(_cuda.VISIBLE)
    physical = _cuda.physical_gpus() if _cuda.compiled_with_cuda(torch) else 0
    cwd = kernel_cwd if os.path.isdir(kernel_cwd) else os.getcwd()
    problem = None
    try:
        method, _notes = choose_start_method(start_method if program is None else "spawn", here)
    except SpawnUsageError as err:
        method, problem = "", str(err)
    if program is not None and problem is None:
        from .._program import locate

        with working_directory(cwd):
            try:
                locate(program)  # read at the door; here: it exists on this node
            except SpawnUsageError as err:
                problem = f"{err} (from {cwd})" if "(from" not in str(err) else str(err)
    address = _net.routable_address(_net.engine_controller_host() or controller_hint)
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            machine = fh.read().strip()
    except OSError:
        machine = ""
    return {
        "node": _net.node_name(),
        "hostname": socket.gethostname(),
        "machine": machine,
        "pid": os.getpid(),
        **versions(),
        "address": address,
        "port": _listen.reserve(address or _listen.LOOPBACK),  # node 0's next store: bound to this address only
        "gpus": _cuda.gpu_count(visible),  # this engine's own view (never cuInit here)
        "physical_gpus": physical,  # the node's, whatever this engine's CUDA_VISIBLE_DEVICES
        "cuda_visible": visible,
        "cpus": here.cpus,
        "cwd": cwd,
        "start_method": method,
        "problem": problem,
        "batch_job": _batch.job_here(),  # the Slurm job holding this engine, asked of Slurm if its ranks are killed
    }


@contextlib.contextmanager
def working_directory(path: str) -> Iterator[None]:
    """The kernel's working directory (as the engine sees it) for what runs inside: a cell's relative paths."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


class RelayView(RunView):
    """The view of a node's run: batches what its ranks report and sends it to the kernel.

    Ranks are renumbered to their global ranks here.  A rank's failure is sent at once (the kernel
    stops the other nodes on it); the rest goes out at most every ``publish_every`` seconds, and a
    rank that writes more than :data:`BATCH_CHARS` in that time has its older lines counted as
    skipped (its log keeps them).  The last batch is not published but returned with the result.
    """

    read_budget = READ_BUDGET

    def __init__(self, offset: int, rich: bool, publish_every: float, publish: Any, alive: Any = None) -> None:
        self.offset = offset
        self.alive = alive  # a kept world's: whether a (local) rank's process lives on after its cell
        self.rich = rich
        self.publish_every = publish_every
        self._publish_data = publish
        self.batch: _wire.Batch = []
        self.chars: dict[int, int] = {}
        self.seq = 0
        self.last = 0.0
        self.pids_sent = False
        self.final: _wire.Batch = []

    # -- RunView ----------------------------------------------------------------------------------

    def started(self, run: Run) -> None:
        self.last = time.monotonic()

    def output(self, rank: int, stream: str, text: str) -> None:
        rank += self.offset
        self.batch.append(("o", rank, stream, text))
        self.chars[rank] = self.chars.get(rank, 0) + len(text)
        if self.chars[rank] > BATCH_CHARS:
            self._cut(rank)

    def display(self, rank: int, item: dict) -> None:
        self.batch.append(("i", rank + self.offset, item))

    def skipped(self, rank: int, lines: int) -> None:
        self.batch.append(("s", rank + self.offset, lines))

    def resources_sampled(self, run: Run) -> None:
        for state in run.ranks:
            if state.status in ("starting", "running") and state.rss is not None:
                self.batch.append(("c", state.rank + self.offset, _costs(run, state)))

    def rank_ended(self, run: Run, state: RankState) -> None:
        died = self.alive is None or not self.alive(state.rank)
        if state.peak_rss is not None or state.failure is not None:  # its last figures, and why it died if for memory
            self.batch.append(("c", state.rank + self.offset, _costs(run, state)))
        self.batch.append(("e", state.rank + self.offset, _end_record(state, died)))
        if state.status in ("failed", "failed_after"):
            self._send_pids(run)
            self._publish()  # the kernel stops the other nodes on it: no waiting

    def tick(self, run: Run) -> None:
        asked = _contact.where_wanted()
        if asked is not None:
            ranks = [RankToAsk(s.rank + self.offset, s.pid, s.stacks_path) for s in run.ranks if s.status == "running"]
            self._publish_data({_wire.where_key(asked): look(ranks, run.spec.program is not None)})
        if not self.pids_sent:
            self._send_pids(run)
            self._publish()
        elif self.batch and time.monotonic() - self.last >= self.publish_every:
            self._publish()

    def finished(self, run: Run) -> None:
        self._send_pids(run)
        self.final, self.batch = self.batch, []

    def wants_stop(self) -> bool | str:
        if _contact.stop_asked():
            return "the kernel stopped this node's ranks"
        if _contact.kernel_silent():
            return f"the kernel is gone (no heartbeat for {_contact.HEARTBEAT_LOST:g} s)"
        return False

    def interrupts(self) -> int:
        return _contact.interrupts_heard()

    # -- batching ---------------------------------------------------------------------------------

    def _send_pids(self, run: Run) -> None:
        if not self.pids_sent:
            self.pids_sent = True
            pids = [(state.rank + self.offset, state.pid) for state in run.ranks]
            self.batch.insert(0, ("started", pids, run.run_dir))

    def _cut(self, rank: int) -> None:
        """Keep this rank's newest text in the batch; count the lines of what is dropped, where it was."""
        kept: _wire.Batch = []
        dropped_lines, at = 0, None
        excess = self.chars[rank] - BATCH_CHARS // 2
        for entry in self.batch:
            if excess > 0 and entry[0] == "o" and entry[1] == rank:
                excess -= len(entry[3])
                self.chars[rank] -= len(entry[3])
                dropped_lines += entry[3].count("\n")
                at = len(kept) if at is None else at
                continue
            kept.append(entry)
        if dropped_lines and at is not None:
            kept.insert(at, ("s", rank, dropped_lines))
        self.batch = kept

    def _publish(self) -> None:
        if self.batch:
            self._publish_data({_wire.batch_key(self.seq): self.batch})
            self.seq += 1
        self.batch, self.chars, self.last = [], {}, time.monotonic()


def look(ranks: list[RankToAsk], program: bool) -> _wire.Where:
    """These ranks' dumps and collectives, as the kernel's ``where_now`` reads them on one machine."""
    stacks = rank_stacks(ranks, wait=LOOK_WAIT)
    return {"stacks": stacks, "collectives": {} if program else rank_collectives(ranks, stacks)}


def _costs(run: Run, state: RankState) -> _wire.Costs:
    return {
        "cpu": state.cpu_percent if state.status == "running" else None,
        "rss": state.rss if state.status == "running" else None,
        "peak_rss": state.peak_rss,
        "gpu": [dataclasses.asdict(device) for device in state.gpu],
        "warning": run.memory_warning,
        "memory": state.failure.memory if state.failure else None,
    }


def _end_record(state: RankState, died: bool) -> _wire.EndRecord:
    """How a rank ended, with its error record and stack dump: what the kernel's supervisor reads."""
    failure = state.failure
    stacks = state.read_stacks(STACKS_SENT)  # the dump taken when it was stopped
    error = state.read_error()
    return {
        "exit_code": state.exit_code or 0,
        "error": error.to_json() if error else None,
        "stacks": stacks,
        # a program's last words when it left no error record (the node's path, as it will be shown)
        "tail": failure.traceback if failure and not failure.exc_type and not failure.stopped else None,
        "ended_at": state.ended_at,
        "died": died,
        "xray": _read_whole(os.path.join(state.dir, XRAY), XRAY_SENT),
    }


def _read_whole(path: str, limit: int) -> str | None:
    """A file the rank wrote whole (``_rankdir.write_whole``), if there is one and it is not over ``limit``."""
    try:
        if os.path.getsize(path) > limit:
            return None
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def run_node(job: _wire.Job, node: _wire.Spot) -> _wire.Answer:
    """Start this node's ranks and supervise them to the end; what they report goes to the kernel.

    Returns the last batch, how many were published before it, and the node's ``--out`` values.
    """
    global _store
    import cloudpickle

    from .._decide import decide_ranks
    from .._machine import Machine
    from .._program import locate
    from .._spec import Handoff, build_spec
    from ..executors._supervisor import execute
    from ..handoff._shm import Payload, forget_arrivals, new_run_prefix

    with _contact.node_run():
        view = RelayView(node["offset"], job["rich"], job["publish_every"], _contact.publisher())
        out_names = tuple(job["out_names"])

        def handoff(method: str) -> Handoff:
            forget_arrivals()
            # CUDA tensors arrive as CPU data (never rebuilt on a GPU in this engine); the ranks place them
            names = cloudpickle.loads(job["names"]) if job["names"] else {}
            prefix = new_run_prefix() if out_names else None
            if method == "fork":
                return Handoff({"__name__": "__main__", "__builtins__": builtins, **names}, None, out_names, prefix)
            return Handoff(None, Payload(names), out_names, prefix)

        settings, placement = node_placement(job, node)
        with working_directory(job["cwd"]):
            program = locate(job["program"]) if job["program"] is not None else None
            ranks = decide_ranks(settings, Machine.here(settings.env), program)
            spec = build_spec(
                job["cell"], settings, ranks, rich=job["rich"], handed=None if program else handoff(ranks.start_method),
                program=program, run_id=job["run_id"], placement=placement,
            )  # fmt: skip
            executor = _NodeProgramRanks(spec) if program is not None else _NodeCellRanks(spec)
            _store = None  # the previous run's: every node's ranks of it had ended before this run began
            run = execute(spec, view, executor)  # node 0's executor hosts the run's store once its ranks are forked
            next_port = _listen.reserve(spec.master_addr) if node["index"] == 0 else None
        return answer(run, view, node, next_port)


def answer(run: Run, view: RelayView, node: _wire.Spot, next_port: int | None, lost: str | None = None) -> _wire.Answer:
    """What a node's agent returns for a run of its ranks, fresh or a kept world's cell: the view's last
    batch, the ``--out`` values, and ``next_port`` (node 0: held for the next run, which then needs no
    probe to know node 0's port)."""
    missing = run.error.missing if isinstance(run.error, SpawnOutputError) else []
    return {
        "last_seq": view.seq,
        "final": view.final,
        "outputs": run.outputs,
        "missing": [(rank + node["offset"], name) for rank, name in missing],
        "run_dir": run.run_dir,
        "status": run.status,
        "next_port": next_port,
        "lost": lost,
    }


def node_placement(job: _wire.Job, node: _wire.Spot) -> tuple[Settings, Placement]:
    """This node's settings (its socket interface and GPUs in the ranks' environment, unless the user
    set them) and its ranks' place in the world: what a run and a kept world on it are built from."""
    settings = job["settings"]
    user_env = dict(settings.env)  # read in the kernel, at the door
    node_env = _socket_interface(node["master_addr"], user_env)
    if node.get("cuda_visible") is not None and "CUDA_VISIBLE_DEVICES" not in user_env:
        node_env["CUDA_VISIBLE_DEVICES"] = str(node["cuda_visible"])  # every GPU of the node, not the agent's one
    placement = Placement(
        master_addr=node["master_addr"],
        master_port=node["master_port"],
        rank_offset=node["offset"],
        world_size=node["world_size"],
        node_rank=node["index"],
        nnodes=node["nnodes"],
        hosts_store=node["index"] == 0,  # its agent hosts the run's store
    )
    return dataclasses.replace(settings, env={**node_env, **user_env}), placement


def _keep_store(store: Any) -> None:
    """Node 0's store of a run stays up until the next run: other nodes' ranks may still be leaving
    the group (a store that vanishes under a rank's exit aborts it)."""
    global _store
    _store = store


class _NodeCellRanks(FreshRanks):
    """Fresh ranks, watched closely: a stop request from the kernel is acted on within 50 ms."""

    supervision = NODE_AGENT

    def cleanup(self, lose: bool) -> None:
        _keep_store(self.store)
        super().cleanup(lose)


class _NodeProgramRanks(ProgramRanks):
    supervision = NODE_AGENT

    def cleanup(self, lose: bool) -> None:
        _keep_store(self.store)
        super().cleanup(lose)


def _socket_interface(master_addr: str, user_env: dict[str, str]) -> dict[str, str]:
    """GLOO/NCCL_SOCKET_IFNAME: the interface this node reaches node 0 through, unless the user chose
    (NCCL's as ``=name``: NCCL matches a prefix otherwise, and ``eth1`` would also pick ``eth10``)."""
    from .. import _cuda

    source = _net.source_address(master_addr)
    name = _listen.interface_of(source) if source else None
    return _cuda.socket_interface_env(name, user_env, os.environ)
