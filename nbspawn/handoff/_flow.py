"""Which kernel names a cell reads, and which it binds, from its AST: definite assignment.

A spawned rank is sent only the kernel names its cell needs (``_names``), and a name that cannot be
pickled is refused before any rank starts.  So a name the cell binds before reading it must not be
sent: a training loop's ``loss = model(x).sum()`` would otherwise drag the kernel's old, non-leaf
``loss`` along, which torch refuses to pickle.  The two ways to be wrong are not alike: a name left
out that the cell does read is a ``NameError`` in a rank (or another value than the kernel has); a
name sent that is not needed costs something only when it cannot travel.  Where in doubt, a name is
needed.

The rule, statement by statement inside every block: a name is needed where it is read and the
kernel's value may still be there, that is on some path from the top of the cell to that read the
cell has neither bound nor deleted it.  What the analysis tracks at each point is the set of names
*touched* (bound or deleted) on every path that reaches it.  On any one path that set only grows
(the kernel's value, once replaced or deleted, never comes back), which is what keeps it simple:

- ``if``/``else``, ``match``: a name is touched after them if every branch (and, for a ``match``
  with no irrefutable case, the path where none matched) touched it.
- ``for``: the target is bound inside the body, which may run zero times, so neither it nor what the
  body binds is touched after the loop, but the body's reads after its own bindings are not needed
  (every iteration starts from at least what the first did).  ``else`` runs from the state before
  the loop; after it, the state is what both the ``else`` and every ``break`` had.
- ``while``: likewise; ``while True`` is left only by ``break``, so what the body binds before every
  ``break`` is touched after it.
- ``try``: an exception may leave the body anywhere, so a handler (and the reads of ``finally``)
  start from what was touched before the ``try``; after the statement, what the body and ``else``,
  or a handler, touched.  ``except E as e`` binds ``e`` and deletes it at the end: either way the
  kernel's ``e`` is gone.
- ``with`` runs its body (a context manager rarely swallows an exception), except
  ``suppress(...)``, which is read as a ``try``.
- ``raise``, ``return``, ``break``, ``continue``: nothing after them in their block runs, and names
  read there are not needed.
- ``x += 1`` and ``del x`` read ``x`` first; ``del x`` then touches it.  ``import`` binds (``from m
  import *`` binds nothing known, so it is taken to bind nothing).  ``x: int`` alone binds nothing.
- Expressions run left to right; ``:=`` binds where it runs, but under ``and``/``or``, the branches
  of ``a if c else b``, later links of a chained comparison, or in ``assert`` (gone under ``-O``),
  it may not run.
- A comprehension is a scope of its own: its targets are local, its first iterable is read where
  it stands, and its other reads as if at that point; what its ``:=`` binds may not run.
- A function or lambda body is not run where it is defined, but its free reads (the names it
  reads that are not its own locals) count as reads *at its definition*.  That is safe because
  a function can only be called after it is defined and what is touched never becomes untouched;
  it is conservative for ``def step(): ... model ...`` above ``model = ...``: the kernel's
  ``model`` is sent, and refused only if it cannot travel.  A name a function declares ``global``
  is followed through the function's own body, so ``global n; n = 1`` needs nothing; it is the
  module's name, whatever the functions around it have.  A class body is run where it stands, in
  its own scope; the methods and comprehensions in it skip that scope, and a name the body binds
  is read from the class or else the module, never from a function around it (as Python does);
  one it deletes (``del``, ``except ... as``) is the module's again, so it is needed wherever read.
  Annotations are taken as read (they are evaluated at module level unless ``from __future__
  import annotations``).

Dynamic access (``globals()``, ``exec``, ``eval``, ``locals()``) is not seen: a cell that reads a
name only through one of them gets it under ``fork`` alone, or through ``--share``.

``tests/unit/test_unit_names_generated.py`` holds the rule to Python: generated cells run with every
kernel name and with only the needed ones must end alike.
"""

from __future__ import annotations

import ast
from typing import TypeAlias

_State: TypeAlias = "frozenset[str] | None"  # names touched on every path here; None: never reached
_Reads: TypeAlias = "tuple[set[str], set[str]]"  # read from the scope around, and from the module
_NOTHING: frozenset[str] = frozenset()
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_NAMED_CAPTURES = (ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.MatchMapping)


def names_needed(tree: ast.Module) -> set[str]:
    """Names the cell may read while the kernel's value is still there: the only ones it can need
    from the kernel (builtins and IPython's names among them: the caller drops those)."""
    scope = _Scope("module")
    scope.body(tree.body, _NOTHING)
    return scope.needed


