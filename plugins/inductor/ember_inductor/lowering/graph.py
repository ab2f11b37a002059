"""Walk an ATen fx graph and build the IR: one lowering per op, ATen fallback for the rest."""

from __future__ import annotations

import logging
import operator
import struct
from typing import Any, Sequence

import sympy
import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..ir import (Buffer, ComputedBuffer, ExternKernel, InputBuffer, IRNode, Layout, MultiOutput,
                  NoneValue, Pointwise, Reduction, ReinterpretView)
from ..sizes import (SizeEnv, SymbolicUnsupported, contiguous_strides, known_eq, size_hint,
                     statically_true, to_expr, to_stride)
from .common import SUPPORTED_DTYPES
from .registry import EXTERN_OPS, LOWERINGS, Unsupported, set_current

__all__ = ["GraphLowering", "dense_stride", "layout_of"]

log = logging.getLogger("ember.inductor")

# A lazy value read by several consumers is recomputed in each unless it costs more than this
# many ops; past it, it is stored once.
INLINE_MULTI_USE_OPS = 4
# A lazy value whose body grew past this many ops is stored (keeps kernels and compile time sane).
MAX_INLINE_OPS = 64


def dense_stride(size: Sequence[Any], stride: Sequence[Any]) -> list[Any]:
    """``stride`` if it describes a dense non-overlapping layout of ``size``; else the dense
    layout with the same order of dims (as ATen's ``empty_like`` keeps a strided view's order:
    an ATen op given the dense copy then returns the layout the metadata describes, where a
    contiguous copy made it return another: mamba2's padded scan with symbolic sizes read its
    fallback's result at the wrong strides). A broadcast dim (stride 0) has no place in that
    order: it keeps its place in the contiguous order and the other dims fill the remaining
    places by stride (an expanded mask (b, 1, q, k) with strides (k, k, 0, 1) is stored
    contiguous, its last dim innermost, as attention kernels require of a bias). Symbolic
    strides are ordered by their example values, then checked exactly."""
    dims = [i for i, s in enumerate(size) if s != 1]
    static = all(isinstance(x, int) for x in list(size) + list(stride))
    key = (lambda i: (stride[i], -i)) if static else (lambda i: (size_hint(stride[i]), -i))
    order = sorted(dims, key=key)
    acc: Any = 1
    dense = True
    for i in order:
        if not (stride[i] == acc if static else known_eq(stride[i], acc)):
            dense = False
            break
        acc = acc * size[i]
    if dense:
        return list(stride)  # size-1 dims: any stride is equivalent; eager's kept
    ordered = [i for i in order if key(i)[0] != 0]  # innermost first, broadcast dims left out
    if len({key(i)[0] for i in ordered}) < len(ordered):
        return contiguous_strides(size)  # dims of equal strides (overlapping): no order to keep
    fill = iter(ordered)  # into the places of the non-broadcast dims, innermost first
    order = [next(fill) if key(i)[0] != 0 else i for i in reversed(dims)]
    out = list(stride)
    acc = 1
    for i in order:
        out[i] = acc
        acc = acc * size[i]
    return out


def _static_strides(node: torch.fx.Node) -> list[int] | None:
    """The strides of a node's strided tensor value when its sizes and strides are static."""
    v = node.meta.get("val")
    if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
        return None
    if not all(isinstance(x, int) for x in (*v.shape, *v.stride())):
        return None
    return list(v.stride())


