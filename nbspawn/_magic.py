"""``%%spawn``: the magic's arguments and configuration; it writes a request, ``nbspawn._dispatch`` does the rest.

Defaults come from traitlets, so ``%config SpawnMagics.nprocs = 8`` (or ``ipython_config.py``)
changes every later cell, and a cell's own options win over them.  The arguments are made from
``nbspawn._options.OPTIONS`` in groups, as ipyparallel's magics share theirs: a cell takes the common
and the cell options; a program (``%spawn [options] -- PROGRAM``) takes the common ones, and its parser
refuses a cell option itself, saying why.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from html import escape
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, argument_group, magic_arguments
from IPython.display import display
from traitlets import Float, Int, TraitType, Unicode, Union

from . import _control, _cuda, _tpu
from ._dispatch import start
from ._door import read_door
from ._options import CONFIG, ROW, Option, ViewChoice, at_door, options_in
from ._request import RunRequest
from ._runstate import Run
from ._source import CellSource, CellSyntaxError, cell_files
from .errors import SpawnUsageError
from .views._choice import view_for
from .views._protocol import RunView

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

FORMS = """\
  %%spawn [options]                     run the cell's body on every rank (options below)
  %spawn [options] -- PROGRAM [ARGS]    run a program on every rank, as torchrun would: train.py ARGS,
                                        python train.py ARGS, -m module ARGS, python -c CODE, or any executable
  %spawn status                         kept worlds and background runs: name or run id, ranks, state, pids, logs
  %spawn stop [NAME|RUN-ID ...]         stop these kept worlds and background runs (all of them if none is named);
                                        only their logs remain
  %spawn where [NAME|RUN-ID ...]        where every rank of these background runs and kept worlds is right now
                                        (all of them if none is named): ranks at the same line grouped
  %spawn show [RUN-ID]                  draw the last run's view again (or this background run's): a page reloaded
                                        before it was saved lost it, but the kernel still holds the run
  %spawn show WORLD NAME                what NAME (or model.lin.weight) holds on each rank of a kept world: type,
                                        shape, dtype, device; a DTensor's mesh, placements and each rank's shard
                                        drawn on the global tensor (with one kept world: %spawn show NAME)
  %spawn debug [NAME|RUN-ID] [RANK]     pdb on a rank from this cell: the post-mortem of a kept world's last
                                        failure (its root cause's rank unless RANK is given), or attach to a
                                        background run's rank waiting at a breakpoint or input()"""

_ARGPARSE: dict[str, dict[str, Any]] = {"env": {"nargs": "+", "action": "extend"}}
_GROUP_TITLES = {"common": "options for cells and programs", "cell": "options for cells only", "magic": "how the run is shown"}


class _NotForPrograms(argparse.Action):
    """A cell option given to a program: the parser refuses it, saying why."""

    def __init__(self, option_strings: list[str], dest: str, why: str, **kwargs: Any) -> None:
        self.why = why
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None
    ) -> None:
        parser.error(f"{option_string} does not apply to a program: {self.why}")


def _argument(option: Option, for_program: bool = False) -> argument:
    kwargs: dict[str, Any] = {"dest": option.param, "help": option.help}
    if option.metavar is None:
        kwargs.update(action="store_true", default=False)
    else:
        kwargs.update(default=None, metavar=option.metavar, **_ARGPARSE.get(option.param, {}))
    if for_program and option.not_for_programs:
        kwargs = {"dest": option.param, "help": argparse.SUPPRESS, "action": _NotForPrograms, "why": option.not_for_programs}
        if option.metavar is None:
            kwargs["nargs"] = 0
    return argument(*option.flags, **kwargs)


