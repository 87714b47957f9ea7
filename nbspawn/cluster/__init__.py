"""Beyond one machine: the same cell on several nodes, over ipyparallel engines.

    import ipyparallel as ipp
    rc = ipp.Cluster(n=2, engines="slurm").start_and_connect_sync()

    %%spawn --cluster rc -n 2
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t); print(t)

Engines are grouped by node (``_plan``); one engine per node is its agent and runs nbspawn's own
local launcher there (``_agent``), and the kernel sees every node's ranks as ranks of one run
(``nbspawn.cluster._executor``): one view, one failure policy.  ``_net`` finds the addresses and
interfaces the ranks must use, never from a hostname that may resolve to loopback.
"""
