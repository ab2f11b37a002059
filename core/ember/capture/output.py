"""The output of one capture: the fx graph being built, its inputs, the guards, and the
generation of the entry function (readable Python) that runs it.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import types
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from .. import _logging
from ..exc import Unsupported
from .aliasing import HELPERS as _ALIAS_HELPERS
from .guards import FN
from .lifetime import make_entry, weak_names
from .sources import Local, NamespaceRef, Source
from .tensor_check import NS_HINT, meta_of, tensors_ok
from .variables import (BoundMethodVar, BuiltinVar, CellVar, ClassVar, ConstVar,
                        ContainerMethodVar, DataclassVar, DictVar, ExitVar, FunctionVar,
                        IteratorVar, ListVar, NestedFunctionVar, NNModuleVar,
                        ObjectVar, PartialVar, PyModuleVar, SetVar, TensorMethodVar, TensorVar,
                        TupleVar, Var)


# Grad-mode and autocast state lives in one module (ember.state); these names stay importable
# from here for the capture modules that use them.
from ..state import (AutocastExit, GradRestore, autocast_nesting,  # noqa: E402,F401
                     enter_autocast as _enter_autocast, leave_nesting as _leave_nesting,
                     restore_autocast, settle_autocast)


def _mkobj(cls: type, fields: dict) -> object:
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def _mkcell(*value: object) -> object:
    return types.CellType(*value)


def instance_dict(obj: object) -> dict:
    """``obj``'s own ``__dict__``, read past a custom ``__getattribute__`` (a transformers
    config remaps attribute names in Python on every read: a state guard of twelve layers paid
    for it twelve times a call)."""
    return object.__getattribute__(obj, "__dict__")


def _with_kwdefaults(fn: types.FunctionType, kw: dict) -> types.FunctionType:
    fn.__kwdefaults__ = kw
    return fn


ENTRY_HELPERS = {"___GradRestore": GradRestore, "___enter_autocast": _enter_autocast,
                 "___autocast_nesting": autocast_nesting, "___settle_autocast": settle_autocast, "___mkobj": _mkobj, "___mkcell": _mkcell,
                 "___MethodType": types.MethodType, "___FunctionType": types.FunctionType,
                 "___with_kwdefaults": _with_kwdefaults, "___tensors_ok": tensors_ok,
                 "___vars": instance_dict, **_ALIAS_HELPERS}

log = logging.getLogger("ember.capture")
graph_log = _logging.get_artifact_logger("graph")
guard_log = _logging.get_artifact_logger("guards")
code_log = _logging.get_artifact_logger("output_code")

_SIMPLE_CONSTS = (int, float, bool, str, type(None), bytes)


class GuardSet:
    """Guards as Python expressions over the entry function's arguments and namespace."""

    def __init__(self) -> None:
        self.exprs: list[str] = []
        self._seen: set[str] = set()
        #: guard -> the user's line (or the rule) that introduced it, for symbolic-size guards
        self.origins: dict[str, str] = {}
        #: source -> namespace name, for sources guarded by identity (``(src) is ___name``)
        self.identity: dict[Source, str] = {}
        #: metadata guard of an identity-guarded parameter or buffer -> (its namespace name,
        #: :func:`~ember.capture.tensor_check.meta_of`): evaluated together as one guard
        self.tensor_meta: dict[str, tuple[str, tuple]] = {}
        self._bulk: tuple[tuple[str, ...], tuple] | None = None
        self._short_memo: tuple[tuple, list[str]] | None = None

    def add(self, expr: str) -> None:
        if expr not in self._seen:
            self._seen.add(expr)
            self.exprs.append(expr)

    def add_identity(self, source: Source, ref: str) -> None:
        """``source`` is the object the namespace holds as ``ref``."""
        self.add(f"({source}) is {ref}")
        self.identity.setdefault(source, ref)

    def add_first(self, exprs: list[str]) -> None:
        """Guards checked before all others (cheap ones that later guards rely on)."""
        new = [e for e in exprs if e not in self._seen]
        self._seen.update(new)
        self.exprs[:0] = new

    def shortened(self, ns: Callable[[Any, str], str] | None = None) -> list[str]:
        """The guards as the entry evaluates them: every path through an identity-guarded
        object read from the namespace reference instead (``___Conv2d_7.padding`` for
        ``self._modules['layer1']._modules['0']._modules['conv1'].padding``).

        The guards are one conjunction, so a guard may read through a reference whose own
        identity guard comes later: when that one fails, the entry misses whatever the other
        read. An identity guard itself is rewritten only below its own source (through its
        nearest guarded ancestor), never to ``(___M) is ___M``. Guards with their own binding
        scopes (a comprehension, a lambda) are kept as they are. ``exprs`` (what the guard log
        and the explanation of a miss print) keep the long form.

        ``ns`` (the capture's namespace naming): the metadata guards of identity-guarded
        parameters and buffers (:attr:`tensor_meta`), when there are two or more, become one
        ``___tensors_ok((refs...), ___tmeta_N)`` at the place of the last."""
        # (entry_source runs for the capture's artifact and again for the entry: guards and
        # identities only grow, so their counts tell whether anything changed in between)
        memo_key = (len(self.exprs), len(self.identity), len(self.tensor_meta), ns is None)
        if self._short_memo is not None and self._short_memo[0] == memo_key:
            return list(self._short_memo[1])
        out = self._shortened(ns)
        self._short_memo = (memo_key, out)
        return list(out)

    def _shortened(self, ns: Callable[[Any, str], str] | None) -> list[str]:
        exprs = self._bulk_tensor_meta(ns) if ns is not None else list(self.exprs)
        # (a root, ``self``, is a local already: nothing to gain)
        chained = {s: r for s, r in self.identity.items() if s.base is not None}
        if not chained:
            return exprs
        import re

        own = {f"({s}) is {r}": s for s, r in chained.items()}
        texts = sorted(((str(s), r) for s, r in chained.items()), key=lambda t: -len(t[0]))
        refs = dict(texts)
        # a whole source text: not the tail of a longer name or attribute path, not a prefix
        # of a longer name (``s.a`` in ``s.ab``), the longest alternative first; string
        # literals (``co_varnames[0] == 'self'``) are matched first and kept as they are
        pattern = re.compile("('(?:[^'\\\\]|\\\\.)*'|\"(?:[^\"\\\\]|\\\\.)*\")|(?<![\\w.])(?:"
                             + "|".join(re.escape(t) for t, _ in texts) + ")(?!\\w)")

        def short_identity(s: Source, ref: str) -> str:
            for anc in itertools.islice(s.chain(), 1, None):
                r = chained.get(anc)
                if r is not None:
                    return f"({s.rebase(anc, NamespaceRef(r))}) is {ref}"
            return f"({s}) is {ref}"

        out = []
        for e in exprs:
            s = own.get(e)
            if s is not None:
                out.append(short_identity(s, chained[s]))
            elif " for " in e or "lambda" in e:
                out.append(e)
            else:
                out.append(pattern.sub(lambda m: m.group(1) or refs[m.group(0)], e))
        return out

    def _bulk_tensor_meta(self, ns: Callable[[Any, str], str]) -> list[str]:
        metas = [e for e in self.exprs if e in self.tensor_meta]
        if len(metas) < 2:
            return list(self.exprs)
        keys = tuple(metas)
        if self._bulk is None or self._bulk[0] != keys:  # one tuple: one namespace name
            self._bulk = (keys, tuple(self.tensor_meta[e][1] for e in metas))
        refs = ", ".join(self.tensor_meta[e][0] for e in metas)
        bulk = f"___tensors_ok(({refs},), {ns(self._bulk[1], NS_HINT)})"
        # at the place of the last: after the identity guards of all of them
        last, drop = metas[-1], set(metas)
        return [bulk if e == last else e for e in self.exprs if e == last or e not in drop]


