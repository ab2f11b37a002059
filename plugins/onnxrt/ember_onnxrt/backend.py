"""The ``onnxrt`` backend: an ATen inference graph, partitioned, its supported parts run by ONNX
Runtime and the rest by ATen.

1. **Support**: every node is asked :func:`translate.check_node` (torch_lib has a function for
   its overload, its arguments and dtypes are taken, it mutates nothing, it is not random).
2. **Partitioning**: the supported nodes are grouped by torch.fx's capability partitioner
   (connected groups that create no cycle with the nodes left out). A group with fewer than
   ``min_subgraph_ops`` ops (default 3) stays in ATen: a tensor crossing from ATen into ORT and
   back costs more than a tiny subgraph saves. Each group becomes one ONNX model and one session;
   the graph that calls them runs the remaining nodes as ATen ops. What stays in ATen, and why,
   is logged (``ember.onnxrt``, INFO), and the share of ops run by ORT is recorded
   (:class:`Compiled`'s ``ort_ops``/``total_ops``/``share``, the last compiled graphs in
   :data:`last_compiled`).
3. **Frozen weights**: in an inference graph, parameters and buffers with stable addresses
   become initializers of the model (ORT folds and pre-packs them). Each call checks that they
   did not change (version counter and data pointer, and with ``freezing_check="content"`` their
   bytes against a snapshot, as ember-inductor's freezing does); when one did, the graph
   switches to sessions that take the weights as inputs (built then, once) and logs it.
4. **Failures**: a session ORT refuses (an operator or type it has no kernel for) sends the node
   it names back to ATen and partitions again; anything else that fails leaves that subgraph to
   ATen, logged. Nothing here makes the user's program fail.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import operator
import re
import time
from collections import Counter
from typing import Any, Callable, Sequence

import torch
import torch.fx

from . import session as S
from . import translate as T

log = logging.getLogger("ember.onnxrt")

aten = torch.ops.aten

OPTIONS = {
    "min_subgraph_ops": "smallest number of ops worth an ORT subgraph (default 3); smaller "
                        "groups of supported ops run as ATen",
    "optimization_level": "ORT graph optimizations: 'all' (default), 'extended', 'basic', "
                          "'disable'",
    "intra_op_threads": "ORT's intra-op threads (default: torch.get_num_threads())",
    "arena": "ORT's CPU memory arena (default True)",
    "freezing": "parameters and buffers become initializers (default True); False: graph "
                "inputs",
    "freezing_check": "per-call check of frozen weights: 'content' (default: bytes compared "
                      "with a snapshot, sees writes through .data) or 'version' (version "
                      "counter and address only)",
    "cache": "use Ember's on-disk cache for ONNX and optimized models (default True)",
    "ort_ops": "None, or a list of ATen op names (e.g. 'aten::addmm') to restrict ORT to "
               "(for tests and bisecting)",
}

#: the most recent compiled graphs (newest last), for tests, benchmarks and the curious
last_compiled: list["Compiled"] = []
counters: Counter[str] = Counter()


def _compute_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem]


@dataclasses.dataclass
class Compiled:
    """What ``compile_onnxrt`` made of one graph (also the callable)."""
    graph_id: str
    fn: Callable[..., Any]
    ort_ops: int
    total_ops: int
    subgraphs: int
    aten_ops: dict[str, str]        # op name -> why it stayed in ATen
    gm: torch.fx.GraphModule        # the partitioned graph (ORT calls + ATen ops)
    calls: list[Any] = dataclasses.field(default_factory=list)  # the _OrtSubgraph objects

    @property
    def share(self) -> float:
        return self.ort_ops / self.total_ops if self.total_ops else 1.0

    def __post_init__(self) -> None:
        self.restride: dict[int, Any] = {}
        #: fx node name -> why it stayed ATen (stored for warm starts)
        self.decisions: dict[str, str] = {}

    def __call__(self, *args: Any) -> Any:
        out = self.fn(*args)
        if self.restride:
            # ONNX tensors are contiguous; where the graph's output has other strides (a
            # transposed result), Ember regenerates aliases of it from those strides: honor them
            out = list(out)
            for k, (shape, stride) in self.restride.items():
                r = out[k]
                if isinstance(r, torch.Tensor) and tuple(r.stride()) != stride \
                        and tuple(r.shape) == shape:
                    t = torch.empty_strided(shape, stride, dtype=r.dtype, device=r.device)
                    t.copy_(r)
                    out[k] = t
        return out

    def ember_precompile(self, name: str) -> tuple[str, dict[str, bytes]]:
        from .precompile import fragment

        return fragment(self, name)


def _output_strides(gm: torch.fx.GraphModule) -> dict[int, tuple[tuple[int, ...], tuple]]:
    """Outputs whose traced strides are not contiguous (static shapes): index -> (shape,
    strides)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    res = {}
    for k, o in enumerate(out.args[0] if isinstance(out.args[0], (list, tuple)) else []):
        v = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
        if isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) and \
                all(isinstance(d, int) for d in v.stride()) and not v.is_contiguous():
            res[k] = (tuple(v.shape), tuple(v.stride()))
    return res