def _loads_across(value: Pointwise, strides: Sequence[int] | None) -> bool:
    """Does a pointwise output with eager's ``strides`` (a permutation whose stride-1 dim is not
    the last) do real work (two loads or more) whose loads all run contiguously along the last
    dim? Stored in eager's order, its inner loop would read every input with a large stride
    (gcc leaves it scalar: views_cat's ``relu(z.sum(2)).transpose(1, 2) + y``), slower than
    computing it contiguously and copying it."""
    import math

    from ..scheduler import _RecordHandler
    from ..sizes import FloorDiv, ModularIndexing, var
    from ..virtualized import set_ops_handler

    size = value.get_size()
    n = len(size)
    if strides is None or n < 2 or not all(isinstance(v, int) for v in size):
        return False
    if size[-1] == 1 or strides[-1] == 1 or math.prod(size) < 4096:
        return False
    if dense_stride(size, strides) != list(strides):
        return False  # not a dense permutation
    rec = _RecordHandler()
    idx = [var(i) for i in range(n)]
    try:
        with set_ops_handler(rec):
            value.inner_fn(idx)
    except Exception:  # a body the recorder cannot run: keep eager's order
        return False
    loads = [sympy.expand(sympy.sympify(e)) for name, e in rec.loads if name]
    if len(loads) < 2:
        return False
    last = idx[-1]
    for e in loads:
        if e.has(FloorDiv) or e.has(ModularIndexing) or e.has(sympy.Min) or e.has(sympy.Max):
            return False
        c = e.coeff(last)
        if c == 0:
            continue  # a broadcast along the last dim
        if c != 1:
            return False
    return any(e.coeff(last) == 1 for e in loads)


def layout_of(t: torch.Tensor, offset: Any = 0) -> Layout:
    return Layout(tuple(to_expr(s) for s in t.shape), tuple(to_stride(s) for s in t.stride()),
                  t.dtype, t.device, offset)


def shape_of(t: Any) -> list[Any]:
    """A tensor's (meta's) sizes: ints, or sympy expressions for symbolic ones."""
    return [to_expr(s) for s in t.shape]


_SYM_TYPES = (torch.SymInt, torch.SymBool, torch.SymFloat)
_SIZE_OPS = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
             torch.ops.aten.sym_numel.default, torch.ops.aten.sym_storage_offset.default}


def _is_size_op(target: Any) -> bool:
    """Ops that compute on sizes (never on tensor data)."""
    if target in _SIZE_OPS:
        return True
    mod = getattr(target, "__module__", None)
    return mod in ("_operator", "operator", "math") or getattr(target, "__name__", "").startswith(
        "sym_")
# ops on sizes that assert a relation the graph's guards already imply
_ASSERT_OPS = {torch.ops.aten._assert_scalar.default}


