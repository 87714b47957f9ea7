"""What runs inside each rank: environment, output capture, signals, the cell, and its error record.

The order matters.  A rank first ties its life to the kernel's (pdeathsig) and becomes its own process
group (so stopping it also stops the processes it started), then points file descriptors 1 and 2 at
its log files (so C extensions, ``os.system`` and child processes are captured too, and nothing ever
blocks on a pipe), and only then runs user code.  Whatever escapes the cell is written to
``error.json`` in torch elastic's format, with the traceback already in the cell's own lines.
"""

from __future__ import annotations

import builtins
import contextlib
import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from types import CodeType, ModuleType
from typing import Any, TextIO

from .. import _cuda, _errorfile
from .._errorfile import ErrorRecord
from .._program import Program
from .._rankdir import RankDir, prompts_path
from .._request import Settings
from .._source import CELL_FILENAME, CellSource, rewrite_cell_frames
from .._spec import RunSpec, cell_env, cell_xray
from . import _children, _devicememory, _fds, _prompt, _stopped, _torchenv, _xray, _xray_values
from ._capture import capture_output, finished, flush_figures
from ._stackdump import open_stack_file
from ._title import name_process, rank_title
from ._watch import FR_ENTRIES, answer_where

EXIT_RAISED = 1
EXIT_INTERRUPTED = 128 + signal.SIGINT

_stack_file: TextIO | None = None  # kept open: faulthandler writes to its descriptor from a signal handler
# The cell raised here and the rank is reporting it (set as the exception reaches ``execute_cell``,
# until the next cell begins, but for a post-mortem prompt): a kept world's rank then does not take the
# kernel's interrupt (``_worldloop``), which would replace its own error with a KeyboardInterrupt raised
# in the middle of writing it down.
failing = False


@dataclass(frozen=True)
class Inherited:
    """Made in the kernel just before it forks, so forked ranks inherit it instead of each redoing the
    work (every page a child writes to is a copy-on-write fault): the compiled cell; and the shared
    part of the environment is already set (``RunSpec.shared_env``)."""

    compiled: tuple[CodeType, CodeType | None]
    kernel_fds: tuple[_fds.Descriptor, ...] = ()  # what the rank lets go of (ranks._fds)


def run_rank(rank: int, spec: RunSpec, inherited: Inherited | None = None) -> None:
    """Entry point given to ``torch.multiprocessing.start_processes``; never returns an exception.

    The error record is written first, while nothing of the GPU has been touched since the failure;
    only then is the GPU brought to rest and what the rank received dropped (:func:`leave_gpu`): a
    broken CUDA context can abort the process in that clean-up, and the real traceback must be on
    disk by then.
    """
    if inherited is not None:
        _fds.let_go(inherited.kernel_fds)  # first: the kernel's sockets are not the rank's
    _die_with_parent(spec)
    name_process(rank_title(spec.rank_offset + rank, spec.world_size or spec.nprocs, run_id=spec.run_id))
    rank_dir = spec.rank_dir(rank)
    imported_with = _torchenv.imported_with()
    apply_kernel_env(spec.kernel_env)
    spec.apply_env(rank, os.environ, own_only=inherited is not None)
    _torchenv.read_again(imported_with)  # TORCH_LOGS, TORCH_DISTRIBUTED_DEBUG: read by torch at its import
    capture_output(rank_dir, spec.rich)
    _devicememory.watch(rank_dir)  # what it holds on a GPU, once it uses one
    _install_signal_handlers(rank_dir, str(_xray.XRAY_FR_ENTRIES) if spec.xrayed else FR_ENTRIES)
    _prompt.install(spec.rank_offset + rank, None, None)  # input(), pdb: the kernel answers
    begin_cell(rank_dir, spec.run_dir, cell_labels(spec.cell, spec.cell_numbers), spec.asked)
    code = 0
    namespace: dict = {}
    # stopped by SIGTERM (a peer failed, --timeout): what it received is dropped first, as when it leaves
    _stopped.install(lambda: leave_gpu(namespace, spec.start_method, failed=True), last_words=_xray.end)
    try:
        namespace = _run_cell(spec, rank, inherited, namespace)
    except SystemExit as exc:  # sys.exit() in the cell: keep Python's meaning of the code
        code = _exit_code(exc)
    except BaseException as exc:
        write_error(rank_dir, spec.cell, exc)
        code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_RAISED
    finally:
        _xray.end()  # what the ranks did together, a failed collective included, is written down
        _devicememory.cell_ended()  # its peak resident memory, however short the cell
        finished()
        _flush()
    # the exception (and the frames its traceback held, with their locals) is gone by now
    settled = leave_gpu(namespace, spec.start_method, failed=code != 0)
    if code or not settled:
        if _cuda_in_use():
            # its NCCL communicators are aborted: leave now, not through an interpreter shutdown
            # (spawn's) whose CUDA and NCCL teardown could wait on work that never completes
            os._exit(code or EXIT_RAISED)
        sys.exit(code)