def names_bound(tree: ast.AST) -> set[str]:
    """Names the code binds (or deletes) in its own scope, whether or not every path does:
    assignments, imports, functions, classes, ``for``/``with``/``except``/``match`` targets, ``del``,
    ``:=`` (in comprehensions too); not the locals of the functions it defines, nor comprehension
    variables.  For a world: the names a cell makes its own."""
    bound: set[str] = set()
    _collect(tree, bound, set(), set())
    return bound


def _join(*states: _State) -> _State:
    reached = [state for state in states if state is not None]
    return frozenset.intersection(*reached) if reached else None


def _bind(state: _State, *names: str) -> _State:
    return None if state is None else state.union(names)


class _Scope:
    """One scope's walk (``kind``: module, function, class; a comprehension is a function).

    ``local``: names it never reads from outside (a function's locals, a comprehension's targets).
    ``globals_``: names whose reads it does not take from the scope around it but from the module's
    (a function's ``global`` ones; in a class body, the names the body binds: Python looks those up
    in the class, then in the module, never in an enclosing function).  What it reads from outside
    is ``needed`` (from the scope around it, where the name may be a closure) and ``needed_global``
    (from the module, whatever the scopes between have).
    """

    def __init__(
        self,
        kind: str,
        local: frozenset[str] = _NOTHING,
        globals_: frozenset[str] = _NOTHING,
        fleeting: frozenset[str] = _NOTHING,
    ) -> None:
        self.kind = kind
        self.local = local
        self.globals_ = globals_
        self.fleeting = fleeting  # a class body's names it may delete: the module's value shows through again
        self.needed: set[str] = set()
        self.needed_global: set[str] = set()
        self.breaks: list[list[_State]] = []  # per enclosing loop: the states its `break`s leave it with

    # -- reads --------------------------------------------------------------------------------------

    def read(self, name: str, state: frozenset[str]) -> None:
        if name not in self.local and (name not in state or name in self.fleeting):
            (self.needed_global if name in self.globals_ else self.needed).add(name)

    def read_inner(self, reads: _Reads, state: frozenset[str]) -> None:
        """What a function, class body or comprehension defined here reads from outside it."""
        free, module = reads
        for name in free:  # a class body is not a scope the functions in it see
            if self.kind == "class":
                self.needed.add(name)
            elif name not in self.local:
                self.read(name, state)
        for name in module:  # only a module, or a function's own `global` name it surely bound, has it
            if self.kind == "module" or (self.kind == "function" and name in self.globals_):
                self.read(name, state)
            else:
                self.needed_global.add(name)

    # -- statements ---------------------------------------------------------------------------------

    def body(self, statements: list[ast.stmt], state: _State) -> _State:
        for statement in statements:
            if state is None:
                return None  # what follows a raise, return, break or continue never runs
            handler = getattr(self, f"_s_{type(statement).__name__}", None)
            state = handler(statement, state) if handler is not None else self._unknown(statement, state)
        return state

    def _unknown(self, node: ast.AST, state: frozenset[str]) -> _State:
        """A statement this module does not know (a newer Python's): all its names are read, none bound."""
        for name in (n.id for n in ast.walk(node) if isinstance(n, ast.Name)):
            self.read(name, state)
        return state

    def _s_Expr(self, node: ast.Expr, state: frozenset[str]) -> _State:
        return self.expr(node.value, state)

    def _s_Pass(self, node: ast.stmt, state: frozenset[str]) -> _State:
        return state

    _s_Global = _s_Nonlocal = _s_Pass  # which scope a name is in: decided by _function_reads

    def _s_Break(self, node: ast.Break, state: frozenset[str]) -> _State:
        if self.breaks:
            self.breaks[-1].append(state)
        return None

    def _s_Continue(self, node: ast.Continue, state: frozenset[str]) -> _State:
        return None

    def _s_Return(self, node: ast.Return, state: frozenset[str]) -> _State:
        if node.value is not None:
            self.expr(node.value, state)
        return None

    def _s_Raise(self, node: ast.Raise, state: frozenset[str]) -> _State:
        for part in (node.exc, node.cause):
            if part is not None:
                state = self.expr(part, state)
        return None

    def _s_Assign(self, node: ast.Assign, state: frozenset[str]) -> _State:
        state = self.expr(node.value, state)
        for target in node.targets:
            state = self.store(target, state)
        return state

    def _s_AugAssign(self, node: ast.AugAssign, state: frozenset[str]) -> _State:
        if isinstance(node.target, ast.Name):  # `x += 1` reads x first
            self.read(node.target.id, state)
            return _bind(self.expr(node.value, state), node.target.id)
        return self.expr(node.value, self.store(node.target, state))

    def _s_AnnAssign(self, node: ast.AnnAssign, state: frozenset[str]) -> _State:
        if node.value is not None:
            state = self.expr(node.value, state)
        state = self.expr(node.annotation, state)
        if not isinstance(node.target, ast.Name):
            return self.store(node.target, state)
        return state if node.value is None else _bind(state, node.target.id)  # `x: int` alone binds nothing

    def _s_Delete(self, node: ast.Delete, state: frozenset[str]) -> _State:
        for target in node.targets:
            state = self.delete(target, state)
        return state

    def _s_Import(self, node: ast.Import | ast.ImportFrom, state: frozenset[str]) -> _State:
        return _bind(state, *_imported(node))

    _s_ImportFrom = _s_Import

    def _s_Assert(self, node: ast.Assert, state: frozenset[str]) -> _State:
        after = self.expr(node.test, state)
        if node.msg is not None:
            self.expr(node.msg, after)
        return state  # under -O the test is not run: what its `:=` binds may not be

    def _s_If(self, node: ast.If, state: frozenset[str]) -> _State:
        state = self.expr(node.test, state)
        return _join(self.body(node.body, state), self.body(node.orelse, state))

    def _s_For(self, node: ast.For | ast.AsyncFor, state: frozenset[str]) -> _State:
        state = self.expr(node.iter, state)
        self.breaks.append([])
        self.body(node.body, self.store(node.target, state))  # every pass starts from at least this
        breaks = self.breaks.pop()
        return _join(self.body(node.orelse, state), *breaks)

    _s_AsyncFor = _s_For

    def _s_While(self, node: ast.While, state: frozenset[str]) -> _State:
        state = self.expr(node.test, state)
        self.breaks.append([])
        self.body(node.body, state)
        breaks = self.breaks.pop()
        forever = isinstance(node.test, ast.Constant) and bool(node.test.value)
        return _join(None if forever else self.body(node.orelse, state), *breaks)

    def _s_With(self, node: ast.With | ast.AsyncWith, state: frozenset[str]) -> _State:
        before = state
        for item in node.items:
            state = self.expr(item.context_expr, state)
            if item.optional_vars is not None:
                state = self.store(item.optional_vars, state)
        after = self.body(node.body, state)
        return _join(after, before) if any(_suppresses(item.context_expr) for item in node.items) else after

    _s_AsyncWith = _s_With

    def _s_Try(self, node: ast.Try, state: frozenset[str]) -> _State:
        before = state
        after_body = self.body(node.body, state)
        ends = [None if after_body is None else self.body(node.orelse, after_body)]
        for handler in node.handlers:  # the body may have raised anywhere: from what was touched before it
            entry = before if handler.type is None else self.expr(handler.type, before)
            ends.append(self.body(handler.body, entry if handler.name is None else _bind(entry, handler.name)))
        after = _join(*ends)
        if not node.finalbody:
            return after
        self.body(node.finalbody, before)  # its reads: it may run after an exception anywhere
        return self.body(node.finalbody, after)

    _s_TryStar = _s_Try

    def _s_Match(self, node: ast.Match, state: frozenset[str]) -> _State:
        state = self.expr(node.subject, state)
        ends: list[_State] = []
        for case in node.cases:
            captured: set[str] = set()
            self.pattern(case.pattern, state, captured)  # its reads: from before any case bound a thing
            entry = state.union(captured)
            if case.guard is not None:
                entry = self.expr(case.guard, entry)
            ends.append(self.body(case.body, entry))
            if case.guard is None and isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None:
                return _join(*ends)  # `case _:` or `case name:` always matches
        return _join(*ends, state)  # no case may match

    def _s_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef, state: frozenset[str]) -> _State:
        state = self.definition(node, state)
        self.read_inner(_function_reads(node), state)
        return _bind(state, node.name)

    _s_AsyncFunctionDef = _s_FunctionDef

    def _s_ClassDef(self, node: ast.ClassDef, state: frozenset[str]) -> _State:
        state = self.definition(node, state)
        bound: set[str] = set()
        nonlocal_: set[str] = set()
        global_: set[str] = set()
        for statement in node.body:
            _collect(statement, bound, nonlocal_, global_)
        deleted = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Del)}
        deleted |= {n.name for n in ast.walk(node) if isinstance(n, ast.ExceptHandler) and n.name is not None}
        body = _Scope("class", globals_=frozenset((bound - nonlocal_) | global_), fleeting=frozenset(deleted))
        body.body(node.body, _NOTHING)
        self.read_inner((body.needed - _type_params(node) | _type_param_reads(node), body.needed_global), state)
        return _bind(state, node.name)

    def definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, state: frozenset[str]) -> frozenset[str]:
        """What a ``def`` or ``class`` runs where it stands; with type parameters (``def f[T]``), all
        but the decorators see them."""
        parts, params = _evaluated_at_definition(node), _type_params(node)
        decorators = len(node.decorator_list) if params else len(parts)
        for part in parts[:decorators]:
            state = self.expr(part, state)
        generic = _Scope("function", frozenset(params))
        for part in parts[decorators:]:
            generic.expr(part, _NOTHING)
        self.read_inner((generic.needed, generic.needed_global), state)
        return state

    def _s_TypeAlias(self, node: ast.AST, state: frozenset[str]) -> _State:
        """``type X = ...`` (Python 3.12): its value is read when it is used; taken as read here."""
        name = node.name  # type: ignore[attr-defined]
        reads = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}  # type: ignore[attr-defined]
        self.read_inner((reads - _type_params(node) - {name.id} | _type_param_reads(node), set()), state)
        return _bind(state, name.id)

    # -- targets ------------------------------------------------------------------------------------

    def store(self, target: ast.expr, state: frozenset[str]) -> frozenset[str]:
        if isinstance(target, ast.Name):
            return state | {target.id}
        if isinstance(target, ast.Starred):
            return self.store(target.value, state)
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                state = self.store(element, state)
            return state
        return self.expr(target, state)  # `a.b = ...`, `a[i] = ...` read a (and i)

    def delete(self, target: ast.expr, state: frozenset[str]) -> frozenset[str]:
        if isinstance(target, ast.Name):  # `del x` needs an x to delete; after it, the kernel's is gone
            self.read(target.id, state)
            return state | {target.id}
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                state = self.delete(element, state)
            return state
        return self.expr(target, state)

    def pattern(self, node: ast.AST, state: frozenset[str], captured: set[str]) -> None:
        """A ``case`` pattern: its value and class reads, and the names it captures."""
        for name in (getattr(node, "name", None), getattr(node, "rest", None)):  # MatchAs, MatchStar, MatchMapping
            if name is not None:
                captured.add(name)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.pattern):
                self.pattern(child, state, captured)
            elif isinstance(child, ast.expr):
                self.expr(child, state)

    # -- expressions (they never end a path; a raise is not followed) --------------------------------

    def expr(self, node: ast.AST, state: frozenset[str]) -> frozenset[str]:
        handler = getattr(self, f"_e_{type(node).__name__}", None)
        if handler is not None:
            return handler(node, state)
        for child in ast.iter_child_nodes(node):  # left to right, as Python runs them
            state = self.expr(child, state)
        return state

    def _e_Name(self, node: ast.Name, state: frozenset[str]) -> frozenset[str]:
        if isinstance(node.ctx, ast.Load):
            self.read(node.id, state)
            return state
        return state | {node.id}

    def _e_NamedExpr(self, node: ast.NamedExpr, state: frozenset[str]) -> frozenset[str]:
        return self.expr(node.value, state) | {node.target.id}

    def _e_BoolOp(self, node: ast.BoolOp, state: frozenset[str]) -> frozenset[str]:
        first = state = self.expr(node.values[0], state)
        for value in node.values[1:]:  # each runs only if those before it did not decide
            state = self.expr(value, state)
        return first

    def _e_Compare(self, node: ast.Compare, state: frozenset[str]) -> frozenset[str]:
        first = state = self.expr(node.comparators[0], self.expr(node.left, state))
        for value in node.comparators[1:]:  # `a < b < c`: c only if a < b
            state = self.expr(value, state)
        return first

    def _e_IfExp(self, node: ast.IfExp, state: frozenset[str]) -> frozenset[str]:
        state = self.expr(node.test, state)
        return self.expr(node.body, state) & self.expr(node.orelse, state)

    def _e_Dict(self, node: ast.Dict, state: frozenset[str]) -> frozenset[str]:
        for key, value in zip(node.keys, node.values, strict=True):  # k1, v1, k2, v2: not all keys first
            if key is not None:
                state = self.expr(key, state)
            state = self.expr(value, state)
        return state

    def _e_Lambda(self, node: ast.Lambda, state: frozenset[str]) -> frozenset[str]:
        for part in _evaluated_at_definition(node):
            state = self.expr(part, state)
        self.read_inner(_function_reads(node), state)
        return state

    def _e_ListComp(
        self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, state: frozenset[str]
    ) -> frozenset[str]:
        first, *rest = node.generators
        state = self.expr(first.iter, state)  # the first iterable is read here, in this scope
        inner = _Scope("function", frozenset().union(*(_stored(g.target) for g in node.generators)))
        inside = inner.store(first.target, _NOTHING)
        for condition in first.ifs:
            inside = inner.expr(condition, inside)
        for generator in rest:
            inside = inner.store(generator.target, inner.expr(generator.iter, inside))
            for condition in generator.ifs:
                inside = inner.expr(condition, inside)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            inside = inner.expr(part, inside)
        self.read_inner((inner.needed, inner.needed_global), state)
        return state  # what its `:=` binds is bound only if it ran once

    _e_SetComp = _e_GeneratorExp = _e_DictComp = _e_ListComp


