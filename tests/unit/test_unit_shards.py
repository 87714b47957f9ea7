"""The pure parts of ``%spawn show WORLD NAME``: a rank's description of what it holds
(``ranks._describe``, on real torch values; a DTensor needs a process group: tests/kernel/test_show_shards.py)
and how the ranks' answers are written and drawn (``views._shards_html``)."""

from __future__ import annotations

import re

import torch

from nbspawn.ranks._describe import describe
from nbspawn.views._shards_html import describe_line, shown_bundle, span_text

DTENSOR = {
    "type": "torch.distributed.tensor.DTensor",
    "dtensor": True,
    "shape": [8, 4],
    "dtype": "float32",
    "device": "cpu",
    "mesh_shape": [2, 2],
    "mesh_dims": ["dp", "tp"],
    "mesh_ranks": [0, 1, 2, 3],
    "placements": ["Shard(dim=0)", "Replicate()"],
    "local_shape": [4, 4],
    "bytes": 64,
    "requires_grad": False,
}


def test_a_rank_describes_names_tensors_modules_and_paths_into_them():
    namespace = {"t": torch.zeros(3, 2, dtype=torch.float16), "net": torch.nn.Linear(4, 2), "n": 7}
    assert describe(namespace, "t") == {
        "type": "torch.Tensor",
        "shape": [3, 2],
        "dtype": "float16",
        "device": "cpu",
        "bytes": 12,
        "requires_grad": False,
    }
    net = describe(namespace, "net")
    assert net["type"] == "torch.nn.modules.linear.Linear" and (net["parameters"], net["tensors"], net["bytes"]) == (10, 2, 40)
    assert [p["name"] for p in net["params"]] == ["weight", "bias"] and net["devices"] == ["cpu"]
    assert describe(namespace, "net.weight")["shape"] == [2, 4]
    assert describe(namespace, "n") == {"type": "int", "repr": "7"}
    assert describe(namespace, "gone") == {"missing": "no name 'gone' on this rank"}
    assert describe(namespace, "net.nope.x") == {"missing": "net has no attribute 'nope'"}
    assert len(describe({"s": "x" * 1000}, "s")["repr"]) == 200


def test_the_ranks_answers_in_words():
    assert span_text([4, 4], [4, 0]) == "[4:8, 0:4]"
    line = describe_line({"rank": 2, **DTENSOR, "offset": [4, 0]})
    assert line == (
        "rank 2: torch.distributed.tensor.DTensor [8, 4] float32 on mesh [2, 2] (dp, tp) "
        "[Shard(dim=0), Replicate()]: holds [4, 4] at [4:8, 0:4] on cpu (64 B)"
    )
    empty = describe_line({"rank": 3, **DTENSOR, "local_shape": [0, 4], "offset": [8, 0]})  # an uneven split's empty shard
    assert "holds [0, 4] on cpu" in empty
    assert describe_line({"rank": 1, "missing": "no name 'x' on this rank"}) == "rank 1: no name 'x' on this rank"
    big = describe_line(
        {"rank": 0, "type": "torch.Tensor", "shape": [1000, 1000], "dtype": "float32", "device": "cuda:0", "bytes": 4 * 10**6}
    )
    assert big.endswith("on cuda:0 (4 MB)")


def test_each_ranks_shard_is_drawn_where_it_lies_and_nothing_runs():
    answers = [{"rank": r, **DTENSOR, "offset": [4 * (r // 2), 0]} for r in range(4)]
    bundle = shown_bundle("w", "x", answers)
    html = bundle["text/html"]
    assert (
        isinstance(html, str)
        and "<script" not in html
        and " on" not in re.sub(r"\bon (world|mesh|cpu)", "", html).lower().split("style")[0]
    )
    shards = re.findall(r'<rect data-shard x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', html)
    assert len(shards) == 4
    (x0, y0, w0, h0), (_, y2, _, _) = (tuple(map(float, s)) for s in (shards[0], shards[2]))
    assert (x0, y0) == (0.0, 0.0) and y2 == h0 and w0 == h0  # rows 4:8 below rows 0:4; all 4 columns
    assert "holds [4, 4] at [4:8, 0:4]" in bundle["text/plain"]
    assert "&lt;" in shown_bundle("<w>", "x", answers)["text/html"]  # the names are escaped
