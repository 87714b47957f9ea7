"""How a run's ranks are started and seen to end: one supervisor, several executors.

Every shape of work takes the same path (``docs/architecture.md``): ``%%spawn`` (``nbspawn._magic``) or
``launch`` (``nbspawn._api``) writes a request; ``nbspawn._dispatch`` checks it and makes a frozen
:class:`~nbspawn._spec.RunSpec` and an executor before any process starts; :func:`execute` starts the
ranks through the executor; ranks report events (output, displays, their end, errors, stacks); one
:class:`~nbspawn._runstate.Run` holds the state; views render it.  This package is the middle of that:

* ``_supervisor``: :func:`execute` and the one supervision loop with the failure policy (the first
  failing rank is the root cause; the others get SIGINT, or their stacks dumped and SIGTERM, then
  SIGKILL after the grace period; timeout, interrupt and Stop the same way) and the clean-up;
* ``_base.Executor``: what an executor answers (start, what to wait on, how a rank ended, clean-up),
  with defaults for ranks that are this machine's processes;
* ``_fresh.FreshRanks``: new rank processes per cell (``torch.multiprocessing.start_processes``);
* ``_world.WorldCell``: a cell handed to the ranks of a kept world, which live on after it;
* ``_program.ProgramRanks``: a program (``%spawn -- train.py``) started per rank with ``Popen``;
* ``_procs``: signalling, killing and reaping process groups; ``_reaper``: what the kernel's death
  leaves behind; ``_registry``: background runs and the last run.

(A cluster's executor, ``nbspawn.cluster._executor.ClusterRanks``, lives with the cluster code.)

The package names nothing itself: ``executors._kept`` (the kept worlds' registry, which the planners
ask) is imported without torch, while the executors import it at their top.

    >>> from nbspawn._dispatch import start
    >>> from nbspawn._request import RunRequest, Settings
    >>> from nbspawn._source import CellSource
    >>> run = start(RunRequest.of(CellSource("print(1)"), settings=Settings(nprocs=2, start_method="fork")))
    >>> run.status
    'succeeded'
"""