def _function_reads(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> _Reads:
    """The names a function's body reads from outside it (from the scope around it, and from the
    module): not its parameters and locals, nor a ``global`` one it surely bound before reading it."""
    args = node.args
    params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a is not None}
    body: list[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
    bound: set[str] = set()
    nonlocal_: set[str] = set()
    global_: set[str] = set()
    for part in body:
        _collect(part, bound, nonlocal_, global_)
    scope = _Scope("function", frozenset(params | _type_params(node) | (bound - nonlocal_ - global_)), frozenset(global_))
    if isinstance(node, ast.Lambda):
        scope.expr(node.body, _NOTHING)
    else:
        scope.body(node.body, _NOTHING)
    return scope.needed | (_type_param_reads(node) - params), scope.needed_global


def _collect(node: ast.AST, bound: set[str], nonlocal_: set[str], global_: set[str]) -> None:
    """``names_bound``'s walk, and what a scope declares ``nonlocal`` and ``global``.  A
    module-level function, so a world rank's every cell leaves no closure cycle behind for its
    garbage collector."""
    if isinstance(node, ast.Name):
        if not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        return
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        (global_ if isinstance(node, ast.Global) else nonlocal_).update(node.names)
        return
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        bound.update(_imported(node))
        return
    if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):  # its body is a scope of its own
        if not isinstance(node, ast.Lambda):
            bound.add(node.name)
        for part in _evaluated_at_definition(node):
            _collect(part, bound, nonlocal_, global_)
        return
    if isinstance(node, _COMPREHENSIONS):  # its targets are its own; its `:=` binds here
        _collect(node.generators[0].iter, bound, nonlocal_, global_)
        bound.update(_walrus_targets(node))
        return
    if isinstance(node, _NAMED_CAPTURES):  # except ... as e; case [*rest], {**rest}, C() as c
        bound.update(name for name in (getattr(node, "name", None), getattr(node, "rest", None)) if name is not None)
    for child in ast.iter_child_nodes(node):
        _collect(child, bound, nonlocal_, global_)


