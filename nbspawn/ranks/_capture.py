"""What a rank writes, and in which order: stdout, stderr and everything it displays.

A rank's descriptors 1 and 2 point at ``stdout.log`` and ``stderr.log`` (so C code and child
processes are captured and nothing ever blocks on a pipe).  Two files cannot say which of two writes
came first, so every write that Python makes goes through :class:`_Ordered`, which appends a record
to ``order.bin`` whenever the rank switches from one stream to another: the sizes of all three
files at that moment.  The kernel (``nbspawn.events._streams``) replays the files in that order, so a
stderr line and the stdout line written 10 ms later never swap, however far behind the kernel is.

Rich output goes the same way.  In a Jupyter kernel a rank looks like a notebook to the code it runs
(``get_ipython()`` exists and has ``IPKernelApp`` in its config, so ``tqdm.auto``, ``transformers``
and the matplotlib inline backend pick their notebook forms), but its display publisher writes each
``display()`` to ``display.jsonl`` as one JSON line, and the widgets it makes (a ``tqdm.notebook``
bar) get comms that record their state there instead of talking to the kernel's frontend: a forked
rank must never use the kernel's sockets (ipykernel would refuse and dump every message into the
server's log).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import os
import sys
import threading
from typing import Any

from .._rankdir import DISPLAY, FILES, ORDER, ORDER_RECORD


class _Ordered:
    """One rank's three output files and the order in which Python wrote to them.

    ``display.jsonl`` and ``order.bin`` are made on first need, so a rank that only prints leaves
    torch elastic's layout and nothing more.
    """

    def __init__(self, rank_dir: str) -> None:
        self.rank_dir = rank_dir
        self.fds = [1, 2, -1]
        self.order_fd = -1
        self.last = 0  # stdout: what the kernel assumes before the first record
        self.lock = threading.Lock()

    def _open(self, name: str) -> int:
        return os.open(os.path.join(self.rank_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, stream: int, data: bytes | memoryview) -> int:
        with self.lock:
            if stream != self.last:
                if self.order_fd < 0:
                    self.order_fd = self._open(ORDER)
                sizes = [os.fstat(fd).st_size if fd >= 0 else 0 for fd in self.fds]
                os.write(self.order_fd, ORDER_RECORD.pack(stream, *sizes))
                self.last = stream
            if self.fds[stream] < 0:
                self.fds[stream] = self._open(FILES[stream])
            view = memoryview(data)
            while view:
                view = view[os.write(self.fds[stream], view) :]
        return len(data)

    def close(self) -> None:
        with self.lock:
            for fd in (self.fds[DISPLAY], self.order_fd):
                if fd >= 0:
                    os.close(fd)
            self.fds[DISPLAY] = self.order_fd = -1


_ordered: _Ordered | None = None
_finished = False  # the cell is over: widget closes from here on are the interpreter's clean-up


class _StreamRaw(io.RawIOBase):
    """Descriptor 1 or 2 as a raw stream whose writes are recorded in order (once a rank set that up)."""

    def __init__(self, stream: int) -> None:
        self.stream = stream

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream + 1

    def isatty(self) -> bool:
        return False

    def write(self, data: Any) -> int:
        if _ordered is not None:
            return _ordered.write(self.stream, data)
        return os.write(self.stream + 1, data)


_stdio: tuple | None = None


def stdio_streams() -> tuple:
    """Text streams on descriptors 0, 1 and 2, made once in the kernel and inherited by forked ranks.

    They are never used in the kernel; in a rank, descriptors 1 and 2 are its log files by then.
    Line buffered, as on a terminal, so a line printed is a line the kernel can show.
    """
    global _stdio
    if _stdio is None:
        encoding, errors = "utf-8", "backslashreplace"
        out, err = (
            io.TextIOWrapper(
                io.BufferedWriter(_StreamRaw(i)), encoding=encoding, errors=errors, line_buffering=True, write_through=i == 1
            )
            for i in (0, 1)
        )
        _stdio = (open(0, closefd=False, encoding=encoding, errors=errors), out, err)  # noqa: SIM115
    return _stdio


def capture_output(rank_dir: str, rich: bool) -> None:
    """Point descriptors 1 and 2 at the rank's logs, order every Python write, capture display()."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    redirect_output(rank_dir)
    # The kernel's sys.stdout is a zmq stream that must not be touched from a forked process.
    # (typeshed makes sys.__stdout__ & co. Final; a rank is a process of its own, replacing them is the point)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdio_streams()  # type: ignore[misc]
    _capture_display(rich)


def redirect_output(rank_dir: str) -> None:
    """From now on, this process's output goes to ``rank_dir`` (a kept world's rank, between cells)."""
    global _ordered, _finished
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    for fd, name in ((1, FILES[0]), (2, FILES[1])):
        target = os.open(os.path.join(rank_dir, name), flags, 0o644)
        os.dup2(target, fd)
        os.close(target)
    previous, _ordered = _ordered, _Ordered(rank_dir)
    if previous is not None:
        previous.close()
    _finished = False


