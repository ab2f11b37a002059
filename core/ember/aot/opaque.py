"""Custom operators whose Python backward cannot be traced run that backward as one opaque op.

A ``torch.library.custom_op`` with ``register_autograd`` has a Python backward that AOT autograd
traces into the joint graph like any other code. Some cannot be traced: transformers 5.17's
CPU grouped-matmul fallback (Mixtral, Qwen2-MoE, OLMoE) loops over ``offs.tolist()`` and branches
on those values (``if start == end``). Unbacked symbols do not help there: the branch guards on
a data-dependent value (torch.compile fails on it too, ``GuardOnDataDependentSymNode: Eq(u0, 0)``,
or splits the graph at the op when it cannot read the value).

Ember traces the backward first, as torch does; when that raises a data-dependent error, the
backward of that one call becomes a node ``ember.custom_op_backward`` in the joint graph. Its
inputs are the forward op's tensor inputs, its outputs and the incoming gradients; at run time it
rebuilds the autograd context by calling the op's own ``setup_context`` on the real values and
runs the op's own backward. The node carries the op's qualified name and a JSON description of
the non-tensor arguments, so a graph holding it is self-describing (no process-local state).

A gradient the user's backward returns as None for an input that needs one is returned as zeros
(the opaque op has a fixed list of tensor outputs); the values are the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any, Iterator, Sequence

import torch

__all__ = ["opaque_custom_backwards", "fallen_back"]

log = logging.getLogger("ember.aot")

_tls = threading.local()
_lock = threading.Lock()
_FWD = "_ember_fwd"
#: on the context too: the trace's (shape_env, ignored symbols, fallen ops). The backward may run
#: on another thread than the trace: the autograd engine runs a CUDA graph's backward nodes on
#: its device thread, where the tracing thread's locals are not seen.
_TRACE = "_ember_trace"


def _active() -> bool:
    return getattr(_tls, "depth", 0) > 0


def fallen_back() -> list[str]:
    """Qualified names of the custom ops whose backward ran opaque in the current trace."""
    return list(getattr(_tls, "fallen", []))


# -- the opaque op ---------------------------------------------------------------------------
_OP: Any = None


def _encode(v: Any) -> Any:
    """A non-tensor argument as JSON (None, bool, int, float, str, lists of them, dtypes)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return {"seq": [_encode(x) for x in v], "tuple": isinstance(v, tuple)}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    raise TypeError(f"cannot describe argument {v!r} of type {type(v).__name__}")


def _decode(v: Any) -> Any:
    if isinstance(v, dict):
        if "seq" in v:
            items = [_decode(x) for x in v["seq"]]
            return tuple(items) if v["tuple"] else items
        if "dtype" in v:
            return getattr(torch, v["dtype"])
        if "device" in v:
            return torch.device(v["device"])
    return v


def _flatten_args(args: Sequence[Any]) -> tuple[list[torch.Tensor], list[Any]]:
    """Tensors out of a positional argument list (top level and lists of tensors); the rest as
    a JSON-able layout with ``{"t": k}`` where tensor ``k`` goes."""
    tensors: list[torch.Tensor] = []

    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return {"t": len(tensors) - 1}
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return {"seq": [one(x) for x in v], "tuple": isinstance(v, tuple)}
        return _encode(v)

    return tensors, [one(a) for a in args]


def _unflatten(layout: Any, tensors: Sequence[torch.Tensor]) -> Any:
    if isinstance(layout, dict):
        if "t" in layout:
            return tensors[layout["t"]]
        if "seq" in layout:
            items = [_unflatten(x, tensors) for x in layout["seq"]]
            return tuple(items) if layout["tuple"] else items
    return _decode(layout)