def run_arguments(*groups: str, for_program: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of these groups, as one stack of IPython ``@argument`` decorators under a heading each."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        # IPython builds the parser from the last decorator applied to the first: applied in reverse
        for group in reversed(groups):
            for option in reversed(options_in(group)):
                func = _argument(option, for_program)(func)
            func = argument_group(_GROUP_TITLES[group])(func)
        return func

    return decorate


_SPAWN_DOC = f"""Run this cell on N local PyTorch ranks, with the torchrun environment.

Every rank runs the cell with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, so
torch.distributed.init_process_group("gloo") needs no arguments. Each rank's output, progress bars
and displays (tables, plots) are shown live, a pane per rank in Jupyter or [rank{{r}}]: lines in a
terminal, and kept whole in the log directory. The first rank that fails stops the others, and the
cell raises that rank's error in this cell's line numbers. Names the ranks assign never change the
kernel's (use --out to bring values back).

With --world NAME the cell runs on a kept world: ranks that stay alive across cells, with their
names, process group and loaded models. With --cluster NAME (a kernel variable holding a connected
ipyparallel Client or Cluster) it runs on several nodes, -n ranks per node. With --bg the kernel is
free at once and the run goes on in the background.

Forms:
{FORMS}

Defaults are configurable, e.g. %config SpawnMagics.nprocs = 8 (also {", ".join(o.param for o in at_door(CONFIG) if o.param != "nprocs")}, live_after).
"""

# SpawnMagics' traitlet for each kind of option %config sets (nbspawn._options: a row's trait)
_TRAITS: dict[str, Callable[[Option], TraitType]] = {
    "count": lambda o: Union([Int(), Unicode()], default_value=o.default, help=o.trait_help),
    "choice": lambda o: Unicode(o.default, help=o.trait_help),
    "seconds": lambda o: (
        Float(o.default, allow_none=True, help=o.trait_help) if o.default is None else Float(o.default, help=o.trait_help)
    ),
    "path": lambda o: Unicode(o.default, allow_none=True, help=o.trait_help),
    "name": lambda o: Unicode(o.default or "", help=o.trait_help),  # '': none
    "whole": lambda o: Int(o.default, help=o.trait_help),  # KB, a nice value
}


def configurable() -> dict[str, TraitType]:
    """A ``config=True`` traitlet for every option ``%config SpawnMagics`` sets, its default the row's."""
    return {option.param: _TRAITS[option.trait](option).tag(config=True) for option in at_door(CONFIG)}


def _documented(text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give the magic its description before IPython builds its parser (and help) from it."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func.__doc__ = text
        return func

    return decorate


@magics_class
class SpawnMagics(Magics):
    """Run a cell on N local PyTorch ranks."""

    # one traitlet per row of nbspawn._options that %config sets: the class namespace is a dict here
    locals().update(configurable())
    live_after = Float(
        0.2,
        help="Seconds a run goes on before its live view (and the toolbar's status) appears; a quicker run "
        "shows only its result. 0: at once.",
    ).tag(config=True)

    @magic_arguments(name="%spawn")  # IPython adds one "%": the usage line reads %%spawn
    @run_arguments("common", "cell", "magic")
    @_documented(_SPAWN_DOC)
    @line_cell_magic
    def spawn(self, line: str, cell: str | None = None) -> Run | None:
        if cell is None:
            return self._line(line)
        args = _parsed(self.spawn, line)
        return self._start(args, CellSource(cell, line_offset=1, label=f"Cell In[{self._cell_number()}]"), None)

    @magic_arguments(name="spawn")
    @run_arguments("common", "cell", "magic", for_program=True)
    def _program_form(self, line: str) -> None:
        """The options a program takes: a cell option is refused by the parser itself."""

    def _line(self, line: str) -> Run | None:
        """``%spawn status``, ``%spawn stop [NAME|ID ...]`` and ``%spawn [options] -- PROGRAM [ARGS...]``."""
        words = line.split()
        if words[:1] == ["status"] and len(words) == 1:
            print(_control.status_table())
            return None
        if words[:1] == ["where"]:
            try:
                print(_control.where(words[1:]))
            except SpawnUsageError as err:
                raise UsageError(str(err)) from None
            return None
        if words[:1] == ["debug"]:
            self._debug(words[1:])
            return None
        if words[:1] == ["show"]:
            from IPython.display import display

            try:
                display(_control.shown(words[1:]), raw=True)
            except SpawnUsageError as err:
                raise UsageError(str(err)) from None
            return None
        if words[:1] == ["stop"]:
            try:
                stopped = _control.stop(words[1:])
            except SpawnUsageError as err:
                raise UsageError(str(err)) from None
            print(f"stopped {', '.join(stopped)}" if stopped else "nothing to stop")
            return None
        tokens = _words(line)
        if "--" not in tokens:
            raise UsageError(f"%spawn takes one of these forms (see %%spawn?):\n{FORMS}")
        cut = tokens.index("--")
        args = self._program_form.parser.parse_args(tokens[:cut])
        return self._start(args, None, tuple(tokens[cut + 1 :]))

    def _start(self, args: argparse.Namespace, cell: CellSource | None, program: tuple[str, ...] | None) -> Run | None:
        """One path for cells and programs, on this machine, a world or a cluster, in the foreground or not."""
        shell = self.shell
        assert shell is not None  # a magic runs in a shell
        try:
            request = self._request(args, cell, program)
            run = start(request, self._view(request.view))
        except (SpawnUsageError, ValueError) as err:  # IPython prints exactly UsageError as one line, no traceback
            raise UsageError(str(err)) from None
        except CellSyntaxError as err:
            raise UsageError(err.report()) from None
        user_ns = shell.user_ns
        if request.background:
            run.when_waited(lambda done: user_ns.update(done.outputs))
            return run
        if run.error is not None:
            if getattr(shell, "call_pdb", False):
                _skip_kernel_post_mortem(shell)
            raise run.error
        user_ns.update(run.outputs)
        return None

    def _debug(self, words: list[str]) -> None:
        """``%spawn debug [NAME|RUN-ID] [RANK]`` (``executors._debug``): a kept world's post-mortem runs
        as a cell does (its view, its error); an attach to a background run says how it ended."""
        from ._dispatch import kept_worlds
        from .executors._debug import debug, parse_debug_words

        try:
            name, _rank = parse_debug_words(words)
            world = kept_worlds().get(name) if name is not None else None
            if world is not None and world.on_cluster:
                raise SpawnUsageError(
                    f"world {name!r} runs on a cluster: its ranks cannot reach this kernel's stdin, so no debugger "
                    "opens there; run the failing cell on a world on this machine to debug it"
                )
            run, said = debug(words, self._view(ROW["view"].read(self.configured()["view"])))
        except (SpawnUsageError, ValueError) as err:
            raise UsageError(str(err)) from None
        if said:
            print(said)
        if run is not None and run.error is not None:
            raise run.error

    def _request(self, args: argparse.Namespace, cell: CellSource | None, program: tuple[str, ...] | None) -> RunRequest:
        """The cell's options, each falling back on its SpawnMagics default (``nbspawn._door.read_door``)."""
        shell = self.shell
        assert shell is not None  # a magic runs in a shell
        return read_door(
            vars(args),
            configured={**self.configured(), "pdb": bool(getattr(shell, "call_pdb", False))},  # %pdb on: --pdb
            cell=cell,
            program=program,
            namespace=shell.user_ns,
            hidden=shell.user_ns_hidden,
            cell_numbers=cell_files(shell),
        )

    def configured(self) -> dict[str, Any]:
        """What ``%config SpawnMagics`` holds for each option it sets (its traitlets are made from the table)."""
        return {option.param: getattr(self, option.param) for option in at_door(CONFIG)}

    def _view(self, choice: ViewChoice) -> RunView:
        return view_for(self.shell, choice, self.live_after)

    def _cell_number(self) -> int:
        """The ``In[N]`` of the running cell, the number IPython's own tracebacks give it.

        IPython caches each cell under a file name (``_source.cell_files``: name -> number)
        just before running it, and ipykernel names that file by a hash of the source alone, so a
        re-run cell keeps its name (and its place in the map) and only its number changes.  The
        running cell is the outermost frame on this stack whose file is a cached cell: the magic is
        called from that cell's code.  ``execution_count`` cannot say it: IPython 9 advances it
        before the cell runs when the cell is stored in history, and not otherwise.
        """
        from types import FrameType

        shell = self.shell
        assert shell is not None  # a magic runs in a shell
        cells = cell_files(shell)
        number = None
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            found = cells.get(frame.f_code.co_filename)
            if found is not None:
                number = found  # keep going: a function from an earlier cell may have called the magic
            frame = frame.f_back
        if number is not None:
            return number
        return next(reversed(cells.values())) if cells else shell.execution_count


def _skip_kernel_post_mortem(shell: InteractiveShell) -> None:
    """``%pdb on``: a rank's failure was debugged in the rank (``--pdb``); IPython's post-mortem of
    the kernel's frames (nbspawn's, where nothing of the rank is) is skipped for this cell only."""
    shell.call_pdb = False

    def restore(*_args: object) -> None:
        shell.call_pdb = True
        shell.events.unregister("post_run_cell", restore)

    shell.events.register("post_run_cell", restore)


_ARGS: dict[tuple[str, str], argparse.Namespace] = {}


def _parsed(magic: Callable[..., Any], line: str) -> argparse.Namespace:
    """The options of ``line``, parsed once per distinct line (a cell re-run, or every cell on a world,
    repeats its line): argparse costs ~0.2 ms a cell, a third of what a world cell's dispatch costs."""
    key = (magic.__name__, line)
    if key not in _ARGS:
        if len(_ARGS) > 256:
            _ARGS.clear()
        _ARGS[key] = magic.parser.parse_args(_words(line))  # type: ignore[attr-defined]  # magic_arguments' parser
    return argparse.Namespace(**vars(_ARGS[key]))


def _words(line: str) -> list[str]:
    """The line's words as a shell reads them: quotes group and are removed (``--env MSG="a b"``,
    ``--log-dir '/my logs'``).  IPython's own reading keeps them (``NCCL_DEBUG='INFO'`` reached the ranks
    with its quotes) and splits a quoted value at its spaces."""
    try:
        return shlex.split(line)
    except ValueError as err:  # an unclosed quote
        raise UsageError(f"cannot read this line: {err}") from None


def note_cuda_culprit(result: Any) -> None:
    """After each cell: the first one that touched CUDA in this kernel, remembered for a refusal to fork
    (``_cuda.note_cell``).  ``result`` is IPython's ExecutionResult."""
    info = getattr(result, "info", None)
    source = getattr(info, "raw_cell", None)
    count = getattr(result, "execution_count", None)
    if isinstance(source, str):
        _cuda.note_cell(f"Cell In[{count}]" if count is not None else "a cell", source)
        _tpu.note_cell(f"Cell In[{count}]" if count is not None else "a cell", source)


_ENDED = {"failed": "failed", "timeout": "timed out", "interrupted": "was interrupted"}


def report_background_failures(*_info: object) -> None:
    """Before each cell: a background run that failed, unwaited, and whose view could not show it in its
    own cell (a text view's cell had ended), is not silent (told once).  As a note of its own above the
    cell's output, in grey, naming the cell it came from: news of that cell, neither an error of the one
    about to run (it was red stderr: issue #57, item 9) nor part of what that cell prints."""
    from .executors._registry import unreported_failures

    for run in unreported_failures():
        summary = str(run.error).splitlines()[0] if str(run.error) else type(run.error).__name__
        text = (
            f"nbspawn: the background run of {run.spec.cell.label} ({run.run_id}) {_ENDED.get(run.status, run.status)}: {summary}\n"
            f"  run.wait() raises its error (the run is also nbspawn.last_run() or in %spawn status); logs: {run.run_dir}"
        )
        html = f'<pre style="color:var(--jp-ui-font-color2,#57606a);margin:0">{escape(text)}</pre>'
        display({"text/plain": text, "text/html": html}, raw=True)
