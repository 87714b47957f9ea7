"""What runs in each rank of a kept world: one process that runs cell after cell.

A world rank is started like a fresh one (``torch.multiprocessing.start_processes``, the torchrun
environment, pdeathsig, its own process group), then loops: it waits for a :class:`WorldJob` on its
pipe, points its output at that cell's log directory, runs the cell in its own namespace, and
answers with how the cell ended.  Between cells its output goes to the world's own directory, so a
background thread's prints are kept and never shown in the wrong cell.

Names: what a world cell binds stays in the rank's namespace for the next cell, and is the world's
own; the kernel sends with each job only the names the cell reads before binding them that no cell
of the world bound (``handoff._names``), with their current values.  SIGINT raises
``KeyboardInterrupt`` only while a cell runs; an idle rank ignores it, so a world whose ranks all
come back from an interrupt lives on.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from .._rankdir import RankDir, prompts_path
from .._source import CellSource
from . import _cell as _rank
from . import _children, _fds, _prompt
from ._capture import finished, redirect_output
from ._stackdump import open_stack_file
from ._title import name_process, rank_title
from ._watch import answer_where

OK, RAISED, INTERRUPTED, EXITED = "ok", "raised", "interrupted", "exited"
STARTED = "started"  # sent once the rank can be interrupted: the kernel holds SIGINT for it until then


@dataclass
class WorldJob:
    """One cell for one world: what every rank receives on its pipe."""

    cell: CellSource
    run_dir: str  # <log-dir>/<run-id> of this cell
    run_id: str
    names: Any = None  # an _shm.Payload of the kernel names the cell uses
    out_names: tuple[str, ...] = ()
    shm_prefix: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    shared: tuple[str, ...] = ()  # the --share names: released after the cell (CUDA IPC reference counts)
    grace: float = 5.0  # how long a rank may take to bring its GPU in step once the cell failed or was interrupted
    rank_offset: int = 0  # a cluster node's part of a world: its first global rank (directories are by global rank)
    on: frozenset[int] | None = None  # --on: the (global) ranks that run the cell; the others sit it out
    debug: int | None = None  # %spawn debug: this rank debugs the failure it kept (the others answer at once)

    def rank_dir(self, rank: int) -> str:
        return os.path.join(self.run_dir, str(self.rank_offset + rank))

    def runs(self, rank: int) -> bool:
        """Whether the (global) rank runs this cell."""
        return self.on is None or rank in self.on


# The last failure of a cell on this rank and that cell (sys.last_traceback's like, as IPython's %debug
# reads it): what ``%spawn debug`` opens, until a later cell fails here.
_kept: tuple[BaseException, CellSource] | None = None


def keep_failure(exc: BaseException, cell: CellSource) -> None:
    """A cell raised here: its exception (with its traceback) is kept for ``%spawn debug``; an interrupt,
    a quit debugger or a prompt nothing could answer is not a failure to debug."""
    global _kept
    if isinstance(exc, Exception) and not isinstance(exc, (_prompt.DebuggerQuit, _prompt.NoPromptError)):
        _kept = (exc, cell)


def debug_kept(rank: int) -> None:
    """A post-mortem job: pdb on the failure this rank kept, at the failed cell's own lines."""
    if _kept is None:
        print(f"nbspawn: no failure kept on rank {rank}: no cell has raised here", file=sys.stderr)
        return
    exc, cell = _kept
    cell.compile()  # the failed cell's lines back in linecache (a later cell's replaced them): pdb lists its own
    _prompt.post_mortem_kept(exc, cell.label)


def _ignore_interrupt(signum: int, frame: Any) -> None:
    """SIGINT while no cell runs: nothing to interrupt (the kernel interrupts every rank at once)."""


