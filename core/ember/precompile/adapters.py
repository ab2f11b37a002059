"""The ``ember_precompile`` protocol for compiled callables of known backends that do not
implement it themselves yet (see docs/precompile.md, 'Backends').

Today: ember-inductor's CPU wrapper. Its compiled graph is the ``call`` function of a wrapper
module (readable Python importing torch, ctypes and ember_inductor's runtime; the C++ source
embedded as ``CPP_SOURCE`` and built by ``load_cpp``). The fragment embeds that wrapper; the
cache holds the built shared library, loaded directly when it fits this machine; without it the
wrapper's own ``load_cpp`` builds the C++ from the source (or finds it in inductor's on-disk
cache). When ember-inductor gives its callables an ``ember_precompile`` method, that wins and
this adapter is no longer used.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .codegen import tensor_literal
from .errors import PrecompileError

__all__ = ["adapter_for"]

_LOAD_LINE = "from ember_inductor.runtime.cache import load_cpp"


def _is_inductor_call(fn: Any) -> bool:
    g = getattr(fn, "__globals__", None)
    return (isinstance(g, dict) and str(g.get("__name__", "")).startswith("ember_inductor_graph_")
            and getattr(fn, "__name__", "") == "call")


def _inductor(gm: torch.fx.GraphModule, fn: Any, options: dict[str, Any]
              ) -> Callable[[str], tuple[str, dict[str, bytes]]]:
    def ember_precompile(name: str) -> tuple[str, dict[str, bytes]]:
        from ember_inductor.compile_fx import generate_source

        src, _ = generate_source(gm, "precompiled")
        consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
        entries: dict[str, bytes] = {}
        if _LOAD_LINE in src:
            from ember_inductor.runtime.cache import compile_cpp

            # The C++ the regenerated wrapper loads (run its head with a recording load_cpp).
            seen: list[str] = []

            class _Stub:
                def __getattr__(self, _: str) -> Any:
                    return _Stub()

            def record(source: str, *_: Any) -> Any:
                seen.append(source)
                return _Stub()

            ns: dict[str, Any] = {"_record_load_cpp": record}
            head = src.split("\ndef call(", 1)[0]
            exec(compile(head.replace(_LOAD_LINE, "load_cpp = _record_load_cpp"), "<w>", "exec"),
                 ns)
            if len(seen) != 1:
                raise PrecompileError(f"ember-inductor wrapper loads {len(seen)} libraries; "
                                      "expected one")
            with open(compile_cpp(seen[0]), "rb") as f:
                entries["kernels.so"] = f.read()
        const_lines = "".join(
            f"    ns['const{i}'] = {tensor_literal(t, f'inductor {name} constant {i}')}\n"
            for i, t in enumerate(consts))
        literal = (f'r"""{src}"""' if '"""' not in src and not src.endswith("\\")
                   else repr(src))
        fragment = f'''
WRAPPER_{name} = {literal}


def make_{name}(cache):
    """ember-inductor's wrapper for the {name} graph (source above, C++ inside it). With the
    cache's kernels.so the kernels are loaded as built; without, load_cpp builds them."""
    so = (cache or {{}}).get("kernels.so")
    src = WRAPPER_{name}
    ns = {{"__name__": "ember_precompiled_{name}"}}
    if so is not None:
        lib = _rt.load_shared_library(so, {name!r})
        ns["_cached_lib"] = lib
        src = src.replace({_LOAD_LINE!r}, "load_cpp = lambda source: _cached_lib")
    exec(compile(src, "<ember-inductor wrapper: {name}>", "exec"), ns)
{const_lines}    return ns["call"]
'''
        return fragment, entries

    return ember_precompile


def adapter_for(gm: torch.fx.GraphModule, fn: Any, backend: str, options: dict[str, Any]
                ) -> Callable[[str], tuple[str, dict[str, bytes]]] | None:
    """An ``ember_precompile`` for ``fn`` (compiled from ``gm``), or None."""
    if _is_inductor_call(fn):
        return _inductor(gm, fn, options)
    return None
