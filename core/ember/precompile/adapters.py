"""The ``ember_precompile`` protocol for compiled callables of known backends that do not
implement it themselves yet (see docs/precompile.md, 'Backends').

Today: ember-inductor's CPU wrapper. Its compiled graph is the ``call`` function of a wrapper
module: readable Python importing torch, ctypes and ``ember_inductor.runtime.cache``, with the
C++ sources embedded and built/loaded through that module's ``compile_cpp``/``load_cpp``
functions. The fragment embeds the wrapper; the cache holds every shared library the wrapper
loads, keyed by the sha256 of its C++ source. At load, the wrapper's import of the build module
is redirected to :class:`~ember.precompile.runtime.CachedLibraries`: cached libraries are loaded
from the artifact, anything missing (no cache, or a cache for another machine) is built by
ember-inductor from the embedded source. When ember-inductor gives its callables an
``ember_precompile`` method, that method wins and this adapter is not used.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import torch

from .codegen import tensor_literal
from .errors import PrecompileError
from .runtime import patch_imports

__all__ = ["adapter_for"]

_BUILD_MODULE = "ember_inductor.runtime.cache"


def _is_inductor_call(fn: Any) -> bool:
    g = getattr(fn, "__globals__", None)
    return (isinstance(g, dict) and str(g.get("__name__", "")).startswith("ember_inductor_graph_")
            and getattr(fn, "__name__", "") == "call")


class _Recorder:
    """Stands for the build module while the wrapper's module level runs at precompile time:
    records every C++ source it would build or load, builds nothing."""

    def __init__(self) -> None:
        self.sources: list[str] = []

    def _stub(self) -> Any:
        class Stub:
            def __getattr__(self, _: str) -> Any:
                return Stub()

            def __getitem__(self, _: Any) -> Any:
                return Stub()
        return Stub()

    def load_cpp(self, source: str, *_: Any, **__: Any) -> Any:
        self.sources.append(source)
        return self._stub()

    def compile_cpp(self, source: str, *_: Any, **__: Any) -> Any:
        self.sources.append(source)
        return "/nonexistent.so"

    def compile_cpp_many(self, sources: Any, *_: Any, **__: Any) -> Any:
        self.sources.extend(sources)
        return ["/nonexistent.so"] * len(sources)

    def __getattr__(self, name: str) -> Any:
        raise PrecompileError(f"the ember-inductor wrapper uses {_BUILD_MODULE}.{name}, which "
                              "the precompile adapter does not know")


def _inductor(gm: torch.fx.GraphModule, fn: Any, options: dict[str, Any]
              ) -> Callable[[str], tuple[str, dict[str, bytes]]]:
    def ember_precompile(name: str) -> tuple[str, dict[str, bytes]]:
        from ember_inductor.compile_fx import generate_source
        from ember_inductor.runtime.cache import compile_cpp

        src, _ = generate_source(gm, "precompiled")
        consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
        # The C++ the wrapper builds: run its module level with a recording build module.
        rec = _Recorder()
        head = src.split("\ndef call(", 1)[0]
        ns: dict[str, Any] = {"_ember_build": rec, "__name__": "ember_precompile_probe"}
        exec(compile(patch_imports(head, _BUILD_MODULE, "_ember_build"), "<wrapper>", "exec"), ns)
        entries: dict[str, bytes] = {}
        for cpp in dict.fromkeys(rec.sources):
            key = hashlib.sha256(cpp.encode("utf-8")).hexdigest()
            with open(compile_cpp(cpp), "rb") as f:
                entries[f"kernels/{key}.so"] = f.read()
        const_lines = "".join(
            f"    ns['const{i}'] = {tensor_literal(t, f'inductor {name} constant {i}')}\n"
            for i, t in enumerate(consts))
        literal = (f'r"""{src}"""' if '"""' not in src and not src.endswith("\\")
                   else repr(src))
        fragment = f'''
WRAPPER_{name} = {literal}


def make_{name}(cache):
    """ember-inductor's wrapper for the {name} graph (above, its C++ inside). Libraries in the
    cache are loaded as built; without them ember-inductor builds them from that C++."""
    libs = {{k[len("kernels/"):-len(".so")]: v for k, v in (cache or {{}}).items()
            if k.startswith("kernels/")}}
    ns = {{"__name__": "ember_precompiled_{name}",
          "_ember_build": _rt.CachedLibraries(libs, {_BUILD_MODULE!r})}}
    src = _rt.patch_imports(WRAPPER_{name}, {_BUILD_MODULE!r}, "_ember_build")
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
