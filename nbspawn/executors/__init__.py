"""How a run's ranks are started and seen to end: one supervisor, several executors.

Every shape of work takes the same path: ``%%spawn`` (``nbspawn._magic``) or ``launch``
(``nbspawn._api``) validates a :class:`~nbspawn._spec.RunSpec` before any process starts; an
executor starts the ranks; ranks report events (output, displays, their end, errors, stacks); one
:class:`~nbspawn._run.Run` holds the state; views render it.  This package is the middle of that:

* ``_supervisor``: :func:`execute` and the one supervision loop with the failure policy (the first
  failing rank is the root cause; the others get SIGINT, or their stacks dumped and SIGTERM, then
  SIGKILL after the grace period; timeout, interrupt and Stop the same way) and the clean-up;
* ``_supervisor.FreshRanks``: new rank processes per cell (``torch.multiprocessing.start_processes``);
* ``_world.WorldCell``: a cell handed to the ranks of a kept world, which live on after it;
* ``_program.ProgramRanks``: a program (``%spawn -- train.py``) started per rank with ``Popen``.

An executor only answers: start the ranks (pids), what becomes ready when a rank's cell ends or it
dies, how it ended, and what to clean up; the supervisor does the rest, identically for all.

    >>> from nbspawn._api import prepare
    >>> from nbspawn._source import CellSource
    >>> from nbspawn.executors import execute
    >>> run = execute(prepare(CellSource("print(1)"), {}, nprocs=2, start_method="fork"))
    >>> run.status
    'succeeded'
"""

from ._supervisor import Executor, FreshRanks, background_runs, execute, last_run

__all__ = ["Executor", "FreshRanks", "background_runs", "execute", "last_run"]
