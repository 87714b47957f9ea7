"""Planners: a request (typed, read at the door) and the facts of this machine, a kept world or a
cluster's nodes become a plan (``_plans``: the frozen spec, which executor, the effects it needs).
They change nothing: the port, a new world and ``--share`` are the plan's effects, done by
``nbspawn._effects`` once every check has passed.  They sit above the process code they hand
specs to (``executors/``, ``cluster/``), importing none of their process code (only the registry,
``executors._kept``, and the wire, ``cluster._wire``), and below the dispatch
(``nbspawn._dispatch``), and read no option again."""