def _layout_ops() -> Any:
    from ..layout import LAYOUT_OPS
    return LAYOUT_OPS


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
        #: var/var_mean as the first element plus the deviations' mean (lowering/reductions.py;
        #: set for the Triton target by compile_fx.generate_source)
        self.shifted_var_mean = False
        # a transposing pointwise output computed along its loads, then copied (C++ target)
        self.transpose_by_copy = True
        #: each float16/bfloat16 op's result rounded in fused kernels (lowering/common.pointwise;
        #: option emulate_precision_casts)
        self.round_16bit = False
        #: rand/randn/bernoulli as Philox draws in the kernels (lowering/random.py; the Triton
        #: target), else ATen calls
        self.random_in_kernels = False
        #: a GPU graph's values eager computes on the CPU (position ids made with arange on the
        #: host, then copied) run as ATen's CPU ops and its host-to-device copy, not as kernels
        #: of the graph's device (_on_host)
        self.host_ops_as_aten = False
        self._n = 0
        self._cse: dict[Any, torch.fx.Node] = {}
        self._realized: dict[int, tuple[IRNode, Buffer]] = {}
        self._canon: dict[torch.fx.Node, torch.fx.Node] = {}
        # symbolic sizes: every placeholder's wrapper argument name, in order, and where each
        # size symbol is read from (``s0 -> "arg0.size(0)"``)
        self.size_env = SizeEnv()
        self.arg_names: list[str] = []
        self.sym_bindings: dict[str, str] = {}
        self._placeholders: list[tuple[str, Any]] = []
        # channels-last layouts for graphs with convolutions (ember_inductor.layout); None: off
        self.layout_plan: Any = None
        self._layout_copies: dict[tuple[Any, ...], IRNode] = {}

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
        if isinstance(meta, torch.Tensor):
            shape = shape_of(meta)
            size = value.get_size()
            if len(shape) == len(size) and all(known_eq(a, b) for a, b in zip(shape, size)):
                stride = dense_stride(shape, [to_stride(s) for s in meta.stride()])
        return self.realize(value, stride)

    def _meta_strides(self, value: IRNode, meta: Any) -> IRNode:
        """A graph output in exactly its metadata's strides (size-1 dims aside): a copy when the
        lowering stored it otherwise (a slice of a stored value, a value stored for another
        consumer). A training forward's saved activations are read by its backward, compiled
        from the same metadata, at those strides: a dense copy of a strided slice would be read
        past its end."""
        if not isinstance(value, (Buffer, ReinterpretView)) or not isinstance(meta, torch.Tensor):
            return value
        if meta.layout != torch.strided:
            return value
        lay = value.layout
        if any(isinstance(s, torch.SymInt) for s in (*meta.shape, *meta.stride())):
            # symbolic sizes: compared as expressions (int() would guard). A saved activation
            # that is a strided slice (HF ProphetNet's [4*s0, s1, 8] rows of a [4*s0, 3*s1, 8]
            # value: stride 24*s1) was returned dense and read by the backward at 24*s1
            size = [to_expr(s) for s in meta.shape]
            want = [to_stride(s) for s in meta.stride()]
            have = list(lay.stride)
            if len(lay.size) != len(size) or not all(
                    known_eq(a, b) for a, b in zip(lay.size, size)):
                return value
            if all(known_eq(h, w) for n, h, w in zip(size, have, want) if not known_eq(n, 1)):
                return value
        else:
            try:
                size = [int(s) for s in meta.shape]
                want = [int(s) for s in meta.stride()]
                have = [int(s) for s in lay.stride]
                if [int(s) for s in lay.size] != size:
                    return value
            except TypeError:  # a symbolic layout for a static meta: left as it is
                return value
            if all(h == w for n, h, w in zip(size, have, want) if n != 1):
                return value
        key = (value.storage().name, tuple(map(str, have)), str(lay.offset),
               tuple(map(str, want)))
        done = self._layout_copies.get(key)
        if done is None:
            src = Pointwise(value.device, value.dtype, list(value.get_size()),
                            value.make_loader(), 1, origins=["output_strides"])
            done = self._layout_copies[key] = self.realize(src, want)
        return done

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
            if type(m) in (int, float, bool):
                # a plain number among the results (CUDA flash attention's max_q/max_k): shape-
                # derived (fake tensors hold no data), so the traced value is the value
                return m
            raise Unsupported(f"fallback output of type {type(m).__name__}")

        return out(meta, ())

    # -- the walk ----------------------------------------------------------------------------
    def run(self) -> "GraphLowering":
        from ..sizes import current_size_env, size_env

        env = current_size_env()
        if env is None:
            env = self.size_env
        self.size_env = env
        set_current(self)
        try:
            with size_env(env):
                for node in self.gm.graph.nodes:
                    self.node = node
                    self.env[node] = self.lower_node(node)
                self._bind_symbols()
        finally:
            set_current(None)
            self.node = None
        return self

    def _bind_symbols(self) -> None:
        """Where the wrapper reads each size symbol: the first placeholder that carries it bare
        (a tensor's size, stride or storage offset, or a SymInt argument)."""
        if not self.size_env.hints:
            return
        bind: dict[str, str] = {}

        def take(e: Any, src: str) -> None:
            if not isinstance(e, int) and getattr(e, "is_Symbol", False) and e.name not in bind:
                bind[e.name] = src

        for name, v in self._placeholders:
            if isinstance(v, torch.Tensor):
                for d, sz in enumerate(v.shape):
                    take(to_expr(sz), f"{name}.size({d})")
        for name, v in self._placeholders:
            if isinstance(v, torch.Tensor):
                for d, st in enumerate(v.stride()):
                    take(to_expr(st), f"{name}.stride({d})")
                take(to_expr(v.storage_offset()), f"{name}.storage_offset()")
            else:
                take(to_expr(v), name)
        missing = sorted(s.name for s in self.size_env.hints if s.name not in bind)
        if missing:
            raise SymbolicUnsupported(f"size symbols {', '.join(missing)} are not sizes of an "
                                      "input nor SymInt inputs")
        used = {s.name for s in self.size_env.hints}
        self.sym_bindings = {k: v for k, v in bind.items() if k in used}

    def lower_node(self, node: torch.fx.Node) -> Any:
        if node.op == "placeholder":
            meta = node.meta.get("val")
            name = f"arg{len(self.arg_names)}"
            self.arg_names.append(name)
            self._placeholders.append((name, meta))
            if isinstance(meta, (torch.SymInt, int)) and not isinstance(meta, bool):
                return to_expr(meta)  # a size (or int) argument: bound in the wrapper
            if not isinstance(meta, torch.Tensor):
                raise Unsupported(f"non-tensor graph input {node.name}")
            layout = layout_of(meta)
            plan = self.layout_plan
            if plan is not None and len(self.arg_names) - 1 in plan.input_strides:
                # the producer (a training forward) stores this input in another layout
                layout = Layout(layout.size, plan.input_strides[len(self.arg_names) - 1],
                                layout.dtype, layout.device, layout.offset)
            buf = InputBuffer(name, layout, len(self.inputs))
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
            for pos, o in enumerate(flat):
                if not isinstance(o, torch.fx.Node):
                    self.outputs.append(o)
                    continue
                v = self.env[o]
                if isinstance(v, IRNode) and not isinstance(v, NoneValue):
                    if self.layout_plan is not None:
                        v = self._layout_output(pos, v, o.meta.get("val"))
                    elif (self.transpose_by_copy and isinstance(v, Pointwise)
                          and _loads_across(v, _static_strides(o))):
                        # computed in the order its loads walk (vector code), then copied into
                        # eager's strides by _meta_strides below
                        v = self.realize(v)
                    elif isinstance(v, (Pointwise, Reduction)) and _static_strides(o):
                        v = self.realize(v, _static_strides(o))  # eager's, dense or not
                    else:
                        v = self.realize_like_meta(v, o.meta.get("val"))
                    if not (self.layout_plan is not None and pos in self.layout_plan.keep_outputs):
                        v = self._meta_strides(v, o.meta.get("val"))
                self.outputs.append(v)
            return None
        if node.op != "call_function":
            raise Unsupported(f"fx op {node.op}")
        val = node.meta.get("val")
        if node.target in _ASSERT_OPS:
            cond = self.env.get(node.args[0]) if isinstance(node.args[0], torch.fx.Node) \
                else node.args[0]
            if cond is True or statically_true(cond):
                return None
            raise SymbolicUnsupported(f"runtime assertion on sizes: {node.format_node()}")
        if isinstance(val, _SYM_TYPES) or (isinstance(val, int) and _is_size_op(node.target)):
            # arithmetic on sizes (aten.sym_size, operator.mul, ...): its value is the
            # expression the trace recorded, over the graph's size symbols
            if isinstance(val, torch.SymBool):
                from ..sizes import _convert
                e = val.node.expr
                if e in (sympy.true, sympy.false):
                    return bool(e)
                return _convert(e)
            if isinstance(val, (torch.SymFloat, float)):
                raise SymbolicUnsupported(f"float size arithmetic {node.format_node()}")
            return to_expr(val)
        key = self._cse_key(node)
        if key is not None:
            prior = self._cse.get(key)
            if prior is not None:  # the same pure op on the same values: reuse its result
                self._canon[node] = prior
                return self.env[prior]
            self._cse[key] = node
        args = pytree.tree_map(self._env_lookup, node.args)
        kwargs = pytree.tree_map(self._env_lookup, node.kwargs)
        if self.layout_plan is not None and node.target in _layout_ops():
            from ..layout import lower_with_layout

            result = lower_with_layout(self, self.layout_plan, node, args, kwargs)
            if result is not None:
                return result
        if node.target is operator.getitem:
            return self._maybe_realize(node, args[0][args[1]])
        fn = LOWERINGS.get(node.target)
        if fn is not None and self.host_ops_as_aten and _on_host(node):
            fn = None
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
        if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
            return None  # two rand_like(x) draw different numbers (lowering/random.py)

        def conv(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return ("node", self._canon.get(a, a).name)
            if isinstance(a, (list, tuple)):
                return (type(a).__name__,) + tuple(conv(x) for x in a)
            if isinstance(a, dict):
                return ("dict",) + tuple(sorted((k, conv(v)) for k, v in a.items()))
            if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
                return str(a)
            if isinstance(a, float):
                # by bit pattern: 0.0 == -0.0 (and NaNs differ from themselves) in Python, but
                # x / 0.0 and x / -0.0 are different ops
                return ("float", struct.pack("<d", a))
            if a is None or isinstance(a, (bool, int, str)):
                return (type(a).__name__, a)  # the type too: True == 1 == 1.0
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
                values = self.realize_like_meta(values, nodes.meta.get("val"))
            if self.layout_plan is not None:
                values = self._eager_layout(values, nodes.meta.get("val"))
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
            return self._realize_node(value, node.meta.get("val"))
        if not isinstance(value, Pointwise):
            return value
        n_users = len(node.users)
        if value.op_count() > MAX_INLINE_OPS or (n_users > 1 and
                                                 value.op_count() > INLINE_MULTI_USE_OPS):
            return self._realize_node(value, node.meta.get("val"))
        return value

    # -- layouts (see ember_inductor.layout) ------------------------------------------------------
    def _realize_node(self, value: IRNode, meta: Any) -> IRNode:
        """Store a node's value: in the layout plan's preferred strides, else like its meta."""
        plan = self.layout_plan
        if plan is not None:
            stride = plan.preferred_stride(meta)
            if stride is not None and list(value.get_size()) == list(meta.shape):
                return self.realize(value, list(stride))
        return self.realize_like_meta(value, meta)

    def _eager_layout(self, value: Any, meta: Any) -> Any:
        """``value`` in the layout its metadata describes (a copy, made once, when the layout
        plan stored it channels-last), with exactly its metadata's strides, size-1 dims too: ATen
        picks an output's memory format from them (``interpolate`` of an [N, C, 1, 1] tensor with
        channels-last strides returns channels-last: mobilevit's wrong gradients)."""
        plan = self.layout_plan
        if plan.is_changed(value, meta):
            stride = tuple(dense_stride(list(meta.shape), list(meta.stride())))
            value = plan.copy_to(self, value, stride)
        return plan.exact_strides(value, meta)

    def _layout_output(self, pos: int, value: IRNode, meta: Any) -> IRNode:
        """A graph output: with eager's strides, or channels-last where the plan keeps it so
        (a training forward's saved activations, read by its backward)."""
        from ..layout import channels_last_stride

        plan = self.layout_plan
        if pos in plan.keep_outputs and plan.keepable(meta):
            if isinstance(value, (Pointwise, Reduction)):
                value = self.realize(value, list(channels_last_stride(meta.shape)))
            return plan.to_channels_last(self, value)
        return self._eager_layout(self.realize_like_meta(value, meta), meta)


def _host_tensors(v: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "cpu"
               for t in pytree.tree_leaves(v))


def _on_host(node: torch.fx.Node) -> bool:
    """In a GPU graph: does ``node`` compute a CPU tensor, or read one that the graph computed
    (not an input or constant, which the kernels' launches copy: runtime/triton.py)? Such a node
    runs as its ATen op (a CPU op as in eager, or the host-to-device copy): a GPU kernel
    cannot read host memory the graph wrote."""
    if _host_tensors(node.meta.get("val")):
        return True
    return any(a.op == "call_function" and _host_tensors(a.meta.get("val"))
               for a in node.all_input_nodes)
