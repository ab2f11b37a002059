"""ember-onnxrt in an ``ember.precompile`` artifact.

A graph compiled by onnxrt is a partitioned fx graph: ATen ops, and calls of ORT subgraphs. Its
fragment holds

* the partitioned graph as Python source (core's ``graph_source``), each ORT subgraph call
  written as ``operator.call(ort_k, ...)`` on an extra trailing argument ``ort_k``;
* per subgraph: the ONNX model (base64, no weights: in an artifact parameters and buffers are
  inputs, read from the model passed at each call) and how to call it (input positions, output
  shapes and dtypes).

The artifact's cache holds the same ONNX models (``ort<k>.onnx``); ``make_<name>(cache)`` opens
sessions from the cache's bytes, or from the embedded ones when there is no cache. Loading imports
``ember_onnxrt.session`` (the backend's runtime: onnxruntime and torch) and nothing of the
translator.
"""

from __future__ import annotations

import base64
import operator
from typing import Any

import torch
import torch.fx

__all__ = ["fragment"]


def fragment(comp: Any, name: str) -> tuple[str, dict[str, bytes]]:
    from ember.precompile.codegen import graph_source
    from ember.precompile.errors import PrecompileError

    gm = torch.fx.GraphModule(comp.gm, _copy(comp.gm.graph))
    mods = {}
    last_ph = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    k = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        holder = getattr(gm, node.target)
        call = getattr(holder, "call", None)
        if call is None:
            raise PrecompileError(f"onnxrt: unexpected submodule {node.target}")
        with gm.graph.inserting_after(last_ph):
            ph = gm.graph.placeholder(f"ort_{k}")
        last_ph = ph
        node.op = "call_function"
        node.args = (ph, *node.args)
        node.target = operator.call
        mods[k] = call
        k += 1
    gm.graph.lint()
    gm.recompile()
    code, self_expr = graph_source(gm, f"onnxrt_{name}")
    entries: dict[str, bytes] = {}
    specs = []
    for k, call in mods.items():
        if call.init:
            raise PrecompileError("onnxrt: a precompiled graph has frozen weights; precompile "
                                  "passes parameters as inputs (internal error)")
        oc = call.frozen_call
        if any(not isinstance(d, int) for shape, _ in oc.out_meta for d in shape):
            raise PrecompileError("onnxrt: precompile needs static output shapes")
        data = call.model_bytes
        entries[f"ort{k}.onnx"] = data
        specs.append(dict(input_names=oc.input_names, input_index=oc.input_index,
                          output_names=oc.output_names,
                          out_meta=[(list(s), str(d).replace("torch.", "")) for s, d in
                                    oc.out_meta],
                          single=call._single, model=base64.b64encode(data).decode()))
    src = f'''
{code}

ONNXRT_{name} = {specs!r}
ONNXRT_RESTRIDE_{name} = {comp.restride!r}


def make_{name}(cache):
    """ember-onnxrt: the partitioned {name} graph (above) and its ONNX Runtime sessions."""
    import base64 as _b64

    from ember_onnxrt.session import artifact_subgraph, artifact_call

    subs = []
    for k, spec in enumerate(ONNXRT_{name}):
        data = (cache or {{}}).get(f"ort{{k}}.onnx") or _b64.b64decode(spec["model"])
        subs.append(artifact_subgraph(data, spec, {dict(comp_options(comp))!r}))
    consts = {self_expr}
    return artifact_call(onnxrt_{name}, consts, subs, ONNXRT_RESTRIDE_{name})
'''
    return src, entries


def comp_options(comp: Any) -> dict[str, Any]:
    calls = comp.calls
    opts = dict(calls[0].options) if calls else {}
    return {k: v for k, v in opts.items() if k in ("optimization_level", "intra_op_threads",
                                                  "arena")
            and isinstance(v, (int, str, bool, type(None)))}


def _copy(g: torch.fx.Graph) -> torch.fx.Graph:
    import copy

    return copy.deepcopy(g)