class DynamicPolicy:
    """How one capture treats sizes and ints: ``mode`` is ``ember.compile(dynamic=...)``;
    ``state`` the function's automatic-dynamic memory (:class:`FrameState`); ``recompile`` is
    True when the function already has entries (automatic dynamic may apply); ``allowed`` is
    False when the backend cannot take symbolic graphs; ``marked`` when an argument carries
    ``ember.mark_dynamic`` marks."""

    __slots__ = ("mode", "state", "recompile", "allowed", "marked", "root_args")

    def __init__(self, mode: bool | None = None, state: "FrameState | None" = None,
                 recompile: bool = False, allowed: bool = True, marked: bool = False,
                 root_args: tuple[str, ...] = ()):
        self.mode, self.state, self.recompile = mode, state, recompile
        self.allowed, self.marked, self.root_args = allowed, marked, root_args

    @property
    def symbolic(self) -> bool:
        if not self.allowed:
            return False
        return self.marked or self.mode is True or (self.mode is None and self.recompile)


class FrameState:
    """Automatic dynamic: what earlier compiles of one function saw. A tensor dim (an int
    argument) whose value differs from the one seen before becomes symbolic from then on."""

    __slots__ = ("shapes", "dims", "ints", "int_dynamic", "modules", "module_generic")

    def __init__(self) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dims: dict[str, set[int]] = {}
        self.ints: dict[str, int] = {}
        self.int_dynamic: set[str] = set()
        #: module arguments: the first instance seen (weakly) and its class, by argument name
        self.modules: dict[str, tuple[Any, type]] = {}
        #: module arguments that held a second instance of their class: guarded by type
        self.module_generic: set[str] = set()

    def see_module(self, source: Any, module: Any) -> bool:
        """Automatic generality for module arguments: the first instance a function sees is
        specialized on (guarded by identity: its parameters are constants of the entry, which
        inductor may freeze); once another instance of the same class comes, that argument is
        guarded by class and structure from then on, its parameters graph inputs, so every
        instance shares one graph (the layers of a model, the experts of a mixture). Models
        made one after another, each dropped before the next (a sweep), are each specialized."""
        import weakref

        source = str(source)
        if source in self.module_generic:
            return True
        seen = self.modules.get(source)
        if seen is None or seen[1] is not type(module):
            try:
                ref: Any = weakref.ref(module)
            except TypeError:
                return False
            self.modules[source] = (ref, type(module))
            return False
        first = seen[0]()
        if first is module:
            return False
        if first is None:
            # the first instance died, and its entries with it: specialize on this one instead
            self.modules[source] = (weakref.ref(module), type(module))
            return False
        self.module_generic.add(source)
        return True

    def see_shape(self, source: Any, shape: tuple[int, ...]) -> set[int]:
        source = str(source)
        old = self.shapes.get(source)
        dims = self.dims.setdefault(source, set())
        if old is not None and len(old) == len(shape):
            dims.update(i for i, (a, b) in enumerate(zip(old, shape)) if a != b)
        self.shapes[source] = shape
        return dims

    def see_int(self, source: Any, value: int) -> bool:
        source = str(source)
        old = self.ints.get(source)
        if old is not None and old != value:
            self.int_dynamic.add(source)
        self.ints[source] = value
        return source in self.int_dynamic


