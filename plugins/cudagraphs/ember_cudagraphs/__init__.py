"""Ember's cudagraphs backend: CUDA graph capture and replay.

* ``ember.compile(model, backend="cudagraphs")``: Ember's AOT autograd makes the forward and
  backward (or inference) ATen graphs; each runs eagerly inside CUDA graphs recorded per input
  shape and replayed afterwards (:mod:`ember_cudagraphs.runtime` says how, and why it is safe).
* ``ember.compile(model, backend="inductor", mode="reduce-overhead")``: core hands each compiled
  ATen graph's callable on CUDA to :func:`wrap`, which records that callable the same way. Any
  ``level="aten"`` backend's callable can be wrapped.

This module stays light (listing backends imports it): torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ember

__all__ = ["compile_cudagraphs", "wrap", "OPTIONS"]

#: Every option the backend reads (``ember.compile(options=...)`` refuses others).
OPTIONS = {
    "max_recordings": "CUDA graphs one compiled graph may record (one per input shape, and again "
                      "when a parameter moves) before new shapes run without graphs (default 16)",
}


def _max_recordings(options: dict[str, Any]) -> int:
    from .runtime import DEFAULT_MAX_RECORDINGS

    v = options.get("max_recordings", DEFAULT_MAX_RECORDINGS)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"ember cudagraphs: option max_recordings must be an int >= 0, got {v!r}")
    return v


def _no_cuda_error() -> Exception:
    import torch

    why = ("this torch build has no CUDA support" if not torch.backends.cuda.is_built()
           else "no CUDA device is visible (torch.cuda.is_available() is False)")
    return ember.DeviceUnavailable(
        f"backend='cudagraphs' records CUDA graphs and needs a CUDA device, but {why}. "
        "Run on a machine with an NVIDIA GPU, or use backend='aot_eager' or 'inductor' here "
        "(mode='reduce-overhead' with inductor compiles as the default mode on the CPU).")


def _views_as_reshapes(gm: Any) -> None:
    """As aot_eager does: a traced ``view`` runs as a reshape (meta and real kernels may
    disagree on strides; a reshape is that same view whenever the view succeeds)."""
    import torch

    views = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in views]
    if nodes:
        for n in nodes:
            n.target = torch.ops.aten.reshape.default
        gm.recompile()


def compile_cudagraphs(gm: Any, example_inputs: list[Any], *, context: Any = None,
                       max_recordings: Any = None, **options: Any) -> Callable[..., Any]:
    """Compile one ATen graph (forward, backward or inference) into recorded CUDA graphs."""
    import torch

    if not torch.cuda.is_available():
        raise _no_cuda_error()
    if max_recordings is not None:
        options["max_recordings"] = max_recordings
    _views_as_reshapes(gm)
    constants = [v for v in vars(gm).values() if isinstance(v, torch.Tensor)]
    constants += [b for _, b in gm.named_buffers()] + [p for _, p in gm.named_parameters()]
    return wrap(gm.forward, gm, example_inputs, context=context, options=options,
                constants=constants)


def wrap(fn: Callable[..., Any], gm: Any, example_inputs: Sequence[Any], *, context: Any = None,
         options: dict[str, Any] | None = None,
         constants: Sequence[Any] = ()) -> Callable[..., Any]:
    """Record ``fn`` (a compiled ATen graph's callable: takes ``gm``'s inputs positionally,
    returns its outputs as a tuple or list) into CUDA graphs. Graphs that cannot be recorded
    safely get a callable that runs ``fn`` as it is, with the reason logged (``ember.cudagraphs``
    logger, INFO). ``context``: the graph's :class:`ember.CompileContext` (which inputs are
    parameters, the graph id naming its memory pool)."""
    import torch

    from .runtime import for_graph
    from .safety import generators, refusal_reason

    options = dict(options or {})
    limit = _max_recordings(options)
    gid = getattr(context, "graph_id", None) or "graph"
    kind = getattr(context, "kind", None) or "inference"
    infos = list(getattr(context, "inputs", ()) or ())
    user = [not (i < len(infos) and infos[i].stable_address)
            for i in range(len(example_inputs))]
    reason = None
    gens: list[Any] = []
    try:
        reason = refusal_reason(gm, example_inputs, user) if gm is not None else None
        if reason is None and gm is not None:
            gens = generators(gm)
            if gens and not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
                reason = ("it draws from an explicit CUDA generator and this torch has no "
                          "CUDAGraph.register_generator_state")
    except Exception as e:  # the check itself failed: do not risk a recording
        reason = f"its safety check failed: {type(e).__name__}: {e}"
    device = next((t.device for t in example_inputs
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
    if device is None or device.type != "cuda":
        reason = reason or "it has no CUDA tensor input"
        device = torch.device("cuda", torch.cuda.current_device()) \
            if torch.cuda.is_available() else torch.device("cpu")
    if reason is None:
        from .runtime import ops
        reason = ops().available()
    return for_graph(fn, name=gid, kind=kind, device=device, inputs=infos,
                     max_recordings=limit, refused=reason, generators=gens, constants=constants)


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="cudagraphs", compile=compile_cudagraphs, level="aten",
                          devices=("cuda",), recompute=False,  # each op its own kernel
                          description="AOT autograd, then the ATen graphs run inside recorded "
                                      "CUDA graphs (replayed per input shape)",
                          options=OPTIONS)]
