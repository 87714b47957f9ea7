"""A rank's prompts: ``input()``, ``getpass()``, ``breakpoint()`` and pdb, answered through the kernel.

A rank has no terminal.  When it asks something, it writes one JSON line to the run's request FIFO
(``<run-dir>/prompts.fifo``, made by the kernel before the ranks start, only when the kernel can answer:
a run whose cell was sent with ``allow_stdin``; a background one's answers come from a later cell) and blocks reading its own answer FIFO
(``<rank-dir>/answers.fifo``, made here at the first prompt).  The kernel's supervisor has the request
FIFO among what it waits on; it shows the rank's output so far, asks the kernel's own ``input()`` (the
``input_request`` every frontend answers) with a prompt that names the rank, and writes the answer back.

No request FIFO means nothing can answer (nbclient, nbconvert, papermill; a cluster run): a prompt
then fails at once, saying so, and nothing waits.  A background run started from a notebook's cell
has one: its rank waits until a later cell attaches (``%spawn debug RUN-ID``).

pdb is this module's :class:`RankPdb` (``pdb.Pdb`` is replaced in the rank, so ``pdb.set_trace()``,
``pdb.post_mortem()`` and ``torch.distributed.breakpoint()`` get it): its prompt names the rank, it
lists the cell's own lines (the cell is in ``linecache`` under ``<nbspawn-cell>``), it never steps into
nbspawn, an interrupt stops the rank instead of asking again, and ``q`` fails the rank with
:class:`DebuggerQuit` ("debugger quit on rank 1").

This module imports nothing of nbspawn: a program's rank (``ranks/_program.py``) loads it by path.
"""

from __future__ import annotations

import builtins
import cmd
import getpass
import json
import linecache
import os
import pdb
import sys
import sysconfig
from types import CodeType, FrameType, TracebackType
from typing import Any

CELL_FILENAME = "<nbspawn-cell>"  # nbspawn._source.CELL_FILENAME (this module imports nothing of nbspawn)
MAX_PROMPT = 2000  # characters of a prompt sent: a request stays one atomic write (PIPE_BUF)
LONG_TIMEOUT_S = 3600.0  # a debugged rank's process groups wait this long, as torch.distributed.breakpoint sets
# frames a rank's pdb never stops in: nbspawn's launcher, multiprocessing's and runpy's
_SKIP = ("nbspawn", "nbspawn.*", "multiprocessing", "multiprocessing.*", "torch.multiprocessing*", "runpy", "_nbspawn_*")


class NoPromptError(RuntimeError):
    """A rank asked for input where nothing can answer it."""


class DebuggerQuit(Exception):
    """``q`` in a rank's debugger: the rank fails here (the run ends by its usual policy)."""


_rank = 0
_prompts: str | None = None  # the run's request FIFO
_answers: str | None = None  # this rank's answer FIFO
_fd: int | None = None  # its read end, open read-write so reads wait for the kernel instead of seeing EOF
_asked = 0  # requests sent: each answer names the request it answers
_depth = 0  # > 0 while a RankPdb reads commands
_current: RankPdb | None = None  # the RankPdb reading commands now: where it stopped goes with its prompts
debugged = False  # a debugger ran in this rank: tracing is cleared when the cell ends
_launcher_file = ""  # a program's: nbspawn/ranks/_program.py, run as __main__
final_code: CodeType | None = None  # the code that ends the running cell (its trailing expression, if any)
# pdb names these files as IPython does: {"<nbspawn-cell>": "Cell In[5]", an earlier cell's file: "Cell In[3]"}
_labels: dict[str, str] = {}
# Python's own, whatever pdb.Pdb was made to be (ipykernel makes it IPython's, which a forked rank inherits)
_Pdb: type[pdb.Pdb] = next(c for c in pdb.Pdb.__mro__ if c.__module__ == "pdb" and c.__name__ == "Pdb")