class _SymIntInput:
    """A graph input holding a symbolic int argument (``out.inputs`` reads ``.node``)."""

    __slots__ = ("node",)

    def __init__(self, node: torch.fx.Node):
        self.node = node


class OutputGraph:
    def __init__(self, fn_globals: dict[str, Any], policy: DynamicPolicy | None = None):
        self.graph = torch.fx.Graph()
        self.policy = policy or DynamicPolicy()  # static; resume functions: automatic
        #: the symbolic-shape machinery of a dynamic compile (None: static, as before)
        self.symbolic: Any = None
        if self.policy.symbolic:
            from .symbolic import SymbolicShapes, _user_where
            self.symbolic = SymbolicShapes(lambda: _user_where(
                self.tracer.frames if self.tracer is not None else []))
            self.fake_mode = self.symbolic.fake_mode
        else:
            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.guards = GuardSet()
        self.namespace: dict[str, Any] = {"___G": fn_globals, "___torch": torch,
                                          **ENTRY_HELPERS}
        if self.symbolic is not None:  # printed size expressions: math.floor, torch.sym_float
            self.namespace.update(math=__import__("math"), torch=torch)
        self._ns_ids: dict[int, str] = {}
        self._counter = itertools.count()
        # graph inputs: (placeholder var, source expression, real value)
        self.inputs: list[tuple[TensorVar, str, torch.Tensor]] = []
        self.tensor_by_id: dict[int, TensorVar] = {}
        #: Distinct tensor objects read from arguments: they must stay distinct (aliasing
        #: changes the meaning of in-place ops, identity tests and sets).
        self.arg_tensor_sources: list[str] = []
        #: Cheaper expressions to fetch an input once the guards hold (identity-guarded ones).
        self.fetch: dict[str, str] = {}
        #: autocast regions opened before this graph that it leaves (device, enabled, dtype).
        self.autocast_exits: list[tuple] = []
        self.var_by_source: dict[str, Var] = {}
        #: the Tracer filling this graph (set by capture): node locations come from its frames
        self.tracer: Any = None
        #: graph input kind by source: "parameter", "buffer" or "user" (see ember.context)
        self.input_kinds: dict[str, str] = {}
        #: argument names of modules guarded by class, not identity (FrameState.see_module):
        #: what is reached through them is read again on every call
        self.generic_roots: set[str] = set()
        #: parameters and buffers read through such a module: not the same tensor every call
        self.unstable_inputs: set[str] = set()
        # side effects to replay after the graph runs, in program order
        self.side_effects: list[tuple[str, Any]] = []
        self.mutated_containers: list[Var] = []
        self.object_stores: dict[tuple[int, str], tuple[Var, str, Var]] = {}
        self.global_stores: dict[str, Var] = {}
        #: source -> the plain-data snapshot its state guard compares with (one per source)
        self.state_snapshots: dict[str, Any] = {}

    def release(self) -> None:
        """Forget the user's objects once the entry is built (it holds what it needs, weakly
        where it identifies them): a backend may keep this graph's symbolic-shape machinery,
        which refers back here, and through it the whole model would stay alive."""
        self.namespace = {}
        self._ns_ids = {}
        self.inputs = []
        self.tensor_by_id = {}
        self.var_by_source = {}
        self.side_effects = []
        self.mutated_containers = []
        self.object_stores = {}
        self.global_stores = {}
        self.state_snapshots = {}
        self.tracer = None

    # -- namespace ---------------------------------------------------------------------------
    def ns(self, obj: Any, hint: str = "obj") -> str:
        """A name in the entry's namespace that refers to ``obj`` (kept alive by the entry)."""
        key = id(obj)
        name = self._ns_ids.get(key)
        if name is None:
            clean = "".join(c if c.isalnum() else "_" for c in hint)[:24]
            name = f"___{clean}_{next(self._counter)}"
            self.namespace[name] = obj
            self._ns_ids[key] = name
        return name

    def _short_path(self, source: Source) -> Source:
        """``M._parameters['w']`` read through the module's namespace reference when ``M`` is
        identity-guarded already (one lookup instead of the whole attribute path)."""
        state = source.module_state()
        if state is not None:
            ref = self.guards.identity.get(state.base)
            if ref is not None:
                return source.rebase(state.base, NamespaceRef(ref))
        return source

    def module_guard(self, source: Source, module: Any) -> str | None:
        """How the module at ``source`` is guarded: None for identity (the default), else the
        type guard (an argument that held another instance of its class before, and every
        module reached through it)."""
        if isinstance(source, Local) and source.local in self.policy.root_args and \
                self.policy.state is not None and self.policy.state.see_module(source, module):
            self.generic_roots.add(source.local)
        if not self.is_generic(source):
            return None
        t = type(module)
        return f"type({source}) is {self.ns(t, t.__name__)}"

    def is_generic(self, source: Source) -> bool:
        """Is ``source`` read through a module guarded by class (so a different object may be
        there on the next call)?"""
        if not self.generic_roots:
            return False
        root = source.root
        return isinstance(root, Local) and root.local in self.generic_roots

    def stable_ref(self, value: Any, source: Source) -> str:
        """``value``'s namespace name when ``source`` is identity-guarded to it (cheaper to read
        in later guards), else ``(source)``."""
        name = self._ns_ids.get(id(value))
        if name is not None and self.guards.identity.get(source) == name:
            return name
        return f"({source})"

    # -- graph building ----------------------------------------------------------------------
    def add_input(self, value: torch.Tensor, source: str, is_param: bool) -> TensorVar:
        existing = self.tensor_by_id.get(id(value))
        if existing is not None:
            if existing.source != source:
                self.guards.add(f"({source}) is ({existing.source})")
            return existing
        name = _node_name(source, len(self.inputs))
        node = self.graph.placeholder(name)
        state = self.policy.state if self.policy.mode is None else None
        auto = state.see_shape(source, tuple(value.shape)) if state is not None and \
            not is_param else set()
        sym = self.symbolic
        if sym is None:
            fake = self.fake_mode.from_tensor(value, static_shapes=True)
        else:
            from .symbolic import dynamic_marks, static_marks
            marks = dynamic_marks(value)
            dims = set(range(value.dim())) if self.policy.mode is True and not is_param else \
                set(auto)
            dims -= static_marks(value)
            fake = sym.fakify(value, source, dims, marks)
            sym.register_tensor(node, fake)
            node.meta["val"] = fake
        node.meta["example_value"] = fake
        var = TensorVar(node, fake, source=source, cls=type(value), is_param=is_param)
        self.inputs.append((var, source, value))
        self.tensor_by_id[id(value)] = var
        self.input_kinds[source] = _input_kind(source, value, is_param)
        generic = is_param and self.is_generic(source)
        if generic:
            self.unstable_inputs.add(source)
        if not is_param or generic:
            self.arg_tensor_sources.append(source)
        if is_param and not generic:
            # Identity first; after it holds, the namespace reference *is* the parameter, so the
            # requires_grad check and the graph input read it without walking the path again.
            ref = self.ns(value, 'p')
            self.guards.add(f"({self._short_path(source)}) is {ref}")
            # The same Parameter object can hold another tensor: ``module.double()``,
            # ``.half()``, ``.to(device)`` and ``p.data = t`` swap its data in place, so its
            # dtype, device, shape and strides are checked too (the graph was specialized to them).
            meta = (f"{ref}.requires_grad is {bool(value.requires_grad)} and "
                    f"{ref}.dtype is {self.ns(value.dtype, str(value.dtype))} and "
                    f"{ref}.device == {self.ns(value.device, 'device')} and "
                    f"{ref}.shape == {tuple(value.shape)!r} and "
                    f"{ref}.stride() == {tuple(value.stride())!r}")
            self.guards.add(meta)
            # the entry checks all of these at once (GuardSet.shortened, tensor_check.py)
            self.guards.tensor_meta.setdefault(meta, (ref, meta_of(value)))
            self.fetch[source] = ref
        elif sym is not None and _is_symbolic_tensor(fake):
            self.guards.add(self.symbolic_tensor_guard(source, value, fake))
        else:
            self.guards.add(self.tensor_guard(source, value))
        return var

    # -- dynamic shapes ------------------------------------------------------------------------
    def symint_arg(self, value: int, source: Any) -> Any:
        """The ConstVar for the int argument ``source``, symbolic when this compile makes it
        dynamic (``dynamic=True``, or automatic dynamic after its value changed); None: wrap it
        as a constant, as before."""
        policy = self.policy
        if not (isinstance(source, Local) and source.local in policy.root_args):
            return None
        state = policy.state if policy.mode is None else None
        dyn = state.see_int(source, value) if state is not None else policy.mode is True
        sym = self.symbolic
        if not dyn or sym is None:
            return None
        s = sym.symint_input(value, source)
        node = self.graph.placeholder(_node_name(str(source), len(self.inputs)))
        node.meta["example_value"] = node.meta["val"] = s
        sym.register_int(node, s)
        self.inputs.append((_SymIntInput(node), source, value))  # type: ignore[arg-type]
        self.input_kinds[source] = "symint"
        return ConstVar(s, source)

    def graph_arg(self, value: Any) -> Any:
        """The fx argument for a constant passed to an op: symbolic ints become nodes that
        compute them from the inputs' sizes (slices and sequences of them too)."""
        sym = self.symbolic
        if sym is None:
            return value
        from .symbolic import is_symbolic
        if is_symbolic(value):
            return sym.node_for(value, self.create_node)
        if isinstance(value, slice):
            if any(is_symbolic(x) for x in (value.start, value.stop, value.step)):
                return slice(self.graph_arg(value.start), self.graph_arg(value.stop),
                             self.graph_arg(value.step))
        elif isinstance(value, (tuple, list)) and any(is_symbolic(x) for x in value):
            return type(value)(self.graph_arg(x) for x in value) if not isinstance(
                value, torch.Size) else tuple(self.graph_arg(x) for x in value)
        return value

    def symbolic_tensor_guard(self, source: Any, t: torch.Tensor, fake: torch.Tensor) -> str:
        """The tensor guard of a tensor with symbolic sizes: static dims and strides compared
        as before, symbolic ones checked by the shape guards (ranges, relations)."""
        sym = self.symbolic
        parts = [
            f"type({source}) is {self.ns(type(t), type(t).__name__)}",
            f"({source}).dtype is {self.ns(t.dtype, str(t.dtype))}",
            f"({source}).device == {self.ns(t.device, 'device')}",
            f"({source}).dim() == {t.dim()}",
        ]
        for i, s in enumerate(fake.shape):
            if not isinstance(s, torch.SymInt):
                parts.append(f"({source}).size({i}) == {int(s)}")
        for i, s in enumerate(fake.stride()):
            parts.append(f"({source}).stride({i}) == "
                         f"{sym.expr_source(s) if isinstance(s, torch.SymInt) else int(s)}")
        parts.append(f"({source}).requires_grad is {bool(t.requires_grad)}")
        return " and ".join(parts)

    def add_symbolic_guards(self) -> None:
        """After tracing (and the backend's compile): the shape guards, each with its origin."""
        sym = self.symbolic
        if sym is None:
            return
        sym.check_marked()
        for expr, origin in sym.guards():
            if expr not in self.guards._seen:
                self.guards.add(expr)
                self.guards.origins[expr] = origin

    def tensor_guard(self, source: str, t: torch.Tensor) -> str:
        parts = [
            f"type({source}) is {self.ns(type(t), type(t).__name__)}",
            f"({source}).dtype is {self.ns(t.dtype, str(t.dtype))}",
            f"({source}).device == {self.ns(t.device, 'device')}",
            f"({source}).shape == {tuple(t.shape)!r}",
            f"({source}).stride() == {tuple(t.stride())!r}",
            f"({source}).requires_grad is {bool(t.requires_grad)}",
        ]
        return " and ".join(parts)

    def create_node(self, op: str, target: Any, args: tuple, kwargs: dict) -> torch.fx.Node:
        node = self.graph.create_node(op, target, args, kwargs)
        trace = self.user_stack()
        if trace:
            node.meta["stack_trace"] = trace
        return node

    def user_stack(self) -> str:
        """The user's frames (outermost first) at the instruction being traced, formatted as a
        Python traceback (what fx prints as ``# File: ...`` in readable graphs)."""
        tracer = self.tracer
        if tracer is None:
            return ""
        import linecache
        parts = []
        for f in tracer.frames:
            line = getattr(f, "lineno", None) or f.code.co_firstlineno
            text = linecache.getline(f.code.co_filename, line).strip()
            parts.append(f'  File "{f.code.co_filename}", line {line}, in {f.code.co_name}\n'
                         f"    {text}\n")
        return "".join(parts)

    # -- finishing ---------------------------------------------------------------------------
    def graph_module(self, output_nodes: list[torch.fx.Node]) -> torch.fx.GraphModule:
        self.graph.output(tuple(output_nodes))
        self.graph.eliminate_dead_code()
        gm = torch.fx.GraphModule(torch.nn.Module(), self.graph, class_name="EmberGraph")
        return gm


