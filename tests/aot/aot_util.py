"""Helpers for AOT tests: lift a module's parameters and buffers into graph inputs (as Ember's
capture does), compile with aot_compile, and compare against eager."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

import ember
from ember.aot import aot_compile


def _functional_module(mod: torch.nn.Module, names: list[str]) -> Callable[..., Any]:
    def call_module(*args: Any) -> Any:
        n = len(args) - len(names)
        return torch.func.functional_call(mod, dict(zip(names, args[n:])), tuple(args[:n]))

    call_module.__name__ = f"call_{type(mod).__name__}"
    return call_module


def lift(module_or_fn: Any, n_user_inputs: int | None = None) -> tuple[fx.GraphModule, list[str]]:
    """Symbolically trace ``module_or_fn``; parameters and buffers become placeholders after the
    user inputs (names returned, in order); the output is made a flat tuple."""
    tracer = fx.Tracer()
    graph = tracer.trace(module_or_fn)
    root = tracer.root
    gm = fx.GraphModule(root, graph)
    g = gm.graph
    state = dict(root.named_parameters()) | dict(root.named_buffers())
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    names: list[str] = []
    lifted: dict[str, fx.Node] = {}
    # Leaf modules (torch.nn layers) become calls of a functional version taking their state.
    for n in list(g.nodes):
        if n.op == "call_module":
            mod = root.get_submodule(n.target)
            local = [k for k, _ in mod.named_parameters()] + [k for k, _ in mod.named_buffers()]
            attrs = []
            with g.inserting_before(n):
                for k in local:
                    attrs.append(g.get_attr(f"{n.target}.{k}"))
                new = g.call_function(_functional_module(mod, local), tuple(n.args) + tuple(attrs),
                                      dict(n.kwargs) or None)
            n.replace_all_uses_with(new)
            g.erase_node(n)
    for n in list(g.nodes):
        if n.op == "get_attr" and n.target in state:
            if n.target not in lifted:
                anchor = last if last is not None else next(iter(g.nodes))
                ctx = g.inserting_after(anchor) if last is not None else g.inserting_before(anchor)
                with ctx:
                    name = n.target.replace(".", "_")
                    ph = g.placeholder(f"_{name}" if name[0].isdigit() else name)
                last = ph
                lifted[n.target] = ph
                names.append(n.target)
            n.replace_all_uses_with(lifted[n.target])
            g.erase_node(n)
    out = next(n for n in g.nodes if n.op == "output")
    if not isinstance(out.args[0], (tuple, list)):
        out.args = ((out.args[0],),)
    g.lint()
    gm.recompile()
    return gm, names


def state_tensors(module: torch.nn.Module, names: Sequence[str]) -> list[torch.Tensor]:
    state = dict(module.named_parameters()) | dict(module.named_buffers())
    return [state[n] for n in names]


def aot_eager_backend() -> ember.Backend:
    return ember.get_backend("aot_eager")


def compile_module(module: torch.nn.Module, backend: Any = None, **options: Any) -> Callable[..., Any]:
    """Return ``call(*user_inputs)`` running ``module`` through aot_compile, with params lifted.
    The module is traced once on the first call (its example inputs are the first call's)."""
    gm, names = lift(module)
    backend = backend or aot_eager_backend()
    compiled: list[Any] = []

    def call(*xs: Any) -> Any:
        args = list(xs) + state_tensors(module, names)
        if not compiled:
            compiled.append(aot_compile(gm, args, backend=backend, options=options))
        out = compiled[0](*args)
        return out[0] if len(out) == 1 else out

    call.gm = gm  # type: ignore[attr-defined]
    call.compiled = compiled  # type: ignore[attr-defined]
    return call


def compile_fn(fn: Callable[..., Any], example: Sequence[Any], backend: Any = None) -> Callable[..., Any]:
    gm, _ = lift(fn)
    return aot_compile(gm, list(example), backend=backend or aot_eager_backend(), options={})


def assert_close(a: Any, b: Any, **kw: Any) -> None:
    kw.setdefault("rtol", 1e-5)
    kw.setdefault("atol", 1e-5)
    torch.testing.assert_close(a, b, **kw)


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: (p.grad.clone() if p.grad is not None else None)
            for n, p in module.named_parameters()}