def install(rank: int, prompts: str | None, answers: str | None, launcher: str = "") -> None:
    """From now on this rank's input, getpass, breakpoint() and pdb ask the kernel (``launcher``: the
    file that runs a program, whose frames pdb leaves out as it does nbspawn's modules)."""
    global _rank, _launcher_file
    _rank, _launcher_file = rank, launcher
    use(prompts, answers)
    builtins.input = rank_input
    getpass.getpass = rank_getpass
    sys.breakpointhook = rank_breakpoint
    pdb.Pdb = RankPdb  # type: ignore[misc]  # pdb.post_mortem and torch.distributed.breakpoint make one
    pdb.set_trace = rank_set_trace  # (ipykernel's is IPython's, which a forked rank inherits)
    _distributed_pdb_is_ours()


def _distributed_pdb_is_ours() -> None:
    """torch < 2.11 made ``torch.distributed._DistributedPdb`` at import, a subclass of the ``pdb.Pdb`` of
    that moment, whose ``interaction`` calls ``pdb.Pdb.interaction(self)``: now RankPdb's, on an object
    that is no RankPdb (``TypeError: super(type, obj)``).  Its ``breakpoint()`` makes a RankPdb instead.
    (torch 2.11 makes the class at each call, on ``pdb.Pdb``: RankPdb already.)  ``import torch`` has
    imported ``torch.distributed`` by the time a rank gets here."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(getattr(dist, "_DistributedPdb", None), type):
        dist._DistributedPdb = RankPdb  # type: ignore[attr-defined]


def name_files(labels: dict[str, str]) -> None:
    """What pdb calls the cell's file and earlier cells' (``Cell In[5], line 6``), as IPython's own
    debugger and tracebacks do, instead of ``<nbspawn-cell>(6)`` or a kernel's temporary file."""
    global _labels
    _labels = dict(labels)


def use(prompts: str | None, answers: str | None) -> None:
    """Where this rank's prompts go now (a kept world's rank: each cell has its own directory)."""
    global _prompts, _answers, _fd
    if answers != _answers and _fd is not None:
        os.close(_fd)
        _fd = None
    _prompts, _answers = prompts, answers


def available() -> bool:
    return _prompts is not None and os.path.exists(_prompts)


def _unavailable(what: str) -> NoPromptError:
    if os.environ.get("GROUP_WORLD_SIZE", "1") != "1":  # a rank of a cluster run
        why = (
            "a rank on a cluster's node cannot reach the kernel's stdin (its node's agent, an ipyparallel engine, "
            "has no channel back for prompts). Debug the cell on this machine first (drop --cluster), or "
        )
    else:
        why = (
            "nothing can answer a prompt here: the cell runs without stdin (allow_stdin false: nbclient, nbconvert "
            "and papermill run notebooks so). "
        )
    return NoPromptError(
        f"{what} is not available on rank {_rank}: {why}"
        "Read the value in the kernel before the cell and pass it in; PYTHONBREAKPOINT=0 (--env) skips breakpoint()."
    )


def ask(prompt: str, kind: str = "input", password: bool = False) -> str:
    """The kernel's answer to ``prompt``; raises at once if nothing can answer."""
    if not available():
        raise _unavailable("the debugger's prompt" if kind == "pdb" else "getpass()" if password else "input()")
    request = {"kind": kind, "prompt": str(prompt)[-MAX_PROMPT:], "password": password}
    if kind == "pdb":
        request["where"] = where_stopped()
    else:  # input(), getpass(): a person answers, as at a debugger's prompt (RankPdb.interaction): the
        extend_timeouts()  # collectives this rank issues from now on wait an hour for its peers
    reply = _request(request)
    if reply.get("stop"):
        raise KeyboardInterrupt("the run was stopped while this rank waited at a prompt")
    if reply.get("eof"):
        raise EOFError
    if "error" in reply:
        raise NoPromptError(f"rank {_rank}'s prompt: {reply['error']}")
    value = str(reply.get("value", ""))
    if kind == "pdb":
        echo_command(prompt, value)
    return value