def compile_onnxrt(gm: torch.fx.GraphModule, example_inputs: list[Any], *,
                   context: Any = None, **options: Any) -> Any:
    """Compile an ATen inference graph (see the module doc)."""
    from ember.exc import InferenceOnlyBackend

    if context is not None and context.kind in ("forward", "backward", "training"):
        raise InferenceOnlyBackend(
            "backend 'onnxrt' is inference-only, but it was given a training graph: run under "
            "torch.no_grad()/torch.inference_mode(), or use a training backend (e.g. "
            "'inductor' or 'aot_eager')")
    S.ort()  # a clear error now when onnxruntime is missing
    t0 = time.perf_counter()
    graph_id = getattr(context, "graph_id", "graph")
    device = getattr(context, "device", None) or _device(example_inputs)
    views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _VIEWS]
    for n in views:  # as aot_eager: a traced view may not be a view of the real strides
        n.target = aten.reshape.default
    if views:
        gm.recompile()
    frozen = _frozen_inputs(gm, example_inputs, context, options)
    total = len(_compute_nodes(gm))
    refused: dict[torch.fx.Node, str] = {}
    pkey = _partition_key(gm, options)
    decided = _load_decisions(gm, pkey) if options.get("cache", True) else None
    if decided is not None:
        counters["partition_cache_hits"] += 1
    for attempt in range(32):
        try:
            comp = _partition_and_build(gm, example_inputs, frozen, options, device, graph_id,
                                        refused, decided)
            if decided is None and options.get("cache", True):
                _store_decisions(pkey, comp.decisions)
            break
        except _Refused as r:
            refused[r.node] = r.reason
            decided = None
            log.info("onnxrt: %s: ORT refused %s (%s); it runs in ATen", graph_id,
                     r.node.format_node(), r.reason[:200])
    else:  # pragma: no cover - ORT keeps refusing: everything in ATen
        comp = None
    if comp is None:
        comp = Compiled(graph_id, gm.forward, 0, total, 0, {"*": "ORT refused the subgraphs"}, gm)
    comp.total_ops = total
    comp.restride = _output_strides(gm) if comp.subgraphs else {}
    last_compiled.append(comp)
    del last_compiled[:-64]
    counters["graphs"] += 1
    counters["ort_ops"] += comp.ort_ops
    counters["total_ops"] += total
    log.info("onnxrt: %s: %d of %d ops in ONNX Runtime (%.0f%%) in %d subgraph(s), "
             "compiled in %.2f s", graph_id, comp.ort_ops, total, 100 * comp.share,
             comp.subgraphs, time.perf_counter() - t0)
    return comp


_VIEWS = (aten.view.default, aten._unsafe_view.default)


def _device(example_inputs: Sequence[Any]) -> str:
    for t in example_inputs:
        if isinstance(t, torch.Tensor):
            return str(t.device)
    return "cpu"


