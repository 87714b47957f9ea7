"""What runs in each rank of a kept world: one process that runs cell after cell.

A world rank is started like a fresh one (``torch.multiprocessing.start_processes``, the torchrun
environment, pdeathsig, its own process group), then loops: it waits for a :class:`WorldJob` on its
pipe, points its output at that cell's log directory, runs the cell in its own namespace, and
answers with how the cell ended.  Between cells its output goes to the world's own directory, so a
background thread's prints are kept and never shown in the wrong cell.

Names: what a world cell binds stays in the rank's namespace for the next cell, and is the world's
own; the kernel sends with each job only the names the cell reads before binding them that no cell
of the world bound (``handoff._names``), with their current values.  SIGINT raises
``KeyboardInterrupt`` only while a cell runs, and only the kernel's interrupt of that cell (its
directory's ``interrupt`` file), never while the rank reports the cell's own error; an idle rank
ignores it, so a world whose ranks all come back from an interrupt lives on.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._options import Settings
from .._rankdir import DESCRIBED, RankDir, write_json
from .._source import CellSource
from . import _cell as _rank
from . import _children, _devicememory, _fds, _prompt, _stopped, _torchenv, _xray
from ._capture import finished, redirect_output
from ._stackdump import open_stack_file
from ._title import name_process, rank_title
from ._watch import FR_ENTRIES, answer_where

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
    shared: tuple[str, ...] = ()  # the --share names: released after the cell (CUDA IPC reference counts)
    # the cell's options as the door read them (RunSpec.asked), what the ranks read of them themselves:
    # --grace-period, how long a rank may take to bring its GPU in step once the cell failed or was
    # interrupted; --xray.  A look at the world (%spawn show, %spawn debug) records nothing: xray off.
    asked: Settings = field(kw_only=True)
    rank_offset: int = 0  # a cluster node's part of a world: its first global rank (directories are by global rank)
    on: frozenset[int] | None = None  # --on: the (global) ranks that run the cell; the others sit it out
    debug: int | None = None  # %spawn debug: this rank debugs the failure it kept (the others answer at once)
    describe: str | None = None  # %spawn show WORLD NAME: each rank writes down what NAME holds (ranks._describe)
    cell_numbers: Mapping[str, int] = field(default_factory=dict)  # IPython's cell files -> In[N]: what pdb calls them

    def rank_dir(self, rank: int) -> str:
        return os.path.join(self.run_dir, str(self.rank_offset + rank))

    @property
    def is_cell(self) -> bool:
        """A cell of the user's (not a look at the world: ``%spawn debug``'s post-mortem, ``%spawn show``)."""
        return self.debug is None and self.describe is None

    def runs(self, rank: int) -> bool:
        """Whether the (global) rank runs this cell."""
        return self.on is None or rank in self.on


# The last failure of a cell on this rank and that cell (sys.last_traceback's like, as IPython's %debug
# reads it): what ``%spawn debug`` opens, until a later cell fails here.  A str in place of the exception:
# its frames held what the kernel sent with --share, so only why it cannot be debugged is kept.
_kept: tuple[BaseException | str, CellSource] | None = None


def keep_failure(exc: BaseException, cell: CellSource, shared: Iterable[Any] = ()) -> None:
    """A cell raised here: its exception (with its traceback) is kept for ``%spawn debug``; an interrupt,
    a quit debugger or a prompt nothing could answer is not a failure to debug.

    Unless a frame of it holds one of the ``--share`` objects the kernel sent this cell (``step(g)``
    raising with ``g`` as its argument): a kept traceback would pin it while the world lives, and the
    kernel could not free it on ``del`` (a CUDA tensor's GPU memory stays in torch's IPC limbo).  Then
    only a note of why is kept; the other failures keep every frame, so ``%spawn debug`` goes on
    working where nothing is pinned (and ``--pdb`` debugs any failure live, before anything is kept)."""
    global _kept
    if isinstance(exc, Exception) and not isinstance(exc, (_prompt.DebuggerQuit, _prompt.NoPromptError)):
        _kept = None  # the earlier failure's frames go now, whatever this one keeps
        held = _holding(exc, shared)
        if held is None:
            _kept = (exc, cell)
        else:
            _kept = (
                f"its frames held what --share sent ({held}), which a kept failure would keep from being freed: "
                "only its traceback (above, in the cell's output) was kept. Run the cell with --pdb to debug it "
                "where it fails.",
                cell,
            )


REACH_BUDGET = 100_000  # objects a kept failure's locals are followed through, at the most


def _holding(exc: BaseException, shared: Iterable[Any]) -> str | None:
    """Where a frame of ``exc`` (or of the exceptions chained to it) reaches a --share object's memory:
    ``x in step()``, ``self in run()`` (an object whose attribute holds it, a dataclass, a closure's
    cell: whatever the garbage collector sees it refer to); None if none does.  Modules, classes and
    namespaces (a function's globals) are not followed: what they hold is alive whatever is kept.
    Past :data:`REACH_BUDGET` objects it cannot tell, and says so: kept frames that pin GPU memory
    are worse than a failure ``%spawn debug`` cannot open."""
    from ..handoff._shm import storage_keys

    keys = storage_keys(list(shared))
    if not keys:
        return None
    namespaces = {id(vars(module)) for module in list(sys.modules.values()) if hasattr(module, "__dict__")}
    seen: set[int] = set()
    budget = [REACH_BUDGET]
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        todo += [current.__cause__, current.__context__]
        tb = current.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            tb = tb.tb_next
            if frame.f_code.co_filename in _rank._OWN_FILES or frame.f_locals is frame.f_globals:
                continue  # nbspawn's, or the cell's top level: the names --share sent are popped from there
            namespaces.add(id(frame.f_globals))
            for name, value in frame.f_locals.items():
                reached = _reaches(value, keys, seen, namespaces, budget)
                if reached is not False:
                    where = f"{name} in {frame.f_code.co_name}()"
                    return where if reached else f"{where} holds more objects than could be followed"
    return None


def _reaches(root: Any, keys: set[int], seen: set[int], namespaces: set[int], budget: list[int]) -> bool | None:
    """Whether ``root`` reaches memory of ``keys`` (None: the budget ran out first)."""
    import gc
    import types

    from ..handoff._shm import storage_keys

    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in namespaces or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if storage_keys(obj) & keys:
            return True
        if type(obj).__module__.startswith("torch") and hasattr(obj, "untyped_storage"):
            continue  # a tensor: its storage was just asked
        todo.extend(gc.get_referents(obj))
    return False


def debug_kept(rank: int) -> None:
    """A post-mortem job: pdb on the failure this rank kept, at the failed cell's own lines."""
    if _kept is None:
        print(f"nbspawn: no failure kept on rank {rank}: no cell has raised here", file=sys.stderr)
        return
    exc, cell = _kept
    if isinstance(exc, str):
        print(f"nbspawn: rank {rank}'s failure cannot be debugged: {exc}", file=sys.stderr)
        return
    cell.compile()  # the failed cell's lines back in linecache (a later cell's replaced them): pdb lists its own
    _prompt.post_mortem_kept(exc, cell.label)


def let_go(namespace: dict[str, Any], timeout: float | None, abort: bool = False) -> None:
    """The rank is leaving (``%spawn stop``, or SIGTERM): it drops everything of the world's it holds,
    its names, the failure it kept and its children's view of them, so that what the kernel sent
    (CUDA IPC memory held by a ``DDP(model)`` or an optimizer the world made) is freed and its
    reference counts reach the kernel: a fork or forkserver rank leaves through ``os._exit``, where
    nothing is freed.  Not while its GPU is busy or broken (freeing CUDA IPC memory then can abort the
    process): the kernel releases what is left once the rank is reaped (``handoff._ipc``)."""
    global _kept
    if _rank._cuda_in_use():
        if abort:
            _rank.abort_groups()
        try:
            if not _rank.settle_devices(timeout):
                return
        except Exception:
            return
    _kept = None
    namespace.clear()
    _children.main_names = None
    import gc

    gc.collect()


def _ignore_interrupt(signum: int, frame: Any) -> None:
    """SIGINT while no cell runs: nothing to interrupt (the kernel interrupts every rank at once)."""


class _CellInterrupt:
    """SIGINT while this cell is served: KeyboardInterrupt, if the interrupt is this cell's and the cell
    has not failed here.  The kernel makes ``marker`` (in this cell's directory) before it interrupts
    the cell, so a SIGINT that arrives late, meant for an earlier cell, is not taken for this one's; a
    rank whose cell raised (``_cell.failing``) is writing its own error down, and ends the cell anyway.
    Until the cell's code begins (the rank is telling the kernel it started) the interrupt is held, so
    it never unwinds through multiprocessing's frames: the rank then leaves the cell unrun."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.begun = False
        self.held = False

    def __call__(self, signum: int, frame: Any) -> None:
        if _rank.failing or not os.path.exists(self.marker):
            return
        if not self.begun:
            self.held = True
            return
        raise KeyboardInterrupt


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
    imported_with = _torchenv.imported_with()
    _rank.apply_kernel_env(spec.kernel_env)
    spec.apply_env(rank, os.environ)
    _torchenv.read_again(imported_with)
    from ._capture import capture_output

    capture_output(between, spec.rich)
    signal.signal(signal.SIGINT, _ignore_interrupt)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until there is something to drop (below)
    stacks = _answer_stacks(between, str(_xray.XRAY_FR_ENTRIES) if spec.xrayed else FR_ENTRIES)
    _prompt.install(spec.rank_offset + rank, None, None)  # each cell says where its prompts go
    _rank.prepare_rank(rank)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    _children.install(namespace)  # the cells' definitions reach the rank's children by value
    own: set[str] = set()  # names world cells assigned in this rank
    group: list[Any] = []  # the default process group, made by the first cell
    _stopped.install(lambda: let_go(namespace, _rank.SETTLE_AFTER_FAILURE, abort=True), last_words=_xray.end)
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
        _rank.begin_cell(rank_dir, job.run_dir, _rank.cell_labels(job.cell, job.cell_numbers), job.asked)
        try:
            outcome = _serve(job, rank, spec, namespace, own, group, conn)
        except KeyboardInterrupt:  # an interrupt that came as the cell was ending
            signal.signal(signal.SIGINT, _ignore_interrupt)
            outcome = INTERRUPTED, 1
        job = None  # nothing of this cell's job is held while the rank waits for the next one
        _devicememory.cell_ended()  # its peak resident memory in the cell, before the kernel is told it ended
        finished()
        _rank._flush()
        redirect_output(between)
        stacks = _stacks_to(between, stacks)
        try:
            conn.send(outcome)
        except (BrokenPipeError, OSError):
            break
    let_go(namespace, spec.asked.grace_period)  # before the group goes: a DDP's hooks, an optimizer's state, freed in step
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
        # from STARTED on an interrupt is this cell's (the kernel may send it as soon as it reads it)
        _rank.failing = False
        interrupt = _CellInterrupt(RankDir(rank_dir).interrupt)
        signal.signal(signal.SIGINT, interrupt)
        conn.send((STARTED, 0))
        if interrupt.held:  # interrupted before its code began: nothing of the cell ran, nothing to report
            return INTERRUPTED, 1
        interrupt.begun = True
        if job.debug is not None:
            if job.debug == rank:
                debug_kept(rank)
            return OK, 0
        if job.describe is not None:
            from ._describe import describe

            write_json(os.path.join(rank_dir, DESCRIBED), describe(namespace, job.describe))
            return OK, 0
        if not group:
            _join(group, spec.backend, rank)
        _devicememory.watch(rank_dir)  # this cell's directory has what it holds on its GPUs
        _rank.begin_xray(job.asked, spec.rank_offset + rank, rank_dir)
        _run(job, rank, namespace, own)
        # in step: every collective this rank queued has completed (an interrupt meanwhile is the cell's);
        # a CUDA error raised here is the cell's own, not an --out value's that could not be sent
        _rank.settle_devices(None, interruptible=True)
        if job.out_names:
            from ..handoff._names import send_outputs

            send_outputs(namespace, job.out_names, job.shm_prefix or "", job.rank_dir(rank))
        outcome = OK, 0
    except SystemExit as exc:
        code = _rank._exit_code(exc)
        outcome = (OK, 0) if code == 0 else (EXITED, code)
    except BaseException as exc:
        signal.signal(signal.SIGINT, _ignore_interrupt)
        _rank.write_error(rank_dir, job.cell, exc)
        if job.is_cell:
            keep_failure(exc, job.cell, [namespace[name] for name in job.shared if name not in own and name in namespace])
        outcome = (INTERRUPTED if isinstance(exc, KeyboardInterrupt) else RAISED), 1
    finally:
        signal.signal(signal.SIGINT, _ignore_interrupt)
        _xray.end()  # and torch's functions back: the world's next cell may not want values
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
    if held and callable(previous):
        previous(signal.SIGINT, None)  # this cell's interrupt (``_interrupt_handler``) raises KeyboardInterrupt


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
    it again), on CPU as on a GPU: CUDA IPC reference counts reach the kernel, which can free a shared
    tensor on ``del``, and a CPU tensor's shared memory is no longer mapped here."""
    if _rank._cuda_in_use():
        _in_step(rank, job)
    dropped = [name for name in job.shared if name not in own and namespace.pop(name, None) is not None]
    if dropped:
        import gc

        gc.collect()


def _in_step(rank: int, job: WorldJob) -> None:
    """Leave (the world is lost) unless this rank's GPU work is done and its GPU is sound."""
    broken: Exception | None = None
    try:
        settled = _rank.settle_devices(job.asked.grace_period)
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
                f"rank {rank}'s GPU work did not finish within {job.asked.grace_period:g} s of the cell's end: its NCCL "
                "collectives are out of step with the other ranks'"
            )
        print(f"nbspawn: {why}, so this world cannot go on; start it again.", file=sys.stderr)
        _rank.abort_groups()
        finished()
        _rank._flush()
        os._exit(_rank.EXIT_RAISED)


def _run(job: WorldJob, rank: int, namespace: dict[str, Any], own: set[str]) -> None:
    from ..handoff._names import names_bound, unpack_namespace

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


def _stacks_to(rank_dir: str, previous: Any) -> Any:
    """faulthandler's dumps (SIGUSR1, fatal signals) go to this directory's stacks.log from now on.

    ``previous`` is the file :func:`_answer_stacks` opened: that same descriptor is pointed at the
    other directory's file (``dup2``), as ``redirect_output`` does with stdout, so two switches a cell
    cost a few system calls, not a file object and faulthandler's two handlers set up again."""
    target = os.open(RankDir(rank_dir).stacks, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # as open(path, "a")
    os.dup2(target, previous.fileno(), inheritable=False)  # as open() made the first
    os.close(target)
    return previous


def _answer_stacks(rank_dir: str, recorder_entries: str = FR_ENTRIES) -> Any:
    """Once: this directory's stacks.log, the file faulthandler and the answer to SIGUSR1 (where the
    rank is: its stacks, its collectives) write to."""
    stack_file = open_stack_file(RankDir(rank_dir).stacks, "a")
    faulthandler.enable(file=stack_file, all_threads=True)
    answer_where(stack_file, recorder_entries)
    return stack_file
