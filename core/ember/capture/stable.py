"""Guards that cannot have changed: checked by the version of the state they read.

Most of a large model's guards are about modules the entry identifies: no hooks, ``forward``
not overridden, ``(___Conv2d_14._parameters['weight']) is ___p_23``, ``___Conv2d_14.stride``
still ``(2, 2)``. A ResNet-50 has about 1600 of them, about 100 us a call in Python. Their truth
depends only on a few dicts (each module's ``__dict__``, its ``_parameters``, ``_modules`` and
hook dicts, a module's globals) and a few classes, and CPython counts every change of those:
a dict carries a version tag that changes on every mutation and is never reused
(``ma_version_tag``, PEP 509), a class a version tag that is reset whenever the class or any
base is modified (``tp_version_tag``).

So :func:`split` reads each guard of an entry, abstractly, over the real objects (the *state
graph*: a weakly held module -> its ``__dict__`` -> ``_parameters`` -> the value under
``'weight'``; a class -> the function its MRO gives for ``forward``), and the guards built only
from such reads, identity tests, comparisons of immutable values (ints, floats, strings,
tuples of them, dtypes, devices) and the truth of dicts are *covered*. The entry evaluates the
other guards as before and then one call, ``___stable_ok()``, into Ember's guard extension
(:data:`C_SOURCE`, built with ``tensor_check``'s): it walks the state graph comparing each
dict's version and each class's tag with the ones recorded when the covered guards last passed.
Nothing changed (every call of a model in a loop): all covered guards hold, in a few
microseconds. Something changed: only the covered guards that read it are evaluated again in
Python (:class:`_Recheck`; a module-level loop changing its globals re-evaluates the few guards
that read those globals), and the versions are recorded again when they pass.

What makes this sound:

* Versions are recorded *before* the guards are evaluated, and only kept when all of them pass
  (a change during the evaluation is seen at the next call).
* A node is read only when its parent is unchanged, so every object the walk touches is still
  held by something it has verified (a dict whose version did not change still holds the same
  values); the roots are the entry's weak references (checked alive) and objects it holds.
* The analysis assumed things about the objects it walked (no data descriptor shadows an
  attribute, a value is immutable or an exact dict); when the objects are read again, those
  assumptions are checked again, and a node whose class changed (a tag different from the first
  one recorded: a property may have appeared) is *broken* for good: its guards are evaluated in
  Python on every call from then on.

Only CPython 3.11 and 3.12 (where the version tags behave as above); elsewhere, and without the
extension, entries keep their guards as they are. ``entry.source`` (the guard log, persisted
captures, golden tests) is unchanged: the split is made when the entry is built
(:func:`~ember.capture.lifetime.make_entry`).
"""

from __future__ import annotations

import ast
import builtins
import collections
import logging
import sys
import types
from typing import Any

import torch

log = logging.getLogger("ember.guards")

__all__ = ["split", "C_SOURCE", "supported"]

# node kinds (the order of the C++ enum)
STRONG, WEAK, IDICT, TYPE, TAG, ITEM_DICT, ITEM_TYPE, DICTV = range(8)
# what a node's value must still be when it is read again (bits)
W_IMM, W_DICT, W_EXACT, W_PLAIN, W_SAME = 1, 2, 4, 8, 16

#: fewer covered guards than this: the entry is left as it is
MIN_COVERED = 8

_IMMUTABLE = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device)
_DICTS = (dict, collections.OrderedDict)


def supported() -> bool:
    return (3, 11) <= sys.version_info[:2] <= (3, 12) and \
        sys.implementation.name == "cpython"


def immutable(v: Any, depth: int = 0) -> bool:
    """The C++ ``immutable`` exactly: a value no operation can change in place."""
    t = type(v)
    if t in _IMMUTABLE:
        return True
    return t is tuple and depth < 8 and all(immutable(x, depth + 1) for x in v)


class _NotCovered(Exception):
    pass


class _V:
    """An abstract value: the object, the state-graph node it is (None: a constant or a fresh
    result), the nodes its value depends on, and whether it is a fresh list of immutables."""

    __slots__ = ("value", "node", "deps", "fresh")

    def __init__(self, value: Any, node: int | None, deps: frozenset[int], fresh: bool = False):
        self.value, self.node, self.deps, self.fresh = value, node, deps, fresh


def _is_data_descriptor(obj: Any) -> bool:
    t = type(obj)
    return hasattr(t, "__set__") or hasattr(t, "__delete__")


def _mro_lookup(tp: type, name: str) -> tuple[bool, Any]:
    for k in tp.__mro__:
        d = k.__dict__
        if name in d:
            return True, d[name]
    return False, None


_GENERIC_GETATTR = (object.__getattribute__, types.ModuleType.__getattribute__)