def _walrus_targets(node: ast.AST) -> set[str]:
    """What the ``:=`` in a comprehension binds (in the scope around it), lambdas' own aside."""
    found = {node.target.id} if isinstance(node, ast.NamedExpr) else set()
    if not isinstance(node, ast.Lambda):
        for child in ast.iter_child_nodes(node):
            found |= _walrus_targets(child)
    return found


def _evaluated_at_definition(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef) -> list[ast.expr]:
    """What a ``def``, ``lambda`` or ``class`` statement runs where it stands: decorators, defaults,
    annotations, bases and keywords."""
    parts: list[ast.expr] = list(getattr(node, "decorator_list", []))
    if isinstance(node, ast.ClassDef):
        return [*parts, *node.bases, *(k.value for k in node.keywords)]
    args = node.args
    every = [a for a in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg) if a is not None]
    parts += [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    parts += [a.annotation for a in every if a.annotation is not None]
    returns = getattr(node, "returns", None)
    return parts + ([returns] if returns is not None else [])


def _type_params(node: ast.AST) -> set[str]:
    """``def f[T]()``, ``class C[T]``, ``type X[T] = ...`` (Python 3.12): names of their own."""
    return {p.name for p in getattr(node, "type_params", ())}


def _type_param_reads(node: ast.AST) -> set[str]:
    """What type parameters' bounds and defaults read (lazily, when asked for; taken as read here)."""
    own = _type_params(node)
    return {n.id for p in getattr(node, "type_params", ()) for n in ast.walk(p) if isinstance(n, ast.Name)} - own


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [(alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*"]


def _stored(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _suppresses(expr: ast.expr) -> bool:
    """``suppress(...)`` or ``contextlib.suppress(...)``: a ``with`` whose body may stop anywhere."""
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    return (isinstance(func, ast.Name) and func.id == "suppress") or (isinstance(func, ast.Attribute) and func.attr == "suppress")