# -- display() -------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return repr(value)


def write_display(record: dict[str, Any]) -> None:
    """Append one record to display.jsonl, in order with the rank's text."""
    line = json.dumps(record, default=_jsonable, ensure_ascii=False, separators=(",", ":")) + "\n"
    data = line.encode("utf-8", "surrogatepass")
    if _ordered is not None:
        # text written before this display must reach its file first
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        _ordered.write(DISPLAY, data)


@functools.cache
def rank_classes() -> tuple[type, type | None]:
    """The display publisher and comm a rank uses, made once: in the kernel before it forks (so forked
    ranks inherit them: a traitlets class costs milliseconds to make), else in the rank."""
    from IPython.core.displaypub import DisplayPublisher

    class RankDisplayPublisher(DisplayPublisher):
        """display() in a rank: a record in display.jsonl, never a message to the kernel's frontend."""

        def publish(
            self,
            data: Any,
            metadata: Any = None,
            source: Any = None,
            *,
            transient: Any = None,
            update: bool = False,
            **kwargs: Any,
        ) -> None:
            write_display({"data": data, "metadata": metadata or {}, "transient": transient or {}, "update": update})

        def clear_output(self, wait: bool = False) -> None:
            write_display({"clear": True, "wait": wait})

    try:
        from comm.base_comm import BaseComm
    except ImportError:  # pragma: no cover - comm comes with ipykernel
        return RankDisplayPublisher, None

    class RankComm(BaseComm):
        """A widget's comm in a rank: its state goes to display.jsonl, nothing to a frontend."""

        def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any) -> None:
            if msg_type == "comm_open":
                if keys.get("target_name") == "jupyter.widget" and isinstance(data, dict):
                    write_display({"widget": self.comm_id, "state": data.get("state", {}), "open": True})
            elif msg_type == "comm_msg":
                if isinstance(data, dict) and data.get("method") == "update":
                    write_display({"widget": self.comm_id, "state": data.get("state", {})})
            elif msg_type == "comm_close" and not _finished:  # not the clean-up at exit
                write_display({"widget": self.comm_id, "closed": True})

    return RankDisplayPublisher, RankComm


def _capture_display(rich: bool) -> None:
    """Make display() (and everything built on it) write to display.jsonl."""
    if not rich and "IPython" not in sys.modules:
        return  # plain Python, plain view: there is no display() to capture
    shell = _rank_shell(rich)
    if shell is None:
        return
    publisher, rank_comm = rank_classes()
    _silence_the_kernel(shell)
    shell.display_pub = publisher(shell=None)
    if rank_comm is not None:
        _capture_comms(rank_comm)


def _rank_shell(rich: bool) -> Any:
    """The IPython shell display() uses in this rank: the kernel's own copy under fork, else a new one.

    A rank started by spawn or forkserver has no IPython at all; where the view can show rich output,
    it gets a plain ``InteractiveShell`` that says it is in a kernel, as the cell would be in the
    notebook it came from.
    """
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        return InteractiveShell.instance()
    if not rich:
        return None
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite file per rank
    config.IPKernelApp = Config()  # what transformers and friends check for a notebook
    import ipykernel.zmqshell  # noqa: F401 - what tqdm.auto checks for

    # matplotlib's inline backend (MPLBACKEND, inherited from the kernel) finds this shell itself
    # when a cell imports pyplot, so a rank that draws nothing pays nothing for it.
    return InteractiveShell.instance(config=config)


def _silence_the_kernel(shell: Any) -> None:
    """A forked rank holds copies of the kernel's sockets: make sure nothing sends on them."""
    kernel = getattr(shell, "kernel", None)
    sessions = {id(s): s for s in (getattr(kernel, "session", None), getattr(shell.display_pub, "session", None)) if s}
    for session in sessions.values():
        session.send = _drop


def _drop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _capture_comms(rank_comm: type) -> None:
    """Widgets made in a rank (tqdm.notebook's bar) keep their state here and record it in display.jsonl."""
    import comm
    from comm.base_comm import CommManager

    manager = CommManager()
    comm.create_comm = rank_comm
    comm.get_comm_manager = lambda: manager


def finished() -> None:
    """The cell is over: widgets closed from here on (at exit) stay as they were last shown."""
    global _finished
    _finished = True


def flush_figures() -> None:
    """Show the figures a cell left open, as the inline backend does at the end of a notebook cell."""
    module = sys.modules.get("matplotlib_inline.backend_inline")
    if module is not None and "matplotlib.pyplot" in sys.modules:
        with contextlib.suppress(Exception):  # a figure that cannot be drawn must not fail the rank
            module.flush_figures()