def begin_cell(rank_dir: str, run_dir: str, labels: Mapping[str, str], asked: Settings) -> None:
    """A cell begins on this rank, a fresh one's or a kept world's (``ranks._worldloop``): the one place
    where what is the cell's own reaches the rank's process, so a kept world's later cell gets its own
    as a fresh rank does (issue #58: a world's 2nd cell once kept its 1st cell's): its variables
    (``_spec.cell_env``, from its options ``asked``: the error file torch and the rank write its failure
    to, ``TORCHELASTIC_ERROR_FILE``), where its prompts go and are answered (``input()``, pdb), and what
    pdb calls its cells' files (``labels``: ``Cell In[5]``).  Its X-ray begins once its group is made
    (:func:`begin_xray`)."""
    _cell_variables.set(cell_env(asked, rank_dir), os.environ)
    _prompt.use(prompts_path(run_dir), RankDir(rank_dir).answers)
    _prompt.name_files(dict(labels))


class CellVariables:
    """The variables a rank's cells set (``_spec.cell_env``), each cell's own: one a later cell of a kept
    world does not set is as the rank had it before any cell set it (the kernel's, the world's ``--env``,
    or none), not the earlier cell's value."""

    def __init__(self) -> None:
        self.outside: dict[str, str | None] = {}  # each variable a cell set, as the rank had it before

    def set(self, env: Mapping[str, str], environ: MutableMapping[str, str]) -> None:
        for key in [key for key in self.outside if key not in env]:
            before = self.outside.pop(key)
            if before is None:
                environ.pop(key, None)
            else:
                environ[key] = before
        for key, value in env.items():
            self.outside.setdefault(key, environ.get(key))
            environ[key] = value


_cell_variables = CellVariables()


def begin_xray(asked: Settings, rank: int, rank_dir: str, program: Program | None = None) -> None:
    """The cell's X-ray (``_spec.cell_xray``: the one rule), from its first collective in nbspawn's group
    or one it makes itself: begun once the group is made, so neither making it nor a kept world's
    earlier cells are the cell's (``rank``: global)."""
    on, values = cell_xray(asked, program)
    if on:
        _xray.begin(rank, rank_dir, values=values)


def cell_labels(cell: CellSource, cell_numbers: Mapping[str, int]) -> dict[str, str]:
    """IPython's name of each cell's file (``Cell In[3]``), this cell's among them."""
    return {**{name: f"Cell In[{number}]" for name, number in cell_numbers.items()}, CELL_FILENAME: cell.label}


def apply_kernel_env(kernel_env: Mapping[str, str] | None) -> None:
    """A forkserver rank: the environment the kernel has now, not the one the fork server was started
    with (``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, ``PYTORCH_CUDA_ALLOC_CONF`` set in the notebook since),
    applied before anything can touch CUDA.  None (fork, spawn): the rank inherited it already."""
    if kernel_env is None:
        return
    for key in [key for key in os.environ if key not in kernel_env]:
        del os.environ[key]
    os.environ.update(kernel_env)


