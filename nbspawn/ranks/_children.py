"""What a rank's children get of its cell: the cell's functions and classes, by value.

A ``torchrun`` script's DataLoader workers, ``multiprocessing.Pool`` workers and ``mp.Process``
children find a function or class of the script by importing the script again (spawn, forkserver)
or by having it already (fork).  A rank's cell is no file: what it defines lives in ``__main__``,
which a spawn or forkserver child cannot import, so pickling a ``Dataset`` class, a ``collate_fn``
or a ``worker_init_fn`` defined in a cell fails (``attribute lookup DS on __main__ failed``).

:func:`install` makes ``multiprocessing``'s own pickler (``ForkingPickler``: what starts spawn and
forkserver children and what fills every ``multiprocessing`` and ``torch.multiprocessing`` queue)
send a function or class of ``__main__`` by value, with cloudpickle, as the kernel already sends
them to spawned ranks.  Everything else pickles as before (a tensor still travels through shared
memory).  Whatever arrives this way installs the same rule in the child, so the child's answers (a
batch of a dataclass defined in the cell, a ``Pool`` result) come back by value too.  A definition
that arrives where its name is bound in the cell's namespace is that binding, as unpickling by
reference would give: a batch a worker made of the cell's ``Batch`` is a ``Batch`` in the rank
(``isinstance`` holds), whether the worker was forked or spawned.

Why this and not the alternatives: making every child fork (where that is safe) would break the
rule that a rank's children never inherit a poisoned CUDA state, and would leave the user's own
``multiprocessing_context="spawn"`` broken; writing the cell to a file that children import would
run the whole cell again in every child (a script's children re-run only its definitions and its
``if __name__ == "__main__"``-less top level, which a notebook cell, all top level, is not).

This module is pickled *by value* itself (:func:`install` registers it with cloudpickle): a child
needs only cloudpickle to receive a cell's definitions, never nbspawn (nor torch, for a ``Pool`` of
plain Python functions).
"""

from __future__ import annotations

import sys
import types
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle

_MAIN = "__main__"


main_names: dict[str, Any] | None = None  # the cell's namespace, in a rank and its forked children


def install(namespace: dict[str, Any] | None = None) -> None:
    """From now on, this process's children receive its ``__main__`` functions and classes by value;
    ``namespace`` (a rank's cell namespace) is where such a definition coming back is looked up."""
    module = sys.modules.get(__name__)
    if module is not None:  # a spawned child got this function by value, without its module
        cloudpickle.register_pickle_by_value(module)
        if namespace is not None:
            module.main_names = namespace  # type: ignore[attr-defined]  # not a global here: it would be pickled with the function
    ForkingPickler.reducer_override = _by_value  # type: ignore[method-assign]  # the pickle protocol's hook


def _by_value(pickler: Any, obj: Any) -> Any:
    """``ForkingPickler.reducer_override``: a function or class of ``__main__`` goes by value; anything
    else as before (``NotImplemented``)."""
    if isinstance(obj, (types.FunctionType, type)) and getattr(obj, "__module__", None) == _MAIN:
        return cloudpickle.loads, (cloudpickle.dumps(_Arrival(obj)),)
    return NotImplemented


class _Arrival:
    """A definition on its way to a child: unpickled there as :func:`_arrive` called on it."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __reduce__(self) -> tuple:
        return _arrive, (self.obj,)


def _arrive(obj: Any) -> Any:
    """Where it arrives: the same rule for what this process sends on, and the definition, or what
    the cell's namespace binds to its name (a batch's class made the rank's own again)."""
    install()
    module = sys.modules.get(__name__)  # this module as imported here (this function may have come by value)
    names = module.main_names if module is not None else None
    same = names.get(obj.__qualname__) if names is not None else None
    if same is not None and type(same) is type(obj) and getattr(same, "__qualname__", None) == obj.__qualname__:
        return same
    return obj