class _Graph:
    """The state graph of one entry's covered guards (:data:`nodes` for the C++ state)."""

    def __init__(self, env: dict[str, Any], weak: set[str], derived: dict[str, str],
                 args: set[str]):
        self.env, self.weak, self.derived, self.args = env, weak, derived, args
        self.nodes: list[list[Any]] = []  # [kind, parent, arg, want]
        self._memo: dict[tuple, int] = {}
        self.names: set[str] = set()  # namespace names the covered guards read
        #: what the guard being read changed, undone when it turns out not covered
        self._journal: list[tuple[Any, ...]] = []

    def node(self, kind: int, parent: int, arg: Any, want: int = 0) -> int:
        key = (kind, parent, arg if kind in (ITEM_DICT, ITEM_TYPE) else id(arg))
        i = self._memo.get(key)
        if i is None:
            i = len(self.nodes)
            self.nodes.append([kind, parent, arg, 0])
            self._memo[key] = i
            self._journal.append(("memo", key))
        self._want(i, want)
        return i

    def _want(self, i: int, bits: int) -> None:
        old = self.nodes[i][3]
        if old | bits != old:
            self._journal.append(("want", i, old))
            self.nodes[i][3] = old | bits

    def want(self, v: _V, bits: int) -> None:
        if v.node is not None:
            self._want(v.node, bits)

    def name(self, n: str) -> None:
        if n not in self.names:
            self.names.add(n)
            self._journal.append(("name", n))

    def try_conjunct(self, tree: ast.expr) -> frozenset[int] | None:
        """The nodes a guard depends on, or None (not covered: whatever reading it added to
        the graph is undone, so nodes nobody reads cost nothing on a call)."""
        mark, n = len(self._journal), len(self.nodes)
        try:
            return self.conjunct(tree)
        except Exception:  # noqa: BLE001 - _NotCovered, or a guard that raises now: kept
            while len(self._journal) > mark:
                op = self._journal.pop()
                if op[0] == "memo":
                    del self._memo[op[1]]
                elif op[0] == "want":
                    if op[1] < n:
                        self.nodes[op[1]][3] = op[2]
                else:
                    self.names.discard(op[1])
            del self.nodes[n:]
            return None

    # -- abstract evaluation -------------------------------------------------------------
    def conjunct(self, tree: ast.expr) -> frozenset[int]:
        """The nodes a guard depends on; raises _NotCovered."""
        v = self.eval(tree)
        deps = v.deps | self.truth(v)
        if not v.value:
            raise _NotCovered("false now")
        return deps

    def truth(self, v: _V) -> frozenset[int]:
        if type(v.value) is bool and v.node is None:
            return frozenset()
        if immutable(v.value):
            self.want(v, W_IMM)
            return frozenset()
        if type(v.value) in _DICTS and v.node is not None:
            return frozenset((self.dict_node(v),))
        raise _NotCovered("truth of a mutable object")

    def dict_node(self, v: _V, exact: bool = False) -> int:
        """The node whose check covers the contents of the dict ``v``."""
        assert v.node is not None
        if exact and type(v.value) is not dict:
            raise _NotCovered("not a plain dict")
        if self.nodes[v.node][0] == IDICT:
            return v.node
        self.want(v, W_EXACT if exact else W_DICT)
        return self.node(DICTV, v.node, None)

    def eval(self, t: ast.expr) -> _V:
        m = getattr(self, "_" + type(t).__name__, None)
        if m is None:
            raise _NotCovered(type(t).__name__)
        return m(t)

    def _Constant(self, t: ast.Constant) -> _V:
        return _V(t.value, None, frozenset())

    def _Tuple(self, t: ast.Tuple) -> _V:
        vs = [self.eval(e) for e in t.elts]
        if not all(v.node is None and immutable(v.value) for v in vs):
            raise _NotCovered("tuple of non-constants")
        return _V(tuple(v.value for v in vs), None, frozenset().union(*[v.deps for v in vs]))

    def _List(self, t: ast.List) -> _V:
        v = self._Tuple(ast.Tuple(elts=t.elts))
        return _V(list(v.value), None, v.deps, fresh=True)

    def builtin(self, n: str) -> _V:
        """A builtin name (``type``, ``str``): read from the builtins' dict, whose version
        covers its replacement."""
        b = builtins.__dict__
        if n in self.args or n in self.env or n not in b:
            raise _NotCovered(f"name {n}")
        root = self.node(STRONG, -1, b)
        dv = self.node(DICTV, root, None)
        item = self.node(ITEM_DICT, dv, n, W_SAME)  # the builtin itself, always
        return _V(b[n], item, frozenset((dv, item)))

    def _Name(self, t: ast.Name) -> _V:
        n = t.id
        if n in self.args:
            raise _NotCovered(f"name {n}")
        if n not in self.env:
            return self.builtin(n)
        self.name(n)
        obj = self.env[n]
        if n in self.weak:
            w = self.node(WEAK, -1, obj)
            return _V(obj, w, frozenset((w,)))
        if n in self.derived:
            owner = self.derived[n]
            self.name(owner)
            w = self.node(WEAK, -1, self.env[owner])
            d = self.node(IDICT, w, None)
            return _V(obj, d, frozenset((w, d)))
        s = self.node(STRONG, -1, obj)
        return _V(obj, s, frozenset())

    def _Attribute(self, t: ast.Attribute) -> _V:
        v = self.eval(t.value)
        if v.node is None:
            raise _NotCovered("attribute of a computed value")
        obj, a = v.value, t.attr
        if a == "__dict__":
            if type(getattr(obj, "__dict__", None)) is not dict or isinstance(obj, type):
                raise _NotCovered("no instance dict")
            d = self.node(IDICT, v.node, None)
            return _V(obj.__dict__, d, v.deps | {d})
        if a.startswith("__") and a.endswith("__"):
            raise _NotCovered("special attribute")
        if isinstance(obj, type):
            if type(obj) is not type:
                raise _NotCovered("metaclass")
            found, raw = _mro_lookup(obj, a)
            if not found or (hasattr(type(raw), "__get__")
                             and not isinstance(raw, types.FunctionType)):
                raise _NotCovered("class attribute through a descriptor")
            tag = self.node(TAG, v.node, None)
            item = self.node(ITEM_TYPE, tag, a, W_PLAIN)
            return _V(raw, item, v.deps | {tag, item})
        tp = type(obj)
        if tp.__getattribute__ not in _GENERIC_GETATTR:
            raise _NotCovered("custom __getattribute__")
        d = getattr(obj, "__dict__", None)
        if type(d) is not dict:
            raise _NotCovered("no instance dict")
        found, raw = _mro_lookup(tp, a)
        if found and _is_data_descriptor(raw):
            raise _NotCovered("data descriptor")
        ty = self.node(TYPE, v.node, tp)
        di = self.node(IDICT, v.node, None)
        if a in d:
            item = self.node(ITEM_DICT, di, a)
            val = d[a]
        elif found and not hasattr(type(raw), "__get__"):
            item = self.node(ITEM_TYPE, ty, a, W_PLAIN)
            val = raw
        else:
            raise _NotCovered("attribute not in the instance dict")
        return _V(val, item, v.deps | {ty, di, item})

    def _Subscript(self, t: ast.Subscript) -> _V:
        v = self.eval(t.value)
        k = self.eval(t.slice)
        if k.node is not None or not immutable(k.value):
            raise _NotCovered("computed key")
        if type(v.value) in _DICTS and v.node is not None:
            dn = self.dict_node(v)
            try:
                val = v.value[k.value]
            except Exception:
                raise _NotCovered("missing key") from None
            item = self.node(ITEM_DICT, dn, k.value)
            return _V(val, item, v.deps | k.deps | {dn, item})
        if type(v.value) in (tuple, str) and immutable(v.value):
            self.want(v, W_IMM)
            try:
                return _V(v.value[k.value], None, v.deps | k.deps)
            except Exception:
                raise _NotCovered("bad index") from None
        raise _NotCovered("subscript of a mutable object")

    def _Call(self, t: ast.Call) -> _V:
        f = t.func
        if not isinstance(f, ast.Name) or t.keywords or len(t.args) != 1 or \
                f.id not in ("type", "len", "list"):
            raise _NotCovered("call")
        fv = self.builtin(f.id)
        v = self.eval(t.args[0])
        v.deps = v.deps | fv.deps
        if f.id == "type":
            if immutable(v.value):
                self.want(v, W_IMM)
                return _V(type(v.value), None, v.deps)
            if v.node is None:
                raise _NotCovered("type of a computed value")
            ty = self.node(TYPE, v.node, type(v.value))
            return _V(type(v.value), None, v.deps | {ty})
        if f.id == "len":
            if type(v.value) in (tuple, str) and immutable(v.value):
                self.want(v, W_IMM)
                return _V(len(v.value), None, v.deps)
            if type(v.value) in _DICTS and v.node is not None:
                return _V(len(v.value), None, v.deps | {self.dict_node(v)})
            raise _NotCovered("len of a mutable object")
        # list(d): the keys of a plain dict (an OrderedDict can reorder without a new version)
        if type(v.value) is dict and v.node is not None and \
                all(immutable(x) for x in v.value):
            return _V(list(v.value), None, v.deps | {self.dict_node(v, exact=True)}, fresh=True)
        raise _NotCovered("list of something else")

    def _value_eq(self, v: _V) -> None:
        if v.fresh and all(immutable(x) for x in v.value):
            return
        if not immutable(v.value):
            raise _NotCovered("comparison of mutable values")
        self.want(v, W_IMM)

    def _Compare(self, t: ast.Compare) -> _V:
        left = self.eval(t.left)
        deps = left.deps
        result = True
        for op, right_t in zip(t.ops, t.comparators):
            right = self.eval(right_t)
            deps = deps | right.deps
            a, b = left.value, right.value
            if isinstance(op, (ast.Is, ast.IsNot)):
                r = (a is b) if isinstance(op, ast.Is) else (a is not b)
            elif isinstance(op, (ast.In, ast.NotIn)):
                if not immutable(a):
                    raise _NotCovered("membership of a mutable value")
                self.want(left, W_IMM)
                if type(b) in _DICTS and right.node is not None:
                    deps = deps | {self.dict_node(right)}
                elif type(b) in (tuple, str) and immutable(b):
                    self.want(right, W_IMM)
                else:
                    raise _NotCovered("membership in a mutable container")
                r = (a in b) if isinstance(op, ast.In) else (a not in b)
            elif isinstance(op, (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
                self._value_eq(left)
                self._value_eq(right)
                r = {ast.Eq: a == b, ast.NotEq: a != b}.get(type(op)) if \
                    isinstance(op, (ast.Eq, ast.NotEq)) else _order(op, a, b)
            else:
                raise _NotCovered("comparison")
            if not r:
                raise _NotCovered("false now")
            result = bool(r)
            left = right
        return _V(result, None, deps)

    def _UnaryOp(self, t: ast.UnaryOp) -> _V:
        if not isinstance(t.op, ast.Not):
            raise _NotCovered("unary op")
        v = self.eval(t.operand)
        return _V(not v.value, None, v.deps | self.truth(v))

    def _BoolOp(self, t: ast.BoolOp) -> _V:
        """Every operand is read, short-circuited or not, with the state its truth depends on:
        after a change the guard may pass through another operand than the one that decided
        it when it was read, and that one's state must be tracked too."""
        is_and = isinstance(t.op, ast.And)
        deps: frozenset[int] = frozenset()
        vals = [self.eval(e) for e in t.values]
        for v in vals:
            deps = deps | v.deps | self.truth(v)
        result = vals[-1]
        for v in vals[:-1]:
            if bool(v.value) != is_and:
                result = v
                break
        return _V(result.value, result.node, deps, result.fresh)


def _order(op: ast.cmpop, a: Any, b: Any) -> bool:
    if isinstance(op, ast.Lt):
        return a < b
    if isinstance(op, ast.LtE):
        return a <= b
    if isinstance(op, ast.Gt):
        return a > b
    return a >= b


def _conjuncts(expr: str) -> list[tuple[ast.expr, str]]:
    """The top-level terms of the guard conjunction, each with its own source text."""
    text = f"({expr})"  # (the guards span several lines)
    tree = ast.parse(text, mode="eval").body
    parts = tree.values if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And) \
        else [tree]
    # ast offsets are UTF-8 byte columns on 1-based lines
    lines = [ln.encode() for ln in text.split("\n")]
    out = []
    for p in parts:
        a, b = p.lineno - 1, (p.end_lineno or p.lineno) - 1
        if a == b:
            seg = lines[a][p.col_offset:p.end_col_offset]
        else:
            seg = b"\n".join([lines[a][p.col_offset:], *lines[a + 1:b],
                              lines[b][:p.end_col_offset]])
        out.append((p, seg.decode()))
    return out


class _Recheck:
    """Evaluates the covered guards whose state changed (indices from the C++ state), with
    the entry's weakly held names dereferenced as the entry's own prologue does."""

    def __init__(self, g: dict[str, Any], exprs: list[str], weak: list[str],
                 derived: dict[str, str]):
        self.g, self.exprs, self.weak, self.derived = g, exprs, weak, derived
        self._codes: dict[int, Any] = {}
        self._all: Any = None

    def _env(self) -> dict[str, Any]:
        g = self.g
        env = {n: g[f"{n}__wr"]() for n in self.weak}
        for d, o in self.derived.items():
            env[d] = getattr(env.get(o, g.get(o)), "__dict__", None)
        return env

    def __call__(self, idx: list[int]) -> bool:
        if not idx:
            return True
        env = self._env()
        if 3 * len(idx) > len(self.exprs):  # most of them (the first call): one expression
            if self._all is None:
                self._all = compile(" and ".join(f"({e})" for e in self.exprs),
                                    "<ember covered guards>", "eval")
            return bool(eval(self._all, self.g, env))
        for i in idx:
            code = self._codes.get(i)
            if code is None:
                code = self._codes[i] = compile(self.exprs[i], "<ember covered guard>", "eval")
            if not eval(code, self.g, env):
                return False
        return True


def split(src: str, g: dict[str, Any], env: dict[str, Any], weak: list[str],
          derived: dict[str, str]) -> str:
    """``src`` (an entry's source, as :func:`~ember.capture.output.entry_source` writes it)
    with its covered guards replaced by ``___stable_ok()``, which it adds to ``g`` (the
    entry's globals). ``env``: the namespace with the weak names dereferenced. Returns
    ``src`` unchanged where nothing (or too little) is covered or the extension is not
    loaded."""
    if not supported():
        return src
    from . import tensor_check

    ext = tensor_check.load_cached()
    if ext is None or not hasattr(ext, "Stable"):
        return src
    lines = src.split("\n")
    head = "        if not ("
    if len(lines) < 4 or lines[1] != "    try:" or not lines[2].startswith(head):
        return src
    try:
        end = lines.index("            return ___MISS", 3)
    except ValueError:
        return src
    expr_lines = lines[2:end]
    expr = "\n".join(expr_lines)[len(head):]
    if not expr.endswith("):"):
        return src
    expr = expr[:-2]
    import gc

    enabled = gc.isenabled()
    gc.disable()  # (thousands of small objects: collections would cost more than the reading)
    try:
        return _split(src, lines, head, end, expr, g, env, weak, derived, ext)
    finally:
        if enabled:
            gc.enable()


def _split(src: str, lines: list[str], head: str, end: int, expr: str, g: dict[str, Any],
           env: dict[str, Any], weak: list[str], derived: dict[str, str], ext: Any) -> str:
    try:
        parts = _conjuncts(expr)
        fdef = ast.parse(lines[0] + "\n    pass").body[0]  # the signature
    except SyntaxError:
        return src
    assert isinstance(fdef, ast.FunctionDef)
    a = fdef.args
    args = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    args |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    graph = _Graph(env, set(weak), derived, args)
    # an argument whose identity the entry checks (``(self) is ___Net_4``, kept: it reads an
    # argument) is that object in every other guard, all of which run after it
    alias = {t.left.id: t.comparators[0].id for t, _ in parts
             if isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and
             t.left.id in args and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is) and
             isinstance(t.comparators[0], ast.Name) and t.comparators[0].id in weak}
    kept, covered, deps = [], [], []
    for tree, text in parts:
        run = tree
        if alias and any(isinstance(n, ast.Name) and n.id in alias for n in ast.walk(tree)) \
                and not _is_alias(tree, alias):
            run = _Rename(alias).visit(_copy(tree))
        d = graph.try_conjunct(run)
        if d is None:
            # a term that binds more loosely than ``and`` had its parentheses in the source,
            # outside the node's own text: they go back, or its ``or`` would split the chain
            loose = isinstance(tree, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr))
            kept.append(f"({text})" if loose else text)
        else:
            covered.append(text if run is tree else ast.unparse(run))
            deps.append(tuple(sorted(d)))
    if len(covered) < MIN_COVERED:
        return src
    used_weak = [n for n in weak if n in graph.names]
    used_derived = {d: o for d, o in derived.items() if d in graph.names}
    weak_ref = {id(env[n]): g[f"{n}__wr"] for n in weak}  # a WEAK node's weakref
    nodes = [(kind, parent, weak_ref[id(arg)] if kind == WEAK else arg, want)
             for kind, parent, arg, want in graph.nodes]
    state = ext.Stable(tuple(nodes), tuple(deps), _Recheck(g, covered, used_weak, used_derived),
                       collections.OrderedDict)
    g["___stable_ok"] = state.check
    log.debug("%d of %d guards checked by state version (%d nodes)", len(covered), len(parts),
              len(nodes))
    guard = " and\n            ".join(kept + ["___stable_ok()"])
    return "\n".join(lines[:2] + [f"{head}{guard}):"] + lines[end:])


