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

An ``ipywidgets.Output`` made in a rank captures as it does in a notebook: while its ``msg_id`` is
set (``with out:``), what the rank prints and displays goes into it, not into the pane, and where it
is displayed the pane shows what it holds, updated in place (rich's live displays, and so
``rich.progress.track`` and Lightning's ``RichProgressBar``, draw this way).
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import functools
import io
import json
import os
import sys
import threading
import time
from html import escape
from typing import Any, NamedTuple

from .._comms import kernel_owns_comms
from .._rankdir import DISPLAY, FILES, ORDER, ORDER_RECORD
from .._shell import kernel_of
from ._launched import look_launched


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
        return os.open(os.path.join(self.rank_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

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
        if _outputs.active and _outputs.stream(self.stream, data):
            return len(data)
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
    look_launched(draws_as_a_notebook=rich)


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
        target = os.open(os.path.join(rank_dir, name), flags, 0o600)
        os.dup2(target, fd)
        os.close(target)
    previous, _ordered = _ordered, _Ordered(rank_dir)
    if previous is not None:
        previous.close()
    _outputs.reset()
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


# -- ipywidgets.Output ------------------------------------------------------------------------------

_OUTPUT_MODEL = "OutputModel"
_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_RANK_PARENT = {"header": {"msg_id": "nbspawn-rank", "msg_type": "execute_request"}, "msg_id": "nbspawn-rank"}
_IMAGES = ("image/png", "image/jpeg", "image/gif")


class _RankKernel:
    """Stands for the kernel where a rank has none (spawn, forkserver): ipywidgets' ``Output`` sets its
    ``msg_id`` from the parent request it finds here, and that is what starts a capture."""

    def __init__(self) -> None:
        self.comm_manager = _RankComms()

    def get_parent(self, channel: str = "shell") -> dict[str, Any]:
        return _RANK_PARENT

    @property
    def _parent_header(self) -> dict[str, Any]:
        """Where ipywidgets 7's ``Output`` looks (``get_ipython().kernel._parent_header``)."""
        return _RANK_PARENT


class _RankComms:
    """The comm manager ipykernel 6.17's ``Comm`` registers with: a rank's comms by id, nothing routed."""

    def __init__(self) -> None:
        self.comms: dict[str, Any] = {}

    def register_comm(self, comm: Any) -> str:
        self.comms[comm.comm_id] = comm
        return str(comm.comm_id)

    def unregister_comm(self, comm: Any) -> None:
        self.comms.pop(comm.comm_id, None)

    def get_comm(self, comm_id: str) -> Any:
        return self.comms.get(comm_id)

    def register_target(self, target_name: str, callback: Any) -> None:
        """ipywidgets registers its targets on import: no front end will open a comm to a rank."""

    def unregister_target(self, target_name: str, callback: Any) -> None:
        """Nothing was registered."""


class _OutputWidgets:
    """The rank's ``ipywidgets.Output`` widgets: what each holds, which capture now, which are shown.

    A notebook's front end routes every message of the request named by an Output's ``msg_id`` into
    that widget; here the rank does it itself.  While an Output captures (innermost ``with`` first),
    Python's writes to stdout and stderr, ``display()`` and ``clear_output()`` change what it holds.
    Where the widget is displayed, the pane gets one display (its id ``nbspawn-output:<model>``)
    holding the widget's outputs drawn as one bundle, updated in place, at most every ``interval``
    seconds (the last change always shown: on leaving the ``with``, and when the cell ends).
    """

    interval = 0.05

    def __init__(self) -> None:
        # `lock` guards the state and is never held while writing: a print holds its stream's lock
        # and then takes this one; records are written under `drain_lock`, in the order queued
        self.lock = threading.RLock()
        self.drain_lock = threading.Lock()
        self.timer: threading.Timer | None = None
        self.models: dict[str, list[dict[str, Any]]] = {}  # model id -> nbformat outputs (kept across cells)
        self.reset()

    def reset(self) -> None:
        """A new cell (a kept world's rank): nothing is shown in its pane yet.  An Output made by an
        earlier cell still captures (in a notebook, into that cell's output), shown here if displayed
        again; its clear_output() must never clear this cell's pane."""
        if self.timer is not None:
            self.timer.cancel()
        self.active: list[str] = []  # capturing now, innermost last
        self.shown: set[str] = set()
        self.waiting: set[str] = set()  # clear_output(wait=True): cleared by the next output
        self.dirty: set[str] = set()
        self.decoders: dict[int, Any] = {}
        self.last = 0.0
        self.timer = None
        self.outbox: list[dict[str, Any]] = []  # display records to write, in order

    # -- what ipywidgets says (the comm) ----------------------------------------------------------

    def opened(self, model: str, state: Any) -> bool:
        if not isinstance(state, dict) or state.get("_model_name") != _OUTPUT_MODEL:
            return False
        with self.lock:
            self.models[model] = list(state.get("outputs") or [])
        return True

    def updated(self, model: str, state: Any) -> bool:
        if model not in self.models:
            return False
        if not isinstance(state, dict):
            return True
        with self.lock:
            if "outputs" in state:  # out.outputs = ..., out.append_stdout(...), out.append_display_data(...)
                self.models[model] = list(state["outputs"] or [])
                self._changed(model)
            if "msg_id" in state:
                if model in self.active:
                    self.active.remove(model)
                if state["msg_id"]:
                    self.active.append(model)
                else:  # the `with` is over: show what it left now
                    self._emit(model)
        self._drain()
        return True

    def closed(self, model: str) -> bool:
        if model not in self.models:
            return False
        with self.lock:
            if model in self.active:
                self.active.remove(model)
            self.models[model] = []
            self._emit(model)  # a closed widget is no longer shown (rich's transient displays)
            self.shown.discard(model)
        self._drain()
        return True

    # -- what the rank writes while an Output captures --------------------------------------------

    def stream(self, stream: int, data: Any) -> bool:
        with self.lock:
            if not self.active:
                return False
            decoder = self.decoders.get(stream)
            if decoder is None:
                decoder = self.decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
            text = decoder.decode(bytes(data))
            if text:
                model = self.active[-1]
                outputs = self._outputs(model)
                name = "stdout" if stream == 0 else "stderr"
                if outputs and outputs[-1].get("output_type") == "stream" and outputs[-1].get("name") == name:
                    outputs[-1] = {**outputs[-1], "text": str(outputs[-1].get("text", "")) + text}
                else:
                    outputs.append({"output_type": "stream", "name": name, "text": text})
                self._changed(model, now=False)  # under the stream's own lock: shown from the timer
        return True

    def publish(self, data: Any, metadata: Any, transient: Any, update: bool) -> bool:
        """display() in a rank: into the capturing Output, or an Output's own display; False: neither."""
        if self.active:
            _flush_stdio()  # text written before this display goes first, into the widget too
        with self.lock:
            view = data.get(_WIDGET_VIEW) if isinstance(data, dict) else None
            model = view.get("model_id") if isinstance(view, dict) else None
            if model in self.models and (not self.active or model in self.active):
                self.shown.add(model)
                self._queue(model, update=False)
            elif not self.active:
                return False
            else:
                self._capture(data, metadata, transient, update, model)
        self._drain()
        return True

    def _capture(self, data: Any, metadata: Any, transient: Any, update: bool, model: Any) -> None:
        """display() while an Output captures: one more output of the innermost one."""
        target = self.active[-1]
        if model in self.models:  # an Output displayed inside another: drawn there as it is now
            data = self.bundle(model)
        outputs = self._outputs(target)
        display_id = (transient or {}).get("display_id") if isinstance(transient, dict) else None
        output = {"output_type": "display_data", "data": data, "metadata": metadata or {}}
        if display_id:
            output["transient"] = {"display_id": display_id}
        if update and display_id:
            for i, old in enumerate(outputs):
                if (old.get("transient") or {}).get("display_id") == display_id:
                    outputs[i] = output
        else:
            outputs.append(output)
        self._changed(target)

    def clear(self, wait: bool) -> bool:
        if self.active:
            _flush_stdio()
        with self.lock:
            if not self.active:
                return False
            model = self.active[-1]
            if wait:
                self.waiting.add(model)
            else:
                self.models[model] = []
                self.waiting.discard(model)
                self._changed(model)
        self._drain()
        return True

    # -- drawing ----------------------------------------------------------------------------------

    def _outputs(self, model: str) -> list[dict[str, Any]]:
        if model in self.waiting:
            self.waiting.discard(model)
            self.models[model] = []
        return self.models.setdefault(model, [])

    def _changed(self, model: str, now: bool = True) -> None:
        """Under the lock: show the change now, or from a timer once ``interval`` has passed."""
        self.dirty.add(model)
        wait = self.last + self.interval - time.monotonic()
        if wait <= 0 and now:
            self._emit(model)
        elif self.timer is None:
            self.timer = threading.Timer(max(wait, 0.0), self._on_timer)
            self.timer.daemon = True
            self.timer.start()

    def _on_timer(self) -> None:
        with self.lock:
            self.timer = None
        if not _finished:
            self.flush()

    def flush(self) -> None:
        """Show every change not yet shown."""
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            for model in sorted(self.dirty):
                self._emit(model)
        self._drain()

    def _emit(self, model: str) -> None:
        self.dirty.discard(model)
        if model in self.shown:
            self._queue(model, update=True)

    def _queue(self, model: str, update: bool) -> None:
        transient = {"display_id": f"nbspawn-output:{model}"}
        self.outbox.append({"data": self.bundle(model), "metadata": {}, "transient": transient, "update": update})
        self.last = time.monotonic()

    def _drain(self) -> None:
        """Write the queued records, outside the lock (write_display flushes stdout, which may be
        captured into a widget: that takes the lock)."""
        with self.drain_lock:
            while True:
                with self.lock:
                    records, self.outbox = self.outbox, []
                if not records:
                    return
                for record in records:
                    write_display(record)

    def bundle(self, model: str) -> dict[str, str]:
        """What an Output holds, as one display: text/plain always, text/html where anything is rich."""
        outputs = [o for o in self.models.get(model, []) if isinstance(o, dict)]
        plain: list[str] = []
        rich: list[str] = []
        richer = False
        for output in outputs:
            kind = output.get("output_type")
            if kind == "stream":
                text = _joined(output.get("text"))
                plain.append(text)
                style = ' style="color: var(--jp-error-color1, #c00)"' if output.get("name") == "stderr" else ""
                rich.append(f"<pre{style}>{escape(text)}</pre>")
            elif kind in ("display_data", "execute_result"):
                raw = output.get("data")
                data: dict[str, Any] = raw if isinstance(raw, dict) else {}
                text = _joined(data.get("text/plain"))
                plain.append(text + ("\n" if text and not text.endswith("\n") else ""))
                if "text/html" in data:
                    rich.append(_joined(data["text/html"]))
                    richer = True
                elif "image/svg+xml" in data:
                    rich.append(_joined(data["image/svg+xml"]))
                    richer = True
                elif image := next((m for m in _IMAGES if m in data), None):
                    rich.append(f'<img src="data:{image};base64,{_joined(data[image]).strip()}"/>')
                    richer = True
                else:
                    rich.append(f"<pre>{escape(text)}</pre>")
            elif kind == "error":
                text = "\n".join(str(line) for line in output.get("traceback") or [])
                plain.append(text + "\n")
                rich.append(f"<pre>{escape(text)}</pre>")
        bundle = {"text/plain": "".join(plain)}
        if richer:
            bundle["text/html"] = "".join(rich)
        return bundle


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _joined(value: Any) -> str:
    """nbformat's multiline strings (lists of lines) as one string."""
    if isinstance(value, list):
        return "".join(str(v) for v in value)
    return "" if value is None else str(value)


_outputs = _OutputWidgets()


@functools.cache
def rank_classes() -> tuple[type, RankCommClasses]:
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
            if _outputs.publish(data, metadata, transient, update):
                return
            write_display({"data": data, "metadata": metadata or {}, "transient": transient or {}, "update": update})

        def clear_output(self, wait: bool = False) -> None:
            if _outputs.clear(wait):
                return
            write_display({"clear": True, "wait": wait})

        def set_parent(self, parent: Any) -> None:
            """ipywidgets' ``Output.__enter__`` sets the shell's parent message: a rank has none to follow."""

    return RankDisplayPublisher, _rank_comm_classes()


@functools.cache
def rank_display_publisher() -> Any:
    """The rank's display publisher, made once: in the kernel before it forks, as :func:`rank_classes`
    (making a traitlets instance cost each forked rank 0.55 ms of copy-on-write faults), else in the
    rank.  Never used in the kernel: each forked rank has its own copy."""
    publisher, _comms = rank_classes()
    return publisher(shell=None)


def ready_to_fork_display() -> None:
    """In the kernel, before it forks ranks: what every forked rank's :func:`_capture_display` makes
    or reads is made or read once here, and inherited.  traitlets computes a trait's default on first
    read: the kernel's ``display_formatter.active_types``, unread in a kernel that has displayed only
    raw bundles, cost each forked rank 3.8 ms and 408 copy-on-write faults to compute (4 ranks at once
    on 2 cores), 30 % of a 4-rank fork cell's own cost."""
    rank_display_publisher()
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        formatter = getattr(InteractiveShell.instance(), "display_formatter", None)
        if formatter is not None:
            _ = formatter.active_types, formatter.format_types, formatter.ipython_display_formatter.enabled


def _widget_message(comm_id: str, msg_type: str, data: Any, keys: dict[str, Any]) -> None:
    """What a widget's comm would send its front end, recorded instead (or routed to an Output)."""
    if msg_type == "comm_open":
        if keys.get("target_name") == "jupyter.widget" and isinstance(data, dict):
            state = data.get("state", {})
            if _outputs.opened(comm_id, state):
                return
            write_display({"widget": comm_id, "state": state, "open": True})
    elif msg_type == "comm_msg":
        if isinstance(data, dict) and data.get("method") == "update":
            state = data.get("state", {})
            if _outputs.updated(comm_id, state):
                return
            write_display({"widget": comm_id, "state": state})
    elif msg_type == "comm_close" and not _finished:  # not the clean-up at exit
        if _outputs.closed(comm_id):
            return
        write_display({"widget": comm_id, "closed": True})


class RankCommClasses(NamedTuple):
    """The comm classes a rank's widgets get, one per place ipywidgets may take its comms from."""

    comm_package: type | None  # for ``comm.create_comm`` (ipykernel >= 6.18)
    kernel_comm: type | None  # for ``ipykernel.comm.Comm`` (ipykernel < 6.18)


def _rank_comm_classes() -> RankCommClasses:
    """The comms a rank's widgets get: ``comm``'s kind, and on ipykernel < 6.18 (Colab's and Kaggle's
    6.17.1) ``ipykernel.comm.Comm``'s kind too, since ipywidgets 7 always, and ipywidgets 8 there,
    make theirs from ``ipykernel.comm.Comm`` (see ``nbspawn._comms``)."""
    comm_package: type | None = None
    kernel_comm: type | None = None
    try:
        from comm.base_comm import BaseComm
    except ImportError:  # Colab: ipykernel 6.17 without the comm package
        pass
    else:

        class RankComm(BaseComm):
            """A widget's comm in a rank: its state goes to display.jsonl, nothing to a frontend."""

            kernel = _RankKernel()  # what ipywidgets' Output asks for the message it captures

            def publish_msg(
                self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any
            ) -> None:
                _widget_message(self.comm_id, msg_type, data, keys)

        comm_package = RankComm
    if kernel_owns_comms():
        from ipykernel.comm import Comm
        from traitlets import Any as AnyTrait

        class RankKernelComm(Comm):
            """ipykernel 6.17's comm in a rank: opened against a stand-in kernel, recorded like ``RankComm``."""

            kernel = AnyTrait(_RankKernel())

            def _publish_msg(
                self, msg_type: str, data: Any = None, metadata: Any = None, buffers: Any = None, **keys: Any
            ) -> None:
                _widget_message(self.comm_id, msg_type, data, keys)

        kernel_comm = RankKernelComm
    return RankCommClasses(comm_package, kernel_comm)


def _capture_display(rich: bool) -> None:
    """Make display() (and everything built on it) write to display.jsonl."""
    if not rich and "IPython" not in sys.modules:
        return  # plain Python, plain view: there is no display() to capture
    shell = _rank_shell(rich)
    if shell is None:
        return
    _publisher, rank_comms = rank_classes()
    _silence_the_kernel(shell)
    shell.display_pub = rank_display_publisher()
    # displayed as in a kernel: terminal IPython formats only text/plain and turns ``_ipython_display_``
    # off, through which ipywidgets 7 displays a widget (tqdm.notebook's bar) with the view naming its model.
    # (Set only where they differ, as in a spawned rank's shell: a forked rank has the kernel's, and each
    # assignment runs traitlets' validation and observers, 0.3 ms of copy-on-write faults in a rank.)
    formatter = getattr(shell, "display_formatter", None)
    if formatter is not None:
        if list(formatter.active_types) != list(formatter.format_types):
            formatter.active_types = list(formatter.format_types)
        if not formatter.ipython_display_formatter.enabled:
            formatter.ipython_display_formatter.enabled = True
    _capture_comms(rank_comms)


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
    shell = InteractiveShell.instance(config=config)
    shell.kernel = _RankKernel()  # type: ignore[attr-defined]  # ipywidgets 7's Output asks the shell's kernel what it captures (8 asks its comm)
    return shell


def _silence_the_kernel(shell: Any) -> None:
    """A forked rank holds copies of the kernel's sockets: make sure nothing sends on them."""
    kernel = kernel_of(shell)
    sessions = {id(s): s for s in (getattr(kernel, "session", None), getattr(shell.display_pub, "session", None)) if s}
    for session in sessions.values():
        session.send = _drop


def _drop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _capture_comms(rank_comms: RankCommClasses) -> None:
    """Widgets made in a rank (tqdm.notebook's bar) keep their state here and record it in display.jsonl."""
    if rank_comms.comm_package is not None:
        import comm
        from comm.base_comm import CommManager

        manager = CommManager()
        comm.create_comm = rank_comms.comm_package
        comm.get_comm_manager = lambda: manager
    if rank_comms.kernel_comm is not None:  # where ipywidgets 7 (imported already, or later) and 8 get theirs
        import ipykernel.comm

        setattr(ipykernel.comm, "Comm", rank_comms.kernel_comm)  # noqa: B010 - ipykernel's stubs lack it
        widgets = sys.modules.get("ipywidgets.widgets.widget")
        if widgets is not None and hasattr(widgets, "Comm"):
            setattr(widgets, "Comm", rank_comms.kernel_comm)  # noqa: B010


def finished() -> None:
    """The cell is over: widgets closed from here on (at exit) stay as they were last shown."""
    global _finished
    _outputs.flush()
    _finished = True


def flush_figures() -> None:
    """Show the figures a cell left open, as the inline backend does at the end of a notebook cell."""
    module = sys.modules.get("matplotlib_inline.backend_inline")
    if module is not None and "matplotlib.pyplot" in sys.modules:
        with contextlib.suppress(Exception):  # a figure that cannot be drawn must not fail the rank
            module.flush_figures()
