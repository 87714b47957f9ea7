"""Planners: a request (typed, read at the door) and the facts of this machine, a kept world or a
cluster's nodes become a frozen spec and its executor.  They sit above the process code they hand
specs to (``executors/``, ``cluster/``) and below the dispatch (``nbspawn._dispatch``), and read no
option again."""
