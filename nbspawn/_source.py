"""The cell's source, compiled so that every traceback speaks in the cell's own line numbers.

A rank compiles the cell body under :data:`CELL_FILENAME`, padded with blank lines so that line *N* of
the code object is line *N* of the notebook cell (the ``%%spawn`` line is line 1).  Tracebacks and
stack dumps from a rank then mention ``File "<nbspawn-cell>", line N``; :func:`rewrite_cell_frames`
turns those into IPython's ``Cell In[5], line N`` with the source line, so users never read nbspawn's
internals to find their bug.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import CodeType
from typing import Any

CELL_FILENAME = "<nbspawn-cell>"
STILL_STARTING = "  (still starting when asked: its cell had not begun)"
CELL_ENDED = "  (its cell had ended: the rank was reporting how, or leaving)"
# stopped unasked (it was setting up when the stop began) but set up by the time the signal came
NOT_ASKED = "  (not known: it was stopped just as it began, before it could be asked)"
# the rank's function that runs a cell and then reports how it ended (ranks._cell.execute_cell): a
# dump inside it but outside the cell is a rank past its cell's end, not one still starting
_REPORTING = re.compile(r"/nbspawn/ranks/_cell\.py\", line \d+ in (?:execute_cell|write_error|_write_error)$")
# a rank answers only once inside its entry point (the handler is installed there): a main thread that
# is in the rank's process (multiprocessing's bootstrap) but no longer in the entry point has returned
# from it, on its way out (a cell that raised SystemExit, say)
_ENTRY = re.compile(r"/nbspawn/ranks/_(?:cell|worldloop)\.py\", line \d+ in (?:run_rank|run_world_rank)$", re.M)
_PROCESS = re.compile(r"/multiprocessing/process\.py\", line \d+ in _bootstrap$", re.M)
# nbspawn's own code in a rank (its output capture under a print, its prompt under input()): not where
# the user is, so cut from the innermost end of where a rank was
_OWN = re.compile(r'File "[^"]*/nbspawn/(?:ranks|handoff|events)/[^"/]+\.py"')

_FRAME = re.compile(r'File "' + re.escape(CELL_FILENAME) + r'", line (\d+)(?:, in | in )(\S+)')
_IN_CELL = re.compile(re.escape(CELL_FILENAME))


# a line IPython would have rewritten: `!cmd`, `x = !cmd`, `%magic`, `%%magic`, `x = %magic`
_IPYTHON_LINE = re.compile(r"^\s*(?:[\w.\[\]'\", ]+=\s*)?(?P<kind>!|%%?)\s*(?P<rest>.*?)\s*$")


class CellSyntaxError(SyntaxError):
    """A syntax error in the cell, reported in the cell's own line numbers before anything starts."""

    def __init__(self, err: SyntaxError, label: str) -> None:
        super().__init__(err.msg, (label, err.lineno, err.offset, err.text, err.end_lineno, err.end_offset))
        self.label = label
        self.hint = ipython_syntax_hint(err.text or "")

    def report(self) -> str:
        """``SyntaxError in Cell In[4], line 2: '(' was never closed`` and the line with its caret
        (then, for a line of IPython syntax, what to write instead)."""
        lines = "".join(traceback.format_exception_only(SyntaxError, self)).rstrip("\n").splitlines()
        report = [f"SyntaxError in {self.label}, line {self.lineno}: {self.msg}", *lines[1:-1]]
        return "\n".join(report + ([self.hint] if self.hint else []))


def ipython_syntax_hint(line: str) -> str:
    """What to write instead of a line of IPython syntax (``!cmd``, ``%magic``); "" for any other line.

    A rank runs the cell body as Python (``compile``), not through IPython's input transformers, so
    such a line is a plain syntax error there: say why, and how to do the same in Python.
    """
    match = _IPYTHON_LINE.match(line.split("\n", 1)[0])
    if match is None:
        return ""
    rest = match.group("rest")
    if match.group("kind") == "!":
        command = rest or "CMD"
        return (
            f"`!{command}` is IPython syntax, and a rank runs its cell as plain Python, so shell escapes are not run "
            f"there. Run the command from Python: os.system({command!r}), or "
            f"subprocess.run({command!r}, shell=True, check=True) to fail the rank when it fails."
        )
    magic = match.group("kind") + (rest.split()[0] if rest else "magic")
    return (
        f"`{magic}` is IPython syntax, and a rank runs its cell as plain Python, so magics are not run there. "
        "Run the magic in a cell of its own in the kernel, or do what it does in Python "
        "(a shell command: os.system or subprocess.run)."
    )


