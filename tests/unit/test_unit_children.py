"""What a rank's children get of its cell (``ranks._children``), between two real processes: a cell's
function and class reach a child that never imports nbspawn (nor torch), and what the child sends back
is the cell's own class again."""

from __future__ import annotations

import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import cloudpickle
import pytest

from nbspawn.ranks import _children

CHILD = """
import pickle, sys
from multiprocessing.reduction import ForkingPickler
double, box = pickle.loads(sys.stdin.buffer.read())
box.value = double(21)
sys.stdout.buffer.write(bytes(ForkingPickler.dumps(box)))  # the child sends the cell's class back
sys.stderr.write(f"{'nbspawn' in sys.modules} {'torch' in sys.modules}")
"""


@pytest.fixture
def rank_namespace():
    """A rank's cell namespace with the rule installed; this process's pickler as it was afterwards."""
    namespace: dict = {"__name__": "__main__"}
    exec("def double(v):\n    return 2 * v\nclass Box:\n    pass\n", namespace)  # a cell
    _children.install(namespace)
    yield namespace
    del ForkingPickler.reducer_override
    cloudpickle.unregister_pickle_by_value(_children)
    _children.main_names = None


def test_a_cells_definitions_reach_a_child_without_nbspawn_and_come_back_as_the_cells_own(rank_namespace):
    sent = ForkingPickler.dumps((rank_namespace["double"], rank_namespace["Box"]()))
    child = subprocess.run([sys.executable, "-c", CHILD], input=bytes(sent), capture_output=True, check=True)
    assert child.stderr.decode() == "False False"  # cloudpickle is all the child needed
    back = ForkingPickler.loads(child.stdout)
    assert type(back) is rank_namespace["Box"] and back.value == 42


def test_without_the_rule_a_cells_class_cannot_be_pickled():
    namespace: dict = {"__name__": "__main__"}
    exec("class Box:\n    pass\n", namespace)  # a cell
    with pytest.raises(Exception, match="attribute lookup Box on __main__ failed"):
        ForkingPickler.dumps(namespace["Box"]())
