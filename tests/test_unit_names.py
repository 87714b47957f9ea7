"""Which names a cell needs from the kernel and which it binds (``handoff._names``), from its AST; and
the check that finds what cannot travel with the pickler that sends it."""

from __future__ import annotations

import ast
import threading

import pytest
import torch

from nbspawn.errors import SpawnUsageError
from nbspawn.handoff import _shm
from nbspawn.handoff._names import names_bound, names_needed, pack_namespace


def needed(source: str) -> set[str]:
    return names_needed(ast.parse(source))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("loss = model(x)\nloss.backward()", {"model", "x"}),  # bound before it is read
        ("loss = loss * 2", {"loss"}),  # read to bind it
        ("loss += 1", {"loss"}),
        ("print(loss)\nloss = 1", {"print", "loss"}),
        ("import torch\ntorch.ones(1)", set()),
        ("def f():\n    return lr\nlr = 1\nf()", {"lr"}),  # a body reads where it is defined
        ("lr = 1\ndef f():\n    return lr", set()),
        ("class Net:\n    pass\nNet()", set()),
        ("with ctx() as c:\n    y = 1\nprint(c, y)", {"ctx", "print"}),  # a with body runs
        ("if flag:\n    y = 1\nprint(y)", {"flag", "print", "y"}),  # maybe not bound: the kernel's is sent
        ("for i in range(3):\n    y = i\nprint(y)", {"range", "print", "y"}),
        ("try:\n    y = f()\nexcept Exception:\n    pass\ny", {"f", "Exception", "y"}),
        ("y: int\nprint(y)", {"int", "print", "y"}),  # an annotation alone binds nothing
        ("x = 1\ndel x\nx", {"x"} - {"x"}),  # deleted after it was bound: the cell's own NameError, not the kernel's x
        ("def g():\n    global z\n    z = 1", {"z"}),
    ],
)
def test_names_needed_are_those_read_before_the_cell_surely_binds_them(source, expected):
    assert needed(source) == expected


def test_names_bound_are_the_top_level_bindings():
    source = "import os.path as p, sys\nfrom m import a as b\nx, (y, z) = 1, (2, 3)\nfor i in r: pass\ndef f(q): w = 1\nclass C: v = 1\ndel k\n(n := 1)\n[c for c in r]"
    assert names_bound(ast.parse(source)) == {"p", "sys", "b", "x", "y", "z", "i", "f", "C", "k", "n"}


def test_a_world_is_sent_none_of_its_own_names():
    user_ns = {"lr": 0.1, "loss": 3.0, "model": "m"}
    payload = pack_namespace(ast.parse("print(lr, loss, model)"), user_ns, world="w", owned={"loss", "model"})
    assert payload.obj == {"lr": 0.1}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (threading.Lock(), "cannot pickle '_thread.lock' object"),
        ((torch.ones(2, requires_grad=True) * 2).sum(), "Cowardly refusing to serialize non-leaf tensor"),
    ],
)
def test_what_cannot_travel_is_found_by_the_pickler_that_sends_it(value, why):
    with pytest.raises(Exception, match=why):
        _shm.check_travels({"v": value})
    with pytest.raises(SpawnUsageError, match=f"cannot send 'v' .*{why}.*: lr, v\\. Bind 'v' in a cell on the world"):
        pack_namespace(ast.parse("print(v, lr)"), {"v": value, "lr": 0.1}, world="w")


def test_the_check_moves_no_tensor_data():
    big = torch.ones(1000)
    _shm.check_travels({"t": big, "m": torch.nn.Linear(2, 2)})
    assert not big.is_shared()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(a, *b, c=d, **e):\n    g = a\n    return g + h", {"d", "h"}),
        ("f = lambda x: x + y", {"y"}),
        ("[x * k for x in xs if x]", {"k", "xs"}),
        ("{a: b for a, b in pairs}", {"pairs"}),
        ("[(x, y) for x in xs for y in x]", {"xs"}),
        ("def f():\n    global n\n    n = 1", {"n"}),
        ("@wrap\ndef f(): pass", {"wrap"}),
        ("def f(x: Batch) -> Out:\n    return x", {"Batch", "Out"}),  # annotations are read where f is defined
    ],
)
def test_a_functions_own_names_and_a_comprehensions_variables_are_not_read_from_the_kernel(source, expected):
    assert needed(source) == expected