def _is_symbolic_tensor(fake: torch.Tensor) -> bool:
    return any(isinstance(s, torch.SymInt) for s in (*fake.shape, *fake.stride()))


def _input_kind(source: Source, value: torch.Tensor, is_param: bool) -> str:
    if not is_param:
        return "user"
    if isinstance(value, torch.nn.Parameter) or not any(s.is_buffer() for s in source.chain()):
        return "parameter"
    return "buffer"


def _node_name(source: Source, i: int) -> str:
    base = "".join(c if c.isalnum() else "_" for c in str(source))
    base = "_".join(p for p in base.split("_") if p and p not in ("modules", "parameters",
                                                                   "buffers", "G"))
    if not base or base[0].isdigit():
        base = f"in{i}_{base}"
    if len(base) > 60:  # cut names stay distinct: fx uses them as the graph's argument names
        base = f"{base[:52]}_{hashlib.sha1(base.encode()).hexdigest()[:7]}"
    return "l_" + base


# ---------------------------------------------------------------------------------------------
# Output reconstruction: Var -> Python expression inside the entry function
# ---------------------------------------------------------------------------------------------

class Reconstructor:
    """Turns Vars into Python expressions of the entry function. Mutable values created while
    tracing are built once into a temporary (``lines``) so that every reference shares them."""

    def __init__(self, out: OutputGraph):
        self.out = out
        self.graph_outputs: list[torch.fx.Node] = []
        self._out_index: dict[torch.fx.Node, int] = {}
        self.lines: list[str] = []
        self._memo: dict[int, str] = {}
        self._n = 0

    def _temp(self, v: Var, expr: str) -> str:
        name = f"___v{self._n}"
        self._n += 1
        self.lines.append(f"{name} = {expr}")
        self._memo[id(v)] = name
        return name

    def tensor_expr(self, v: TensorVar) -> str:
        if v.node.op == "placeholder" and v.source is not None:
            return str(v.source)
        idx = self._out_index.get(v.node)
        if idx is None:
            idx = len(self.graph_outputs)
            self.graph_outputs.append(v.node)
            self._out_index[v.node] = idx
        return f"___o[{idx}]"

    def expr(self, v: Var, *, allow_source: bool = True) -> str:
        memo = self._memo.get(id(v))
        if memo is not None and allow_source:
            return memo
        mutable = isinstance(v, (ListVar, DictVar, SetVar, DataclassVar, IteratorVar, CellVar,
                                 NestedFunctionVar, ExitVar))
        if mutable and allow_source and getattr(v, "source", None) is None:
            return self._temp(v, self._expr(v, allow_source=allow_source))
        return self._expr(v, allow_source=allow_source)

    def _expr(self, v: Var, *, allow_source: bool = True) -> str:
        out = self.out
        if isinstance(v, TensorVar):
            return self.tensor_expr(v)
        if isinstance(v, ConstVar):
            if v.guard_pending and v.source is not None:
                return str(v.source)  # forwarded untouched: no need to specialize on it
            val = v.value
            if out.symbolic is not None:
                from .symbolic import is_symbolic
                if is_symbolic(val):  # a size: recomputed from the inputs in the entry
                    return out.symbolic.expr_source(val)
                from .symbolic import has_symbolic
                if has_symbolic(val) and type(val) in (tuple, list, torch.Size):
                    inner = ", ".join(self.expr(ConstVar(i)) for i in val)
                    if type(val) is list:
                        return f"[{inner}]"
                    tup = f"({inner}{',' if len(val) == 1 else ''})"
                    return f"___torch.Size({tup})" if type(val) is torch.Size else tup
            if type(val) in _SIMPLE_CONSTS and not (isinstance(val, float) and
                                                        (val != val or val in (float("inf"),
                                                                               float("-inf")))):
                return repr(val)
            return out.ns(val, type(val).__name__)
        if isinstance(v, (ListVar, DictVar, SetVar)) and allow_source and v.source is not None:
            return str(v.source)  # identity matters; mutations are replayed separately
        if isinstance(v, TupleVar):
            inner = ", ".join(self.expr(i) for i in v.items)
            if v.cls is tuple:
                return f"({inner}{',' if len(v.items) == 1 else ''})"
            if v.cls is torch.Size:
                return f"___torch.Size([{inner}])"
            if hasattr(v.cls, "_fields") or v.cls.__module__ == "torch.return_types":
                if v.cls.__module__ == "torch.return_types":
                    return f"{out.ns(v.cls, v.cls.__name__)}(({inner}{',' if len(v.items) == 1 else ''}))"
                return f"{out.ns(v.cls, v.cls.__name__)}({inner})"
            return f"{out.ns(v.cls, v.cls.__name__)}(({inner},))"
        if isinstance(v, ListVar):
            inner = ", ".join(self.expr(i) for i in v.items)
            return f"[{inner}]" if v.cls is list else f"{out.ns(v.cls, v.cls.__name__)}([{inner}])"
        if isinstance(v, SetVar):
            if not v.items:
                return "set()"
            # added one by one in the traced order, as the program built it: a set display of
            # constants would be filled from a frozenset constant, in another hash order
            return "set([" + ", ".join(self.expr(i) for i in v.items) + "])"
        if isinstance(v, DictVar):
            inner = ", ".join(f"{self.key_expr(k)}: {self.expr(val)}" for k, val in v.items.items())
            if v.cls is dict:
                return "{" + inner + "}"
            factory = getattr(v, "default_factory", None)
            if factory is not None:
                return f"{out.ns(v.cls, v.cls.__name__)}({self.expr(factory)}, {{{inner}}})"
            return f"{out.ns(v.cls, v.cls.__name__)}({{{inner}}})"
        if isinstance(v, PartialVar):
            parts = [self.expr(v.fn)] + [self.expr(a) for a in v.args] + [
                f"{k}={self.expr(a)}" for k, a in v.kwargs.items()]
            return f"{out.ns(functools.partial, 'partial')}({', '.join(parts)})"
        if isinstance(v, DataclassVar):
            if v.cls is types.SimpleNamespace:
                inner = ", ".join(f"{k}={self.expr(val)}" for k, val in v.fields.items())
                return f"{out.ns(v.cls, 'SimpleNamespace')}({inner})"
            if getattr(v, "plain", False):
                inner = ", ".join(f"{k!r}: {self.expr(val)}" for k, val in v.fields.items())
                return f"___mkobj({out.ns(v.cls, v.cls.__name__)}, {{{inner}}})"
            inner = ", ".join(f"{k}={self.expr(val)}" for k, val in v.fields.items())
            return f"{out.ns(v.cls, v.cls.__name__)}({inner})"
        if isinstance(v, IteratorVar):
            return "iter([" + ", ".join(self.expr(i) for i in v.rest()) + "])"
        if isinstance(v, BoundMethodVar):
            return f"___MethodType({self.expr(v.fn)}, {self.expr(v.self_var)})"
        if isinstance(v, TensorMethodVar):
            return f"{self.expr(v.tensor)}.{v.name}"
        if isinstance(v, ContainerMethodVar):
            return f"{self.expr(v.obj)}.{v.name}"
        if isinstance(v, CellVar):
            if getattr(v, "per_call", False):  # a resume function's cell: its own each call
                return str(v.source)
            if v.real_cell is not None:
                return out.ns(v.real_cell, "cell")
            return f"___mkcell({self.expr(v.value) if v.value is not None else ''})"
        if isinstance(v, NestedFunctionVar):
            defaults = self.expr(v.defaults) if v.defaults is not None else "None"
            closure = ("(" + "".join(self.expr(c) + ", " for c in v.closure) + ")"
                       if v.closure else "None")
            fn = f"___FunctionType({out.ns(v.code, 'code')}, {out.ns(v.fn_globals, 'globals')}, " \
                 f"{v.code.co_name!r}, {defaults}, {closure})"
            if v.kwdefaults is not None:
                fn = f"___with_kwdefaults({fn}, {self.expr(v.kwdefaults)})"
            return fn
        if isinstance(v, ExitVar):
            from .variables import GradModeVar
            if v.source is not None:
                return str(v.source)
            if isinstance(v.ctx, GradModeVar):
                return f"___GradRestore({getattr(v, 'prev_mode', True)!r})"
            from .variables import AutocastVar
            if isinstance(v.ctx, AutocastVar):
                c = v.ctx
                return (f"___enter_autocast({c.device_type!r}, {out.ns(c.dtype, str(c.dtype))}, "
                        f"{c.enabled!r})")
            raise Unsupported("a graph break inside this `with` block")
        if isinstance(v, (NNModuleVar, ObjectVar, FunctionVar, PyModuleVar, ClassVar)):
            if v.source is not None:
                return str(v.source)
            return out.ns(v.value, "obj")
        if isinstance(v, BuiltinVar):
            owner = getattr(v.value, "__self__", None)
            if v.source is not None and owner is not None and \
                    not isinstance(owner, (types.ModuleType, type)):
                return str(v.source)  # a method bound to an argument: this call's argument's
            return out.ns(v.value, getattr(v.value, "__name__", "fn"))
        raise Unsupported(f"cannot return {v.describe()} from a compiled region")

    def key_expr(self, k: Any) -> str:
        if type(k) in _SIMPLE_CONSTS:
            return repr(k)
        return self.out.ns(k, "key")