@dataclass(frozen=True)
class CellSource:
    """The body of a ``%%spawn`` cell and where it sits in the notebook cell."""

    body: str
    line_offset: int = 0  # lines above the body in the cell as the user sees it
    label: str = "Cell"  # "Cell In[5]" in a notebook
    written_by_nbspawn: bool = False  # nbspawn.spawn's call (_torchcall): its frames are not the user's
    # the kernel's cells whose functions the ranks run, by IPython's file name: a spawned rank puts them
    # in its linecache, so its tracebacks show their lines as a forked one's do (kernel_cell_sources)
    kernel_cells: tuple[tuple[str, str], ...] = ()

    @property
    def padded(self) -> str:
        return "\n" * self.line_offset + self.body

    def line(self, lineno: int) -> str:
        lines = self.padded.splitlines()
        return lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""

    @cached_property
    def tree(self) -> ast.Module:
        """The cell parsed, once per process (the door asks first, in the kernel, so a syntax error
        is reported before any process starts); read it, never change it.  Not pickled: a rank
        parses the cell it compiles."""
        return self.parse()

    def parse(self) -> ast.Module:
        """A new parse of the cell (:attr:`tree` is the one to read)."""
        try:
            return ast.parse(self.padded, CELL_FILENAME, "exec")
        except SyntaxError as err:
            raise CellSyntaxError(err, self.label) from None

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "tree"}

    def compile(self, tree: ast.Module | None = None) -> tuple[CodeType, CodeType | None]:
        """Code for the cell, split like IPython does: statements, then a last bare expression.

        The value of a trailing expression is printed by the rank, as a notebook would display it.
        ``tree``: the cell parsed, if the caller has it (it is only read), so a cell is parsed once.
        """
        if tree is None:
            tree = self.tree
        linecache.cache[CELL_FILENAME] = (len(self.padded), None, self.padded.splitlines(True), CELL_FILENAME)
        for filename, source in self.kernel_cells:
            linecache.cache.setdefault(filename, (len(source), None, source.splitlines(True), filename))
        last = None
        body = tree.body
        if body and isinstance(final := body[-1], ast.Expr):
            body = body[:-1]
            last = compile(ast.Expression(final.value), CELL_FILENAME, "eval")
        return compile(ast.Module(body=body, type_ignores=tree.type_ignores), CELL_FILENAME, "exec"), last


def kernel_cell_sources(values: Iterable[Any], cell_numbers: Mapping[str, int]) -> tuple[tuple[str, str], ...]:
    """The sources of the kernel's cells where the functions and classes of ``values`` are defined,
    and those they call by global name: what a spawned rank needs to show their lines in a traceback.
    A kernel's cell is a file only its linecache has: IPython's (``cell_numbers``), or any other that
    is not on disk (marimo's cells).  Only objects of ``__main__`` are followed."""
    files: set[str] = set()
    seen: set[int] = set()
    todo = list(values)
    while todo:
        value = todo.pop()
        if id(value) in seen or getattr(value, "__module__", None) != "__main__":
            continue
        seen.add(id(value))
        if isinstance(value, type):
            todo.extend(getattr(v, "__func__", v) for v in vars(value).values())
            continue
        code, names = getattr(value, "__code__", None), getattr(value, "__globals__", {})
        codes = [code] if isinstance(code, CodeType) else []
        while codes:
            c = codes.pop()
            files.add(c.co_filename)
            codes.extend(k for k in c.co_consts if isinstance(k, CodeType))
            todo.extend(names[n] for n in c.co_names if n in names)
    cached = {
        f: linecache.cache[f]
        for f in sorted(files)
        if f in linecache.cache and (f in cell_numbers or not (f.startswith("<") or os.path.exists(f)))
    }
    return tuple((f, "".join(entry[2])) for f, entry in cached.items() if len(entry) == 4)  # not a lazy entry


