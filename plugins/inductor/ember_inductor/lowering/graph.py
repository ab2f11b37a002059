"""Walk an ATen fx graph and build the IR: one lowering per op, ATen fallback for the rest."""

from __future__ import annotations

import logging
import operator
from typing import Any, Sequence

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..ir import (Buffer, ComputedBuffer, ExternKernel, InputBuffer, IRNode, Layout, MultiOutput,
                  NoneValue, Pointwise, Reduction, ReinterpretView)
from ..sizes import contiguous_strides
from .common import SUPPORTED_DTYPES
from .registry import EXTERN_OPS, LOWERINGS, Unsupported, set_current

__all__ = ["GraphLowering", "dense_stride", "layout_of"]

log = logging.getLogger("ember.inductor")

# A lazy value read by several consumers is recomputed in each unless it costs more than this
# many ops; past it, it is stored once.
INLINE_MULTI_USE_OPS = 4
# A lazy value whose body grew past this many ops is stored (keeps kernels and compile time sane).
MAX_INLINE_OPS = 64


def dense_stride(size: Sequence[int], stride: Sequence[int]) -> list[int]:
    """``stride`` if it describes a dense non-overlapping layout of ``size``, else contiguous."""
    dims = [i for i, s in enumerate(size) if s != 1]
    order = sorted(dims, key=lambda i: (stride[i], -i))
    acc = 1
    for i in order:
        if stride[i] != acc:
            return contiguous_strides(size)
        acc *= size[i]
    out = list(stride)
    # size-1 dims: any stride is equivalent; keep eager's
    return out


def layout_of(t: torch.Tensor, offset: int = 0) -> Layout:
    return Layout(tuple(int(s) for s in t.shape), tuple(int(s) for s in t.stride()), t.dtype,
                  t.device, offset)