def _die_with_parent(spec: RunSpec) -> None:
    """A rank must not outlive the kernel, even one killed with SIGKILL."""
    # private torch API (Linux prctl; a no-op elsewhere), what torch's own spawned processes use
    from torch.multiprocessing import _prctl_pr_set_pdeathsig  # type: ignore[attr-defined]

    _prctl_pr_set_pdeathsig(signal.SIGKILL)
    if spec.start_method != "forkserver" and os.getppid() != spec.parent_pid:
        os._exit(EXIT_RAISED)  # the kernel died before prctl took effect
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group leader (e.g. under some forkservers)
        pass


def _install_signal_handlers(rank_dir: str, recorder_entries: str = FR_ENTRIES) -> None:
    """SIGINT raises KeyboardInterrupt where the cell is; fatal signals dump every stack, and SIGUSR1
    every stack and where the rank is in its collectives."""
    global _stack_file
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _stack_file = open_stack_file(RankDir(rank_dir).stacks, "w")
    faulthandler.enable(file=_stack_file, all_threads=True)
    answer_where(_stack_file, recorder_entries)


def _namespace(spec: RunSpec) -> dict:
    from ..handoff._names import unpack_namespace

    if spec.namespace is not None:  # fork: our own copy-on-write copy of the kernel's namespace
        from ..handoff._shm import place_arrivals

        place_arrivals()  # a cluster engine's names: CUDA tensors that came as CPU data
        return spec.namespace

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if spec.namespace_payload:
        namespace.update(unpack_namespace(spec.namespace_payload))
    return namespace


def _run_cell(spec: RunSpec, rank: int, inherited: Inherited | None, namespace: dict) -> dict:
    """Set up, run the cell, send its ``--out`` values, bring the GPU to rest; the namespace the cell
    ran in.  ``namespace`` is filled as soon as it is known, so the caller can drop it whatever fails."""
    prepare_rank(rank)
    if spec.namespace is not None:
        namespace = _namespace(spec)  # fork: the cell runs in the kernel's namespace (the rank's copy of it)
    else:
        namespace.update(_namespace(spec))
    _children.install(namespace)  # the cell's definitions reach the rank's children by value
    code, last = inherited.compiled if inherited is not None else spec.cell.compile()
    dist = init_process_group(spec.backend, rank)
    begin_xray(spec.asked, spec.rank_offset + rank, spec.rank_dir(rank), spec.program)
    execute_cell(code, last, namespace, lambda exc: write_error(spec.rank_dir(rank), spec.cell, exc))
    _flush()
    # what the cell queued on the GPU is done (writes to --share tensors included); a CUDA error that
    # surfaces only now (a device-side assert) fails the rank here, with its own traceback, before
    # --out copies a value to CPU (where it would read as a value that cannot be sent)
    settle_devices(None)
    if spec.out_names:
        from ..handoff._names import send_outputs

        assert spec.shm_prefix is not None  # every run with --out names has a prefix
        send_outputs(namespace, spec.out_names, spec.shm_prefix, spec.rank_dir(rank))
    _xray.end()
    wait_until_every_peer_joined()
    dist = dist or sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # also the user's own group, so the rank exits without warnings
    return namespace


def leave_gpu(namespace: dict, start_method: str, failed: bool) -> bool:
    """A fresh rank, once its cell is over and its error (if any) is written: a failed rank aborts its
    NCCL communicators (a collective the others never match must not hold it), waits a little for its
    GPU, and drops what it received (:func:`release_names`) unless the GPU is broken or still busy:
    freeing CUDA IPC memory then can abort the process.  Whether the GPU is at rest."""
    if not _cuda_in_use():
        release_names(namespace, start_method)
        return True
    if failed:
        abort_groups()
    try:
        settled = settle_devices(SETTLE_AFTER_FAILURE if failed else None)
    except Exception:  # a sticky CUDA error: the context is unusable, nothing it holds can be freed safely
        return False
    if settled:
        release_names(namespace, start_method)
    return settled