def rewrite_cell_frames(text: str, cell: CellSource) -> str:
    """Replace ``File "<nbspawn-cell>", line N, in f`` with ``Cell In[5], line N, in f``.

    Python tracebacks already print the source line below the frame (linecache knows the cell);
    faulthandler dumps don't, so the source line is added where the next line isn't it.
    """
    out: list[str] = []
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        match = _FRAME.search(raw)
        if not match:
            out.append(raw)
            continue
        lineno, func = int(match.group(1)), match.group(2)
        where = f"{cell.label}, line {lineno}" + ("" if func == "<module>" else f", in {func}")
        indent = raw[: len(raw) - len(raw.lstrip())]
        out.append(indent + where)
        source = cell.line(lineno)
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if source and following != source:
            out.append(indent + "    " + source)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def main_thread_stack(dump: str, cell: CellSource) -> str:
    """The main thread's frames from a faulthandler dump, innermost last, cut below the cell.

    faulthandler prints most recent call first and every thread; a user wants Python's order and
    only the thread running their cell, without the launcher frames underneath it.
    """
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip()) if b.strip()]
    # the main thread's block: the one in the cell, else in the rank's entry point, else in its process's
    # bootstrap; faulthandler names none of them (the thread that dumps comes first)
    chosen = next((b for mark in (_IN_CELL, _ENTRY, _PROCESS) for b in blocks if mark.search(b)), blocks[0] if blocks else "")
    frames = [ln.rstrip() for ln in chosen.splitlines()[1:] if ln.strip().startswith("File ")]
    cut = next((i for i, ln in enumerate(frames) if CELL_FILENAME in ln and ln.endswith("<module>")), None)
    if cut is None:
        entered = any(_ENTRY.search(f) for f in frames)
        if any(_REPORTING.search(f) for f in frames) or (not entered and any(_PROCESS.search(f) for f in frames)):
            return CELL_ENDED
        return STILL_STARTING if frames else ""
    frames = [f.strip() for f in frames[: cut + 1] if _IMPORTLIB not in f]
    frames.reverse()
    while cell.written_by_nbspawn and len(frames) > 1 and CELL_FILENAME in frames[0]:
        frames.pop(0)  # nbspawn.spawn's own call: the user's function is where the rank is
    while len(frames) > 1 and _OWN.search(frames[-1]):
        frames.pop()
    return rewrite_cell_frames("\n".join("  " + f for f in _trim_library(frames)), cell)


_IMPORTLIB = '"<frozen importlib._bootstrap'  # and _bootstrap_external: the machinery of every import
_LIBRARY = re.compile(r'File "(?:<frozen [^>]*>|[^"]*/(?:site-packages|dist-packages)/[^"]*|[^"]*/lib/python3\.\d+/[^"]*)"')
_PACKAGE = re.compile(
    r'File "[^"]*/(?:(?:site|dist)-packages|lib/python3\.\d+)/(?!site-packages|dist-packages)([^"/]+?)(?:\.py)?[/"]'
)


def _trim_library(frames: list[str]) -> list[str]:
    """Frames innermost last, cut to the user's code: below the last frame of the user's own (the
    cell, a notebook function, their modules), only the call into a library and where it was, with
    how many frames of which packages lie between (a rank stopped while importing torch: 17 frames)."""
    last = max((i for i, f in enumerate(frames) if not _LIBRARY.search(f)), default=-1)
    tail = frames[last + 1 :]
    if len(tail) <= 3:
        return frames
    between = tail[1:-1]
    packages = sorted({m.group(1) for f in between if (m := _PACKAGE.search(f))})
    named = f" in {', '.join(packages)}" if packages else ""
    return [*frames[: last + 2], f"... {len(between)} frames{named} ...", tail[-1]]


_TRACEBACK_FRAME = re.compile(r"^(\s*)(?:File \"|Cell In\[)")