def _frozen_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], context: Any,
                   options: dict[str, Any]) -> set[int]:
    """Positions of placeholders embedded as initializers: parameters and buffers with stable
    addresses, in an inference graph, unless ``freezing=False``."""
    if context is None or context.kind != "inference" or not options.get("freezing", True):
        return set()
    out = set()
    for i, (info, ex) in enumerate(zip(context.inputs, example_inputs)):
        if info.kind in ("parameter", "buffer") and info.stable_address and \
                isinstance(ex, torch.Tensor) and not ex.requires_grad and ex.numel() > 0 \
                and ex.layout is torch.strided and not ex.is_complex():
            out.add(i)
    return out


class _Refused(Exception):
    def __init__(self, node: torch.fx.Node, reason: str):
        self.node, self.reason = node, reason


def _partition_key(gm: torch.fx.GraphModule, options: dict[str, Any]) -> str:
    h = hashlib.sha256(gm.code.encode())
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            h.update(repr((getattr(v, "shape", v), getattr(v, "dtype", None))).encode())
    h.update(repr((options.get("ort_ops"), options.get("min_subgraph_ops"), T.TRANSLATOR_VERSION,
                   T.onnxscript_version(), S.ort().__version__)).encode())
    return h.hexdigest()


def _load_decisions(gm: torch.fx.GraphModule, key: str) -> dict[torch.fx.Node, str] | None:
    """Which nodes stayed ATen, and why, when this graph was compiled before (Ember's text
    store): a warm start then asks no node whether it can be translated (which imports
    torch_lib, seconds)."""
    import json

    from ember._store import get_text

    text = get_text("onnxrt-partition", key)
    if text is None:
        return None
    try:
        by_name = json.loads(text)
        nodes = {n.name: n for n in gm.graph.nodes}
        return {nodes[k]: str(v) for k, v in by_name.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _store_decisions(key: str, decisions: dict[str, str]) -> None:
    import json

    from ember._store import put_text

    put_text("onnxrt-partition", key, json.dumps(decisions, sort_keys=True))


class _Support:
    """torch.fx's OperatorSupport protocol over check_node (results memoized per node), or over
    the decisions of an earlier compile of the same graph (``decided``)."""

    def __init__(self, refused: dict[torch.fx.Node, str], allowed: set[str] | None,
                 decided: dict[torch.fx.Node, str] | None = None):
        self.refused = refused
        self.allowed = allowed
        self.decided = decided
        self.why: dict[torch.fx.Node, str] = {}

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node in self.why:
            return False
        if self.decided is not None:
            if node in self.decided:
                self.why[node] = self.decided[node]
                return False
            return True
        if node in self.refused:
            self.why[node] = self.refused[node]
            return False
        if node.target is operator.getitem:
            return True
        name = T.qualified_name(node.target) or str(node.target)
        if self.allowed is not None and name not in self.allowed:
            self.why[node] = "not in ort_ops"
            return False
        try:
            T.check_node(node)
        except T.Unsupported as e:
            self.why[node] = str(e)
            return False
        return True


def _op_name(n: torch.fx.Node) -> str:
    return T.qualified_name(n.target) or str(n.target)


def _partition_and_build(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                         frozen: set[int], options: dict[str, Any], device: str,
                         graph_id: str, refused: dict[torch.fx.Node, str],
                         decided: dict[torch.fx.Node, str] | None = None) -> Compiled:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    allowed = options.get("ort_ops")
    support = _Support(refused, set(allowed) if allowed is not None else None, decided)
    min_ops = int(options.get("min_subgraph_ops", 3))
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True,
                                             non_compute_ops=["operator.getitem"])
    parts = partitioner.propose_partitions()
    aten_ops: dict[str, str] = {}
    for n, why in support.why.items():
        aten_ops.setdefault(_op_name(n), why)
    kept = []
    for p in parts:
        ops = [n for n in p.nodes.keys() if n.target is not operator.getitem]
        if len(ops) < min_ops and len(ops) < len(_compute_nodes(gm)):
            for n in ops:
                aten_ops.setdefault(_op_name(n), f"in a group of {len(ops)} supported op(s), "
                                    f"fewer than min_subgraph_ops={min_ops}")
            continue
        kept.append(p)
    total = len(_compute_nodes(gm))
    if not kept:
        log.info("onnxrt: %s: nothing for ONNX Runtime (%d ops), the graph runs as ATen: %s",
                 graph_id, total, _summary(aten_ops))
        comp = Compiled(graph_id, gm.forward, 0, total, 0, aten_ops, gm)
        comp.decisions = {n.name: why for n, why in support.why.items()}
        return comp
    if aten_ops:
        log.info("onnxrt: %s: ops kept in ATen: %s", graph_id, _summary(aten_ops))
    # copy: fusing rewrites the graph, and a refusal below must start again from the original
    g2 = torch.fx.GraphModule(gm, _copy_graph(gm))
    name_map = {n.name: n for n in gm.graph.nodes}
    by_name = {n.name: n for n in g2.graph.nodes}
    from torch.fx.passes.infra.partitioner import Partition

    parts2 = []
    for k, p in enumerate(kept):
        q = Partition(id=k, nodes=[by_name[n.name] for n in p.nodes])
        parts2.append(q)
    fused = _fuse(g2, parts2)
    placeholders = [n for n in fused.graph.nodes if n.op == "placeholder"]
    ph_pos = {n: i for i, n in enumerate(placeholders)}
    calls = []
    ort_ops = 0
    failed: dict[str, str] = {}
    for node in list(fused.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(fused, node.target)
        sub_ops = _compute_nodes(sub)
        sub_ph = [n for n in sub.graph.nodes if n.op == "placeholder"]
        # which of the subgraph's inputs are frozen weights (a top-level placeholder)
        init = {}
        for j, a in enumerate(node.args):
            if isinstance(a, torch.fx.Node) and a in ph_pos and ph_pos[a] in frozen:
                init[j] = example_inputs[ph_pos[a]]
        sub_examples = [_example(a, example_inputs, ph_pos) for a in node.args]
        call = _OrtSubgraph(sub, init, options, device, f"{graph_id}.{node.target}",
                            sub_examples, name_map)
        try:
            call.build()
        except _Refused:
            raise
        except Exception as e:  # noqa: BLE001  this subgraph stays ATen
            log.warning("onnxrt: %s: the subgraph %s (%d ops) could not be built and runs as "
                        "ATen: %s: %s", graph_id, node.target, len(sub_ops), type(e).__name__,
                        str(e)[:2000])
            log.debug("onnxrt: %s: %s", graph_id, node.target, exc_info=True)
            for n in sub_ops:
                aten_ops.setdefault(_op_name(n), f"its subgraph failed to build: "
                                    f"{type(e).__name__}")
                if n.name in name_map:
                    failed[n.name] = f"its subgraph failed to build: {type(e).__name__}"
            continue
        calls.append(call)
        ort_ops += len(sub_ops)
        setattr(fused, node.target, _Module(call))
    fused.graph.lint()
    fused.recompile()
    comp = Compiled(graph_id, fused.forward, ort_ops, total, len(calls), aten_ops, fused, calls)
    comp.decisions = {**{n.name: why for n, why in support.why.items()}, **failed}
    return comp


def _example(a: Any, example_inputs: Sequence[Any], ph_pos: dict[Any, int]) -> Any:
    if isinstance(a, torch.fx.Node):
        if a in ph_pos:
            return example_inputs[ph_pos[a]]
        return a.meta.get("val")
    return a


def _copy_graph(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    import copy

    return copy.deepcopy(gm.graph)


def _fuse(gm: torch.fx.GraphModule, parts: list[Any]) -> torch.fx.GraphModule:
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    return fuse_by_partitions(gm, [dict.fromkeys(p.nodes) for p in parts],
                              prefix="ort_subgraph_")


def _summary(aten_ops: dict[str, str]) -> str:
    return "; ".join(f"{k} ({v})" for k, v in sorted(aten_ops.items()))


_NODE_RE = re.compile(r"node (?:with name )?'?([A-Za-z0-9_./:\-]+)'?")


class _OrtSubgraph:
    """One ORT session for one fused subgraph, with its frozen-weight check."""

    def __init__(self, sub: torch.fx.GraphModule, init: dict[int, torch.Tensor],
                 options: dict[str, Any], device: str, name: str,
                 examples: Sequence[Any], name_map: dict[str, torch.fx.Node]):
        self.sub = sub
        self.init = init
        self.options = options
        self.device = device
        self.name = name
        self.__name__ = re.sub(r"\W", "_", name)
        self.examples = list(examples)
        self.name_map = name_map
        self.check = str(options.get("freezing_check", "content"))
        self.frozen_call: S.OrtCall | None = None
        self.unfrozen_call: S.OrtCall | None = None
        self.model_bytes: bytes = b""
        self.unfrozen_bytes: bytes = b""
        self.key: list[tuple[int, int]] = []
        self.snapshot: list[torch.Tensor] = []
        self.thawed = False
        self.fell_back = False
        self._reported = False

    # -- building --------------------------------------------------------------------------

    def _graph_key(self, frozen: bool) -> str:
        """Content address of the model: the graph's code and its inputs' types, plus (frozen)
        a digest of the weights' bytes."""
        h = hashlib.sha256()
        h.update(self.sub.code.encode())
        for n in self.sub.graph.nodes:
            if n.op == "placeholder":
                v = n.meta.get("val")
                h.update(repr((getattr(v, "shape", v), getattr(v, "dtype", None))).encode())
        h.update(f"opset={T.OPSET}|translator={T.TRANSLATOR_VERSION}|"
                 f"onnxscript={T.onnxscript_version()}".encode())
        if frozen:
            for j in sorted(self.init):
                t = self.init[j].detach().contiguous()
                h.update(f"{j}:{tuple(t.shape)}:{t.dtype}".encode())
                if t.device.type == "cpu":
                    h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                else:
                    h.update(t.cpu().numpy().tobytes())
        return h.hexdigest()

    def _make(self, frozen: bool) -> tuple[S.OrtCall, bytes]:
        init = self.init if frozen else {}
        built: list[T.Built] = []

        def model_bytes() -> bytes:
            b = T.build_model(self.sub, init, name=self.__name__)
            built.append(b)
            import onnx_ir as ir

            return ir.to_proto(b.model).SerializeToString()

        key = self._graph_key(frozen)
        try:
            sess, data = S.open_session(key, model_bytes, self.options, self.device,
                                        use_cache=bool(self.options.get("cache", True)))
        except T.Unsupported as e:
            node = self.name_map.get(e.node_name or "") or self._node_named(str(e))
            raise _Refused(node, str(e)) if node is not None else e
        except Exception as e:  # noqa: BLE001  ORT refused the model
            node = self._node_from_ort_error(str(e), built)
            if node is not None:
                raise _Refused(node, f"{type(e).__name__}: {str(e)[:300]}") from e
            raise
        ph = [n for n in self.sub.graph.nodes if n.op == "placeholder"]
        input_index = [i for i in range(len(ph)) if i not in init]
        input_names = [f"in{i}_{ph[i].name}" for i in input_index]
        out_node = next(n for n in self.sub.graph.nodes if n.op == "output")
        outs = out_node.args[0]
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        out_meta = []
        for o in outs:
            v = o.meta.get("val")
            shape = [d if isinstance(d, int) else _expr(d) for d in v.shape]
            out_meta.append((shape, v.dtype))
        sym_dims: dict[str, tuple[int, int]] = {}
        for i, p in enumerate(ph):
            v = p.meta.get("val")
            if isinstance(v, torch.Tensor):
                for d, s in enumerate(v.shape):
                    if isinstance(s, torch.SymInt):
                        e = _expr(s)
                        if e is not None and getattr(e, "is_Symbol", False):
                            sym_dims.setdefault(e.name, (i, d))
            elif isinstance(v, torch.SymInt):
                e = _expr(v)
                if e is not None and getattr(e, "is_Symbol", False):
                    sym_dims.setdefault(e.name, (i, -1))
        call = S.OrtCall(sess, input_names, input_index, [f"out{k}" for k in range(len(outs))],
                         out_meta, self.device, sym_dims)
        self._single = not isinstance(out_node.args[0], (list, tuple))
        return call, data

    def _node_named(self, text: str) -> torch.fx.Node | None:
        for n in self.sub.graph.nodes:
            if n.op == "call_function" and (T.qualified_name(n.target) or "") in text:
                return self.name_map.get(n.name)
        return None

    def _node_from_ort_error(self, text: str, built: list[Any]) -> torch.fx.Node | None:
        """ORT names the ONNX node it refused; the translator tagged every ONNX node with the
        fx node it came from (``metadata_props["ember.fx_node"]``)."""
        if not built:
            return None
        names = set(re.findall(r"node \(([^)]+)\)|node with name '([^']*)'|Node \(([^)]+)\)",
                               text))
        flat = {x for tup in names for x in tup if x}
        for onode in built[-1].model.graph.all_nodes():
            if onode.name in flat:
                fx = onode.metadata_props.get("ember.fx_node")
                if fx is not None:
                    return self.name_map.get(fx)
        return None

    def build(self) -> None:
        frozen = bool(self.init)
        self.frozen_call, self.model_bytes = self._make(frozen)
        if frozen:
            self._remember()

    # -- the frozen-weight check ---------------------------------------------------------

    def _weights(self, args: Sequence[Any]) -> list[torch.Tensor]:
        return [args[j] for j in sorted(self.init)]

    def _remember(self, args: Sequence[Any] | None = None) -> None:
        ws = self._weights(args) if args is not None else [self.init[j]
                                                             for j in sorted(self.init)]
        self.key = [(t._version, t.data_ptr()) for t in ws]
        if self.check == "content":
            self.snapshot = [t.detach().clone() for t in ws]

    def _changed(self, args: Sequence[Any]) -> bool:
        ws = self._weights(args)
        if [(t._version, t.data_ptr()) for t in ws] != self.key:
            return True
        if self.check == "content":
            from ember._compare import same_contents

            t0 = time.perf_counter()
            same = all(same_contents(t, s) for t, s in zip(ws, self.snapshot))
            if not self._reported:
                self._reported = True
                nbytes = sum(t.numel() * t.element_size() for t in ws)
                log.info("onnxrt: %s: %d weights (%.1f MiB) are initializers; each call "
                         "compares them with a snapshot (%.2f ms on this call) so that writes "
                         "through .data are seen; pass options={'freezing_check': 'version'} "
                         "if they only change through torch's in-place ops, copy_ or "
                         "load_state_dict (or {'freezing': False})", self.name, len(ws),
                         nbytes / 2 ** 20, (time.perf_counter() - t0) * 1e3)
            return not same
        return False

    def _thaw(self) -> None:
        log.info("onnxrt: %s: a frozen parameter or buffer changed; this subgraph now takes "
                 "them as inputs (one more session, built now)", self.name)
        self.thawed = True
        counters["thawed"] += 1
        self.unfrozen_call, self.unfrozen_bytes = self._make(False)

    def _fallback(self, e: Exception) -> None:
        log.warning("onnxrt: %s: ONNX Runtime failed (%s: %s); this subgraph runs as ATen from "
                    "now on", self.name, type(e).__name__, str(e)[:300])
        self.fell_back = True
        counters["runtime_fallbacks"] += 1

    def __call__(self, *args: Any) -> Any:
        if self.fell_back:
            return self.sub(*args)
        try:
            if self.init and not self.thawed and self._changed(args):
                self._thaw()
            call = self.unfrozen_call if self.thawed else self.frozen_call
            outs = call(*args)
        except Exception as e:  # noqa: BLE001  never fail the user's program
            self._fallback(e)
            return self.sub(*args)
        return outs[0] if self._single else tuple(outs)


class _Module(torch.nn.Module):
    """Holds an ORT subgraph where the fused graph calls its submodule."""

    def __init__(self, call: "_OrtSubgraph"):
        super().__init__()
        self.call = call

    def forward(self, *args: Any) -> Any:
        return self.call(*args)


def _expr(s: Any) -> Any:
    if isinstance(s, torch.SymInt):
        return s.node.expr
    return s
