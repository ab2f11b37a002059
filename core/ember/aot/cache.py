"""On-disk, content-addressed cache of AOT autograd results.

A warm start (a fresh process whose caches were filled by an earlier one) should not trace again:
tracing runs the graph three or four times over FakeTensors (analysis, make_fx, functionalize),
0.3–0.8 s per graph on two CPU cores. This cache stores what tracing produced and rebuilds it.

**Key** (sha256 of, in order): a format version and a fingerprint of Ember's AOT sources; the torch
version; the canonical torch-level graph (every node: op, name, target by qualified name — with the
source file's hash when it is not torch's or Python's own —, args and kwargs), non-tensor inputs
(baked in as constants), every tensor input's metadata (type, shape, stride, storage offset, dtype,
device, layout, conj/neg bits, whether it is a view, which inputs share a storage, its kind:
parameter, buffer or user input); the variant (inference, or the ``requires_grad`` pattern); grad
mode, inference mode, autocast state, default dtype and deterministic-algorithms flag; the
backend's name and options; its decomposition table (every op, and the hash of each non-torch file
defining a decomposition). Anything the canonical form cannot express exactly (an unknown callable
or constant, a symbolic size, a device other than the CPU or CUDA) makes the graph uncacheable:
it is traced as before. A graph that touches CUDA adds the GPU (name, capability), the CUDA and
cuDNN versions and the flags that steer which kernels tracing picks (the SDPA backends, cuDNN on
or off, deterministic).

**Value**: JSON text (never pickle): the :class:`GraphInfo` (output structure, aliasing, mutated
inputs), and the functional ATen graphs (inference forward, or forward and backward with the
partition's metadata), node by node with each node's tensor metadata. Rebuilt graphs carry real,
uninitialized CPU tensors of the traced sizes/strides/dtypes as ``meta["val"]`` (no FakeTensorMode:
its first use loads a large part of torch, ~1.3 s); values on a CUDA device are
:class:`DeviceVal` stand-ins, geometry without memory. Before an entry is written it is rebuilt and
compared with the traced graphs (generated code and every node's metadata); an entry that would not
round-trip exactly is not written.

Entries live in Ember's text store (``ember/_store.py``, shared with persisted captures and the
inductor plugin) under ``<cache dir>/text/aot/``: ``{"format", "key", "sha256", "text"}``, atomic
replace, a corrupt entry is a miss and is rewritten. ``ember.config.aot_cache = False`` (``EMBER_AOT_CACHE=0``)
turns the cache off.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import logging
import math
import operator
import os
import pathlib
import sys
import time
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .._fxjson import decode_arg, encode_arg
from .analysis import GraphInfo, OutputInfo

__all__ = ["enabled", "cache_dir", "get_text", "put_text", "lookup", "store", "dumps_graph",
           "loads_graph", "counters"]

log = logging.getLogger("ember.aot.cache")

#: Bump when the meaning of an entry changes: old entries become misses.
FORMAT_VERSION = 1
NAMESPACE = "aot"

#: What this process did: ``hits`` (variants rebuilt from disk), ``misses`` (cacheable variants
#: traced and stored), ``uncacheable`` (variants the key cannot describe), ``corrupt``.
counters: dict[str, int] = {"hits": 0, "misses": 0, "uncacheable": 0, "corrupt": 0}


class Uncacheable(Exception):
    """The graph or its inputs hold something the canonical form cannot express exactly."""


def enabled() -> bool:
    """``ember.config.aot_cache`` (``EMBER_AOT_CACHE=0`` turns it off)."""
    from .. import config

    return bool(getattr(config, "aot_cache", True))


# --------------------------------------------------------------------------------------------
# the text store (ember/_store.py: shared with persisted captures and the inductor plugin)

from .._store import cache_dir  # noqa: E402  (re-exported: ``ember.aot.cache.cache_dir``)
from .._store import put_text  # noqa: E402


def get_text(namespace: str, key: str) -> str | None:
    """The text stored under ``(namespace, key)``; None when absent or corrupt (counted)."""
    from .._store import get_text as get

    return get(namespace, key, on_corrupt=lambda path: counters.__setitem__(
        "corrupt", counters["corrupt"] + 1))


# --------------------------------------------------------------------------------------------
# the key

_PY_MODULES = ("builtins", "_operator", "operator", "math")
_fingerprints: dict[str, str] = {}


def _file_hash(path: str) -> str:
    h = _fingerprints.get(path)
    if h is None:
        try:
            h = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
        except OSError as e:
            raise Uncacheable(f"cannot read {path}: {e}") from e
        _fingerprints[path] = h
    return h


def _ember_fingerprint() -> str:
    """Ember's AOT sources (and the state helpers tracing uses): an edit makes every entry a miss
    (the editable install keeps the version number unchanged)."""
    import ember

    root = pathlib.Path(__file__).parent
    files = sorted(root.glob("*.py")) + [root.parent / "state.py"]
    h = hashlib.sha256(f"format={FORMAT_VERSION};ember={getattr(ember, '__version__', '?')}"
                       .encode())
    for p in files:
        h.update(p.name.encode())
        h.update(_file_hash(str(p)).encode())
    return h.hexdigest()


def _is_torch_module(mod: str) -> bool:
    return mod == "torch" or mod.startswith("torch.")


def _callable_name(fn: Any) -> str:
    """A process-independent name of a graph target, checked to resolve back to ``fn``; with the
    hash of its source file when it is neither torch's nor Python's own."""
    if isinstance(fn, torch._ops.OpOverload):
        return f"op:{fn.name()}"
    if isinstance(fn, torch._ops.OpOverloadPacket):
        return f"packet:{fn._qualified_op_name}"
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<" in qual:
        raise Uncacheable(f"graph target {fn!r} has no importable name")
    if _resolve(mod, qual) is not fn:
        # torch's C functions: qualname "_VariableFunctionsClass.relu", found as torch.relu
        name_ = getattr(fn, "__name__", None)
        if not isinstance(name_, str) or _resolve(mod, name_) is not fn:
            raise Uncacheable(f"graph target {mod}.{qual} does not resolve to itself")
        qual = name_
    name = f"fn:{mod}:{qual}"
    if mod in _PY_MODULES or _is_torch_module(mod):
        return name
    file = getattr(sys.modules.get(mod), "__file__", None)
    if not file:
        raise Uncacheable(f"graph target {mod}.{qual}: module without a file")
    return f"{name}@{_file_hash(file)}"


def _resolve(mod: str, qual: str) -> Any:
    if mod == "_operator":
        obj: Any = operator
    else:
        obj = sys.modules.get(mod)
        if obj is None and (mod == "torch" or mod.startswith("torch.")):
            return None  # not imported yet: not what the graph holds
    if obj is None:
        return None
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


_SCALARS = (bool, int, str, type(None))


def _canon(x: Any) -> str:
    """An exact, process-independent text of a graph argument or option value."""
    if isinstance(x, fx.Node):
        return f"%{x.name}"
    if isinstance(x, _SCALARS):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, float):
        return f"float:{x.hex()}"
    if isinstance(x, complex):
        return f"complex:{x.real.hex()},{x.imag.hex()}"
    if isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"{type(x).__name__}:{x}"
    if isinstance(x, torch.Size):
        return "Size(" + ",".join(_canon(v) for v in x) + ")"
    if isinstance(x, (tuple, list)):
        inner = ",".join(_canon(v) for v in x)
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    if isinstance(x, dict):
        return "{" + ",".join(f"{_canon(k)}:{_canon(v)}" for k, v in x.items()) + "}"
    if isinstance(x, slice):
        return f"slice({_canon(x.start)},{_canon(x.stop)},{_canon(x.step)})"
    if x is Ellipsis:
        return "..."
    if callable(x):
        return _callable_name(x)
    raise Uncacheable(f"constant of type {type(x).__name__} in the graph or its options")


def _canon_graph(gm: fx.GraphModule) -> list[str]:
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            target = _callable_name(n.target)
        elif n.op in ("placeholder", "call_method", "output"):
            target = str(n.target)
        else:  # get_attr / call_module: state the text cannot describe
            raise Uncacheable(f"{n.op} node in the torch-level graph")
        ckpt = n.meta.get("custom", {}).get("ember_recompute")  # activation checkpointing
        out.append(f"{n.op} {n.name} {target} {_canon(n.args)} {_canon(n.kwargs)}"
                   + (f" recompute={ckpt}" if ckpt is not None else ""))
    return out


_DEVICES = ("cpu", "cuda")


def _cuda_text(graph_lines: list[str], args: Sequence[Any]) -> str:
    """What decides the ATen graph of a CUDA program beyond its inputs: tracing dispatches
    composite ops (attention, batch norm) to the kernels this GPU and these flags allow."""
    if not (any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
            or any("cuda" in line for line in graph_lines)):
        return ""
    if not torch.cuda.is_available():
        raise Uncacheable("a CUDA graph without a usable CUDA device")
    b = torch.backends
    flags = {name: fn() for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled",
                                     "math_sdp_enabled", "cudnn_sdp_enabled")
             if callable(fn := getattr(b.cuda, name, None))}
    devices = [(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
               for i in range(torch.cuda.device_count())]
    return (f"cuda={torch.version.cuda} cudnn={b.cudnn.version()} enabled={b.cudnn.enabled} "
            f"cudnn_deterministic={b.cudnn.deterministic} devices={devices} sdp={flags}")


def _tensor_text(t: torch.Tensor, storages: dict[int, int], i: int) -> str:
    if t.layout != torch.strided or t.device.type not in _DEVICES:
        raise Uncacheable(f"input of layout {t.layout} on {t.device}")
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise Uncacheable(f"tensor subclass {type(t).__name__}")
    sid = storages.setdefault(t.untyped_storage()._cdata, i)
    view = ""
    if t._is_view():
        b = t._base
        view = f"view of {tuple(b.shape)}/{b.stride()}/{b.storage_offset()}/{b.dtype}"
    return (f"{type(t).__name__} {tuple(t.shape)} {t.stride()} {t.storage_offset()} {t.dtype} "
            f"{t.device} conj={t.is_conj()} neg={t.is_neg()} storage={sid} {view}")


def _decomp_text(table: dict[Any, Any], graph_text: str) -> str:
    """The decomposition table's entries that can matter. Entries for operator namespaces other
    than aten/prims count only when the graph names that namespace: the table grows with what the
    process imported (some torch modules register ``c10d_functional``'s), which must not make a
    fresh process that never imported it miss."""
    parts = []
    files = set()
    for op, fn in table.items():
        ns = getattr(op, "namespace", None)
        if ns not in ("aten", "prims") and f"op:{ns}::" not in graph_text:
            continue
        mod = getattr(fn, "__module__", "") or ""
        parts.append(f"{op}={mod}.{getattr(fn, '__qualname__', type(fn).__name__)}")
        if not _is_torch_module(mod):
            file = getattr(sys.modules.get(mod), "__file__", None)
            if not file:
                raise Uncacheable(f"decomposition of {op} from a module without a file")
            files.add(file)
    parts.sort()
    parts += sorted(f"{os.path.basename(f)}@{_file_hash(f)}" for f in files)
    return "\n".join(parts)


def graph_key(aot: Any, variant: Any, args: Sequence[Any]) -> str:
    """The cache key of one AOT variant (see the module docstring); raises :class:`Uncacheable`."""
    from ..state import global_state

    h = hashlib.sha256()

    def put(s: str) -> None:
        h.update(s.encode())
        h.update(b"\n")

    put(_ember_fingerprint())
    put(f"torch={torch.__version__} {getattr(torch.version, 'git_version', '')}")
    graph_lines = _canon_graph(aot.gm)
    for line in graph_lines:
        put(line)
    storages: dict[int, int] = {}
    kinds = None
    if aot.context is not None and len(aot.context.inputs) == len(args):
        kinds = [getattr(i, "kind", "?") for i in aot.context.inputs]
    for i, a in enumerate(args):
        kind = kinds[i] if kinds else "?"
        if isinstance(a, torch.Tensor):
            put(f"in{i} {kind} {_tensor_text(a, storages, i)}")
        elif isinstance(a, torch.SymInt):
            raise Uncacheable("symbolic input")
        else:
            put(f"in{i} const {_canon(a)}")
    put(f"variant={variant!r}")
    put(f"state={global_state()!r} default_dtype={torch.get_default_dtype()} "
        f"deterministic={torch.are_deterministic_algorithms_enabled()} "
        f"inference_mode={torch.is_inference_mode_enabled()}")
    put(f"backend={aot.backend.name} recompute={aot.backend.recompute} "
        f"options={_canon(dict(sorted(aot.options.items())))}")
    put(_decomp_text(aot._decomps, "\n".join(graph_lines)))
    put(_cuda_text(graph_lines, args))
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# graphs <-> JSON



def _enc(x: Any) -> Any:
    return encode_arg(x, Uncacheable)


_dec = decode_arg


def _enc_val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        if (v.layout != torch.strided or v.device.type not in _DEVICES or v.requires_grad
                or any(not isinstance(s, int) for s in (*v.shape, *v.stride()))):
            raise Uncacheable("node value that is not a plain strided CPU or CUDA tensor")
        rec = [list(v.shape), list(v.stride()), int(v.storage_offset()),
               str(v.dtype).removeprefix("torch.")]
        if v.device.type != "cpu":
            rec.append(str(v.device))
        return {"T": rec}
    if isinstance(v, (tuple, list)):
        return {"t" if isinstance(v, tuple) else "l": [_enc_val(e) for e in v]}
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return {"f": v.hex()}
    raise Uncacheable(f"node value of type {type(v).__name__}")


def _tensor_like(shape: Sequence[int], stride: Sequence[int], offset: int,
                 dtype: torch.dtype) -> torch.Tensor:
    """A real CPU tensor with this geometry; its memory is allocated, never touched (a stand-in
    for the FakeTensor tracing put in ``meta["val"]``)."""
    if offset == 0:
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype)
    extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride)) if all(shape) else 0
    base = torch.empty(offset + extent, dtype=dtype)
    return base.as_strided(tuple(shape), tuple(stride), offset)


class DeviceVal(torch.Tensor):
    """A value's geometry on a device whose memory rebuilding a graph must not take (CUDA): a
    meta tensor that reports that device, as the FakeTensors tracing put in ``meta["val"]`` do.
    Operations on it run on the meta device and give DeviceVals on the same device. (A
    FakeTensorMode is not made for this: its construction imports most of torch's compiler
    stack, about 1 s of a warm start.)"""

    _device: torch.device
    _elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device) -> "DeviceVal":
        self = torch.Tensor._make_subclass(cls, elem, False, dispatch_device=True,
                                           device_for_backend_keys=device)
        self._elem, self._device = elem, device
        return self

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._device

    def __repr__(self) -> str:  # type: ignore[override]
        return (f"DeviceVal(size={tuple(self.shape)}, stride={self.stride()}, "
                f"dtype={self.dtype}, device={self._device})")

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        devices = []

        def unwrap(x: Any) -> Any:
            if isinstance(x, DeviceVal):
                devices.append(x._device)
                return x._elem
            return x

        out = func(*pytree.tree_map(unwrap, args), **pytree.tree_map(unwrap, kwargs or {}))
        if not devices:
            return out
        return pytree.tree_map(
            lambda x: DeviceVal(x, devices[0]) if isinstance(x, torch.Tensor)
            and x.device.type == "meta" else x, out)


def _device_val(shape: Sequence[int], stride: Sequence[int], offset: int, dtype: torch.dtype,
                device: str) -> torch.Tensor:
    elem = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="meta")
    if offset:
        elem = elem.as_strided(tuple(shape), tuple(stride), offset)
    return DeviceVal(elem, torch.device(device))


def _dec_val(v: Any) -> Any:
    if isinstance(v, dict):
        (tag, e), = v.items()
        if tag == "T":
            shape, stride, offset, dtype, *device = e
            dt = getattr(torch, dtype)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"not a dtype: {dtype}")
            if device:
                if torch.device(device[0]).type not in _DEVICES[1:]:
                    raise ValueError(f"not a device of this cache: {device[0]}")
                return _device_val(shape, stride, offset, dt, device[0])
            return _tensor_like(shape, stride, offset, dt)
        if tag == "t":
            return tuple(_dec_val(x) for x in e)
        if tag == "l":
            return [_dec_val(x) for x in e]
        if tag == "f":
            return float.fromhex(e)
        raise ValueError(f"unknown value tag {tag!r}")
    return v


def _target_name(t: Any) -> str:
    if isinstance(t, torch._ops.OpOverload):
        return f"op:{t.name()}"
    if t is operator.getitem:
        return "getitem"
    raise Uncacheable(f"ATen graph target {t!r}")


def _target(name: str) -> Any:
    if name == "getitem":
        return operator.getitem
    if not name.startswith("op:"):
        raise ValueError(f"unknown target {name!r}")
    qual = name[3:]
    ns, _, rest = qual.partition("::")
    opname, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), opname)
    return getattr(packet, overload or "default")


def dumps_graph(gm: fx.GraphModule) -> dict[str, Any]:
    """A functional ATen graph as JSON-able data; raises :class:`Uncacheable`."""
    nodes = []
    for n in gm.graph.nodes:
        rec: dict[str, Any] = {"op": n.op, "name": n.name}
        if n.op == "call_function":
            rec["target"] = _target_name(n.target)
        elif n.op == "placeholder":
            rec["target"] = n.target
        elif n.op != "output":
            raise Uncacheable(f"{n.op} node in an ATen graph")
        if n.args:
            rec["args"] = _enc(n.args)
        if n.kwargs:
            rec["kwargs"] = _enc(dict(n.kwargs))
        if n.op != "output" or "val" in n.meta:
            rec["val"] = _enc_val(n.meta.get("val"))
        if "tensor_meta" in n.meta:
            rec["tm"] = True
        st = n.meta.get("stack_trace")
        if isinstance(st, str):
            rec["st"] = st
        nodes.append(rec)
    return {"nodes": nodes}


def _tensor_metadata(t: torch.Tensor) -> Any:
    """What ``shape_prop._extract_tensor_metadata`` gives for a plain (unquantized) tensor,
    computed without it: its contiguity check goes through ``torch._check``, whose first use
    imports ``torch.fx.experimental.symbolic_shapes`` (0.15-0.5 s on a warm start)."""
    from torch.fx.passes.shape_prop import TensorMetadata

    memory_format = None
    for mf in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
        if t.dim() == {torch.channels_last: 4, torch.channels_last_3d: 5}.get(mf, t.dim()) \
                and t.is_contiguous(memory_format=mf):
            memory_format = mf
            break
    return TensorMetadata(t.shape, t.dtype, t.requires_grad, t.stride(), memory_format, False, {})


def loads_graph(data: dict[str, Any]) -> fx.GraphModule:
    """The graph :func:`dumps_graph` wrote, with ``meta["val"]`` (and ``tensor_meta`` where the
    original had it) on every node."""
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    for rec in data["nodes"]:
        op = rec["op"]
        args = _dec(rec.get("args", {"t": []}), env)
        kwargs = _dec(rec.get("kwargs", {"d": {}}), env)
        if op == "placeholder":
            n = g.placeholder(rec["target"])
        elif op == "output":
            n = g.output(args[0])
        else:
            n = g.create_node(op, _target(rec["target"]), tuple(args), kwargs, name=rec["name"])
        if n.name != rec["name"]:
            raise ValueError(f"node name {rec['name']!r} rebuilt as {n.name!r}")
        if "val" in rec:
            n.meta["val"] = _dec_val(rec["val"])
            if rec.get("tm") and isinstance(n.meta["val"], torch.Tensor):
                n.meta["tensor_meta"] = _tensor_metadata(n.meta["val"])
        if "st" in rec:
            n.meta["stack_trace"] = rec["st"]
        env[n.name] = n
    return fx.GraphModule(torch.nn.Module(), g)


def _same_graph(a: fx.GraphModule, b: fx.GraphModule) -> bool:
    """Same generated code and the same metadata on every node."""
    if a.code != b.code:
        return False
    for x, y in zip(a.graph.nodes, b.graph.nodes):
        try:
            if _enc_val(x.meta.get("val")) != _enc_val(y.meta.get("val")):
                return False
        except Uncacheable:
            return False
    return len(a.graph.nodes) == len(b.graph.nodes)


# --------------------------------------------------------------------------------------------
# GraphInfo <-> JSON


_INFO_FIELDS = {"out_spec", "outputs", "graph_out_flat", "mutated", "graph_out_requires_grad",
                "mutated_requires_grad", "meta_mutated"}


def _dumps_info(info: GraphInfo) -> dict[str, Any]:
    for f in dataclasses.fields(info):
        # a field this format does not know (added to GraphInfo later) must hold its default,
        # else the rebuilt GraphInfo would differ: not cached
        if f.name not in _INFO_FIELDS and f.compare:
            default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else f.default)
            if getattr(info, f.name) != default:
                raise Uncacheable(f"GraphInfo.{f.name} is set")
    outs = []
    for o in info.outputs:
        if o.kind == "const" and not isinstance(o.value, (bool, int, float, str, type(None))):
            raise Uncacheable(f"constant output of type {type(o.value).__name__}")
        outs.append({"kind": o.kind, "index": o.index, "size": list(o.size),
                     "stride": list(o.stride), "offset": o.offset, "same": o.same,
                     "detached": o.detached,
                     "value": _enc(o.value) if o.kind == "const" else None,
                     "dtype": _enc(o.dtype) if o.dtype is not None else None})
    try:
        spec = pytree.treespec_dumps(info.out_spec)
    except Exception as e:  # a pytree node type without a serialized name
        raise Uncacheable(f"output structure: {e}") from e
    return {"spec": spec, "outputs": outs, "graph_out_flat": info.graph_out_flat,
            "mutated": info.mutated, "graph_out_requires_grad": info.graph_out_requires_grad,
            "mutated_requires_grad": info.mutated_requires_grad,
            "meta_mutated": [[i, list(s), list(st), off]
                             for i, (s, st, off) in info.meta_mutated.items()]}


def _loads_info(d: dict[str, Any]) -> GraphInfo:
    outs = [OutputInfo(o["kind"], o["index"], tuple(o["size"]), tuple(o["stride"]), o["offset"],
                       o["same"], _dec(o["value"], {}) if o["kind"] == "const" else None,
                       _dec(o["dtype"], {}) if o["dtype"] is not None else None,
                       detached=bool(o.get("detached", False)))
            for o in d["outputs"]]
    return GraphInfo(pytree.treespec_loads(d["spec"]), outs, list(d["graph_out_flat"]),
                     list(d["mutated"]), list(d["graph_out_requires_grad"]),
                     list(d["mutated_requires_grad"]),
                     {i: (tuple(s), tuple(st), off) for i, s, st, off in d["meta_mutated"]})


def _same_info(a: GraphInfo, b: GraphInfo) -> bool:
    return (a.outputs == b.outputs and a.graph_out_flat == b.graph_out_flat
            and a.mutated == b.mutated and a.graph_out_requires_grad == b.graph_out_requires_grad
            and a.mutated_requires_grad == b.mutated_requires_grad
            and a.meta_mutated == b.meta_mutated
            and pytree.treespec_dumps(a.out_spec) == pytree.treespec_dumps(b.out_spec))


# --------------------------------------------------------------------------------------------
# lookup and store (called by AOTCompiled._build_variant)


@dataclasses.dataclass
class Entry:
    info: GraphInfo
    kind: str  # "inference" or "training"
    fw: fx.GraphModule
    bw: fx.GraphModule | None = None
    partition: dict[str, Any] = dataclasses.field(default_factory=dict)


def _dumps_entry(info: GraphInfo, kind: str, fw: fx.GraphModule, part: Any = None) -> str:
    d: dict[str, Any] = {"info": _dumps_info(info), "kind": kind, "fw": dumps_graph(fw)}
    if part is not None:
        d["bw"] = dumps_graph(part.bw)
        d["partition"] = {"n_saved": part.n_saved, "saved_names": list(part.saved_names),
                          "saved_bytes": part.saved_bytes,
                          "grad_tangent_deps": [sorted(s) for s in part.grad_tangent_deps],
                          "primal_reaches": [sorted(s) for s in part.primal_reaches]}
    return json.dumps(d, separators=(",", ":"))


def _loads_entry(text: str) -> Entry:
    d = json.loads(text)
    e = Entry(_loads_info(d["info"]), d["kind"], loads_graph(d["fw"]))
    if e.kind == "training":
        e.bw = loads_graph(d["bw"])
        e.partition = d["partition"]
    elif e.kind != "inference":
        raise ValueError(f"unknown entry kind {e.kind!r}")
    return e


def lookup(aot: Any, variant: Any, args: Sequence[Any], tensors: list[torch.Tensor]
           ) -> tuple[str | None, Any]:
    """``(key, runtime)``: the runtime rebuilt from the cache on a hit, else ``(key, None)``
    (``key`` is None when the variant cannot be cached or the cache is off). ``tensors`` are the
    ATen graphs' inputs (the tensor arguments)."""
    if not enabled() or getattr(aot, "dynamic", False):  # static shapes only, for now
        return None, None
    t0 = time.perf_counter()
    try:
        key = graph_key(aot, variant, args)
    except Uncacheable as e:
        counters["uncacheable"] += 1
        log.debug("AOT result not cacheable: %s", e)
        return None, None
    text = get_text(NAMESPACE, key)
    if text is None:
        return key, None
    try:
        entry = _loads_entry(text)
    except Exception as e:  # a record that passed its checksum but does not rebuild
        counters["corrupt"] += 1
        log.warning("AOT cache entry %s does not rebuild (%s: %s); tracing again", key[:16],
                    type(e).__name__, e)
        return key, None
    counters["hits"] += 1
    return key, _runtime(aot, entry, variant, tensors, t0)


def _runtime(aot: Any, e: Entry, variant: Any, tensors: list[torch.Tensor], t0: float) -> Any:
    from .. import events
    from .compile import _example_from_meta
    from .partition import Partition
    from .runtime import ForwardOnly, Training

    detached = [t.detach() for t in tensors]
    log.debug("AOT graphs rebuilt from the on-disk cache (no tracing)")
    aot._log("inference forward" if e.kind == "inference" else "forward", e.fw)
    extra = {"saved_bytes": e.partition["saved_bytes"]} if e.kind == "training" else {}
    events.emit("timing", stage="aot", seconds=time.perf_counter() - t0,
                graph=e.kind, cached=True, **extra)
    primals = aot._primal_infos()
    if e.kind == "inference":
        runtime = ForwardOnly(e.info, aot._compile(e.fw, detached,
                                                   aot._context("inference", primals)))
        runtime.graph = e.fw
        runtime.backend = str(aot.backend.name)
        runtime.size_guards = None  # static shapes: nothing to check per call
        return runtime
    assert e.bw is not None
    aot._log("backward", e.bw)
    p = e.partition
    part = Partition(e.fw, e.bw, p["n_saved"], list(p["saved_names"]), p["saved_bytes"],
                     [frozenset(s) for s in p["grad_tangent_deps"]],
                     [frozenset(s) for s in p["primal_reaches"]])
    tangent_meta = []
    for n in list(part.bw.graph.nodes)[part.n_saved:]:
        if n.op != "placeholder":
            break
        v = n.meta["val"]
        tangent_meta.append((tuple(v.shape), tuple(v.stride()), v.dtype, v.device))
    rg = list(variant)
    fw = aot._compile(part.fw, detached, aot._context("forward", primals))
    # part.fw's placeholders are the joint graph's primals, with their names
    bw_infos = aot._backward_infos(part.fw, part, primals)
    bw = aot._compile(part.bw, _example_from_meta(part.bw), aot._context("backward", bw_infos))
    runtime = Training(e.info, fw, lambda: bw, rg, part.n_saved, tangent_meta,
                       part.grad_tangent_deps, part.primal_reaches,
                       backend=str(aot.backend.name))
    runtime.partition = part
    runtime.size_guards = None
    return runtime


def store(key: str | None, info: GraphInfo, fw: fx.GraphModule, part: Any = None) -> None:
    """Write the traced result under ``key`` (no-op for None), after checking that it rebuilds
    into exactly the traced graphs."""
    if key is None:
        return
    kind = "inference" if part is None else "training"
    try:
        if getattr(info, "geometry", None) is not None or getattr(part, "n_saved_sym", 0):
            raise Uncacheable("dynamic shapes")
        text = _dumps_entry(info, kind, fw if part is None else part.fw, part)
        back = _loads_entry(text)
    except Uncacheable as e:
        counters["uncacheable"] += 1
        log.debug("AOT result not cacheable: %s", e)
        return
    same = _same_graph(back.fw, fw if part is None else part.fw) and _same_info(back.info, info)
    if part is not None:
        same = same and back.bw is not None and _same_graph(back.bw, part.bw)
    if not same:
        counters["uncacheable"] += 1
        log.debug("AOT result %s does not round-trip exactly; not cached", key[:16])
        return
    counters["misses"] += 1
    put_text(NAMESPACE, key, text)