class GraphLowering:
    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.operations: list[Buffer] = []       # ComputedBuffer / ExternKernel / MultiOutput, in order
        self.inputs: list[InputBuffer] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.outputs: list[Any] = []              # IR values (storage-backed) or None
        self.env: dict[torch.fx.Node, Any] = {}
        self.node: torch.fx.Node | None = None
        self.fallback_ops: list[str] = []
        self._n = 0
        self._cse: dict[Any, torch.fx.Node] = {}
        self._realized: dict[int, tuple[IRNode, Buffer]] = {}
        self._canon: dict[torch.fx.Node, torch.fx.Node] = {}

    # -- naming / realizing ----------------------------------------------------------------
    def new_name(self, prefix: str = "buf") -> str:
        self._n += 1
        return f"{prefix}{self._n - 1}"

    def meta(self) -> Any:
        return self.node.meta.get("val") if self.node is not None else None

    def realize(self, value: IRNode, stride: Sequence[Any] | None = None) -> IRNode:
        """Storage-backed version of ``value`` (a Buffer or a ReinterpretView)."""
        if isinstance(value, (Buffer, ReinterpretView, NoneValue)):
            return value
        if isinstance(value, (Pointwise, Reduction)):
            done = self._realized.get(id(value))
            if done is not None and done[0] is value:  # stored once, however many consumers
                return done[1]
            size = value.get_size()
            if stride is None or len(stride) != len(size):
                stride = contiguous_strides(size)
            layout = Layout(tuple(size), tuple(stride), value.dtype, value.device)
            if not value.origins and self.node is not None:
                value.origins = [getattr(self.node.target, "__name__",
                                         str(self.node.target)).split(".")[0]]
            buf = ComputedBuffer(self.new_name(), layout, value)
            self.operations.append(buf)
            self._realized[id(value)] = (value, buf)
            return buf
        raise TypeError(f"cannot realize {type(value).__name__}")

    def realize_like_meta(self, value: IRNode, meta: Any) -> IRNode:
        stride = None
        if isinstance(meta, torch.Tensor) and list(meta.shape) == list(value.get_size()):
            stride = dense_stride([int(s) for s in meta.shape], [int(s) for s in meta.stride()])
        return self.realize(value, stride)

    # -- fallback ----------------------------------------------------------------------------
    def fallback(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any],
                 kind: str | None = None) -> Any:
        if kind is None:
            kind = "extern" if op in EXTERN_OPS else "fallback"
        if kind == "fallback":
            self.fallback_ops.append(str(op))

        def prep(a: Any) -> Any:
            if isinstance(a, IRNode):
                return self.realize(a)
            return a

        args = pytree.tree_map(prep, list(args))
        kwargs = pytree.tree_map(prep, dict(kwargs))
        meta = self.meta()
        origins = [self.node.name] if self.node is not None else []
        if isinstance(meta, torch.Tensor):
            buf = ExternKernel(self.new_name(), layout_of(meta), op, args, kwargs, kind, origins)
            self.operations.append(buf)
            return buf
        parent = ExternKernel(self.new_name(), None, op, args, kwargs, kind, origins)
        self.operations.append(parent)

        def out(m: Any, path: tuple[int, ...]) -> Any:
            if isinstance(m, torch.Tensor):
                mo = MultiOutput(self.new_name(), layout_of(m), parent, path)
                self.operations.append(mo)
                return mo
            if isinstance(m, (list, tuple)):
                return type(m)(out(x, path + (i,)) for i, x in enumerate(m))
            if m is None:
                return NoneValue()
            raise Unsupported(f"fallback output of type {type(m).__name__}")

        return out(meta, ())

    # -- the walk ----------------------------------------------------------------------------
    def run(self) -> "GraphLowering":
        set_current(self)
        try:
            for node in self.gm.graph.nodes:
                self.node = node
                self.env[node] = self.lower_node(node)
        finally:
            set_current(None)
            self.node = None
        return self

    def lower_node(self, node: torch.fx.Node) -> Any:
        if node.op == "placeholder":
            meta = node.meta.get("val")
            if not isinstance(meta, torch.Tensor):
                raise Unsupported(f"non-tensor graph input {node.name}")
            buf = InputBuffer(f"arg{len(self.inputs)}", layout_of(meta), len(self.inputs))
            self.inputs.append(buf)
            return buf
        if node.op == "get_attr":
            t = getattr(self.gm, node.target)
            if not isinstance(t, torch.Tensor):
                raise Unsupported(f"get_attr of {type(t).__name__}")
            name = f"const{len(self.constants)}"
            self.constants[name] = t
            return InputBuffer(name, layout_of(t), -1)
        if node.op == "output":
            outs = node.args[0]
            flat = outs if isinstance(outs, (list, tuple)) else [outs]
            for o in flat:
                if not isinstance(o, torch.fx.Node):
                    self.outputs.append(o)
                    continue
                v = self.env[o]
                if isinstance(v, IRNode) and not isinstance(v, NoneValue):
                    v = self.realize_like_meta(v, o.meta.get("val"))
                self.outputs.append(v)
            return None
        if node.op != "call_function":
            raise Unsupported(f"fx op {node.op}")
        key = self._cse_key(node)
        if key is not None:
            prior = self._cse.get(key)
            if prior is not None:  # the same pure op on the same values: reuse its result
                self._canon[node] = prior
                return self.env[prior]
            self._cse[key] = node
        args = pytree.tree_map(self._env_lookup, node.args)
        kwargs = pytree.tree_map(self._env_lookup, node.kwargs)
        if node.target is operator.getitem:
            return self._maybe_realize(node, args[0][args[1]])
        fn = LOWERINGS.get(node.target)
        if fn is not None and any(isinstance(a, IRNode) and not isinstance(a, NoneValue)
                                  and a.dtype not in SUPPORTED_DTYPES
                                  for a in pytree.tree_leaves((args, kwargs))):
            fn = None  # complex and other dtypes the code generator has no type for
        result = None
        if fn is not None and node.target not in EXTERN_OPS:
            try:
                result = fn(*args, **kwargs)
                for r in (result if isinstance(result, (list, tuple)) else [result]):
                    if isinstance(r, (Pointwise, Reduction)) and r.dtype not in SUPPORTED_DTYPES:
                        raise Unsupported(f"dtype {r.dtype}")
            except Unsupported as e:
                log.debug("lowering %s: %s; ATen fallback", node.target, e)
                result = None
        if result is None:
            # ATen decides its output's layout from its inputs' layouts: give it the ones the
            # graph's metadata describes (the same the output metadata was computed from)
            args = self._realize_like_nodes(node.args, args)
            kwargs = self._realize_like_nodes(node.kwargs, kwargs)
            result = self.fallback(node.target, args, kwargs)
        self._set_origins(node, args, result)
        return self._maybe_realize(node, result)

    def _set_origins(self, node: torch.fx.Node, args: Any, result: Any) -> None:
        name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        prior: list[str] = []
        for a in pytree.tree_leaves(args):
            if isinstance(a, Pointwise):
                prior.extend(a.origins)
        origins = list(dict.fromkeys(prior + [name]))[-12:]
        for r in (result if isinstance(result, (list, tuple)) else [result]):
            if isinstance(r, Pointwise) and not r.origins:
                r.origins = origins

    def _cse_key(self, node: torch.fx.Node) -> Any:
        """A key equal for nodes computing the same pure op on the same values (graphs often
        recompute attention masks or position ids per layer); None for anything else."""
        if node.target not in LOWERINGS or node.target in EXTERN_OPS:
            return None

        def conv(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return ("node", self._canon.get(a, a).name)
            if isinstance(a, (list, tuple)):
                return (type(a).__name__,) + tuple(conv(x) for x in a)
            if isinstance(a, dict):
                return ("dict",) + tuple(sorted((k, conv(v)) for k, v in a.items()))
            if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
                return str(a)
            if isinstance(a, float) and a != a:
                raise TypeError("NaN constant")
            if a is None or isinstance(a, (bool, int, float, str)):
                return (type(a).__name__, a)
            raise TypeError(type(a).__name__)

        try:
            key = (node.target, conv(node.args), conv(node.kwargs))
            hash(key)
        except TypeError:
            return None
        return key

    def _realize_like_nodes(self, nodes: Any, values: Any) -> Any:
        if isinstance(nodes, torch.fx.Node):
            if isinstance(values, (Pointwise, Reduction)):
                return self.realize_like_meta(values, nodes.meta.get("val"))
            return values
        if isinstance(nodes, (list, tuple)) and isinstance(values, (list, tuple)):
            return type(values)(self._realize_like_nodes(n, v) for n, v in zip(nodes, values))
        if isinstance(nodes, dict) and isinstance(values, dict):
            return {k: self._realize_like_nodes(nodes[k], v) for k, v in values.items()}
        return values

    def _env_lookup(self, a: Any) -> Any:
        return self.env[a] if isinstance(a, torch.fx.Node) else a

    def _maybe_realize(self, node: torch.fx.Node, value: Any) -> Any:
        if isinstance(value, Reduction):
            return self.realize_like_meta(value, node.meta.get("val"))
        if not isinstance(value, Pointwise):
            return value
        n_users = len(node.users)
        if value.op_count() > MAX_INLINE_OPS or (n_users > 1 and
                                                 value.op_count() > INLINE_MULTI_USE_OPS):
            return self.realize_like_meta(value, node.meta.get("val"))
        return value
