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


def _write_error(exc: BaseException) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # @record wrote it already: keep the program's own
        return
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, _runpy_file(), "<frozen runpy>"):
        tb = tb.tb_next  # start at the program, not at this launcher
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    errorfile = _load("_errorfile.py")
    errorfile.write(path, errorfile.ErrorRecord.of(exc, text))


def _load(name: str) -> types.ModuleType:
    """A module of nbspawn (``_errorfile.py``, ``ranks/_prompt.py``), loaded by path: importing the
    nbspawn package would import torch."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name)
    spec = importlib.util.spec_from_file_location("_nbspawn_" + os.path.basename(name)[1:-3], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _install_prompts() -> None:
    """input(), getpass(), breakpoint() and pdb ask the kernel, as in a cell (``ranks/_prompt.py``)."""
    error = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error:
        return
    rank_dir = os.path.dirname(error)
    rankdir = _load("_rankdir.py")
    prompt = _load("ranks/_prompt.py")
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
    title = _load("ranks/_title.py")
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
        stackdump = _load("ranks/_stackdump.py")
        handle = stackdump.open_stack_file(stacks, "w")
        faulthandler.enable(file=handle, all_threads=True)
        stackdump.answer_stack_requests(handle)
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
