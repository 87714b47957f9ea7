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
from dataclasses import dataclass
from types import CodeType, ModuleType
from typing import TextIO

from .. import _cuda, _errorfile
from .._errorfile import ErrorRecord
from .._rankdir import RankDir, prompts_path
from .._source import CellSource, rewrite_cell_frames
from .._spec import RunSpec
from . import _children, _prompt
from ._capture import capture_output, finished, flush_figures
from ._watch import watch

EXIT_RAISED = 1
EXIT_INTERRUPTED = 128 + signal.SIGINT

_stack_file: TextIO | None = None  # kept open: faulthandler writes to its descriptor from a signal handler


@dataclass(frozen=True)
class Inherited:
    """Made in the kernel just before it forks, so forked ranks inherit it instead of each redoing the
    work (every page a child writes to is a copy-on-write fault): the compiled cell; and the shared
    part of the environment is already set (``RunSpec.shared_env``)."""

    compiled: tuple[CodeType, CodeType | None]


def run_rank(rank: int, spec: RunSpec, inherited: Inherited | None = None) -> None:
    """Entry point given to ``torch.multiprocessing.start_processes``; never returns an exception."""
    _die_with_parent(spec)
    rank_dir = spec.rank_dir(rank)
    os.environ.update(spec.own_env(rank) if inherited is not None else spec.rank_env(rank))
    capture_output(rank_dir, spec.rich)
    _install_signal_handlers(rank_dir)
    watch(lambda: _stack_file)  # where it is in its collectives, when the kernel asks where it is
    _prompt.install(
        spec.rank_offset + rank, prompts_path(spec.run_dir), RankDir(rank_dir).answers
    )  # input(), pdb: the kernel answers
    code = 0
    try:
        _run_cell(spec, rank, inherited)
    except SystemExit as exc:  # sys.exit() in the cell: keep Python's meaning of the code
        code = _exit_code(exc)
    except BaseException as exc:
        write_error(rank_dir, spec.cell, exc)
        code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_RAISED
    finally:
        finished()
        _flush()
    if code:
        if _cuda_in_use():
            # its NCCL communicators are aborted (_run_cell): leave now, not through an interpreter
            # shutdown (spawn's) whose CUDA and NCCL teardown could wait on work that never completes
            os._exit(code)
        sys.exit(code)


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


def _install_signal_handlers(rank_dir: str) -> None:
    """SIGINT raises KeyboardInterrupt where the cell is; SIGUSR1 and fatal signals dump every stack."""
    global _stack_file
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _stack_file = open(RankDir(rank_dir).stacks, "w")  # noqa: SIM115
    faulthandler.enable(file=_stack_file, all_threads=True)
    # faulthandler gives SIGUSR1 back to what was there when Python shuts down: ignore it then, so a
    # stack request that comes as the rank exits does not kill it
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)


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


def _run_cell(spec: RunSpec, rank: int, inherited: Inherited | None) -> None:
    prepare_rank(rank)
    namespace = _namespace(spec)
    _children.install(namespace)  # the cell's definitions reach the rank's children by value
    code, last = inherited.compiled if inherited is not None else spec.cell.compile()
    try:
        dist = init_process_group(spec.backend, rank)
        execute_cell(code, last, namespace)
        if spec.out_names:
            from ..handoff._names import send_outputs

            assert spec.shm_prefix is not None  # every run with --out names has a prefix
            send_outputs(namespace, spec.out_names, spec.shm_prefix, spec.rank_dir(rank))
    except BaseException:
        if _cuda_in_use():
            abort_groups()  # a collective the others never match must not hold this rank
            if settle_devices(SETTLE_AFTER_FAILURE):
                release_names(namespace, spec.start_method)
        raise
    _flush()
    if _cuda_in_use():
        settle_devices(None)  # what the cell queued on the GPU is done (writes to --share tensors included)
        release_names(namespace, spec.start_method)
    dist = dist or sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # also the user's own group, so the rank exits without warnings


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


def execute_cell(code: CodeType, last: CodeType | None, namespace: dict) -> None:
    """The cell's statements, then its trailing expression shown, then the figures it left open.

    A cell that raises may first stop in post-mortem (``--pdb``, ``%pdb on``: the kernel says which
    rank), before anything is torn down."""
    _prompt.final_code = last or code  # where a debugger stepping through the cell lets go
    try:
        exec(code, namespace)  # noqa: S102 - running the user's cell is the point
        value = None if last is None else eval(last, namespace)  # noqa: S307
    except Exception as exc:
        _prompt.post_mortem_if_asked(exc)
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
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    # where the kernel answers prompts, a rank at a breakpoint must not make the others' collectives
    # time out while a person types: an hour, as torch.distributed.breakpoint gives its ranks
    timeout = timedelta(seconds=_prompt.LONG_TIMEOUT_S) if _prompt.available() else None
    if backend == "nccl":
        device = _cuda.rank_device(rank, torch.cuda.device_count())
        assert device is not None  # nccl is refused without GPUs
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=torch.device("cuda", device), timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    return dist


SETTLE_AFTER_FAILURE = 2.0  # how long a failed rank waits for its GPU before leaving anyway


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and _cuda.compiled_with_cuda(torch) and bool(torch.cuda.is_initialized())


def settle_devices(timeout: float | None, interruptible: bool = False) -> bool:
    """Wait until the GPU work this rank queued is done, on every device it has a context on (none
    is created); False if it did not finish within ``timeout`` (an unmatched NCCL collective).

    The wait runs in a helper thread, so the rank's main thread can give up on it, and (with
    ``interruptible``) still take a KeyboardInterrupt meanwhile.
    """
    if not _cuda_in_use():
        return True
    import threading

    import torch

    done = threading.Event()

    def wait() -> None:
        try:
            with contextlib.suppress(Exception):  # a broken device: nothing more will finish on it
                for index in range(torch.cuda.device_count()):
                    if torch._C._cuda_hasPrimaryContext(index):  # type: ignore[attr-defined]  # CUDA builds only
                        torch.cuda.synchronize(index)
        finally:
            done.set()

    threading.Thread(target=wait, name="nbspawn-settle", daemon=True).start()
    if timeout is not None:
        return done.wait(timeout)
    while not done.wait(0.1 if interruptible else None):
        pass
    return True


def release_names(namespace: dict, start_method: str) -> None:
    """Drop this rank's references to what it received (after ``settle_devices``), so CUDA IPC
    reference counts reach the kernel before the rank leaves with ``os._exit`` (the kernel can
    then free a shared tensor's memory on ``del``).  A forked rank's namespace is the kernel's own
    objects, received by no IPC: left alone (their finalizers are the kernel's)."""
    if start_method == "fork":
        return
    import gc

    namespace.clear()
    gc.collect()


def abort_groups() -> None:
    """Abort every NCCL communicator of this rank (torch's ``_abort_process_group``): pending
    collectives stop, and neither leaving nor anything after waits on them."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # best effort: the rank is leaving anyway
        if "nccl" in str(dist.get_backend()).lower():
            from torch.distributed.distributed_c10d import _abort_process_group

            _abort_process_group()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


_OWN_FILES = {__file__, __file__.replace("_cell.py", "_world.py")}


def write_error(rank_dir: str, cell: CellSource, exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next  # start at the cell, not at nbspawn
    if isinstance(exc, _prompt.DebuggerQuit):
        tb = _prompt.cut_debugger_frames(tb)  # end at the line where the debugger was quit
    text = rewrite_cell_frames("".join(traceback.format_exception(type(exc), exc, tb)), cell)
    _errorfile.write(RankDir(rank_dir).error, ErrorRecord.of(exc, text))


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