def echo_command(prompt: str, command: str) -> None:
    """A pdb command answered is written to the rank's stdout as a terminal shows it (``(Pdb rank 1) p x``),
    just before pdb's answer: the rank's pane, the merged pane, the text view and the saved run read as
    one transcript, each command above its answer.  (The frontend's own echo of its stdin box stays
    below the cell, out of the kernel's reach; the pane holds the whole session all the same.)"""
    try:
        sys.stdout.write(f"{prompt}{command}\n")
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _request(request: dict[str, Any]) -> dict[str, Any]:
    """Send one request line, then wait for the answer that names it."""
    global _fd, _asked
    assert _prompts is not None and _answers is not None  # available() said so
    for stream in (sys.stdout, sys.stderr):  # what the rank printed is shown before the prompt
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if _fd is None:
        if not os.path.exists(_answers):
            os.mkfifo(_answers, 0o600)
        _fd = os.open(_answers, os.O_RDWR)
    _asked += 1
    line = json.dumps({**request, "rank": _rank, "id": _asked}) + "\n"
    try:
        out = os.open(_prompts, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader (ENXIO) or gone (ENOENT): the run is ending
        raise _unavailable("a prompt") from None
    try:
        os.write(out, line.encode())
    finally:
        os.close(out)
    buffer = b""
    while True:
        while not buffer.endswith(b"\n"):
            buffer += os.read(_fd, 65536)  # an interrupt (SIGINT) raises KeyboardInterrupt here
        for raw in buffer.splitlines():
            reply = json.loads(raw)
            if reply.get("id") == _asked:
                return reply
        buffer = b""  # an answer to a request this rank gave up on


def where_stopped() -> str:
    """Where the debugger reading commands stopped: "cell line 4", "train.py line 12" ("" if none)."""
    debugger = _current
    try:
        frame, lineno = debugger.stack[debugger.curindex]  # type: ignore[union-attr]
    except (AttributeError, IndexError, TypeError):
        return ""
    filename = frame.f_code.co_filename
    return f"{'cell' if filename == CELL_FILENAME else os.path.basename(filename)} line {lineno}"


def rank_input(prompt: object = "") -> str:
    """``input()`` in a rank."""
    return ask(str(prompt), "pdb" if _depth else "input")


def rank_getpass(prompt: str = "Password: ", stream: object = None) -> str:
    """``getpass.getpass()`` in a rank: the frontend hides what is typed."""
    return ask(prompt, "input", password=True)


def rank_breakpoint(*args: Any, **kwargs: Any) -> Any:
    """``breakpoint()`` in a rank: PYTHONBREAKPOINT is honoured (0 skips, another hook is called)."""
    hook = os.environ.get("PYTHONBREAKPOINT", "")
    if hook == "0":
        return None
    if hook and hook != "pdb.set_trace":
        return sys.__breakpointhook__(*args, **kwargs)
    if not available():
        raise _unavailable("breakpoint()")
    frame = sys._getframe(1)
    RankPdb().set_trace(frame)
    return None


def rank_set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` in a rank."""
    debugger = RankPdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe(1))


def post_mortem_if_asked(exc: BaseException) -> None:
    """A cell failed on this rank: if the kernel says so (``--pdb``, ``%pdb on``; the first failing
    rank only), stop in post-mortem at the exception before anything is torn down."""
    if not isinstance(exc, Exception) or isinstance(exc, (DebuggerQuit, NoPromptError)) or not available():
        return
    try:
        reply = _request({"kind": "failed", "prompt": f"{type(exc).__name__}: {exc}"[:MAX_PROMPT], "password": False})
    except (OSError, ValueError, NoPromptError):
        return
    if reply.get("value") != "post-mortem":
        return
    _post_mortem(exc, f"post-mortem of rank {_rank}: q, c or EOF leaves it, and the run ends")


def post_mortem_kept(exc: BaseException, label: str) -> None:
    """``%spawn debug`` on a kept world: post-mortem of the failure this rank kept from an earlier cell
    (``label``), as IPython's ``%debug`` is of ``sys.last_traceback``; the rank stays as it was."""
    if not available():
        raise _unavailable("%spawn debug")
    _post_mortem(exc, f"post-mortem of rank {_rank}'s last failure ({label}): q, c or EOF leaves it")


def _post_mortem(exc: BaseException, note: str) -> None:
    tb = exc.__traceback__
    while tb is not None and _launcher(tb.tb_frame) and tb.tb_next is not None:
        tb = tb.tb_next
    debugger = RankPdb()
    debugger.message(f"*** {type(exc).__name__}: {exc}\n*** {note}")
    debugger.reset()
    try:
        debugger.interaction(None, tb)
    finally:
        stop_tracing()


def stop_tracing() -> None:
    """A kept world's rank between cells: no debugger left tracing from the last one."""
    global debugged
    debugged = False
    sys.settrace(None)


def extend_timeouts() -> None:
    """This rank's process groups wait at least an hour (torch.distributed.breakpoint does the same)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        from datetime import timedelta

        from torch.distributed import distributed_c10d as c10d

        for group in list(c10d._pg_map):
            c10d._set_pg_timeout(timedelta(seconds=LONG_TIMEOUT_S), group)
    except Exception:  # noqa: S110 - a private API of torch: without it, the groups keep their timeouts
        pass


_DEBUGGER_FILES = tuple(os.path.splitext(m.__file__ or "")[0] for m in (pdb, sys.modules["bdb"], cmd, sys.modules[__name__]))


def cut_debugger_frames(tb: TracebackType | None) -> TracebackType | None:
    """A :class:`DebuggerQuit`'s traceback ends where the user was, not in pdb's machinery (None if
    it has nothing else: the debugger was quit as a frame returned)."""
    while tb is not None and _debugger_frame(tb):
        tb = tb.tb_next
    first = tb
    while tb is not None and tb.tb_next is not None:
        if _debugger_frame(tb.tb_next):
            tb.tb_next = None
            break
        tb = tb.tb_next
    return first


def _debugger_frame(tb: TracebackType) -> bool:
    return os.path.splitext(tb.tb_frame.f_code.co_filename)[0] in _DEBUGGER_FILES


def _cell_code(frame: FrameType) -> bool:
    return frame.f_code.co_filename == CELL_FILENAME and frame.f_code.co_name == "<module>"


# where libraries live: a post-mortem starts at the innermost frame outside them
_LIBRARY_DIRS = tuple({os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _users(frame: FrameType) -> bool:
    """A frame of the user's code: a cell's, a notebook function's, their script's or module's."""
    filename = frame.f_code.co_filename
    if filename in _labels:
        return True
    library = ("/site-packages/", "/dist-packages/")
    return not (filename.startswith(("<", *_LIBRARY_DIRS)) or any(part in filename for part in library))


def _launcher(frame: FrameType) -> bool:
    name = str(frame.f_globals.get("__name__", ""))
    return name.startswith(("nbspawn.", "multiprocessing", "torch.multiprocessing", "runpy", "_nbspawn_")) or (
        frame.f_code.co_filename in ("<frozen runpy>", _launcher_file)
    )


class RankPdb(_Pdb):  # type: ignore[misc,valid-type]
    """pdb for a rank: its prompt names the rank; see the module's docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["skip"] = [*(kwargs.get("skip") or ()), *_SKIP]
        kwargs["nosigint"] = True  # SIGINT is the kernel's way of stopping the rank, never a break
        super().__init__(*args, **kwargs)
        self.prompt = f"(Pdb rank {_rank}) "
        self._post_mortem = False

    def set_trace(self, frame: FrameType | None = None) -> None:
        if not available():
            raise _unavailable("the debugger")
        super().set_trace(frame or sys._getframe(1))

    def interaction(self, frame: FrameType | None, tb: Any) -> None:
        global debugged
        if not available():
            raise _unavailable("the debugger")
        debugged = True
        self._post_mortem = frame is None
        extend_timeouts()
        super().interaction(frame, tb)

    def setup(self, f: FrameType | None, tb: TracebackType | None) -> Any:
        """A post-mortem starts at the innermost frame of the user's code, as IPython's ``%debug`` does
        (``u``/``d`` still reach every frame): the cell's line that raised, not torch's ``forward``."""
        result = super().setup(f, tb)
        if f is None and tb is not None:
            users = [i for i, (frame, _) in enumerate(self.stack) if _users(frame)]
            if users:
                innermost = users[-1]
                self.curindex = innermost
                self.curframe = self.stack[innermost][0]
                self.curframe_locals = self.curframe.f_locals
        return result

    def cmdloop(self, intro: str | None = None) -> None:
        global _depth, _current
        _depth += 1
        outer, _current = _current, self
        try:
            cmd.Cmd.cmdloop(self, intro)
        finally:
            _depth -= 1
            _current = outer

    def _cmdloop(self) -> None:
        # pdb's own catches KeyboardInterrupt and asks again: here an interrupt stops the rank
        self.allow_kbdint = True
        try:
            self.cmdloop()
        except KeyboardInterrupt:
            self._leave()
            raise
        self.allow_kbdint = False

    def _leave(self) -> None:
        self.quitting = True
        sys.settrace(None)

    def do_quit(self, arg: str) -> bool | None:
        if self._post_mortem:  # leaving a post-mortem: the rank fails with its own error, as it would have
            return bool(super().do_quit(arg))
        self._leave()
        self.message(f"debugger quit on rank {_rank}")
        raise DebuggerQuit(f"debugger quit on rank {_rank}")

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> bool | None:
        return self.do_quit(arg)

    def dispatch_return(self, frame: FrameType, arg: Any) -> Any:
        cell = _cell_code(frame)
        if not cell and not (frame.f_back is not None and _launcher(frame.f_back)):
            return super().dispatch_return(frame, arg)
        if self.quitting:
            return None
        if not cell or final_code is None or frame.f_code is final_code:
            self.set_continue()  # the cell is done: nothing of nbspawn's to step into
        elif self.stoplineno != -1:
            self.set_step()  # the statements are done: stop in the trailing expression next
        return None

    def user_call(self, frame: FrameType, argument_list: Any) -> None:
        if not _cell_code(frame):  # the cell's trailing expression: its first line stops, no --Call--
            super().user_call(frame, argument_list)

    def format_stack_entry(self, frame_lineno: tuple[FrameType, int], lprefix: str = ": ") -> str:
        """``> Cell In[5], line 6, in f`` and the line, for a cell's frame (``w``, ``u``, each stop)."""
        frame, lineno = frame_lineno
        label = _labels.get(frame.f_code.co_filename)
        if label is None:
            return str(super().format_stack_entry(frame_lineno, lprefix))
        func = frame.f_code.co_name
        where = f"{label}, line {lineno}" + ("" if func == "<module>" else f", in {func}")
        source = linecache.getline(frame.f_code.co_filename, lineno, frame.f_globals).strip()
        return where + (lprefix + source if source else "")

    def get_stack(self, f: FrameType | None, t: TracebackType | None) -> tuple[list[tuple[FrameType, int]], int]:
        """The stack from the cell (a program: its own first frame) up, as in a notebook."""
        stack, index = super().get_stack(f, t)
        frames = [frame for frame, _ in stack]
        cut = next((i for i, fr in enumerate(frames) if fr.f_code.co_filename == CELL_FILENAME), None)
        if cut is None:
            cut = next((i for i, fr in enumerate(frames) if not _launcher(fr)), 0)
        cut = min(cut, index)
        return stack[cut:], index - cut