class _Ctx:
    """The autograd context a custom op's ``setup_context``/``backward`` see, rebuilt at run
    time (the methods and attributes ``torch.autograd.function.FunctionCtx`` offers them)."""

    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[Any, ...] = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        self.saved_for_forward = tensors

    def mark_dirty(self, *args: Any) -> None:
        pass

    def mark_non_differentiable(self, *args: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value


def _find_opdef(qualname: str) -> Any:
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(qualname)
    if opdef is None:
        raise RuntimeError(f"custom op {qualname} is not registered in this process")
    return opdef


def _run_backward(tensors: list[torch.Tensor], meta: str) -> list[torch.Tensor]:
    m = json.loads(meta)
    opdef = _find_opdef(m["op"])
    setup = _original(opdef._setup_context_fn)
    backward = _original(opdef._backward_fn)
    n_in, n_out = m["n_in_tensors"], m["n_out"]
    in_t, out_t, grads = tensors[:n_in], tensors[n_in:n_in + n_out], tensors[n_in + n_out:]
    args = [_unflatten(a, in_t) for a in m["args"]]
    kwargs = {k: _unflatten(v, in_t) for k, v in m["kwargs"].items()}
    output = out_t[0] if m["out_single"] else tuple(out_t)
    ctx = _Ctx(tuple(m["needs"]))
    with torch.no_grad():
        if setup is not None:
            if m["kwargs_only"]:
                setup(ctx=ctx, inputs=tuple(args), keyword_only_inputs=kwargs, output=output)
            else:
                setup(ctx=ctx, inputs=tuple(args), output=output)
        result = backward(ctx, *grads)
    if not isinstance(result, tuple):
        result = (result,)
    out = []
    for pos in m["grad_pos"]:
        g = result[pos] if pos < len(result) else None
        if g is None:
            g = torch.zeros_like(args[pos], memory_format=torch.contiguous_format)
        else:
            g = g.contiguous()
            if _aliases_input(g, tensors):  # a custom op's outputs may not alias its inputs
                g = g.clone()
        out.append(g)
    return out


def _aliases_input(g: torch.Tensor, tensors: Sequence[torch.Tensor]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr()
               == g.untyped_storage().data_ptr() for t in tensors if t.numel() and g.numel())


def _fake_backward(tensors: list[torch.Tensor], meta: str) -> list[torch.Tensor]:
    m = json.loads(meta)
    in_t = tensors[:m["n_in_tensors"]]
    args = [_unflatten(a, in_t) for a in m["args"]]
    return [torch.empty_like(args[pos], memory_format=torch.contiguous_format)
            for pos in m["grad_pos"]]


def _op() -> Any:
    global _OP
    if _OP is None:
        with _lock:
            from torch._library.custom_ops import OPDEFS

            if _OP is None and "ember::custom_op_backward" in OPDEFS:  # module reloaded
                _OP = OPDEFS["ember::custom_op_backward"]
            if _OP is None:
                op = torch.library.custom_op("ember::custom_op_backward", _run_backward,
                                             mutates_args=(),
                                             schema="(Tensor[] tensors, str meta) -> Tensor[]")
                torch.library.register_fake("ember::custom_op_backward", _fake_backward)
                _OP = op
    return torch.ops.ember.custom_op_backward.default


# -- tracing ---------------------------------------------------------------------------------
def _data_dependent(e: BaseException) -> bool:
    from .compile import _data_dependent as dd  # late: compile imports this module's users

    return dd(e) is not None


def _original(fn: Any) -> Any:
    return getattr(fn, "_ember_orig", fn)


def _wrap(opdef: Any) -> None:
    """Wrap the op's setup_context and backward once (idempotent; registered again by the user,
    wrapped again). Outside Ember's joint tracing on this thread the wrappers only call through."""
    if getattr(opdef._backward_fn, "_ember_orig", None) is not None and \
            getattr(opdef._setup_context_fn, "_ember_orig", False) is not False:
        return
    orig_setup = _original(opdef._setup_context_fn)
    orig_backward = _original(opdef._backward_fn)
    qualname = opdef._qualname
    kwargs_only = any(a.kwarg_only for a in opdef._opoverload._schema.arguments)

    def setup_context(ctx: Any, inputs: Any, output: Any, **kw: Any) -> Any:
        if _active():
            setattr(ctx, _FWD, (tuple(inputs), dict(kw.get("keyword_only_inputs") or {}),
                                output))
            setattr(ctx, _TRACE, (_tls.shape_env, _tls.ignored, _tls.fallen))
        if orig_setup is None:
            return None
        return orig_setup(ctx=ctx, inputs=inputs, output=output, **kw)

    def backward(ctx: Any, *grads: Any) -> Any:
        # (not _active(): this may be the autograd engine's device thread, not the trace's)
        trace = getattr(ctx, _TRACE, None)
        if trace is None or not hasattr(ctx, _FWD):
            return orig_backward(ctx, *grads)
        env, ignored, fallen = trace
        before = set(env.var_to_range) if env is not None else None
        seen = _visible_tensors(ctx, grads)
        versions = [t._version for t in seen]
        try:
            return orig_backward(ctx, *grads)
        except Exception as e:
            if not _data_dependent(e):
                raise
            if any(t._version != v for t, v in zip(seen, versions)):
                # the abandoned trace already changed a tensor that outlives it: the recorded
                # graph is no longer that of a backward that did not run
                raise
            if before is not None:  # symbols the abandoned trace made belong to no graph
                ignored.update(s for s in env.var_to_range if s not in before)
            log.info("ember: the backward of custom op %s cannot be traced (%s: %s); it runs "
                     "as one opaque op in the backward graph", qualname, type(e).__name__,
                     str(e).split("\n", 1)[0])
            fallen.append(qualname)
            return _opaque(ctx, grads, qualname, kwargs_only)

    setup_context._ember_orig = orig_setup  # type: ignore[attr-defined]
    backward._ember_orig = orig_backward  # type: ignore[attr-defined]
    opdef._setup_context_fn = setup_context
    opdef._backward_fn = backward


def _visible_tensors(ctx: Any, grads: Sequence[Any]) -> list[torch.Tensor]:
    """Tensors the backward can reach from outside: saved ones, the forward's inputs and
    outputs, the incoming gradients."""
    inputs, kwargs, output = getattr(ctx, _FWD)
    flat = [*grads, *inputs, *kwargs.values(), output]
    try:
        flat.extend(ctx.saved_tensors)
    except RuntimeError:  # saved tensors already freed
        pass
    out: list[torch.Tensor] = []
    for v in flat:
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor) and all(t is not o for o in out):
                out.append(t)
    return out