def run_world_rank(rank: int, spec: Any, conns: list[Any], kernel_fds: tuple[_fds.Descriptor, ...] = (), world: str = "") -> None:
    """Entry point of a world rank: set up once, then one cell per job until told to stop."""
    _fds.let_go(kernel_fds)  # first (a forked rank): the kernel's sockets are not the rank's
    _rank._die_with_parent(spec)
    name_process(rank_title(spec.rank_offset + rank, spec.world_size or spec.nprocs, world))
    conn = conns[rank]
    for other in conns:
        if other is not conn:
            other.close()
    between = spec.rank_dir(rank)
    _rank.apply_kernel_env(spec.kernel_env)
    spec.apply_env(rank, os.environ)
    from ._capture import capture_output

    capture_output(between, spec.rich)
    signal.signal(signal.SIGINT, _ignore_interrupt)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stacks = _answer_stacks(between)
    _prompt.install(spec.rank_offset + rank, None, None)  # each cell says where its prompts go
    _rank.prepare_rank(rank)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    _children.install(namespace)  # the cells' definitions reach the rank's children by value
    own: set[str] = set()  # names world cells assigned in this rank
    group: list[Any] = []  # the default process group, made by the first cell
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            break
        if job is None:
            break
        if not job.runs(spec.rank_offset + rank):
            _sit_out(job, rank, spec.backend, group)
            continue
        rank_dir = job.rank_dir(rank)
        with contextlib.suppress(FileExistsError):
            os.mkdir(rank_dir, 0o700)  # the kernel made the cell's run directory; each rank makes its own
        redirect_output(rank_dir)
        stacks = _stacks_to(rank_dir, stacks)
        os.environ.update(job.env)
        os.environ["TORCHELASTIC_ERROR_FILE"] = RankDir(rank_dir).error
        _prompt.use(prompts_path(job.run_dir), RankDir(rank_dir).answers)
        _prompt.name_files(_rank.cell_labels(job.cell, {}))
        try:
            outcome = _serve(job, rank, spec, namespace, own, group, conn)
        except KeyboardInterrupt:  # an interrupt that came as the cell was ending
            signal.signal(signal.SIGINT, _ignore_interrupt)
            outcome = INTERRUPTED, 1
        job = None  # nothing of this cell's job is held while the rank waits for the next one
        finished()
        _rank._flush()
        redirect_output(between)
        stacks = _stacks_to(between, stacks)
        try:
            conn.send(outcome)
        except (BrokenPipeError, OSError):
            break
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _rank._flush()


def _serve(
    job: WorldJob, rank: int, spec: Any, namespace: dict[str, Any], own: set[str], group: list[Any], conn: Any
) -> tuple[str, int]:
    """Run one cell; interrupts reach it only while it runs. Returns (outcome, exit code)."""
    rank_dir = job.rank_dir(rank)
    try:
        # from STARTED on an interrupt is this cell's (the kernel may send it as soon as it reads it),
        # but never inside the send itself: it would unwind through multiprocessing's frames
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            conn.send((STARTED, 0))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if job.debug is not None:
            if job.debug == rank:
                debug_kept(rank)
            return OK, 0
        if not group:
            _join(group, spec.backend, rank)
        _run(job, rank, namespace, own)
        # in step: every collective this rank queued has completed (an interrupt meanwhile is the cell's)
        _rank.settle_devices(None, interruptible=True)
        outcome = OK, 0
    except SystemExit as exc:
        code = _rank._exit_code(exc)
        outcome = (OK, 0) if code == 0 else (EXITED, code)
    except BaseException as exc:
        signal.signal(signal.SIGINT, _ignore_interrupt)
        _rank.write_error(rank_dir, job.cell, exc)
        if job.debug is None:
            keep_failure(exc, job.cell)
        outcome = (INTERRUPTED if isinstance(exc, KeyboardInterrupt) else RAISED), 1
    finally:
        signal.signal(signal.SIGINT, _ignore_interrupt)
    keep_in_step(rank, job, namespace, own)
    return outcome


def _join(group: list[Any], backend: str, rank: int) -> None:
    """The world's process group, made whole whatever interrupt comes while it is made.

    A cell that one rank fails at once (its first line raises) makes the kernel interrupt the others
    while some are still inside ``init_process_group``: the peers that got out have the group; one
    interrupted in the middle would have half of it, and the next cell would make it again alone and
    wait forever (or fail with "initialize the default process group twice").  The group is made by
    every rank together, so an interrupt waits for it and is raised as soon as it is made: the rank
    is back at the prompt with the group its peers have."""
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        group.append(_rank.init_process_group(backend, rank))
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def _sit_out(job: WorldJob, rank: int, backend: str, group: list[Any]) -> None:
    """A cell this rank does not run (``--on``): nothing of the rank changes (its names, its output
    directory), it answers nothing, and the kernel does not wait for it.  Only the world's process
    group, if this is the world's first cell, is made here with the ranks that run it: every rank
    makes it together, at the first cell whatever ranks run it.  SIGINT is ignored meanwhile (the
    kernel never interrupts a rank that sits a cell out); a failure is said between cells, and the
    group is tried again, with the others, at the next cell."""
    if group:
        return
    try:
        group.append(_rank.init_process_group(backend, rank))
    except Exception as exc:
        print(f"nbspawn: rank {rank} could not join the world's process group: {type(exc).__name__}: {exc}", file=sys.stderr)


