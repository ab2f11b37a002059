"""ATen graph -> ONNX model, through onnxscript's torch_lib and onnx-ir.

Every ``call_function`` node of an ATen graph names an ATen overload (``aten.addmm.default``) or
a Python operator on sizes (``operator.mul``). onnxscript's torch_lib registry maps the
qualified name (``aten::addmm``, ``aten::add.Tensor``, ``_operator::mul``) to an ONNX function
written against the ATen schema; this module calls that function with onnx-ir values while a
recording evaluator (:class:`_Recorder`) turns each ONNX op it issues into a node of an
``onnx_ir`` graph (onnxscript's ``GraphBuilder``: schema-aware constant promotion and shape
inference). No ONNX node is written here by hand for an op the library has; what this module
adds is the glue torch_lib expects of its caller:

* argument conversion (``torch.dtype`` -> ONNX data type, lists of sizes holding symbolic sizes
  -> one INT64 tensor, devices and layouts dropped);
* ATen's type promotion for the binary arithmetic and comparison ops (torch_lib expects its
  caller to have made operand types agree): operands are cast to the type ATen computes in;
* a check of every result's type against the graph's metadata, with a ``Cast`` where they
  differ.

:func:`check_node` answers "can this node be translated, and if not why" for the partitioner;
:func:`build_model` translates a whole (sub)graph.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import operator
from typing import Any, Sequence

import torch
import torch.fx

log = logging.getLogger("ember.onnxrt.translate")

OPSET = 18  # torch_lib's functions are written against opset 18
#: part of every cache key: bump when a change here changes the models built
TRANSLATOR_VERSION = 3


def onnxscript_version() -> str:
    """onnxscript's version, read from its metadata (importing torch_lib takes seconds: a warm
    start does not)."""
    from importlib import metadata

    try:
        return metadata.version("onnxscript")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "?"

aten = torch.ops.aten


@functools.cache
def _lib() -> Any:
    """(onnx_ir, onnxscript, torch_lib registry, opset module) imported once, on first use."""
    import onnx_ir as ir
    import onnxscript
    from onnxscript.function_libs.torch_lib import ops as _ops  # noqa: F401  (registers)
    from onnxscript.function_libs.torch_lib.registration import default_registry

    return ir, onnxscript, default_registry


@functools.cache
def _dtype_map() -> dict[torch.dtype, Any]:
    ir = _lib()[0]
    D = ir.DataType
    return {torch.float32: D.FLOAT, torch.float64: D.DOUBLE, torch.float16: D.FLOAT16,
            torch.bfloat16: D.BFLOAT16, torch.int64: D.INT64, torch.int32: D.INT32,
            torch.int16: D.INT16, torch.int8: D.INT8, torch.uint8: D.UINT8, torch.bool: D.BOOL}


def onnx_dtype(dtype: torch.dtype) -> Any:
    try:
        return _dtype_map()[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype} has no ONNX equivalent here") from None


class Unsupported(Exception):
    """A node the translator cannot take (the message says why; ``node_name``: which)."""

    node_name: str | None = None


def qualified_name(target: Any) -> str | None:
    """torch_lib's registry key for an fx target: ``aten::add.Tensor``, ``aten::relu``,
    ``_operator::mul``; None for targets it cannot name."""
    if isinstance(target, torch._ops.OpOverload):
        ns, name = target._schema.name.split("::")
        ov = target._overloadname
        return f"{ns}::{name}" if ov == "default" else f"{ns}::{name}.{ov}"
    if getattr(target, "__module__", None) == "_operator" or target in _PY_OPS:
        return f"_operator::{target.__name__}"
    return None


_PY_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
           operator.mod, operator.neg, operator.eq, operator.ne, operator.lt, operator.le,
           operator.gt, operator.ge, operator.pow}

#: Nodes that cost nothing and are never a reason to split a graph.
_BOOKKEEPING = {operator.getitem}

#: ATen's binary ops whose operands torch_lib expects to have one type already; the value is
#: which arguments are operands. Their operands are cast to the dtype ATen computes in.
_ARITH = {aten.add.Tensor: (0, 1), aten.sub.Tensor: (0, 1), aten.mul.Tensor: (0, 1),
          aten.div.Tensor: (0, 1), aten.div.Tensor_mode: (0, 1), aten.rsub.Tensor: (0, 1),
          aten.rsub.Scalar: (0, 1), aten.maximum.default: (0, 1), aten.minimum.default: (0, 1),
          aten.where.self: (1, 2), aten.remainder.Tensor: (0, 1), aten.fmod.Tensor: (0, 1),
          aten.floor_divide.default: (0, 1), aten.atan2.default: (0, 1),
          aten.pow.Tensor_Tensor: (0, 1), aten.add.Scalar: (0, 1), aten.mul.Scalar: (0, 1),
          aten.sub.Scalar: (0, 1), aten.div.Scalar: (0, 1), aten.remainder.Scalar: (0, 1),
          aten.masked_fill.Scalar: (0, 2), aten.masked_fill.Tensor: (0, 2)}
#: Reductions whose input torch_lib expects in the result's type (a sum of bools is an int64)
_REDUCE = {aten.sum.default, aten.sum.dim_IntList, aten.cumsum.default, aten.prod.default,
           aten.prod.dim_int, aten.mean.default, aten.mean.dim}
_COMPARE = {aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor,
            aten.lt.Scalar, aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar,
            aten.ge.Tensor, aten.ge.Scalar}

#: Arguments the ONNX functions need not see: where a value lives and how it is laid out in
#: memory (ONNX tensors have no strides and the session decides the device).
_DROPPABLE = {"device", "layout", "pin_memory", "memory_format", "non_blocking",
              "requires_grad"}

#: Ops torch_lib has but whose result differs from ATen's in a way the graph can observe, or
#: that make no sense inside a session; they stay ATen.
_DENY = {
    # random numbers: ORT's generator is not torch's (results differ from eager's seeded run)
    "aten::rand", "aten::randn", "aten::randint", "aten::bernoulli", "aten::bernoulli.p",
    "aten::native_dropout", "aten::dropout", "aten::rand_like", "aten::randn_like",
    "aten::normal", "aten::uniform", "aten::multinomial", "aten::randperm",
}


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else n


def _is_tensor_node(n: Any) -> bool:
    return isinstance(n, torch.fx.Node) and isinstance(_val(n), torch.Tensor)


def lookup(node: torch.fx.Node) -> Any:
    """The torch_lib function for ``node``, or raise :class:`Unsupported` saying why."""
    if node.target in _BOOKKEEPING:
        return None
    name = qualified_name(node.target)
    if name is None:
        raise Unsupported(f"{node.target!r} is not an ATen op")
    if name in _DENY:
        raise Unsupported(f"{name}: kept in ATen (results would differ from eager's)")
    _, _, reg = _lib()
    if name not in reg:
        raise Unsupported(f"{name}: onnxscript's torch_lib has no function for it")
    fns = reg[name].overloads
    if not fns:
        raise Unsupported(f"{name}: torch_lib has only a complex-number function")
    return fns[0]


def _check_dtypes(node: torch.fx.Node) -> None:
    vals = [_val(a) for a in node.all_input_nodes] + [_val(node)]
    for v in vals:
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor):
                if t.is_complex() or t.dtype not in _dtype_map():
                    raise Unsupported(f"dtype {t.dtype} is not taken")
                if t.layout is not torch.strided:
                    raise Unsupported(f"layout {t.layout} is not taken")


def check_node(node: torch.fx.Node) -> None:
    """Raise :class:`Unsupported` (with the reason) if ``node`` cannot be translated."""
    if node.op != "call_function":
        raise Unsupported(f"{node.op} nodes are not translated")
    if isinstance(node.target, torch._ops.OpOverload):
        if node.target._schema.is_mutable:
            raise Unsupported(f"{qualified_name(node.target)} mutates an input")
    _check_dtypes(node)
    fn = lookup(node)
    if fn is None:
        return
    _named_args(node, fn)  # raises for arguments the function cannot take


def _schema_names(target: Any) -> list[str] | None:
    if isinstance(target, torch._ops.OpOverload):
        return [a.name for a in target._schema.arguments]
    return None


@functools.cache
def _fn_params(fn: Any) -> tuple[str, ...]:
    py = getattr(fn, "function", fn)
    try:
        return tuple(inspect.signature(py).parameters)
    except (TypeError, ValueError):
        return ()


def _named_args(node: torch.fx.Node, fn: Any) -> dict[str, Any]:
    """``node``'s arguments by the ATen schema's names, those the ONNX function takes."""
    names = _schema_names(node.target)
    params = _fn_params(fn)
    if names is None:
        # a Python operator: positional, as the function declares them
        return dict(zip(params, node.args))
    named: dict[str, Any] = {}
    for i, a in enumerate(node.args):
        named[names[i]] = a
    named.update(node.kwargs)
    out: dict[str, Any] = {}
    schema_args = {a.name: a for a in node.target._schema.arguments}
    for k, v in named.items():
        if k in params:
            out[k] = v
            continue
        pos = names.index(k) if k in names else -1
        if 0 <= pos < len(params) and params[pos] not in names and params[pos] not in out:
            out[params[pos]] = v  # the same parameter under another name (``min`` / ``min_``)
            continue
        if k in _DROPPABLE or v is None:
            continue
        default = schema_args[k].default_value if k in schema_args else None
        if schema_args.get(k) is not None and schema_args[k].has_default_value() and v == default:
            continue
        raise Unsupported(f"{qualified_name(node.target)}: torch_lib's function does not take "
                          f"argument {k}={v!r}")
    return out


class _Recorder:
    """An onnxscript evaluator that records the ONNX ops torch_lib functions issue into a
    ``GraphBuilder`` (so calling a torch_lib function with ``ir.Value`` arguments builds
    nodes instead of computing)."""

    def __init__(self, builder: Any):
        self.builder = builder
        self.functions: dict[Any, Any] = {}
        self.n_consts = 0

    def eval_op(self, op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        schema = op.op_schema
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        n_out = len(schema.outputs) if schema is not None else 1
        if op.name == "Split" and op.opset.domain == "":
            n_out = int(kwargs.get("num_outputs") or n_out)
        elif op.name == "BatchNormalization" and not kwargs.get("training_mode", 0):
            n_out = 1
        # optional trailing inputs left as None are dropped (ONNX: absent)
        args = [self._sequence(self._tensor(a)) for a in args]
        while args and args[-1] is None:
            args.pop()
        return self.builder.call_op(op.name, args, kwargs, domain=op.opset.domain,
                                    version=op.opset.version, outputs=n_out)

    def _tensor(self, a: Any) -> Any:
        """A tensor constant given as an input (``ir.tensor(...)``): an initializer with a
        name (the builder requires one)."""
        ir = _lib()[0]
        if isinstance(a, ir.TensorProtocol) and not isinstance(a, ir.Value):
            self.n_consts += 1
            return self.builder.initializer(a, name=f"const_t{self.n_consts}")
        return a

    def _sequence(self, a: Any) -> Any:
        """A Python list of sizes holding symbolic sizes (``ir.Value``s), as torch_lib passes
        them on: one INT64 tensor (torch_lib's functions take such lists; ONNX ops do not)."""
        ir = _lib()[0]
        if isinstance(a, (list, tuple)) and len(a) == 0:
            # an empty list of sizes (a scalar's shape): the builder cannot type it
            return self._tensor(ir.tensor([], dtype=ir.DataType.INT64))
        if not isinstance(a, (list, tuple)) or not any(isinstance(x, ir.Value) for x in a):
            return a
        b = self.builder
        parts = []
        for x in a:
            if isinstance(x, ir.Value):
                parts.append(b.op.Reshape(b.op.Cast(x, to=ir.DataType.INT64),
                                          self._tensor(ir.tensor([1], dtype=ir.DataType.INT64))))
            else:
                parts.append(self._tensor(ir.tensor([int(x)], dtype=ir.DataType.INT64)))
        return b.op.Concat(*parts, axis=0)

    def _promote(self, a: Any, prm: Any, params: list[Any], values: list[Any]) -> Any:
        """A Python constant for an input of a scripted function: the type its parameter's
        constraint allows (INT64 for sizes), else the type of the input sharing its
        constraint."""
        ir = _lib()[0]
        if a is None or isinstance(a, ir.Value):
            return a
        tc = getattr(prm, "type_constraint", None)
        allowed = list(getattr(tc, "allowed_types", ()) or ())
        if len(allowed) == 1 and hasattr(allowed[0], "dtype"):
            return self.builder._input_to_ir_value(
                self._tensor(ir.tensor(a, dtype=allowed[0].dtype)) if not isinstance(
                    a, ir.Value) else a)
        for other, v in zip(params, values):
            if isinstance(v, ir.Value) and getattr(other, "type_constraint", None) is tc:
                return self.builder._input_to_ir_value(a, v)
        return self.builder._input_to_ir_value(a)

    def eval_function(self, function: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        traceable = getattr(function, "traceable", None)
        if traceable is None or traceable:  # TracedOnnxFunction, or marked traceable
            return function.function(*args, **kwargs)
        # a scripted ONNX function: inline its body (no function definitions in the model);
        # its attributes must be given by name, its inputs positionally
        sig = function.op_signature
        names = [p.name for p in sig.params]
        attr_names = {p.name for p in sig.params if isinstance(p, ir_schemas().AttributeParameter)}
        bound = dict(zip(names, args))
        bound.update(kwargs)
        ins_raw = [bound[n] if n in bound else None for n in names if n not in attr_names]
        attrs = {}
        for prm in sig.params:
            if prm.name not in attr_names:
                continue
            v = bound.get(prm.name)
            if v is None:
                if prm.default is None:
                    continue
                attrs[prm.name] = prm.default
            else:
                attrs[prm.name] = ir_convenience().convert_attribute(prm.name, v, prm.type)
        kwargs = attrs
        while ins_raw and ins_raw[-1] is None:
            ins_raw.pop()
        in_params = [prm for prm in sig.params if prm.name not in attr_names]
        ins = [self._promote(a, prm, in_params, ins_raw) for a, prm in zip(ins_raw, in_params)]
        return self.builder.call_inline(function, *ins, **kwargs)


def ir_convenience() -> Any:
    import onnx_ir.convenience

    return onnx_ir.convenience


def ir_schemas() -> Any:
    import onnx_ir.schemas

    return onnx_ir.schemas


def _is_ir_value(v: Any) -> bool:
    ir = _lib()[0]
    return isinstance(v, ir.Value)


@dataclasses.dataclass
class Built:
    """A translated graph: the model and how its inputs/outputs map to the fx graph."""
    model: Any                      # onnx_ir.Model
    input_names: list[str]          # graph inputs (fx placeholders that are not initializers)
    input_index: list[int]          # their positions among the fx placeholders
    output_names: list[str]
    initializer_index: list[int]    # placeholders embedded as initializers


def _sym_name(s: Any) -> str | int:
    if isinstance(s, int):
        return s
    if isinstance(s, torch.SymInt):
        e = s.node.expr  # never int(s): that would read the hint and specialize
        if getattr(e, "is_Integer", False):
            return int(e)
        return str(e).replace(" ", "")
    return str(s)


def value_type(ir: Any, v: torch.Tensor) -> tuple[Any, Any]:
    shape = ir.Shape([_sym_name(d) if not isinstance(d, int) else d for d in v.shape])
    return ir.TensorType(onnx_dtype(v.dtype)), shape


def build_model(gm: torch.fx.GraphModule, initializers: dict[int, torch.Tensor] | None = None,
                name: str = "ember") -> Built:
    """Translate every node of ``gm`` (an ATen graph whose nodes all passed
    :func:`check_node`) into one ONNX model. ``initializers`` maps placeholder positions to
    tensors embedded as initializers (parameters and buffers); the other placeholders are graph
    inputs, in order. Raises :class:`Unsupported` naming the node that failed."""
    ir, onnxscript, _ = _lib()
    from onnxscript._internal import evaluator
    from onnxscript._internal.builder import GraphBuilder
    from onnx_ir.tensor_adapters import TorchTensor

    initializers = initializers or {}
    graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name=name)
    builder = GraphBuilder(graph)
    env: dict[torch.fx.Node, Any] = {}
    input_names, input_index, init_index = [], [], []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, p in enumerate(placeholders):
        v = _val(p)
        pname = f"in{i}_{p.name}"
        if i in initializers:
            t = initializers[i].detach()
            if not t.is_contiguous():
                t = t.contiguous()
            value = ir.Value(name=pname, shape=ir.Shape(list(t.shape)),
                             type=ir.TensorType(onnx_dtype(t.dtype)),
                             const_value=TorchTensor(t, name=pname))
            graph.register_initializer(value)
            init_index.append(i)
        elif isinstance(v, torch.Tensor):
            typ, shape = value_type(ir, v)
            value = ir.Value(name=pname, type=typ, shape=shape)
            graph.inputs.append(value)
            input_names.append(pname)
            input_index.append(i)
        elif isinstance(v, (torch.SymInt, int)):
            value = ir.Value(name=pname, type=ir.TensorType(ir.DataType.INT64),
                             shape=ir.Shape([]))
            graph.inputs.append(value)
            input_names.append(pname)
            input_index.append(i)
        else:
            raise Unsupported(f"placeholder {p.name}: a {type(v).__name__} input")
        env[p] = value
    rec = _Recorder(builder)
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    # ``a * b`` on values inside torch_lib's functions: the builder's ops
    old_handler = ir.set_value_magic_handler(builder.op)
    try:
        _translate_nodes(gm, graph, env, builder, rec, evaluator)
    finally:
        ir.set_value_magic_handler(old_handler)
    outs = output_node.args[0]
    output_names = []
    for k, o in enumerate(outs if isinstance(outs, (list, tuple)) else [outs]):
        value = env[o] if isinstance(o, torch.fx.Node) else None
        if value is None:
            raise Unsupported(f"output {k} is not a tensor computed by the graph")
        if value in graph.inputs or value.is_initializer() or value.producer() is None \
                or any(value is ov for ov in graph.outputs):
            value = builder.op.Identity(value)
        value.name = f"out{k}"
        v = _val(o)
        if isinstance(v, torch.Tensor):
            value.type, value.shape = value_type(ir, v)
        graph.outputs.append(value)
        output_names.append(value.name)
    model = ir.Model(graph, ir_version=10, producer_name="ember-onnxrt")
    return Built(model, input_names, input_index, output_names, init_index)


def _translate_nodes(gm: torch.fx.GraphModule, graph: Any, env: dict[torch.fx.Node, Any],
                     builder: Any, rec: Any, evaluator: Any) -> None:
    current = [""]
    add = builder._add_node

    def tagged(onode: Any) -> None:  # every ONNX node names the fx node it came from
        onode.metadata_props["ember.fx_node"] = current[0]
        add(onode)

    builder._add_node = tagged
    with evaluator.default_as(rec):
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            current[0] = node.name
            try:
                env[node] = _translate(node, env, builder)
            except Unsupported as e:
                e.node_name = node.name
                raise
            except Exception as e:
                log.debug("translating %s failed", node.format_node(), exc_info=True)
                u = Unsupported(f"{qualified_name(node.target) or node.target}: translation "
                                f"failed: {type(e).__name__}: {str(e)[:300]}")
                u.node_name = node.name
                raise u from e


def _const(builder: Any, value: Any, dtype: torch.dtype) -> Any:
    ir = _lib()[0]
    return builder._get_or_create_constant(value, onnx_dtype(dtype)) \
        if hasattr(builder, "_get_or_create_constant") else \
        builder.initializer(ir.tensor(value, dtype=onnx_dtype(dtype)))


def _compute_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype ATen computes a binary op in (the result's, for arithmetic; the promoted
    operands' type for comparisons)."""
    out = _val(node)
    if node.target in _ARITH and isinstance(out, torch.Tensor):
        if node.target in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
            return out.dtype
        return out.dtype
    if node.target in _COMPARE:
        def rep(a: Any) -> Any:
            v = _val(a)
            if isinstance(v, torch.Tensor):
                return torch.empty((1,) * v.dim() if v.dim() else (), dtype=v.dtype)
            return v
        try:
            return torch.result_type(rep(node.args[0]), rep(node.args[1]))
        except Exception:
            return None
    return None


def _convert_arg(a: Any, env: dict[torch.fx.Node, Any], builder: Any) -> Any:
    ir = _lib()[0]
    if isinstance(a, torch.fx.Node):
        return env[a]
    if isinstance(a, (list, tuple)):
        items = [_convert_arg(x, env, builder) for x in a]
        return items
    if isinstance(a, torch.dtype):
        return onnx_dtype(a)
    if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
        return str(a)
    return a


def _scalar_param(target: Any, name: str) -> bool:
    """Is ``name`` a ``Scalar`` parameter of the overload (torch_lib's functions for those take
    a Python number)?"""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    for a in target._schema.arguments:
        if a.name == name:
            return str(a.type) in ("Scalar", "number")
    return False


def _translate(node: torch.fx.Node, env: dict[torch.fx.Node, Any], builder: Any) -> Any:
    ir = _lib()[0]
    if node.target is operator.getitem:
        src, idx = node.args
        got = env[src]
        if isinstance(got, (list, tuple)):
            return got[idx]
        return builder.op.SequenceAt(got, idx)  # a Sequence value (split)
    fn = lookup(node)
    named = _named_args(node, fn)
    names = _schema_names(node.target)
    cd = _compute_dtype(node)
    kwargs: dict[str, Any] = {}
    for k, a in named.items():
        v = _convert_arg(a, env, builder)
        if node.target in _REDUCE and k == "self" and isinstance(v, ir.Value):
            want = _val(node).dtype
            if _val(a).dtype != want:
                v = builder.op.Cast(v, to=onnx_dtype(want))
        if cd is not None and names is not None and k in names and \
                names.index(k) in _ARITH.get(node.target, (0, 1)):
            if isinstance(v, ir.Value):
                src = _val(a)
                if isinstance(src, torch.Tensor) and src.dtype != cd:
                    v = builder.op.Cast(v, to=onnx_dtype(cd))
            elif isinstance(v, (int, float, bool)) and not _scalar_param(node.target, k):
                v = _const(builder, v, cd)
        kwargs[k] = v
    result = _call(fn, kwargs)
    return _fix_types(node, result, builder)


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    """Call a torch_lib function with arguments by name (its first parameter is often named
    ``self``, which its ``__call__`` also takes: pass positionally)."""
    py = getattr(fn, "function", fn)
    params = inspect.signature(py).parameters
    args = []
    rest = dict(kwargs)
    for name, p in params.items():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
            break
        if name in rest:
            args.append(rest.pop(name))
        elif p.default is not p.empty and any(k in rest for k in list(params)[len(args):]):
            args.append(p.default)
        else:
            break
    return fn(*args, **rest)


def _fix_types(node: torch.fx.Node, result: Any, builder: Any) -> Any:
    """Cast results whose type differs from the graph's metadata (torch_lib follows ONNX's
    type rules, which can differ from ATen's, e.g. for integer means)."""
    ir = _lib()[0]
    expected = _val(node)
    if isinstance(result, ir.Value) and isinstance(expected, torch.Tensor):
        return _settle(builder, result, expected)
    if isinstance(result, ir.Value) and isinstance(expected, (torch.SymInt, int)):
        return result
    if isinstance(result, (list, tuple)) and isinstance(expected, (list, tuple)):
        return [_settle(builder, r, e) if isinstance(r, ir.Value) and
                isinstance(e, torch.Tensor) else r for r, e in zip(result, expected)]
    return result


def _settle(builder: Any, value: Any, expected: torch.Tensor) -> Any:
    """Give ``value`` the type and shape the graph's metadata says it has (torch_lib's
    functions read their inputs' ranks and types); a ``Cast`` where its type differs."""
    ir = _lib()[0]
    want = onnx_dtype(expected.dtype)
    if value.dtype is None or value.dtype != want:
        value = builder.op.Cast(value, to=want)
    if value.producer() is not None and not value.is_graph_input():
        typ, shape = value_type(ir, expected)
        value.type = typ
        value.shape = shape
    return value
