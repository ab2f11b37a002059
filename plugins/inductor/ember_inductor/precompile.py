"""ember-inductor in an ``ember.precompile`` artifact: the ``ember_precompile_graph`` hook.

A graph compiled by inductor is the ``call`` function of a wrapper module: readable Python that
imports torch, ctypes and :mod:`ember_inductor.runtime.cache`, holds its C++ as strings
(``CPP_SOURCES``) and builds/loads them with that module's ``compile_cpp_many``/``load_cpp``.
For an artifact, this hook returns

* a fragment embedding that wrapper, whose ``make_<name>(cache)`` runs it with the build module
  replaced by :class:`ember.precompile.runtime.CachedLibraries` (libraries in the cache are
  loaded as built; anything missing is built by this plugin from the embedded C++);
* the cache entries: every shared library the wrapper loads, ``kernels/<sha256 of its C++>.so``.

Loading an artifact with a fitting cache therefore imports nothing of ember-inductor (not even
its runtime). Weights are never baked in: precompile tells the compiler that parameters and
buffers have no stable address, and constants of the graph are written as literals.
"""

from __future__ import annotations

import hashlib
from typing import Any

import ember

__all__ = ["ember_precompile_graph"]

_BUILD_MODULE = "ember_inductor.runtime.cache"
_TRITON_MODULE = "ember_inductor.runtime.triton"


def _is_wrapper_call(fn: Any) -> bool:
    g = getattr(fn, "__globals__", None)
    return (isinstance(g, dict) and str(g.get("__name__", "")).startswith("ember_inductor_graph_")
            and getattr(fn, "__name__", "") == "call")


def _wrapper_source(gm: Any, options: dict[str, Any]) -> str:
    """The wrapper compile_inductor loaded for ``gm``: from the text cache when it is there
    (same key as compile_inductor), else generated again (same input, same output)."""
    from .compile_fx import _graph_key, generate_source
    from .runtime.cache import get_text

    key = _graph_key(gm, dict(options))
    src = get_text("wrapper", key)
    if src is None:
        src, _ = generate_source(gm, key, dict(options))
    return src


def _cpp_sources(src: str, triton: list[Any] | None = None) -> list[str]:
    """The C++ sources the wrapper builds, read by running its module level with a build
    module that records instead of building; a Triton wrapper's (kernel module, specs) are
    appended to ``triton``."""
    triton = [] if triton is None else triton
    from ember.precompile.runtime import patch_imports

    sources: list[str] = []

    class _Stub:
        def __getattr__(self, _: str) -> Any:
            return _Stub()

        def __getitem__(self, _: Any) -> Any:
            return _Stub()

    class _Recorder:
        def load_cpp(self, source: str, *_: Any, **__: Any) -> Any:
            sources.append(source)
            return _Stub()

        def compile_cpp(self, source: str, *_: Any, **__: Any) -> Any:
            sources.append(source)
            return "/nonexistent.so"

        def compile_cpp_many(self, many: Any, *_: Any, **__: Any) -> Any:
            sources.extend(many)
            return ["/nonexistent.so"] * len(many)

        def __getattr__(self, name: str) -> Any:
            raise ember.EmberError(f"ember-inductor precompile: the wrapper uses "
                                   f"{_BUILD_MODULE}.{name}, which the precompile hook does "
                                   "not know (update ember_inductor/precompile.py)")

    head = src.split("\ndef call(", 1)[0]
    ns: dict[str, Any] = {"_ember_build": _Recorder(), "__name__": "ember_precompile_probe",
                          "_ember_triton": _TritonRecorder(triton)}
    head = patch_imports(head, _TRITON_MODULE, "_ember_triton")
    exec(compile(patch_imports(head, _BUILD_MODULE, "_ember_build"), "<wrapper>", "exec"), ns)
    return list(dict.fromkeys(sources))


class _TritonRecorder:
    """Stands for runtime/triton.py while a wrapper's module level runs in the probe: records
    the kernels' module and specs instead of loading them."""

    def __init__(self, out: list[Any]):
        self.out = out

    def load_kernels(self, source: str, specs: dict[str, Any]) -> Any:
        self.out.append((source, specs))
        return {name: None for name in specs}

    # the CUDA wrapper's module level binds these too (codegen/target.py TritonTarget.imports);
    # only ``call`` uses them, and the probe never runs it
    @staticmethod
    def capturing() -> bool:
        return False

    @staticmethod
    def on_device(t: Any, device: str) -> Any:
        return t

    def __getattr__(self, name: str) -> Any:
        raise ember.EmberError(f"ember-inductor precompile: the wrapper uses {_TRITON_MODULE}."
                               f"{name}, which the precompile hook does not know (update "
                               "ember_inductor/precompile.py)")


@ember.hookimpl
def ember_precompile_graph(backend: str, name: str, gm: Any, compiled: Any,
                           options: dict) -> "tuple[str, dict[str, bytes]] | None":
    """Write one graph compiled by inductor into a precompiled artifact (see the module doc)."""
    # a training forward of a graph with convolutions generates late (layout.DeferredForward);
    # the source below is regenerated from ``options`` as given, with eager's strides on the
    # saved activations, and its backward's likewise: the pair stays consistent
    from .layout import DeferredForward

    if isinstance(compiled, DeferredForward) and compiled.fn is not None:
        compiled = compiled.fn
    if not _is_wrapper_call(compiled):
        return None
    from ember.precompile.codegen import tensor_literal

    from .runtime.cache import compile_cpp

    src = _wrapper_source(gm, options or {})
    entries: dict[str, bytes] = {}
    triton: list[Any] = []
    for cpp in _cpp_sources(src, triton):
        key = hashlib.sha256(cpp.encode("utf-8")).hexdigest()
        with open(compile_cpp(cpp), "rb") as f:  # built already: a cache lookup
            entries[f"kernels/{key}.so"] = f.read()
    if triton:  # the Triton target: its binaries and tuning choices (runtime/triton.py)
        from .runtime.triton import artifact_entries

        for source, specs in triton:
            entries.update(artifact_entries(source, specs))
    install = ("    from ember_inductor.runtime.triton import install_artifact\n"
               "    install_artifact({k: v for k, v in (cache or {}).items() "
               "if k.startswith('triton')})\n") if any(k.startswith("triton") for k in entries) \
        else ""
    consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    const_lines = "".join(
        f"    ns['const{i}'] = {tensor_literal(t, f'inductor {name} constant {i}')}\n"
        for i, t in enumerate(consts))
    literal = f'r"""{src}"""' if '"""' not in src and not src.endswith("\\") else repr(src)
    fragment = f'''
WRAPPER_{name} = {literal}


def make_{name}(cache):
    """ember-inductor's wrapper for the {name} graph (above, its C++ inside). Libraries in the
    cache are loaded as built; without them ember-inductor builds them from that C++."""
    libs = {{k[len("kernels/"):-len(".so")]: v for k, v in (cache or {{}}).items()
            if k.startswith("kernels/")}}
{install}    ns = {{"__name__": "ember_precompiled_{name}",
          "_ember_build": _rt.CachedLibraries(libs, {_BUILD_MODULE!r})}}
    src = _rt.patch_imports(WRAPPER_{name}, {_BUILD_MODULE!r}, "_ember_build")
    exec(compile(src, "<ember-inductor wrapper: {name}>", "exec"), ns)
{const_lines}    return ns["call"]
'''
    return fragment, entries