def keep_in_step(rank: int, job: WorldJob, namespace: dict[str, Any], own: set[str]) -> None:
    """A rank that used the GPU answers only once its queued work is done, so a world that goes on
    is provably in step: NCCL calls return once queued, and an interrupted or failed cell can leave
    ranks with different numbers of collectives queued; then one of them never completes.  Such a
    rank leaves (the kernel reports the world lost) rather than pair the next cell's collectives
    off by one; so does a rank whose GPU raised a CUDA error (a device-side assert is sticky: its
    context is unusable).  Then what ``--share`` sent is dropped (the next cell that uses it gets
    it again): CUDA IPC reference counts reach the kernel, which can free a shared tensor on ``del``."""
    if not _rank._cuda_in_use():
        return
    broken: Exception | None = None
    try:
        settled = _rank.settle_devices(job.grace)
    except Exception as exc:
        settled, broken = False, exc
    if not settled:
        if broken is not None:
            said = str(broken).strip().splitlines()[0] if str(broken).strip() else ""
            why = (
                f"rank {rank}'s GPU raised {type(broken).__name__}{': ' + said if said else ''}; a CUDA error such as "
                "a device-side assert stays with the process (every later CUDA call fails)"
            )
        else:
            why = (
                f"rank {rank}'s GPU work did not finish within {job.grace:g} s of the cell's end: its NCCL "
                "collectives are out of step with the other ranks'"
            )
        print(f"nbspawn: {why}, so this world cannot go on; start it again.", file=sys.stderr)
        _rank.abort_groups()
        finished()
        _rank._flush()
        os._exit(_rank.EXIT_RAISED)
    dropped = [name for name in job.shared if name not in own and namespace.pop(name, None) is not None]
    if dropped:
        import gc

        gc.collect()


def _run(job: WorldJob, rank: int, namespace: dict[str, Any], own: set[str]) -> None:
    from ..handoff._names import names_bound, send_outputs, unpack_namespace

    tree = job.cell.parse()
    bound = names_bound(tree)  # before compile takes the last expression out of the tree (``(x := 1)``)
    if job.names is not None:
        # a name this rank's cells assigned is the rank's own (the kernel sends none of the world's names, but
        # one given to --share); no loop variable is left bound in this frame, which a failed cell's kept
        # traceback holds (it would keep a --share tensor alive)
        namespace.update({name: value for name, value in unpack_namespace(job.names).items() if name not in own})
    code, last = job.cell.compile(tree)
    try:
        _rank.execute_cell(code, last, namespace, lambda exc: _rank.write_error(job.rank_dir(rank), job.cell, exc))
    finally:  # what the cell bound, even if it failed half-way, is now the rank's own
        own.update(name for name in bound if name in namespace)
    if job.out_names:
        send_outputs(namespace, job.out_names, job.shm_prefix or "", job.rank_dir(rank))


def _stacks_to(rank_dir: str, previous: Any) -> Any:
    """faulthandler's dumps (SIGUSR1, fatal signals) go to this directory's stacks.log from now on.

    ``previous`` is the file :func:`_answer_stacks` opened: that same descriptor is pointed at the
    other directory's file (``dup2``), as ``redirect_output`` does with stdout, so two switches a cell
    cost a few system calls, not a file object and faulthandler's two handlers set up again."""
    target = os.open(RankDir(rank_dir).stacks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # as open(path, "a")
    os.dup2(target, previous.fileno(), inheritable=False)  # as open() made the first
    os.close(target)
    return previous


def _answer_stacks(rank_dir: str) -> Any:
    """Once: this directory's stacks.log, the file faulthandler and the answer to SIGUSR1 (where the
    rank is: its stacks, its collectives) write to."""
    stack_file = open_stack_file(RankDir(rank_dir).stacks, "a")
    faulthandler.enable(file=stack_file, all_threads=True)
    answer_where(stack_file)
    return stack_file