def fold_library_frames(traceback_text: str) -> str:
    """A traceback whose last frames are a library's (torch's under ``dist.barrier()``, where gloo's
    "Connection closed by peer" was raised) folded to the user's frames and one line counting the
    library's: ``... 2 frames in torch ...``.  Only frames under the user's own lines are folded, in
    each traceback of a chain; one with no frame of the user's is left whole."""
    lines = traceback_text.splitlines()
    out: list[str] = []
    frames: list[list[str]] = []  # the current run of frames: each its header line and the lines under it

    def settle() -> None:
        headers = [frame[0] for frame in frames]
        last = max((i for i, header in enumerate(headers) if not _LIBRARY.search(header)), default=-1)
        folded = frames[last + 1 :] if last >= 0 else []
        for frame in frames[: len(frames) - len(folded)]:
            out.extend(frame)
        if folded:
            indent = _TRACEBACK_FRAME.match(folded[0][0]).group(1)  # type: ignore[union-attr]  # a frame's header
            packages = sorted({m.group(1) for frame in folded if (m := _PACKAGE.search(frame[0]))})
            named = f" in {', '.join(packages)}" if packages else ""
            out.append(f"{indent}... {len(folded)} frame{'s' if len(folded) > 1 else ''}{named} ...")
        frames.clear()

    for line in lines:
        header = _TRACEBACK_FRAME.match(line)
        if header:
            frames.append([line])
        elif frames and line.startswith(frames[-1][0][: len(frames[-1][0]) - len(frames[-1][0].lstrip())] + "  "):
            frames[-1].append(line)  # the frame's source line and its carets, indented under it
        else:
            settle()
            out.append(line)
    settle()
    return "\n".join(out) + ("\n" if traceback_text.endswith("\n") else "")


def rewrite_notebook_frames(text: str, cell_numbers: dict[str, int]) -> str:
    """Frames in functions defined by earlier cells read ``Cell In[3], line 2, in f``, as in IPython."""
    if not cell_numbers:
        return text

    def label(match: re.Match[str]) -> str:
        number = cell_numbers.get(match.group(1))
        if number is None:
            return match.group(0)
        func = match.group(3)
        return f"Cell In[{number}], line {match.group(2)}" + ("" if func == "<module>" else f", in {func}")

    return re.sub(r'File "([^"]+)", line (\d+), in (\S+)', label, text)


def program_stack(dump: str) -> str:
    """The main thread's frames from a program's faulthandler dump, innermost last, nbspawn's cut."""
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip()) if b.strip()]
    main = next((b for b in blocks if "nbspawn/ranks/_program.py" in b), blocks[0] if blocks else "")
    frames = [ln.strip() for ln in main.splitlines()[1:] if ln.strip().startswith("File ")]
    frames = [f for f in frames if not any(s in f for s in ("nbspawn/ranks/_program.py", "/runpy.py", "<frozen runpy>"))]
    frames.reverse()
    return "\n".join("  " + f for f in frames)


def cell_files(shell: Any) -> dict[str, int]:
    """IPython's map from each cell's compiled file name to its execution number (``Cell In[N]``):
    IPython 8 and later keep it (``shell.compile._filename_map``), and on IPython 7 ``record_cell_files``
    keeps it from ``%load_ext nbspawn`` on."""
    compiler = getattr(shell, "compile", None)
    kept = getattr(compiler, "_filename_map", None)
    if not isinstance(kept, dict):
        kept = getattr(compiler, "_nbspawn_cell_files", None)
    return dict(kept) if isinstance(kept, dict) else {}


def record_cell_files(shell: Any) -> None:
    """IPython 7 (Colab's and Kaggle's 7.34) names each cell's file as IPython 8 does (a hash of its
    source, under ipykernel) but keeps no map from name to number: from now on, remember the name
    ``compile.cache`` gives each cell.  The cells run before come from the history, as well as it can
    say: it keeps a cell's source without its trailing newlines, which are part of the name, so each is
    named without and with one."""
    compiler = getattr(shell, "compile", None)
    cache = getattr(compiler, "cache", None)
    if compiler is None or cache is None or hasattr(compiler, "_filename_map") or hasattr(compiler, "_nbspawn_cell_files"):
        return
    files: dict[str, int] = {}
    history = getattr(shell, "history_manager", None)
    name_of = getattr(compiler, "get_code_name", None)
    if history is not None and name_of is not None:
        raw, parsed = history.input_hist_raw, history.input_hist_parsed
        for number in range(1, min(len(raw), len(parsed))):
            try:
                for ending in ("", "\n"):
                    files[name_of(raw[number] + ending, parsed[number] + ending, number)] = number
            except Exception:  # a compiler of another make: the earlier cells stay unnamed
                break

    def cache_and_remember(transformed_code: str, number: int = 0, raw_code: str | None = None) -> str:
        name = cache(transformed_code, number, raw_code)
        files[name] = number
        return str(name)

    compiler.cache = cache_and_remember
    compiler._nbspawn_cell_files = files