def prepare_rank(rank: int) -> None:
    """Threads and device, as torchrun sets them up."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # a forked rank inherited the kernel's thread pool size
    dist = sys.modules.get("torch.distributed")
    if dist is not None and "TORCH_DISTRIBUTED_DEBUG" in os.environ:
        # read when torch.distributed was imported, in the kernel for a forked rank: read it again
        dist.set_debug_level_from_env()
    _use_local_gpu(rank)


def execute_cell(
    code: CodeType, last: CodeType | None, namespace: dict, record: Callable[[BaseException], None] | None = None
) -> None:
    """The cell's statements, then its trailing expression shown, then the figures it left open.

    A cell that raises may first stop in post-mortem (``--pdb``, ``%pdb on``: the kernel says which
    rank), before anything is torn down.  Its error is recorded (``record``) before the kernel is
    asked: a rank stopped while it asks (another rank's failure or ``q`` ends the run) is then told
    as what it was, a rank whose cell raised, not one that had not begun it."""
    global failing
    _prompt.final_code = last or code  # where a debugger stepping through the cell lets go
    try:
        exec(code, namespace)  # noqa: S102 - running the user's cell is the point
        value = None if last is None else eval(last, namespace)  # noqa: S307
    except Exception as exc:
        failing = True  # first, before any call (where Python runs signal handlers): see ``failing``
        if record is not None:
            record(exc)
        failing = False  # a prompt: the kernel's interrupt ends it, and the cell's own error stands
        try:
            _prompt.post_mortem_if_asked(exc)
        except KeyboardInterrupt:
            pass
        finally:
            failing = True
        raise
    finally:
        if _prompt.debugged:
            _prompt.stop_tracing()
    if value is not None:
        _show(value)
    flush_figures()


def _show(value: object) -> None:
    """A trailing expression's value, as the notebook would show it: rich where the view is."""
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        from IPython.display import display

        display(value)
    else:
        print(repr(value))


def _use_local_gpu(rank: int) -> None:
    """``torch.device("cuda")`` in rank r means cuda:LOCAL_RANK, as torchrun users expect; lazily.

    The choice is queued with torch's own lazy-init queue (``torch.cuda._lazy_call``, what
    ``manual_seed`` uses): it runs when the rank first initializes CUDA, so a rank whose cell never
    touches CUDA never initializes it (nor asks how many GPUs there are), and a forked rank of a
    kernel that could not fork CUDA still runs CPU cells.
    """
    torch = sys.modules.get("torch")
    if torch is None or not _cuda.compiled_with_cuda(torch):
        return

    def select() -> None:
        device = _cuda.rank_device(rank, int(torch._C._cuda_getDeviceCount()))
        if device is not None:
            torch.cuda.set_device(device)

    torch.cuda._lazy_call(select)


def init_process_group(backend: str, rank: int) -> ModuleType | None:
    """The default group, as torchrun's ranks make it; nccl bound to cuda:LOCAL_RANK (``device_id``:
    the communicator is made now, so a set-up error surfaces here, ``barrier()`` knows its device,
    and ``new_group`` can split it)."""
    if backend == "none":
        return None
    import torch
    import torch.distributed as dist

    # torch's own timeouts (nccl 10 min, gloo 30 min), whether or not the kernel answers prompts: NCCL's
    # watchdog, its flight-recorder dump on timeout and TORCH_NCCL_ASYNC_ERROR_HANDLING handle a real
    # hang as torch intends.  A debugger prompt gets longer where torch can give it (_prompt.extend_timeouts
    # and torch.distributed.breakpoint: the collectives issued from then on; docs/guide.md, "CUDA").
    if backend == "nccl":
        device = _cuda.rank_device(rank, torch.cuda.device_count())
        assert device is not None  # nccl is refused without GPUs
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=torch.device("cuda", device))
    else:
        dist.init_process_group(backend)
    _say_joined(dist)
    return dist


JOINED_KEY = "nbspawn/joined/{rank}"
_joined: list[tuple[Any, int]] = []  # (the default group's store, world size), once this rank has joined


