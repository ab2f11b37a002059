"""What a captured graph does to its inputs and how its outputs alias, found by running it over
FakeTensors (no real compute, no tracing).

The compiled graphs are purely functional, so before tracing we need to know which inputs the
program mutates (their new values become extra graph outputs, copied back after the graph runs),
which outputs are views of an input or of another output (those are regenerated as views at run
time rather than returned by the graph), and which outputs require grad (each gets a tangent in
the joint forward+backward trace).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Sequence

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .._views import elements_meet
from ..exc import Unsupported
from .symbolic import expr_of, is_sym

__all__ = ["OutputInfo", "GraphInfo", "analyze", "fakeify"]


@dataclasses.dataclass(frozen=True)
class OutputInfo:
    """How one flat user output is produced at run time.

    kind: "graph" (a value the compiled forward returns, index ``index`` among its user outputs),
    "input_alias" (a view of tensor input ``index``), "output_alias" (a view of flat user output
    ``index``) or "const" (a non-tensor constant ``value``).
    """

    kind: str
    index: int = -1
    # ints; sympy expressions over the inputs' symbols under dynamic shapes
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    # "input_alias": storage offset (in elements of ``dtype``); "output_alias": in bytes,
    # relative to the base output's storage offset (the base's offset may differ at run time)
    offset: int = 0
    same: bool = False  # the alias is the very tensor (same size, stride and offset)
    value: Any = None
    dtype: Any = None  # the alias's dtype (a view may reinterpret its base: view(dtype), .real)
    # "input_alias": the traced input's storage offset (in its elements). ``offset`` is valid for
    # an input with that offset; the runtime shifts it by the difference (capture does not guard
    # storage offsets: x and big[1:] with the same sizes and strides reach the same graph)
    base_offset: Any = 0
    # an alias that does not carry its base's autograd history (``x.detach()``, a view made
    # under ``no_grad``): made from the detached base (set by the training analysis)
    detached: bool = False


@dataclasses.dataclass
class GraphInfo:
    out_spec: Any
    outputs: list[OutputInfo]
    graph_out_flat: list[int]  # flat user-output position of each "graph" output, in order
    mutated: list[int]  # tensor-input positions the program mutates
    graph_out_requires_grad: list[bool] = dataclasses.field(default_factory=list)
    mutated_requires_grad: list[bool] = dataclasses.field(default_factory=list)
    # tensor-input position -> (size, stride, storage offset) it has after the program: in-place
    # view ops (``t_``, ``transpose_``, ``squeeze_``, ``as_strided_``) change an input's metadata
    # without writing its data; the runtime applies the new metadata after the graph runs
    meta_mutated: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = dataclasses.field(
        default_factory=dict)
    # dynamic shapes: ``geometry(inputs) -> {flat output position: (size, stride, offset)}``
    # for the aliased outputs, whose OutputInfo then holds sympy expressions over the symbols
    geometry: Any = None
    # positions among the graph outputs that are sizes (SymInts the graph returns as ints)
    graph_out_sym: frozenset[int] = frozenset()
    # (training) (shape, dtype, device) of each forward output (graph outputs, then mutated
    # inputs' new values), from the grad-mode run: the joint trace's tangents are made from it
    # (one fake run fewer); shapes may be symbolic
    fwd_out_meta: Any = dataclasses.field(default=None, compare=False, repr=False)


class _MutationMode(TorchDispatchMode):
    """Records which tensors ops write to (per their schema), applying Ember's base
    decompositions first so that kernels whose schema hides a mutation (legacy batch norm updating
    running statistics) show it."""

    def __init__(self) -> None:
        super().__init__()
        from .trace import base_decompositions

        self.table = base_decompositions()
        self.written: list[torch.Tensor] = []
        self.resized: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        fn = self.table.get(func)
        if fn is not None:
            with self:
                out = fn(*args, **kwargs)
            if out is not NotImplemented:
                return out
        schema = getattr(func, "_schema", None)
        if torch.Tag.inplace_view in getattr(func, "tags", ()):
            # metadata only (the input's new size/strides are read after the run), except
            # resize_, which may also reallocate the storage
            if func.__name__.split(".")[0] in ("resize_", "resize_as_") and args:
                self.resized.append(args[0])
            schema = None
        if schema is not None:
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    v = args[i] if i < len(args) else kwargs.get(a.name)
                    if isinstance(v, torch.Tensor):
                        self.written.append(v)
        return func(*args, **kwargs)


def fakeify(mode: FakeTensorMode, tensors: Sequence[Any],
            requires_grad: Sequence[bool] | None = None,
            metas: Sequence[Any] | None = None) -> list[Any]:
    """Fresh leaf FakeTensors with the inputs' sizes, strides, storage offsets and devices.

    With ``metas`` (dynamic shapes: the placeholders' symbolic ``meta["val"]``), the fakes are
    detached copies of those, so they carry capture's symbols; SymInt inputs are passed as
    they are. Non-tensor inputs are passed as they are."""
    out: list[Any] = []
    for i, t in enumerate(tensors):
        if metas is not None:
            m = metas[i]
            if not isinstance(m, torch.Tensor):
                out.append(m)
                continue
            f = m.detach()
        elif not isinstance(t, torch.Tensor):
            out.append(t)
            continue
        else:
            f = mode.from_tensor(t.detach())
        if requires_grad is not None and requires_grad[i]:
            f.requires_grad_(True)
        out.append(f)
    return out


def _geometry(t: torch.Tensor) -> tuple[tuple[Any, ...], tuple[Any, ...], Any]:
    """Size, strides and storage offset, symbolic ones as sympy expressions (compared
    structurally: comparing SymInts would add guards)."""
    return (tuple(expr_of(s) for s in t.size()), tuple(expr_of(s) for s in t.stride()),
            expr_of(t.storage_offset()))


def _output_base(flat: list[Any], k: int, own: set[int]) -> int | None:
    """The output that output ``k`` is regenerated as a view of (its position), or None when
    the graph returns ``k`` itself. A base is the largest output holding every element of ``k``
    (the first of equal ones), before or after ``k``: returned as separate buffers, a view and
    its base would no longer share memory, and a write through one after a graph break would
    not reach the other. The base chosen is itself returned by the graph (no output holds it
    but its equals, of which it is the first)."""
    o = flat[k]
    holders = [j for j in own if j != k and torch._C._is_alias_of(o, flat[j])
               and _holds(flat[j], o)]
    bigger = [j for j in holders if not _inside(flat[j], o)]
    if bigger:
        top = [j for j in bigger if not any(_inside(flat[j], flat[c]) and not
                                            _inside(flat[c], flat[j]) for c in bigger if c != j)]
        return min(top)
    equal = [j for j in holders if j < k]
    return min(equal) if equal else None


def _holds(b: torch.Tensor, o: torch.Tensor) -> bool:
    """Does ``b`` hold every element of ``o``? With symbolic geometry (where ``_inside`` decides
    nothing without guarding the sizes): when ``o`` is a view of ``b`` and ``b`` is no view, a
    tensor the graph made, which its storage fits (``y[1:]`` of ``y = x * 1``)."""
    if _inside(o, b):
        return True
    return getattr(o, "_base", None) is b and b._base is None and _symbolic(o, b)


def _refuse_unrelated_overlaps(flat: list[Any], bases: dict[int, int | None]) -> None:
    """Two outputs that share elements while neither holds the other and no output holds both
    (``y[1:]`` and ``y[:-1]`` of an intermediate ``y`` the graph does not return) cannot both be
    regenerated as views; returned as separate buffers, a write through one after a graph
    break would not reach the other. Such a graph runs eagerly. Not decided for symbolic
    geometry (deciding would add guards on the sizes): such outputs stay separate buffers, a
    gap of dynamic shapes."""
    groups: dict[int, list[int]] = {}
    for k in sorted(k for k, b in bases.items() if b is None):  # the graph's own returns
        key = next((r for r in groups if torch._C._is_alias_of(flat[k], flat[r])), k)
        groups.setdefault(key, []).append(k)
    for roots in groups.values():
        for i, a in enumerate(roots):
            for b in roots[i + 1:]:
                if not _symbolic(flat[a], flat[b]) and elements_meet(flat[a], flat[b]):
                    raise Unsupported("two outputs of the graph share memory without either "
                                      "being a view of the other (overlapping views of a value "
                                      "the graph does not return)")


def _symbolic(*ts: torch.Tensor) -> bool:
    return any(is_sym(v) for t in ts for v in (*t.shape, *t.stride(), t.storage_offset()))


def _inside(o: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether every byte ``o`` addresses is one ``b`` addresses (``b`` non-overlapping and
    dense, ``o`` within its span). Only then may ``o`` be regenerated as a view of ``b``: two
    views of one intermediate (``y[:, :8]``, ``y[:, 8:]``) share a storage, but an as_strided of
    the first reaching the second's elements gets a wrong gradient (the first's backward cannot
    hold them). Symbolic geometry: False unless the same (``o`` is then returned by the graph)."""
    def span(t: torch.Tensor) -> tuple[Any, Any]:  # [first byte, one past the last byte)
        lo = hi = t.storage_offset()
        for size, stride in zip(t.shape, t.stride()):
            lo += min(0, (size - 1) * stride)
            hi += max(0, (size - 1) * stride)
        return lo * t.element_size(), (hi + 1) * t.element_size()

    if _geometry(o) == _geometry(b) or o.numel() == 0:
        return True
    if any(is_sym(v) for t in (o, b) for v in (*t.shape, *t.stride(), t.storage_offset())):
        return False  # deciding it could add guards on the sizes
    expected = 1  # b dense: its dims sorted by stride tile its span exactly
    for size, stride in sorted((d for d in zip(b.shape, b.stride()) if d[0] != 1),
                               key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    (olo, ohi), (blo, bhi) = span(o), span(b)
    return blo <= olo and ohi <= bhi


def _raw_geometry(t: torch.Tensor) -> tuple[Any, ...]:
    """Size, strides and offset as they are (SymInts by object: a guard the run adds may rewrite
    a symbol's expression, which is no change of the tensor's metadata)."""
    return (*t.size(), None, *t.stride(), None, t.storage_offset())


def _same_raw(a: tuple[Any, ...], b: tuple[Any, ...] | None) -> bool:
    if b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.SymInt) or isinstance(y, torch.SymInt):
            if not (isinstance(x, torch.SymInt) and isinstance(y, torch.SymInt)
                    and x.node is y.node):
                return False
        elif x != y:
            return False
    return True


def _dispatch(metas: Sequence[Any] | None) -> Any:
    """Dynamic shapes: run composite ops through torch's Python decompositions, as make_fx's
    symbolic trace does. Some C++ composite kernels read concrete sizes (torch 2.11's matmul:
    ``sizes()``/``numel()``), which would specialize capture's symbols to constants."""
    return enable_python_dispatcher() if metas is not None else contextlib.nullcontext()


def _flatten(out: Any) -> tuple[list[Any], Any]:
    return pytree.tree_flatten(out)


def analyze(gm: Any, tensors: Sequence[Any], requires_grad: Sequence[bool],
            need_grad_info: bool, mode: FakeTensorMode | None = None,
            metas: Sequence[Any] | None = None) -> GraphInfo:
    """Find mutated inputs, aliased outputs and (when ``need_grad_info``) which outputs require
    grad, by running ``gm`` over fake copies of ``tensors``.

    Dynamic shapes: ``mode`` is capture's FakeTensorMode and ``metas`` the inputs' symbolic
    values; the geometry of aliased outputs is then recorded as sympy expressions over the
    inputs' symbols (evaluated per call by the runtime)."""
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = fakeify(mode, tensors, None, metas)
    before = [_raw_geometry(f) if isinstance(f, torch.Tensor) else None for f in fakes]
    mm = _MutationMode()
    with mode, mm, torch.no_grad(), _dispatch(metas):
        flat, spec = _flatten(gm(*fakes))
    tfakes = [(i, f) for i, f in enumerate(fakes) if isinstance(f, torch.Tensor)]
    mutated = [i for i, f in tfakes if any(torch._C._is_alias_of(w, f) for w in mm.written)]
    for i, f in tfakes:
        if any(torch._C._is_alias_of(w, f) for w in mm.resized):
            raise NotImplementedError(
                "resize_ of a graph input (or of a view of one) is not supported by AOT autograd")
    meta_mutated = {i: _geometry(f) for i, f in tfakes
                    if not _same_raw(_raw_geometry(f), before[i])}

    outputs: list[OutputInfo] = []
    graph_out_flat: list[int] = []
    # the tensor outputs that alias no input: the graph's own (one may be a view of another)
    own = {k for k, o in enumerate(flat) if isinstance(o, torch.Tensor)
           and not any(torch._C._is_alias_of(o, f) for _, f in tfakes)}
    bases = {k: _output_base(flat, k, own) for k in own}
    _refuse_unrelated_overlaps(flat, bases)
    for k, o in enumerate(flat):
        if is_sym(o):  # a size computed by the graph (dynamic shapes): the graph returns it
            outputs.append(OutputInfo("graph", len(graph_out_flat)))
            graph_out_flat.append(k)
            continue
        if not isinstance(o, torch.Tensor):
            outputs.append(OutputInfo("const", value=o))
            continue
        info = None
        og = _geometry(o)
        for i, f in tfakes:
            if torch._C._is_alias_of(o, f):
                # the very input object (``return x``), not a view of the same geometry
                # (``x.view(-1)``, ``x.detach()``: another tensor, which eager returns anew)
                same = o is f
                info = OutputInfo("input_alias", i, og[0], og[1], og[2], same, dtype=o.dtype,
                                  base_offset=expr_of(f.storage_offset()))
                break
        if info is None:
            j = bases.get(k)
            if j is not None:
                b = flat[j]
                info = OutputInfo("output_alias", j, og[0], og[1],
                                  expr_of(o.storage_offset() * o.element_size()
                                          - b.storage_offset() * b.element_size()), o is b,
                                  dtype=o.dtype)
        if info is None:
            info = OutputInfo("graph", len(graph_out_flat))
            graph_out_flat.append(k)
        outputs.append(info)

    result = GraphInfo(spec, outputs, graph_out_flat, mutated, meta_mutated=meta_mutated,
                       graph_out_sym=frozenset(j for j, k in enumerate(graph_out_flat)
                                               if is_sym(flat[k])))
    if need_grad_info:
        # the same mode: dynamic shapes (capture's), or static shapes with unbacked symbols
        _grad_info(gm, tensors, requires_grad, result,
                   mode if metas is not None or mode.shape_env is not None else None, metas)
    return result


def _grad_info(gm: Any, tensors: Sequence[Any], requires_grad: Sequence[bool], info: GraphInfo,
               mode: FakeTensorMode | None = None, metas: Sequence[Any] | None = None) -> None:
    """Second fake run with autograd on: which graph outputs and mutated inputs require grad."""
    if mode is None:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = fakeify(mode, tensors, requires_grad, metas)
    with mode, _MutationMode(), torch.enable_grad(), _dispatch(metas):
        xs = list(fakes)
        for i in info.mutated:
            if xs[i].requires_grad:  # mutate a non-leaf copy, as the joint trace does
                xs[i] = xs[i].clone()
        flat, _ = _flatten(gm(*xs))
    info.graph_out_requires_grad = [isinstance(flat[k], torch.Tensor)
                                    and bool(flat[k].requires_grad)
                                    for k in info.graph_out_flat]
    for k, o in enumerate(info.outputs):
        if o.kind in ("input_alias", "output_alias") and not o.same and \
                isinstance(flat[k], torch.Tensor) and not flat[k].requires_grad:
            info.outputs[k] = dataclasses.replace(o, detached=True)
    info.mutated_requires_grad = [bool(xs[i].requires_grad) for i in info.mutated]
    outs = [flat[k] for k in info.graph_out_flat] + [xs[i] for i in info.mutated]
    info.fwd_out_meta = [(tuple(o.shape), o.dtype, o.device) if isinstance(o, torch.Tensor)
                         else None for o in outs]
