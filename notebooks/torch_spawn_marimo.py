"""nbspawn in marimo: torch's own spawn call, its ranks' output live in the cell.

Open it with `marimo edit notebooks/torch_spawn_marimo.py`, or run it as a script:
`python notebooks/torch_spawn_marimo.py` (the ranks' lines are then printed as [rank0]: ...).
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App()


@app.cell
def _():
    import marimo as mo

    mo.md(
        """
        # torch's `spawn`, in marimo

        marimo has no cell magics, so `%%spawn` is not for it; `nbspawn.spawn` is torch's own call
        (`torch.multiprocessing.spawn(fn, args, nprocs)`) and works here: a function defined in a
        cell runs on every rank under `fork`, `spawn` and `forkserver`, each rank's output is drawn
        in the cell while it runs and stays there when it ends, a failing rank is named, and marimo's
        Stop button stops the ranks.
        """
    )
    return


@app.cell
def _():
    import os

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import nbspawn
    return dist, nbspawn, nn, os, torch


@app.cell
def _(dist, nn, os, torch):
    def train(rank, world_size, port):
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Linear(10, 5))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(3):
            loss = nn.functional.mse_loss(model(torch.randn(20, 10)), torch.randn(20, 5))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step}: loss {loss.item():.3f}")
        dist.destroy_process_group()
        return loss.item()
    return (train,)


@app.cell
def _(nbspawn, train):
    losses = nbspawn.spawn(train, args=(2, 29513), nprocs=2, start_method="spawn")
    print("each rank's last loss:", losses)
    return


if __name__ == "__main__":
    app.run()
