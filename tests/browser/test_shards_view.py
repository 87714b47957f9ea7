"""``%spawn show WORLD NAME`` in real JupyterLab (issue #43, item 4): a DTensor's shards drawn rank by
rank on the global tensor, as a learner reads them after ``distribute_tensor``: each rank's card, its
shard filled where it lies, its local shape and offset in words.

Screenshots go to test-artifacts/browser/ (NBSPAWN_TEST_ARTIFACTS overrides).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_harness import NEEDS_WIDGET, Page, open_with_nbspawn, run_cell, serve, shot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600), NEEDS_WIDGET]

WORLD = """\
%%spawn --world shards -n 4 --backend gloo --view text
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
w = distribute_tensor(torch.arange(64.).reshape(8, 8), mesh, [Shard(0), Shard(1)])
from torch.distributed.fsdp import fully_shard
net = fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)), mesh=init_device_mesh("cpu", (4,)))
"""


def _write(root: Path) -> None:
    write_notebook(
        root, "shards.ipynb", ["%load_ext nbspawn", WORLD, "%spawn show shards w", "%spawn show shards net", "%spawn stop shards"]
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    yield from serve("lab", tmp_path_factory.mktemp("shards-lab"), _write)


def test_a_dtensors_shards_are_drawn_rank_by_rank_on_the_global_tensor(lab, browser, artifacts):
    with Page(browser, width=1000, height=700) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "shards.ipynb")
        run_cell(pg, cells.nth(1))
        cells.nth(1).locator(".jp-OutputArea-output").first.wait_for(timeout=120_000)
        run_cell(pg, cells.nth(2))
        drawing = cells.nth(2).locator(".nbspawn-shards")
        drawing.wait_for(timeout=60_000)
        shot(cells.nth(2), artifacts, "show-shards.png", unhover=True)
        cards = drawing.locator("[data-rank]")
        assert cards.count() == 4
        # a 2x2 mesh, [Shard(0), Shard(1)]: each rank holds one quarter, where its mesh coordinates say
        where = {i: cards.nth(i).inner_text() for i in range(4)}
        expected = {0: "[0:4, 0:4]", 1: "[0:4, 4:8]", 2: "[4:8, 0:4]", 3: "[4:8, 4:8]"}
        for rank, span in expected.items():
            assert f"holds [4, 4] at {span}" in where[rank], where[rank]
        boxes = [cards.nth(i).locator("rect[data-shard]").bounding_box() for i in range(4)]
        outer = [cards.nth(i).locator("svg").bounding_box() for i in range(4)]
        for box, svg in zip(boxes, outer, strict=True):
            assert box and svg and 0.4 < box["width"] / svg["width"] < 0.6 and 0.4 < box["height"] / svg["height"] < 0.6
        assert boxes[1]["x"] - outer[1]["x"] > boxes[0]["x"] - outer[0]["x"]  # rank 1's quarter is to the right
        assert boxes[2]["y"] - outer[2]["y"] > boxes[0]["y"] - outer[0]["y"]  # rank 2's is below
        # an FSDP module's card: its long type name stays inside the card (issue #57, item 5)
        run_cell(pg, cells.nth(3))
        module = cells.nth(3).locator(".nbspawn-shards")
        module.wait_for(timeout=60_000)
        cards = module.locator("[data-rank]")
        assert cards.count() == 4 and "FSDPSequential" in cards.nth(0).inner_text(), cards.nth(0).inner_text()
        for i in range(4):
            spill = cards.nth(i).evaluate(
                "e => { const r = document.createRange(); r.selectNodeContents(e);"
                " return r.getBoundingClientRect().right - e.getBoundingClientRect().right; }"
            )
            assert spill <= 0.5, (i, spill)  # the words' own extent, not their box's: text can run out of its box
        shot(cells.nth(3), artifacts, "show-module.png", unhover=True)
        run_cell(pg, cells.nth(4))
