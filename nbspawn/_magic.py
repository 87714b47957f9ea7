"""``%%spawn``: argument parsing and configuration; everything else is the launcher's job.

Defaults come from traitlets, so ``%config SpawnMagics.nprocs = 8`` (or ``ipython_config.py``)
changes every later cell, and a cell's own options win over them.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Float, Int, Unicode, Union

from ._api import prepare
from ._run import Run
from ._source import CellSource, CellSyntaxError
from ._spec import RunSpec
from .errors import SpawnUsageError
from .executors._supervisor import Executor, RunView, execute
from .views._text import TextView

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell


@magics_class
class SpawnMagics(Magics):
    """Run a cell on N local PyTorch ranks."""

    nprocs = Union(
        [Int(), Unicode()],
        default_value="auto",
        help="Ranks per cell: a number, or 'auto' (one per GPU, else up to 4 CPU ranks).",
    ).tag(config=True)
    start_method = Unicode("auto", help="fork, spawn, forkserver, or auto (fork unless CUDA is initialized in the kernel).").tag(
        config=True
    )
    backend = Unicode("none", help="Process group set up around the cell: none, gloo, nccl, or auto (nccl with GPUs).").tag(
        config=True
    )
    timeout = Float(None, allow_none=True, help="Seconds before every rank is stopped (None: no limit).").tag(config=True)
    grace_period = Float(5.0, help="Seconds between SIGTERM and SIGKILL when ranks are stopped.").tag(config=True)
    log_dir = Unicode(
        None, allow_none=True, help="Where <run-id>/<rank>/{stdout,stderr}.log go (None: a new temporary directory)."
    ).tag(config=True)
    max_saved_kb = Int(
        256, help="Most KB a finished run's saved output takes in the notebook, images aside (the logs keep all)."
    ).tag(config=True)
    max_image_kb = Int(
        2048,
        help="Most KB of images a run shows and saves; past it an image is named, not shown (its rank's display.jsonl has it).",
    ).tag(config=True)
    world = Unicode(
        "", help="Run every %%spawn cell on the kept world of this name ('' : fresh ranks per cell; --fresh for one cell)."
    ).tag(config=True)
    cluster = Unicode(
        "", help="Run every %%spawn cell on this kernel variable's ipyparallel Client or Cluster ('' : this machine)."
    ).tag(config=True)
    view = Unicode(
        "auto",
        help="How a run is shown: widget (live panes, frozen into a static view at the end), text "
        "([rank{r}]: lines), or auto (widget in a Jupyter kernel, text in a terminal).",
    ).tag(config=True)

    @magic_arguments(name="%spawn")  # IPython adds one "%": the usage line reads %%spawn
    @argument("-n", "--nprocs", default=None, metavar="N|auto", help="number of ranks (default: SpawnMagics.nprocs)")
    @argument(
        "--start-method",
        default=None,
        metavar="fork|spawn|forkserver",
        help="how ranks start; fork sees the kernel's names as they are, spawn and forkserver get the "
        "names the cell uses pickled by value (default: fork unless CUDA is initialized)",
    )
    @argument(
        "--backend",
        default=None,
        metavar="none|gloo|nccl|auto",
        help="initialize the default process group before the cell and destroy it after",
    )
    @argument(
        "--env",
        nargs="+",
        action="extend",
        default=None,
        metavar="KEY=VALUE",
        help="extra environment variables for every rank",
    )
    @argument("--timeout", default=None, metavar="SECONDS", help="stop every rank after this long, showing each one's stack")
    @argument("--grace-period", default=None, metavar="SECONDS", help="time between SIGTERM and SIGKILL")
    @argument("--log-dir", default=None, metavar="DIR", help="keep logs in DIR/<run-id>/<rank>/")
    @argument(
        "--ranks", default=None, metavar="LIST", help="show only these ranks' output, e.g. 0 or 0,2 or 0-3 (all are logged)"
    )
    @argument(
        "--share",
        default=None,
        metavar="NAMES",
        help="comma-separated kernel tensors, nn.Modules or dicts/lists/tuples of tensors that every rank "
        "sees in the same (shared) memory; in-place writes by ranks are seen by the kernel",
    )
    @argument(
        "--out",
        default=None,
        metavar="NAMES",
        help="comma-separated names each rank defines; after the cell each is bound in the kernel as a list "
        "indexed by rank (tensors come back through shared memory)",
    )
    @argument(
        "--view",
        default=None,
        metavar="auto|widget|text",
        help="live widget or [rank{r}]: text lines (default: SpawnMagics.view)",
    )
    @argument(
        "--world",
        default=None,
        metavar="NAME",
        help="run on the kept world NAME (ranks that live across cells), started with this cell's options if new",
    )
    @argument("--fresh", action="store_true", help="fresh ranks for this cell, even if SpawnMagics.world names a world")
    @argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="run on several nodes: NAME is a kernel variable holding a connected ipyparallel Client, Cluster "
        "or DirectView; one engine per node starts that node's ranks (-n is then ranks per node)",
    )
    @argument("--nodes", default=None, metavar="N", help="with --cluster: use the first N nodes (default: all)")
    @argument(
        "--bg",
        action="store_true",
        help="run in the background: the kernel is free at once; the run is returned (also nbspawn.last_run()), "
        "run.wait() joins it and raises its error",
    )
    @line_cell_magic
    def spawn(self, line: str, cell: str | None = None) -> Run | None:
        """Run this cell on N local PyTorch ranks, with the torchrun environment.

        Every rank runs the cell with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set,
        so torch.distributed.init_process_group("gloo") needs no arguments. Each rank's output,
        progress bars and displays (tables, plots) are shown live, a pane per rank in Jupyter or
        [rank{r}]: lines in a terminal, and kept whole in the log directory. The first rank that
        fails stops the others, and the cell raises that rank's error in this cell's line numbers.
        Names the ranks assign never change the kernel's (use --out to bring values back).

        With --world NAME the cell runs on a kept world: ranks that stay alive across cells, with
        their names, process group and loaded models. As a line magic:

          %spawn status            the kept worlds: name, ranks, pids, state
          %spawn stop [NAME ...]   stop these worlds (all if no name); only their logs remain

        With --cluster NAME (a kernel variable holding a connected ipyparallel Client or Cluster) the
        cell runs on several nodes: -n ranks per node, on the first --nodes N nodes (default: all),
        as torchrun would run it on each; one view, and the first failure anywhere stops every node.

        Defaults are configurable, e.g. %config SpawnMagics.nprocs = 8 (also start_method, backend,
        timeout, grace_period, log_dir, view, world, cluster, max_saved_kb, max_image_kb).
        """
        if cell is None:
            return self._line(line)
        args = parse_argstring(self.spawn, line)
        world = "" if args.fresh else (self.world if args.world is None else args.world)
        if args.bg and world.strip():
            raise UsageError("--bg runs on fresh ranks: a kept world runs one cell at a time (use --fresh with --bg)")
        try:
            view = self._view(args.view or self.view)
        except ValueError as err:
            raise UsageError(str(err)) from None
        try:
            executor: Executor | None
            cluster = self._cluster(args, world.strip() if args.world is not None else "")
            if cluster:
                spec, executor = self._prepare_cluster(args, cluster, view, cell=cell)
            else:
                spec, executor = self._prepare(args, cell, world.strip(), view)
        except SpawnUsageError as err:  # IPython prints exactly UsageError as one line, no traceback
            raise UsageError(str(err)) from None
        except CellSyntaxError as err:
            raise UsageError(err.report()) from None
        return self._execute(spec, view, executor, args.bg)

    def _cluster(self, args: argparse.Namespace, world: str) -> str:
        """The cluster this run goes to ('' : this machine); what a cluster cannot do yet is said here."""
        cluster = (self.cluster if args.cluster is None else args.cluster).strip()
        if args.nodes is not None and not cluster:
            raise SpawnUsageError("--nodes needs --cluster NAME (or %config SpawnMagics.cluster)")
        if cluster and world:
            raise SpawnUsageError("--world does not work with --cluster yet: a cluster runs each cell on fresh ranks")
        if cluster and args.bg:
            raise SpawnUsageError("--bg does not work with --cluster yet: a cluster run holds the kernel until it ends")
        return cluster

    def _prepare_cluster(
        self, args: argparse.Namespace, cluster: str, view: RunView, cell: str | None = None, program: list[str] | None = None
    ) -> tuple[RunSpec, Executor]:
        from .executors._cluster import prepare_cluster

        shell = self.shell
        assert shell is not None  # a magic runs in a shell
        source, cells = self._source(cell) if cell is not None else (None, _cell_files(shell))
        spec, executor = prepare_cluster(
            cluster, shell.user_ns, source, program=program, nodes=args.nodes, hidden=shell.user_ns_hidden,
            share=args.share, out=args.out, rich=bool(getattr(view, "rich", False)), **self._options(args),
        )  # fmt: skip
        spec.cell_numbers = cells
        return spec, executor

    def _source(self, cell: str) -> tuple[CellSource, dict[str, int]]:
        """The cell's body, labelled as the notebook shows it, and IPython's map of earlier cells."""
        shell = self.shell
        assert shell is not None  # a magic runs in a shell
        cells = _cell_files(shell)
        return CellSource(cell, line_offset=1, label=f"Cell In[{_cell_number(shell, cells)}]"), cells

    def _options(self, args: argparse.Namespace) -> dict[str, Any]:
        """The cell's options, each falling back on its SpawnMagics default."""
        return {
            "nprocs": self.nprocs if args.nprocs is None else args.nprocs,
            "start_method": args.start_method or self.start_method,
            "backend": args.backend or self.backend,
            "env": args.env,
            "timeout": self.timeout if args.timeout is None else args.timeout,
            "grace_period": self.grace_period if args.grace_period is None else args.grace_period,
            "log_dir": args.log_dir or self.log_dir,
            "ranks": args.ranks,
            "max_saved_kb": self.max_saved_kb,
            "max_image_kb": self.max_image_kb,
        }

    def _execute(self, spec: RunSpec, view: RunView, executor: Executor | None, background: bool) -> Run | None:
        """One path for cells and programs, on this machine or a cluster, in the foreground or not."""
        for note in spec.notes:
            print(note, file=sys.stderr)
        if spec.cluster is not None:
            print(spec.cluster.describe())
        try:
            run = execute(spec, view, executor, background=background)
        except SpawnUsageError as err:
            raise UsageError(str(err)) from None
        assert self.shell is not None  # a magic runs in a shell
        user_ns = self.shell.user_ns
        if background:
            run._on_wait.append(lambda done: user_ns.update(done.outputs))
            return run
        if run.error is not None:
            raise run.error
        user_ns.update(run.outputs)
        return None

    def _view(self, choice: str) -> RunView:
        choice = choice.strip().lower()
        if choice not in ("auto", "widget", "text"):
            raise ValueError(f"--view must be auto, widget or text, not {choice!r}")
        in_jupyter = getattr(self.shell, "kernel", None) is not None
        if choice == "widget" or (choice == "auto" and in_jupyter):
            from .views._widget import WidgetView, widget_available

            if widget_available():
                return WidgetView()
            if choice == "widget":
                raise ValueError("--view widget: the widget's front end was not built (run `make lab` or `pip install .`)")
        return TextView()

    def _line(self, line: str) -> Run | None:
        """``%spawn status``, ``%spawn stop [NAME|ID ...]`` and ``%spawn [options] -- PROGRAM [ARGS...]``."""
        words = line.split()
        if words[:1] == ["status"] and len(words) == 1:
            print(_status_table())
            return None
        if words[:1] == ["stop"]:
            try:
                stopped = _stop(words[1:])
            except SpawnUsageError as err:
                raise UsageError(str(err)) from None
            print(f"stopped {', '.join(stopped)}" if stopped else "nothing to stop")
            return None
        try:
            tokens = shlex.split(line)
        except ValueError as err:
            raise UsageError(f"cannot read this line: {err}") from None
        if "--" not in tokens:
            raise UsageError(
                "%spawn takes: status | stop [NAME|ID ...] | [options] -- PROGRAM [ARGS...]   "
                "(%%spawn [options] runs a cell; see %%spawn?)"
            )
        cut = tokens.index("--")
        args = parse_argstring(self.spawn, shlex.join(tokens[:cut]))
        try:
            view = self._view(args.view or self.view)
            cluster = self._cluster(args, "")
            if cluster:
                self._refuse_for_program(args)
                spec, executor = self._prepare_cluster(args, cluster, view, program=tokens[cut + 1 :])
            else:
                spec, executor = self._prepare_program(args, tokens[cut + 1 :])
        except (ValueError, SpawnUsageError) as err:
            raise UsageError(str(err)) from None
        return self._execute(spec, view, executor, args.bg)

    def _prepare_program(self, args: argparse.Namespace, words: list[str]) -> tuple[RunSpec, Executor]:
        from ._spec import build_spec
        from .executors._program import ProgramRanks, parse_program

        self._refuse_for_program(args)
        program = parse_program(words)
        # a program is always a new process, and sets up its own process group
        options = {**self._options(args), "start_method": "spawn", "backend": None}
        spec = build_spec(CellSource("", label=str(program)), **options)
        spec.program = program
        return spec, ProgramRanks(spec, program)

    @staticmethod
    def _refuse_for_program(args: argparse.Namespace) -> None:
        pointless = [
            (option, why)
            for option, value, why in (
                ("--share", args.share, "a program's ranks cannot map the kernel's tensors; pass it files, or run a cell"),
                ("--out", args.out, "a program has no names to bring back; have it write files, or run a cell"),
                ("--world", args.world, "a kept world runs cells; a program starts and ends its own processes"),
                ("--start-method", args.start_method, "a program is always started as a new process"),
                ("--backend", args.backend, "a program sets up its own process group (init_process_group())"),
                ("--fresh", args.fresh or None, "a program always gets fresh ranks"),
            )
            if value is not None
        ]
        if pointless:
            option, why = pointless[0]
            raise SpawnUsageError(f"{option} does not apply to a program: {why}")

    def _prepare(self, args: argparse.Namespace, cell: str, world: str, view: RunView) -> tuple[RunSpec, Executor | None]:
        shell = self.shell
        assert shell is not None  # a magic runs in a shell
        source, cells = self._source(cell)
        options = self._options(args)
        if world:
            from .executors._world import prepare_cell

            given = {
                o
                for o, v in (
                    ("-n", args.nprocs),
                    ("--start-method", args.start_method),
                    ("--backend", args.backend),
                    ("--env", args.env),
                )
                if v is not None
            }
            spec, executor = prepare_cell(
                world, source, shell.user_ns, hidden=shell.user_ns_hidden, share=args.share, out=args.out,
                given=given, rich=bool(getattr(view, "rich", False)), **options,
            )  # fmt: skip
            spec.cell_numbers = cells
            return spec, executor
        spec = prepare(source, shell.user_ns, hidden=shell.user_ns_hidden, share=args.share, out=args.out, **options)
        spec.cell_numbers = cells
        return spec, None


