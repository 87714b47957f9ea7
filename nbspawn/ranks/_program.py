"""What runs first in each rank of a program: ``python .../nbspawn/ranks/_program.py MODE TARGET [ARGS...]``.

It ties the rank's life to the kernel's (pdeathsig, which survives ``exec``), then becomes the
program.  A Python script or module is run right here (``runpy``), so its uncaught exception is the
rank's root cause with the script's own file names and lines, written to ``TORCHELASTIC_ERROR_FILE``
as torch elastic's ``@record`` would (a script that uses ``@record`` itself writes the same file
first), and SIGUSR1 dumps its stacks when nbspawn stops it.  Anything else is ``exec``-ed.

    MODE: script (TARGET is a .py file) | module (TARGET is a module name) | code (TARGET is python -c's
    code) | exec (TARGET is a program)
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import traceback
import types

EXIT_RAISED = 1
EXIT_INTERRUPTED = 128 + signal.SIGINT


def _die_with_parent() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    parent = os.environ.get("NBSPAWN_PARENT_PID")
    if parent and os.getppid() != int(parent):
        os._exit(EXIT_RAISED)  # the kernel died before prctl took effect


def _watch_device_memory() -> None:
    """What the program holds on its GPUs, written beside its error file about once a second once it
    uses one (``ranks._devicememory``)."""
    error = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error:
        _load("ranks._devicememory").watch(os.path.dirname(error))


def _write_error(exc: BaseException) -> None:
    memory = sys.modules.get(f"{PACKAGE}.ranks._devicememory")
    if memory is not None:
        memory.on_error(exc)  # out of GPU memory: what it holds there now, for the kernel's account
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # @record wrote it already: keep the program's own
        return
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, _runpy_file(), "<frozen runpy>"):
        tb = tb.tb_next  # start at the program, not at this launcher
    report = traceback.TracebackException(type(exc), exc, tb)
    report.stack = traceback.StackSummary.from_list(_load("ranks._xray_values").without_wrappers(list(report.stack)))
    text = "".join(report.format())
    errorfile = _load("_errorfile")
    errorfile.write(path, errorfile.ErrorRecord.of(exc, text))


PACKAGE = "_nbspawn_pkg"  # nbspawn's modules, in a program's rank: under this name, with no __init__ of nbspawn's run


def _load(name: str) -> types.ModuleType:
    """A module of nbspawn (``_errorfile``, ``ranks._prompt``), imported under a stand-in for its
    package: importing the nbspawn package itself would import torch (its ``__init__``), which a
    program may never use.  The stand-in runs none of nbspawn's ``__init__`` (``ranks/__init__`` is a
    docstring), and the modules' own relative imports work; each is imported once, so the modules that
    share state (``ranks._stackdump`` and ``ranks._stopped``) share it."""
    import importlib

    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.{name}")


def _record_collectives() -> None:
    """``--xray``: the program's collectives are drained from torch's flight recorder into its rank's
    ``xray.json`` from its first process group on (``ranks._xray``), and written down however it ends:
    at its end, on an interrupt, and on SIGTERM (a peer failed, Stop: ``ranks._stopped``)."""
    rank_dir = os.environ.pop("NBSPAWN_XRAY", "")  # the program's own children are not X-rayed
    rank = os.environ.get("RANK", "")
    if not rank_dir or not rank.isdigit():
        return
    xray = _load("ranks._xray")
    xray.begin_once_grouped(int(rank), rank_dir)
    _load("ranks._stopped").install(lambda: None, last_words=xray.end)


def _collectives_written() -> None:
    """The X-ray's last drain and write, when the program was X-rayed (a no-op otherwise)."""
    xray = sys.modules.get(f"{PACKAGE}.ranks._xray")
    if xray is not None:
        xray.end()


def _install_prompts() -> None:
    """input(), getpass(), breakpoint() and pdb ask the kernel, as in a cell (``ranks/_prompt.py``)."""
    error = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error:
        return
    rank_dir = os.path.dirname(error)
    rankdir = _load("_rankdir")
    prompt = _load("ranks._prompt")
    local = os.environ.get("LOCAL_RANK", "0")
    prompt.install(
        int(local) if local.isdigit() else 0,
        rankdir.prompts_path(os.path.dirname(rank_dir)),
        rankdir.RankDir(rank_dir).answers,
        launcher=os.path.abspath(__file__),
    )


def _name_process(mode: str, target: str, args: list[str]) -> None:
    """``nbspawn rank 2 of 4 [run ID]: train.py --lr 0.1`` in ``ps``, until an exec-ed program names itself."""
    rank, size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if not (rank.isdigit() and size.isdigit()):
        return
    title = _load("ranks._title")
    program = {"code": "python -c ...", "module": f"python -m {target}"}.get(mode, target)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or None
    title.name_process(title.rank_title(int(rank), int(size), program=" ".join([program, *args]), run_id=run_id))


def _runpy_file() -> str:
    import runpy

    return runpy.__file__


def main() -> None:
    _die_with_parent()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # nbspawn's modules are not the program's
    mode, target, *args = sys.argv[1:]
    if mode == "exec":
        os.execvp(target, [target, *args])  # noqa: S606 - running the user's program is the point
    _name_process(mode, target, args)
    import runpy

    stacks = os.environ.get("NBSPAWN_STACKS_FILE")
    if stacks:
        stackdump = _load("ranks._stackdump")
        handle = stackdump.open_stack_file(stacks, "w")
        faulthandler.enable(file=handle, all_threads=True)
        stackdump.answer_stack_requests(handle)
    _watch_device_memory()
    _record_collectives()  # after the stack answers: SIGTERM is heard by their thread (ranks._stopped)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _install_prompts()
    sys.argv = ["-c" if mode == "code" else target, *args]
    code: object = 0
    try:
        if mode == "code":  # as python -c runs it: __main__, the working directory first on the path
            sys.path.insert(0, "")
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})  # noqa: S102
        elif mode == "module":
            sys.path.insert(0, os.getcwd())  # as python -m does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # the program's failure is the rank's root cause
        _write_error(exc)  # the view and the kernel's error show the traceback (not printed twice)
        code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_RAISED
    _leave(code)


def _leave(code: object) -> None:
    """Exit as multiprocessing's children do: the program's atexit handlers run, then ``os._exit``.

    Without interpreter teardown: destroying torch's C++ objects then (a process group's store
    client whose server, on rank 0 or another node, has just gone) can abort a rank that finished
    its work ("terminate called without an active exception").
    """
    import atexit

    _collectives_written()  # before the program's exit handlers (they may end its process groups)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    if code is None:
        os._exit(0)
    if isinstance(code, int):
        os._exit(code & 0xFF)
    print(code, file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    main()