def _say_joined(dist: ModuleType) -> None:
    """Tell the peers this rank has its group, in the group's own store (one key, no collective)."""
    store = dist.distributed_c10d._get_default_store()
    store.set(JOINED_KEY.format(rank=dist.get_rank()), b"1")  # its rank in the world (``rank``: on this node)
    _joined[:] = [(store, dist.get_world_size())]


def wait_until_every_peer_joined() -> None:
    """A rank whose cell is over waits, before it leaves, until every peer has its group.

    torch makes a group without a closing barrier (``TORCH_DIST_INIT_BARRIER`` is off), and gloo's
    side that dials a pair counts it connected once it has written its greeting: a rank whose cell
    does not communicate can finish, destroy its group and exit while a peer's gloo is still taking
    that connection, and the peer then fails in ``init_process_group`` with "Connection closed by
    peer" (1.5 % of 2-rank runs on 2 busy cores, measured; 0 in 600 with this wait).  The wait is one
    store read; it never blocks on a peer that failed, since a failed rank ends the run.  It uses the
    store kept at join time, so it holds even when the cell destroyed the group itself."""
    if not _joined:
        return
    store, world_size = _joined.pop()
    store.wait([JOINED_KEY.format(rank=peer) for peer in range(world_size)])


SETTLE_AFTER_FAILURE = 2.0  # how long a failed rank waits for its GPU before leaving anyway


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and _cuda.compiled_with_cuda(torch) and bool(torch.cuda.is_initialized())


def settle_devices(timeout: float | None, interruptible: bool = False) -> bool:
    """Wait until the GPU work this rank queued is done, on every device it has a context on (none
    is created); False if it did not finish within ``timeout`` (an unmatched NCCL collective).

    A CUDA error that ``synchronize`` raises is raised here: an error such as a device-side assert is
    sticky (every later CUDA call fails the same way), so it never counts as settled.  The wait runs
    in a helper thread, so the rank's main thread can give up on it, and (with ``interruptible``)
    still take a KeyboardInterrupt meanwhile.
    """
    if not _cuda_in_use():
        return True
    import threading

    import torch

    done = threading.Event()
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            for index in range(torch.cuda.device_count()):
                if torch._C._cuda_hasPrimaryContext(index):  # type: ignore[attr-defined]  # CUDA builds only
                    torch.cuda.synchronize(index)
        except Exception as exc:  # a broken device: nothing more will finish on it
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, name="nbspawn-settle", daemon=True).start()
    if timeout is not None:
        finished_in_time = done.wait(timeout)
    else:
        while not done.wait(0.1 if interruptible else None):
            pass
        finished_in_time = True
    if failure:
        raise failure[0]
    return finished_in_time


def release_names(namespace: dict, start_method: str) -> None:
    """Drop this rank's references to what it received (after ``settle_devices``), so CUDA IPC
    reference counts reach the kernel before the rank leaves with ``os._exit`` (a forkserver rank
    always does; a failed rank that used CUDA too): torch gives a CUDA IPC block back to the kernel
    only when the last storage opened on it is freed, and the kernel can then free a shared tensor's
    memory on ``del``.  The namespace is the only holder left (``_shm._Sealed`` keeps nothing once
    opened).  A forked rank's namespace is the kernel's own objects, received by no IPC: left alone
    (their finalizers are the kernel's)."""
    if start_method == "fork":
        return
    namespace.clear()
    if _cuda_in_use():  # reference cycles too; on CPU the process's exit frees everything anyway
        import gc

        gc.collect()