def owned_state(out: OutputGraph) -> set[str]:
    """Namespace names of parameters and buffers read through an identity-guarded module: the
    entry dies with that module, so they are held strongly (see ``lifetime``)."""
    owned = set()
    for _var, source, _value in out.inputs:
        ref = out.fetch.get(source)
        state = source.module_state() if isinstance(source, Source) else None
        if ref is not None and state is not None and state.base in out.guards.identity:
            owned.add(ref)
    return owned


def signature_source(code: types.CodeType) -> str:
    """The parameter list of ``code`` as source (defaults are attached separately)."""
    names = code.co_varnames
    npos = code.co_argcount
    nposonly = code.co_posonlyargcount
    nkw = code.co_kwonlyargcount
    parts = list(names[:nposonly])
    if nposonly:
        parts.append("/")
    parts += list(names[nposonly:npos])
    i = npos + nkw
    if code.co_flags & 0x04:  # CO_VARARGS
        parts.append("*" + names[i])
        i += 1
    elif nkw:
        parts.append("*")
    parts += list(names[npos:npos + nkw])
    if code.co_flags & 0x08:  # CO_VARKEYWORDS
        parts.append("**" + names[i])
    return ", ".join(parts)


def conjunct(guard: str) -> str:
    """``guard`` as one term of the entry's ``a and b and ...``: a guard whose top level binds
    more loosely than ``and`` (a symbolic relation printed as ``x > 0 or y > 0``, a conditional
    expression, a lambda) goes in parentheses, or its ``or`` would split the whole chain (every
    guard before it would then be optional)."""
    if " or " not in guard and " if " not in guard and "lambda" not in guard and ":=" not in guard:
        return guard
    import ast

    try:
        top = ast.parse(guard.strip(), mode="eval").body
    except SyntaxError:
        return f"({guard})"
    if isinstance(top, ast.BoolOp) and isinstance(top.op, ast.And) or \
            not isinstance(top, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)):
        return guard
    return f"({guard})"


