"""``%spawn show WORLD NAME`` through a real kernel (issue #43, item 4): what a name holds on each rank of
a kept world, in words and drawn; a DTensor's shards where they lie, an FSDP2 model's sharded
parameters; a name, a world or a moment that cannot be shown refused in one line; and the look
changes nothing (the world's cell count, ``nbspawn.last_run()``)."""

from __future__ import annotations

import os
import signal

from kernel_harness import dead_to_the_kernel, execute, ok, run

WORLD = """\
%%spawn --world {world} -n 4 --backend gloo
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
mesh = init_device_mesh("cpu", (4,))
rows = distribute_tensor(torch.arange(32.).reshape(8, 4), mesh, [Shard(0)])
same = distribute_tensor(torch.ones(3, 3), mesh, [Replicate()])
model = fully_shard(torch.nn.Linear(8, 4), mesh=mesh)
plain = torch.zeros(5, 2, dtype=torch.int64)
"""


def shown(kernel, line: str) -> dict:
    result = execute(kernel.client, line, timeout=120)
    assert result.status == "ok", result.error_text
    (data,) = [o["data"] for o in result.outputs if o.get("msg_type") == "display_data"]
    return data


def test_a_worlds_names_are_shown_rank_by_rank(kernel, world):
    ok(kernel, WORLD.format(world=world), timeout=180)
    before = ok(kernel, "print(nbspawn.last_run().run_id)").stdout.strip()

    rows = shown(kernel, f"%spawn show {world} rows")["text/plain"].splitlines()
    assert rows[0] == f"rows on world {world!r}, rank by rank:"
    for rank in range(4):
        assert rows[1 + rank].endswith(
            f"[8, 4] float32 on mesh [4] [Shard(dim=0)]: holds [2, 4] at [{2 * rank}:{2 * rank + 2}, 0:4] on cpu (32 B)"
        ), rows
    html = shown(kernel, f"%spawn show {world} rows")["text/html"]
    assert html.count("<rect data-shard") == 4 and "<script" not in html

    same = shown(kernel, f"%spawn show {world} same")["text/plain"]
    assert same.count("[Replicate()]: holds [3, 3] at [0:3, 0:3]") == 4, same
    model = shown(kernel, f"%spawn show {world} model")["text/plain"]
    # FSDP2: 36 parameters, each rank holds its quarter of each (weight rows [2, 8], bias [1])
    assert model.count("36 parameters in 2 tensors, this rank holds 36 B on cpu; weight is [Shard(dim=0)] on mesh [4]") == 4, (
        model
    )
    weight = shown(kernel, f"%spawn show {world} model.weight")["text/plain"]
    assert "rank 3: " in weight and "holds [1, 8] at [3:4, 0:8]" in weight, weight  # Linear(8, 4): 4 rows
    plain = shown(kernel, f"%spawn show {world} plain")["text/plain"]
    assert plain.count("torch.Tensor [5, 2] int64 on cpu (80 B)") == 4, plain

    # a look changes nothing: the next cell is the world's second, and the last run is still the user's
    assert ok(kernel, "print(nbspawn.last_run().run_id)").stdout.strip() == before
    again = ok(kernel, f"%%spawn --world {world}\nprint('cell')")
    assert "cell" in again.stdout
    assert ok(kernel, "print(nbspawn.last_run().world_cell)").stdout.strip() == "2"


def test_what_cannot_be_shown_is_said_in_one_line(kernel, world):
    ok(kernel, f"%%spawn --world {world} -n 2\nx = 1")
    for line, said in [
        (f"%spawn show {world} nope", f"world '{world}' has no nope on any rank: no name 'nope' on this rank"),
        (f"%spawn show {world} x.real.y", "x.real has no attribute 'y'"),
        (f"%spawn show {world} 1x", "'1x' is not a name"),
        ("%spawn show nosuchworld x", "no kept world named 'nosuchworld'"),
    ]:
        result = run(kernel, line)
        assert result.status == "error" and result.error.ename == "UsageError", (line, result.error_text)
        assert said in result.error.evalue and "Traceback" not in result.error_text, (line, result.error.evalue)
    assert "rank 1: int: 1" in shown(kernel, f"%spawn show {world} x")["text/plain"]
    # lost: a rank that died since is said, and nothing is shown
    pid = int(ok(kernel, f"%%spawn --world {world}\nimport os\nprint(os.getpid())").stdout.split("[rank1]: ")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    dead_to_the_kernel(kernel, world, 1)  # not a fixed 0.5 s: what follows finds it dead, not dying
    lost = run(kernel, f"%spawn show {world} x")
    assert lost.status == "error" and "was lost between cells: rank 1 died (SIGKILL)" in lost.error.evalue, lost.error_text