def report_background_failures(*_info: object) -> None:
    """Before each cell: a background run that failed, unwaited, is not silent (told once)."""
    from .executors._supervisor import unreported_failures

    for run in unreported_failures():
        summary = str(run.error).splitlines()[0] if str(run.error) else type(run.error).__name__
        print(
            f"nbspawn: background run {run.run_id} {run.status}: {summary}\n"
            f"  run.wait() raises its error (the run is also nbspawn.last_run() or in %spawn status); logs: {run.run_dir}",
            file=sys.stderr,
        )


def _stop(names: list[str]) -> list[str]:
    """Stop these worlds and background runs (all of them if no name is given)."""
    from .executors import _world
    from .executors._supervisor import background_runs

    runs = background_runs()
    worlds = [n for n in names if n not in runs]
    chosen = [runs[n] for n in names if n in runs] if names else [r for r in runs.values() if not r.done]
    stopped = _world.stop(worlds or None) if worlds or not names else []
    for run in chosen:
        run.stop()
    for run in chosen:
        run._done.wait()
        stopped.append(run.run_id)
    return stopped


def _status_table() -> str:
    """Kept worlds and background runs, one line each."""
    from .executors import _world
    from .executors._supervisor import background_runs

    worlds, runs = _world.worlds(), background_runs()
    if not worlds and not runs:
        return "no kept worlds or background runs (%%spawn --world NAME, %%spawn --bg)"
    rows = [("name", "kind", "ranks", "state", "cells/elapsed", "pids", "logs")]
    for world in worlds.values():
        s = world.status()
        pids = ",".join(map(str, s["pids"]))
        rows.append(
            (
                s["name"],
                f"world {s['start_method']}/{s['backend']}",
                str(s["ranks"]),
                s["state"],
                f"{s['cells']} cells",
                pids,
                s["logs"],
            )
        )
    for run in runs.values():
        elapsed = (run.ended_at or time.time()) - run.started_at
        pids = ",".join(str(r.pid) for r in run.ranks if r.status == "running")
        what = "program" if run.spec.program else "cell"
        rows.append((run.run_id, f"background {what}", str(run.nprocs), run.status, f"{elapsed:.0f} s", pids or "-", run.run_dir))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def _cell_files(shell: InteractiveShell) -> dict[str, int]:
    """IPython's map from each cell's compiled filename to its execution number."""
    return dict(getattr(shell.compile, "_filename_map", {}))


def _cell_number(shell: InteractiveShell, cells: dict[str, int]) -> int:
    """The ``In[N]`` of the running cell: the last one IPython compiled (IPython 9 has already
    advanced ``execution_count`` by the time a magic runs; IPython 8 has not)."""
    return next(reversed(cells.values())) if cells else shell.execution_count