def entry_source(fn: Callable[..., Any], out: OutputGraph, has_graph: bool,
                 input_exprs: list[str], body: list[str], prologue: tuple[str, ...] = ()) -> str:
    """The entry function's source: guards, graph call, side effects, result (or break)."""
    sig = signature_source(fn.__code__)
    # The function being called comes first: functions sharing this code object share entries,
    # and each call's guards read that call's own function (closure, defaults, globals).
    sig = f"{FN}, {sig}" if sig else FN
    guard_expr = " and\n            ".join(map(conjunct, out.guards.shortened(out.ns))) or "True"
    lines = [f"def ___entry({sig}):",
             "    try:",
             f"        if not ({guard_expr}):",
             "            return ___MISS",
             "    except Exception:",
             "        return ___MISS"]
    lines += ["    " + p for p in prologue]
    if has_graph:
        lines.append(f"    ___o = ___compiled({', '.join(input_exprs)})")
    lines += ["    " + b for b in body]
    return "\n".join(lines) + "\n"


def build_entry(fn: Callable[..., Any], out: OutputGraph, compiled: Callable[..., Any] | None,
                input_exprs: list[str], body: list[str],
                prologue: tuple[str, ...] = ()) -> Callable[..., Any]:
    """Generate the entry function: guards, graph call, side effects, result (or break)."""
    from .frame import MISS

    code = fn.__code__
    sig = signature_source(code)
    sig = f"{FN}, {sig}" if sig else FN
    src = entry_source(fn, out, compiled is not None, input_exprs, body, prologue)
    ns = dict(out.namespace)  # (after the source: it may name a value of its own)
    ns["___MISS"] = MISS
    ns["___compiled"] = compiled
    # A second function evaluates the guards one by one to name the first that fails.
    explain_lines = [f"def ___failed_guard({sig}):"]
    for g in out.guards.exprs:
        origin = out.guards.origins.get(g)
        shown = f"{g}  (introduced by {origin})" if origin else g
        explain_lines += ["    try:", f"        if not ({g}):", f"            return {shown!r}",
                          "    except Exception as e:",
                          f"        return {g!r} + ' (raised ' + type(e).__name__ + ')'"]
    explain_lines.append("    return None")
    src_explain = "\n".join(explain_lines) + "\n"
    filename = f"<ember entry for {code.co_name} at {code.co_filename}:{code.co_firstlineno}>"
    # The objects the guards identify are held weakly: the entry dies with them (lifetime.py).
    entry, explain = make_entry(src, src_explain, ns, filename,
                                weak_names(ns, out.guards.exprs, owned_state(out)))
    ns = entry.__globals__
    if getattr(compiled, "swap", False) is None:  # drop the first-call output check once done
        compiled.swap = lambda raw: ns.__setitem__("___compiled", raw)
    for f in (entry, explain):
        f.__defaults__ = fn.__defaults__
        f.__kwdefaults__ = fn.__kwdefaults__
    entry.source = src
    entry.guards = list(out.guards.exprs)
    if guard_log.isEnabledFor(logging.INFO):
        shown = [f"{g}  # {out.guards.origins[g]}" if g in out.guards.origins else g
                 for g in out.guards.exprs]
        guard_log.info("guards for %s:\n  %s", filename, "\n  ".join(shown))
    if code_log.isEnabledFor(logging.INFO):
        code_log.info("entry for %s:\n%s", filename, src)
    return entry