def _is_alias(tree: ast.expr, alias: dict[str, str]) -> bool:
    """The identity guard an alias comes from (kept as it is)."""
    return isinstance(tree, ast.Compare) and isinstance(tree.left, ast.Name) and \
        tree.left.id in alias and len(tree.comparators) == 1 and \
        isinstance(tree.comparators[0], ast.Name) and tree.comparators[0].id == alias[tree.left.id]


def _copy(tree: ast.expr) -> ast.expr:
    import copy

    return copy.deepcopy(tree)


class _Rename(ast.NodeTransformer):
    def __init__(self, alias: dict[str, str]):
        self.alias = alias

    def visit_Name(self, node: ast.Name) -> ast.Name:
        new = self.alias.get(node.id)
        return ast.copy_location(ast.Name(id=new, ctx=node.ctx), node) if new else node


C_SOURCE = r"""
// ---- guards checked by state version (ember/capture/stable.py) ----
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000 && !defined(PYPY_VERSION)
#define EMBER_STABLE 1
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
enum { K_STRONG, K_WEAK, K_IDICT, K_TYPE, K_TAG, K_ITEM_DICT, K_ITEM_TYPE, K_DICTV };
enum { W_IMM = 1, W_DICT = 2, W_EXACT = 4, W_PLAIN = 8, W_SAME = 16 };

struct SNode {
  int kind, want;
  Py_ssize_t parent;
  PyObject *arg;       // owned: STRONG object, WEAK weakref, TYPE expected type, ITEM key
  PyObject *obj;       // the node's object when last recorded (borrowed, see stable.py)
  PyObject *obj0;      // W_SAME: the first one recorded (owned: compared by address)
  uint64_t version;    // IDICT, DICTV
  unsigned int tag, tag0;  // TYPE, TAG: the recorded tag, the first one ever recorded
  bool valid, broken;
};
struct SPending { PyObject *obj; uint64_t version; unsigned int tag; bool ok; };

typedef struct {
  PyObject_HEAD
  std::vector<SNode> *nodes;
  std::vector<std::vector<Py_ssize_t>> *conj;
  std::vector<std::vector<Py_ssize_t>> *readers;  // node -> the guards that read it
  std::vector<char> *scratch;
  PyObject *recheck, *odict;
} Stable;

static inline uint64_t dver(PyObject *d) { return ((PyDictObject *)d)->ma_version_tag; }

static bool type_tag(PyTypeObject *t, unsigned int *tag) {
  if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || t->tp_version_tag == 0) {
    static PyObject *probe = NULL;  // a lookup assigns a tag to a type that can have one
    if (!probe) probe = PyUnicode_InternFromString("__ember_version_probe__");
    if (probe) _PyType_Lookup(t, probe);
  }
  if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || t->tp_version_tag == 0) return false;
  *tag = t->tp_version_tag;
  return true;
}

static inline bool tag_same(const SNode &x) {
  PyTypeObject *t = (PyTypeObject *)x.obj;
  return (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && t->tp_version_tag == x.tag;
}

static bool stable_immutable(PyObject *v, int depth) {
  if (v == Py_None || PyLong_CheckExact(v) || PyFloat_CheckExact(v) || PyBool_Check(v) ||
      PyUnicode_CheckExact(v) || PyBytes_CheckExact(v) || PyComplex_CheckExact(v) ||
      THPDtype_Check(v) || THPDevice_Check(v))
    return true;
  if (PyTuple_CheckExact(v) && depth < 8) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++)
      if (!stable_immutable(PyTuple_GET_ITEM(v, i), depth + 1)) return false;
    return true;
  }
  return false;
}

static bool wants_ok(Stable *s, int want, PyObject *v) {
  if ((want & W_IMM) && !stable_immutable(v, 0)) return false;
  if ((want & W_EXACT) && !PyDict_CheckExact(v)) return false;
  if ((want & W_DICT) && !PyDict_CheckExact(v) && (PyObject *)Py_TYPE(v) != s->odict) return false;
  if ((want & W_PLAIN) && Py_TYPE(v)->tp_descr_get != NULL && !PyFunction_Check(v)) return false;
  return true;
}

// Read node i again from its parent's fresh object: the pending record, or not ok (the node
// cannot be checked by version any more: broken for good)
static bool rederive(Stable *s, Py_ssize_t i, std::vector<SPending> &p) {
  SNode &x = (*s->nodes)[i];
  SPending &r = p[i];
  r.ok = false;
  if (x.broken) return false;
  PyObject *po = NULL;
  if (x.parent >= 0) {
    if (!p[x.parent].ok) return false;
    po = p[x.parent].obj;
  }
  switch (x.kind) {
    case K_STRONG: r.obj = x.arg; break;
    case K_WEAK: {
      PyObject *o = PyWeakref_GET_OBJECT(x.arg);
      if (o == Py_None) return false;  // dying: the entry dies with it
      r.obj = o;
      break;
    }
    case K_IDICT: {
      PyObject **dp = _PyObject_GetDictPtr(po);
      if (PyErr_Occurred()) PyErr_Clear();
      if (!dp || !*dp || !PyDict_CheckExact(*dp)) return false;
      r.obj = *dp;
      r.version = dver(*dp);
      break;
    }
    case K_TYPE: case K_TAG: {
      PyObject *t = x.kind == K_TYPE ? (PyObject *)Py_TYPE(po) : po;
      if ((x.kind == K_TYPE && t != x.arg) || !PyType_Check(t) ||
          !type_tag((PyTypeObject *)t, &r.tag))
        return false;  // another class (now): read again next time
      if (x.tag0 && r.tag != x.tag0) {
        x.broken = true;  // the class itself changed: a descriptor may have come
        return false;
      }
      r.obj = t;
      break;
    }
    case K_ITEM_DICT: {
      if (!PyDict_Check(po)) return false;
      PyObject *v = PyDict_GetItemWithError(po, x.arg);
      if (!v) { PyErr_Clear(); return false; }
      if (!wants_ok(s, x.want, v)) return false;  // not what the guard was read for (now)
      if ((x.want & W_SAME) && x.obj0 && v != x.obj0) { x.broken = true; return false; }
      r.obj = v;
      break;
    }
    case K_ITEM_TYPE: {
      if (!PyType_Check(po)) return false;
      PyObject *v = _PyType_Lookup((PyTypeObject *)po, x.arg);
      if (!v || !wants_ok(s, x.want, v)) return false;
      r.obj = v;
      break;
    }
    case K_DICTV:
      if (!PyDict_Check(po)) return false;
      r.obj = po;
      r.version = dver(po);
      break;
    default: return false;
  }
  r.ok = true;
  return true;
}

static PyObject *stable_slow(Stable *s, std::vector<char> &ch) {
  std::vector<SNode> &N = *s->nodes;
  size_t n = N.size();
  std::vector<SPending> p(n);
  // the changed nodes read again (recorded before the guards run); the others as recorded
  for (size_t i = 0; i < n; i++) {
    if (ch[i]) {
      rederive(s, (Py_ssize_t)i, p);
    } else {
      p[i].obj = N[i].obj; p[i].version = N[i].version; p[i].tag = N[i].tag; p[i].ok = true;
    }
  }
  // the guards that read a changed node, in their order
  std::vector<char> want(s->conj->size(), 0);
  for (size_t i = 0; i < n; i++)
    if (ch[i])
      for (Py_ssize_t j : (*s->readers)[i]) want[j] = 1;
  PyObject *idx = PyList_New(0);
  if (!idx) return NULL;
  for (size_t j = 0; j < want.size(); j++) {
    if (!want[j]) continue;
    PyObject *k = PyLong_FromSsize_t((Py_ssize_t)j);
    if (!k || PyList_Append(idx, k) < 0) { Py_XDECREF(k); Py_DECREF(idx); return NULL; }
    Py_DECREF(k);
  }
  Py_INCREF(s);  // the guards run Python: the entry (and this state) may die meanwhile
  PyObject *recheck = s->recheck;
  Py_XINCREF(recheck);
  PyObject *r = NULL;
  if (recheck) r = PyObject_CallOneArg(recheck, idx);
  else PyErr_SetString(PyExc_RuntimeError, "the entry's guard state was cleared");
  Py_XDECREF(recheck);
  Py_DECREF(idx);
  int t = r ? PyObject_IsTrue(r) : -1;
  Py_XDECREF(r);
  if (t == 1 && s->recheck) {
    for (size_t i = 0; i < n; i++) {
      if (!ch[i]) continue;
      SNode &x = N[i];
      if (p[i].ok && !x.broken) {
        x.obj = p[i].obj;
        x.version = p[i].version;
        x.tag = p[i].tag;
        if ((x.kind == K_TYPE || x.kind == K_TAG) && !x.tag0) x.tag0 = p[i].tag;
        if ((x.want & W_SAME) && !x.obj0) {  // held: compared by address from now on
          Py_INCREF(p[i].obj);
          x.obj0 = p[i].obj;
        }
        x.valid = true;
      } else {
        x.valid = false;
      }
    }
  }
  Py_DECREF(s);
  if (t < 0) return NULL;
  if (t) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// check() -> bool: every covered guard holds (by version, else evaluated again)
static PyObject *stable_check(Stable *s, PyObject *) {
  std::vector<SNode> &N = *s->nodes;
  std::vector<char> &ch = *s->scratch;
  size_t n = N.size();
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    const SNode &x = N[i];
    bool c;
    if (x.parent >= 0 && ch[x.parent]) c = true;
    else if (!x.valid || x.broken) c = true;
    else {
      switch (x.kind) {
        case K_WEAK: c = PyWeakref_GET_OBJECT(x.arg) != x.obj; break;
        case K_IDICT: {
          PyObject **dp = _PyObject_GetDictPtr(N[x.parent].obj);
          if (PyErr_Occurred()) PyErr_Clear();
          c = !dp || *dp != x.obj || dver(x.obj) != x.version;
          break;
        }
        case K_TYPE: c = (PyObject *)Py_TYPE(N[x.parent].obj) != x.obj || !tag_same(x); break;
        case K_TAG: c = !tag_same(x); break;
        case K_DICTV: c = dver(x.obj) != x.version; break;
        default: c = false;  // STRONG, ITEM: the same object while the parent is unchanged
      }
    }
    ch[i] = c;
    any = any || c;
  }
  if (!any) Py_RETURN_TRUE;
  std::vector<char> local(ch);  // the guards may run this state again (another thread)
  return stable_slow(s, local);
}

static int stable_traverse(Stable *s, visitproc visit, void *arg) {
  Py_VISIT(s->recheck);
  Py_VISIT(s->odict);
  if (s->nodes)
    for (auto &x : *s->nodes) {
      Py_VISIT(x.arg);
      Py_VISIT(x.obj0);
    }
  return 0;
}

static int stable_clear(Stable *s) {
  Py_CLEAR(s->recheck);
  Py_CLEAR(s->odict);
  if (s->nodes) {
    for (auto &x : *s->nodes) {
      Py_CLEAR(x.arg);
      Py_CLEAR(x.obj0);
      x.broken = true;
      x.valid = false;
    }
  }
  return 0;
}

static void stable_dealloc(Stable *s) {
  PyObject_GC_UnTrack(s);
  stable_clear(s);
  delete s->nodes;
  delete s->conj;
  delete s->readers;
  delete s->scratch;
  s->nodes = NULL;
  Py_TYPE(s)->tp_free((PyObject *)s);
}

// Stable(nodes, conjuncts, recheck, OrderedDict): nodes ((kind, parent, arg, want), ...),
// conjuncts (node indices per covered guard, ...)
static PyObject *stable_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  PyObject *nodes, *conj, *recheck, *odict;
  if (!PyArg_ParseTuple(args, "O!O!OO", &PyTuple_Type, &nodes, &PyTuple_Type, &conj, &recheck,
                        &odict))
    return NULL;
  Stable *s = (Stable *)type->tp_alloc(type, 0);
  if (!s) return NULL;
  s->nodes = new std::vector<SNode>();
  s->conj = new std::vector<std::vector<Py_ssize_t>>();
  s->readers = new std::vector<std::vector<Py_ssize_t>>((size_t)PyTuple_GET_SIZE(nodes));
  s->scratch = new std::vector<char>();
  Py_INCREF(recheck);
  s->recheck = recheck;
  Py_INCREF(odict);
  s->odict = odict;
  Py_ssize_t n = PyTuple_GET_SIZE(nodes);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *t = PyTuple_GET_ITEM(nodes, i);
    SNode x{};
    PyObject *arg;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "inOi", &x.kind, &x.parent, &arg, &x.want) ||
        x.parent >= i || x.kind < K_STRONG || x.kind > K_DICTV ||
        (x.kind == K_WEAK && !PyWeakref_CheckRef(arg)) ||
        ((x.kind == K_STRONG || x.kind == K_WEAK) ? x.parent != -1 : x.parent < 0)) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "bad state node %zd", i);
      Py_DECREF(s);
      return NULL;
    }
    Py_INCREF(arg);
    x.arg = arg;
    s->nodes->push_back(x);
  }
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(conj); j++) {
    PyObject *t = PyTuple_GET_ITEM(conj, j);
    std::vector<Py_ssize_t> d;
    for (Py_ssize_t k = 0; PyTuple_Check(t) && k < PyTuple_GET_SIZE(t); k++) {
      Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, k));
      if (v < 0 || v >= n) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad node index");
        Py_DECREF(s);
        return NULL;
      }
      d.push_back(v);
      (*s->readers)[(size_t)v].push_back(j);
    }
    s->conj->push_back(d);
  }
  s->scratch->assign((size_t)n, 0);
  return (PyObject *)s;
}

static PyMethodDef stable_methods[] = {
    {"check", (PyCFunction)stable_check, METH_NOARGS, "check() -> bool"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StableType = {PyVarObject_HEAD_INIT(NULL, 0)};

static int stable_ready(PyObject *m) {
  StableType.tp_name = "ember_tensor_check.Stable";
  StableType.tp_basicsize = sizeof(Stable);
  StableType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  StableType.tp_new = stable_new;
  StableType.tp_dealloc = (destructor)stable_dealloc;
  StableType.tp_traverse = (traverseproc)stable_traverse;
  StableType.tp_clear = (inquiry)stable_clear;
  StableType.tp_methods = stable_methods;
  if (PyType_Ready(&StableType) < 0) return -1;
  Py_INCREF(&StableType);
  return PyModule_AddObject(m, "Stable", (PyObject *)&StableType);
}
#else
static int stable_ready(PyObject *) { return 0; }
#endif
"""
