"""A cluster run in JupyterLab: the same live view as a local run, each rank's pane naming its node.

Two nodes of real ipyparallel engines on this machine (``tests/cluster/cluster_nodes.py``), 2 ranks each;
rank 2 (on node 1) fails while the others are still running.  The live view and the frozen run that
replaces it must say which node each rank ran on, and where its logs are there (``host:/path``).
Screenshots go to test-artifacts/browser/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cluster_nodes import LocalNodes
from lab_harness import (  # the servers, browser pages and helpers (the fixtures: tests/browser/conftest.py)
    NEEDS_WIDGET,
    Page,
    frozen_run,
    live_view,
    open_with_nbspawn,
    run_cell,
    serve,
    shot,
    sync_api,
    write_notebook,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), NEEDS_WIDGET]

# rank 2 fails at step 3 once the test has seen the live view (a flag file the test writes, SEEN, in
# the notebook's folder, named by its absolute path: the ranks run on the nodes' engines; 120 s at most):
# a fixed ~4 s of live view was all the live checks had (issue #55; 1.6 s once was not enough)
SEEN = "live-seen.flag"
TRAIN = """\
%%spawn --cluster rc -n 2
import os, time
rank = int(os.environ["RANK"])
for step in range(6):
    print(f"rank {rank} on node {os.environ['GROUP_RANK']}: step {step}", flush=True)
    time.sleep(0.4)
    if rank == 2 and step == 3:
        end = time.time() + 120
        while not os.path.exists(SEEN_PATH) and time.time() < end:
            time.sleep(0.05)
        raise ValueError("rank 2 diverged: loss is nan")
"""


@pytest.fixture(scope="module")
def nodes():
    with LocalNodes(nodes=2, engines_per_node=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def lab(tmp_path_factory, nodes):
    connect = (
        f"%load_ext nbspawn\nimport ipyparallel as ipp\nrc = ipp.Client({nodes.url_file!r})\nrc.wait_for_engines(2, timeout=60)"
    )

    def write(root: Path) -> None:
        write_notebook(root, "cluster.ipynb", [connect, TRAIN.replace("SEEN_PATH", repr(str(root / SEEN)))])

    yield from serve("lab", tmp_path_factory.mktemp("cluster-lab"), write)


def test_lab_cluster_run_names_each_ranks_node(lab, browser, artifacts):
    with Page(browser, width=1200, height=1000) as p:
        pg = p.page
        cells = open_with_nbspawn(pg, lab, "cluster.ipynb")

        run = cells.nth(1)
        run_cell(pg, run)
        view = live_view(run, widget=True)
        sync_api.expect(view.locator(".nbs-Chip")).to_have_count(4)
        view.locator(".nbs-Chip[data-rank='3']").click()
        title = view.locator(".nbs-Pane[data-rank='3'] .nbs-Pane-title")
        sync_api.expect(title).to_have_text(re.compile(r"^rank 3 · node 1 \(node\d\)$"))
        sync_api.expect(view.locator(".nbs-Pane[data-rank='3'] .nbs-Output")).to_contain_text(
            "rank 3 on node 1: step 1", timeout=60_000
        )
        shot(view, artifacts, "lab-cluster-live.png", unhover=True)
        (lab.root / SEEN).write_text("")  # rank 2 fails now

        frozen = frozen_run(run)
        # the failed rank's pane: its node and its traceback
        frozen.locator(".nbs-Chip[data-rank='2']").click()
        failed = frozen.locator(".nbs-Pane[data-rank='2']")
        sync_api.expect(failed.locator(".nbs-Pane-title")).to_have_text(re.compile(r"^rank 2 · node 1 \(node\d\)$"))
        sync_api.expect(failed).to_contain_text("rank 2 diverged: loss is nan")
        error = run.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").last
        sync_api.expect(error).to_contain_text(re.compile(r"rank 2 on node 1 \(node\d\)"))
        path = failed.locator(".nbs-File").first.get_attribute("title") or ""
        assert re.match(r"^[^/\s]+:/.+/2/stdout\.log", path), path  # host:/path on its node
        shot(run, artifacts, "lab-cluster-frozen.png", unhover=True)