def _opaque(ctx: Any, grads: Sequence[Any], qualname: str, kwargs_only: bool) -> Any:
    inputs, kwargs, output = getattr(ctx, _FWD)
    in_tensors, layout = _flatten_args(inputs)
    kw_layout = {}
    for k, v in kwargs.items():
        t, (lay,) = _flatten_args([v])
        if t:  # keyword tensors go after the positional ones
            lay = _shift(lay, len(in_tensors))
            in_tensors.extend(t)
        kw_layout[k] = lay
    outs = [output] if isinstance(output, torch.Tensor) else list(output)
    needs = [bool(n) for n in ctx.needs_input_grad]
    grad_pos = [i for i, a in enumerate(inputs)
                if isinstance(a, torch.Tensor) and i < len(needs) and needs[i]]
    meta = json.dumps({"op": qualname, "args": layout, "kwargs": kw_layout,
                       "kwargs_only": kwargs_only, "n_in_tensors": len(in_tensors),
                       "n_out": len(outs), "out_single": isinstance(output, torch.Tensor),
                       "needs": needs, "grad_pos": grad_pos}, sort_keys=True)
    gs = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs)]
    res = _op()(list(in_tensors) + outs + gs, meta)
    full: list[Any] = [None] * len(inputs)
    for pos, g in zip(grad_pos, res):
        full[pos] = g
    return tuple(full)


def _shift(layout: Any, base: int) -> Any:
    if isinstance(layout, dict):
        if "t" in layout:
            return {"t": layout["t"] + base}
        if "seq" in layout:
            return {"seq": [_shift(x, base) for x in layout["seq"]], "tuple": layout["tuple"]}
    return layout


@contextlib.contextmanager
def opaque_custom_backwards(shape_env: Any = None) -> Iterator[set[Any]]:
    """While active (AOT's joint tracing on this thread), the backward of a custom op with a
    registered Python backward becomes the opaque op when tracing it raises a data-dependent
    error. Yields the set of symbols the abandoned backward traces made (they belong to no
    graph: the caller ignores them)."""
    from torch._library.custom_ops import OPDEFS

    with _lock:
        for opdef in list(OPDEFS.values()):
            if getattr(opdef, "_backward_fn", None) is not None:
                _wrap(opdef)
    prev = (getattr(_tls, "depth", 0), getattr(_tls, "shape_env", None),
            getattr(_tls, "ignored", None), getattr(_tls, "fallen", None))
    _tls.depth, _tls.shape_env, _tls.ignored, _tls.fallen = prev[0] + 1, shape_env, set(), []
    try:
        yield _tls.ignored
    finally:
        ignored, fallen = _tls.ignored, _tls.fallen
        _tls.depth, _tls.shape_env = prev[0], prev[1]
        _tls.ignored = ignored if prev[2] is None else prev[2] | ignored
        _tls.fallen = fallen if prev[3] is None else prev[3] + fallen



# Registered on import (about 1.5 ms, once per process that compiles through AOT): a graph that
# holds the op can then be rebuilt by name from the AOT cache.
_op()