def abort_groups() -> None:
    """Abort every NCCL communicator of this rank (torch's ``_abort_process_group``): pending
    collectives stop, and neither leaving nor anything after waits on them.  A gloo default group
    with NCCL subgroups (``new_group(backend="nccl")``) too: each subgroup's NCCL backend is aborted
    (torch's call aborts them only with an NCCL default group)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # best effort: the rank is leaving anyway
        if "nccl" in str(dist.get_backend()).lower():
            dist.distributed_c10d._abort_process_group()  # every group, in one NCCL group call
            return
    for backend in _nccl_backends(dist):
        with contextlib.suppress(Exception):
            backend.abort()


def _nccl_backends(dist: ModuleType) -> list[Any]:
    """The NCCL backends of this rank's process groups (``pg_map``: the default group's and the subgroups')."""
    import torch

    found: list[Any] = []
    with contextlib.suppress(Exception):
        for group in list(dist.distributed_c10d._world.pg_map):
            try:
                backend = group._get_backend(torch.device("cuda"))
            except Exception:  # noqa: S112 - no CUDA backend in this group
                continue
            if type(backend).__name__ == "ProcessGroupNCCL":
                found.append(backend)
    return found


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


_OWN_FILES = {__file__, __file__.replace("_cell.py", "_worldloop.py")}
# nbspawn's code that a cell's own call runs on its behalf (print, input() and pdb, --out): an error
# raised there is the call's, told at the cell's line; an error anywhere else in nbspawn keeps its frames
_HERE = os.path.dirname(os.path.abspath(__file__))
_ON_ITS_BEHALF = (
    os.path.join(_HERE, "_capture.py"),
    os.path.join(_HERE, "_prompt.py"),
    os.path.join(os.path.dirname(_HERE), "handoff", "_names.py"),
)


_recorded: tuple[int, str] | None = None  # the exception whose record is on disk, and where


def write_error(rank_dir: str, cell: CellSource, exc: BaseException) -> None:
    """Record how the cell failed, whole: a SIGTERM that comes meanwhile (the run is being stopped,
    say because a peer's failure ended it) waits until the record is written, so the rank is told as
    the failure it was, not as one stopped somewhere unknown."""
    # (A handler, not a blocked signal: a signal mask is per thread, and the kernel hands a process's
    # SIGTERM to any thread that does not block it, such as the output pumps.)
    global _recorded
    if _recorded == (id(exc), rank_dir):
        return  # recorded as it was raised (execute_cell): its time is when it happened, which picks the root cause
    _recorded = (id(exc), rank_dir)  # an id, not the exception: its frames (their tensors) are not kept alive
    pending: list[int] = []
    try:
        before = signal.signal(signal.SIGTERM, lambda signum, _frame: pending.append(signum))
    except ValueError:  # not the main thread: nothing to hold
        _write_error(rank_dir, cell, exc)
        return
    try:
        _write_error(rank_dir, cell, exc)
    finally:
        signal.signal(signal.SIGTERM, before)
        if pending:
            os.kill(os.getpid(), signal.SIGTERM)


def _write_error(rank_dir: str, cell: CellSource, exc: BaseException) -> None:
    _devicememory.on_error(exc)  # out of GPU memory: what it holds there now, for the kernel's account
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next  # start at the cell, not at nbspawn
    while (
        cell.written_by_nbspawn and tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == CELL_FILENAME
    ):
        tb = tb.tb_next  # nbspawn.spawn's own call: start at the user's function
    if isinstance(exc, _prompt.DebuggerQuit):
        tb = _prompt.cut_debugger_frames(tb)  # end at the line where the debugger was quit
    report = traceback.TracebackException(type(exc), exc, tb)
    frames = _xray_values.without_wrappers(list(report.stack))
    ours = _ON_ITS_BEHALF + (tuple(_OWN_FILES) if isinstance(exc, KeyboardInterrupt) else ())
    while frames and frames[-1].filename in ours:
        frames.pop()  # under the user's last line: input() waiting on the kernel, --out sending a value, the interrupt's handler
    report.stack = traceback.StackSummary.from_list(frames)
    text = rewrite_cell_frames("".join(report.format()), cell)
    if type(exc).__module__.startswith("nbspawn."):  # nbspawn's exception, named as the user knows it
        text = text.replace(f"{type(exc).__module__}.{type(exc).__qualname__}:", f"{type(exc).__qualname__}:")
    _errorfile.write(RankDir(rank_dir).error, ErrorRecord.of(exc, text))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
