"""The cache container (format, refusal of anything corrupt) and the backend protocol through
which a backend puts its own code and binaries into an artifact."""

from __future__ import annotations

import struct

import pytest
import torch

import ember
from ember.precompile import CacheError, container
from ember.precompile.codegen import graph_source


def _compile_kernelbin(gm, example_inputs, **options):
    """A test backend (level "aten") whose "binary" per graph is its Python code: the artifact
    holds it in the cache and rebuilds it from the source when the cache is absent."""

    def run(*args):
        return gm(*args)

    def ember_precompile(name):
        code, self_expr = graph_source(gm, "kernel")
        assert self_expr == "None"
        fragment = f'''
KERNEL_SOURCE_{name} = {code!r}
BUILT = {{}}


def make_{name}(cache):
    data = (cache or {{}}).get("kernel.bin")
    BUILT[{name!r}] = "source" if data is None else "cache"
    if data is None:
        data = KERNEL_SOURCE_{name}.encode()
    ns = dict(globals())
    exec(data.decode(), ns)
    kernel = ns["kernel"]
    return lambda *args: kernel(None, *args)
'''
        return fragment, {"kernel.bin": code.encode()}

    run.ember_precompile = ember_precompile
    return run


KERNELBIN = ember.Backend(name="kernelbin", compile=_compile_kernelbin, level="aten")


@pytest.fixture(scope="module")
def art():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    x = torch.randn(4, 6)
    return ember.precompile(lambda model, x: model(x).mean(), model, x, backend=KERNELBIN), \
        model, x


def _check(fn, model, x):
    import copy
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    fn(a, x).backward()
    b(x).mean().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_backend_protocol_uses_cache_and_rebuilds_without(art, tmp_path):
    a, model, x = art
    entries, _ = container.unpack(a.cache, source_sha256=container.sha256(a.source))
    assert sorted(entries) == ["backward/kernel.bin", "forward/kernel.bin"]
    a.save(str(tmp_path / "a"))
    fn = ember.precompile.load(str(tmp_path / "a"))
    assert fn.used_cache and fn.module.BUILT == {"forward": "cache", "backward": "cache"}
    _check(fn, model, x)
    (tmp_path / "a" / "artifact.cache").unlink()  # missing cache: rebuilt from the source
    fn = ember.precompile.load(str(tmp_path / "a"))
    assert not fn.used_cache and fn.module.BUILT == {"forward": "source", "backward": "source"}
    _check(fn, model, x)


def test_cache_for_another_machine_is_not_used(art):
    a, model, x = art
    entries, plat = container.unpack(a.cache, source_sha256=container.sha256(a.source))
    other = container.pack(entries, source_sha256=container.sha256(a.source),
                           platform=dict(plat, torch="0.0.1"))
    fn = ember.precompile.load(source=a.source, cache=other)
    assert not fn.used_cache and fn.module.BUILT["forward"] == "source"
    _check(fn, model, x)


def _payload_start(data: bytes) -> int:
    return container.read_manifest(data)[1]


@pytest.mark.parametrize("damage, match", [
    ("flip", "does not match its sha256"),
    ("truncate", "runs past the end"),
    ("trailing", "unexpected bytes after the last entry"),
    ("magic", "not an Ember precompile cache"),
    ("version", "container version 99"),
    ("header", "shorter than the container header"),
    ("manifest", "manifest is not valid JSON"),
])
def test_damaged_cache_refused(art, tmp_path, damage, match):
    a, _, _ = art
    data = bytearray(a.cache)
    if damage == "flip":
        data[_payload_start(bytes(data)) + 3] ^= 0x01
    elif damage == "truncate":
        data = data[:-5]
    elif damage == "trailing":
        data += b"\x00"
    elif damage == "magic":
        data[0:8] = b"NOTEMBER"
    elif damage == "version":
        data[8:12] = struct.pack("<I", 99)
    elif damage == "header":
        data = data[:10]
    elif damage == "manifest":
        data[16] = ord("#")
    with pytest.raises(CacheError, match=match):
        ember.precompile.load(source=a.source, cache=bytes(data))
    a.save(str(tmp_path / "a"))
    (tmp_path / "a" / "artifact.cache").write_bytes(bytes(data))
    with pytest.raises(CacheError, match="cache refused"):
        ember.precompile.load(str(tmp_path / "a"))


def test_cache_of_another_source_refused(art):
    a, _, _ = art
    edited = a.source + "\n# edited\n"
    with pytest.raises(CacheError, match="belongs to the source with sha256"):
        ember.precompile.load(source=edited, cache=a.cache)


def test_container_manifest_is_json_with_names_sizes_hashes(art):
    a, _, _ = art
    manifest, start = container.read_manifest(a.cache)
    assert a.cache[:8] == container.MAGIC
    assert manifest["version"] == container.CONTAINER_VERSION
    assert manifest["source_sha256"] == container.sha256(a.source)
    sizes = {e["name"]: e["size"] for e in manifest["entries"]}
    assert sum(sizes.values()) == len(a.cache) - start
    assert all(len(e["sha256"]) == 64 for e in manifest["entries"])


class _OpaquePlugin:
    """A plugin that writes the graphs of the 'opaque' backend through the hookspec
    ``ember_precompile_graph`` (its compiled callables have no method of their own)."""

    @ember.hookimpl
    def ember_precompile_graph(self, backend, name, gm, compiled):
        if backend != "opaque":
            return None
        code, _ = graph_source(gm, f"opaque_{name}")
        return (code + f"\n\ndef make_{name}(cache):\n"
                f"    assert cache == {{'marker': b'opaque'}}, cache\n"
                f"    return lambda *a: opaque_{name}(None, *a)\n", {"marker": b"opaque"})


def test_hookspec_ember_precompile_graph():
    from ember.plugins import plugin_manager

    opaque = ember.Backend(name="opaque", compile=lambda gm, ex: (lambda *a: gm(*a)))
    with pytest.raises(ember.precompile.PrecompileError, match="does not support precompile"):
        ember.precompile(lambda x: x.cos() * 2, torch.randn(3), backend=opaque)
    plugin = _OpaquePlugin()
    plugin_manager().register(plugin, name="test-opaque-precompile")
    try:
        x = torch.randn(3)
        art = ember.precompile(lambda x: x.cos() * 2, x, backend=opaque)
        assert "def opaque_graph(" in art.source
        torch.testing.assert_close(art.load()(x), x.cos() * 2)
    finally:
        plugin_manager().unregister(plugin)


def test_inductor_implements_the_hook_itself():
    """ember-inductor answers ember_precompile_graph from its own plugin module; Ember's core
    holds no inductor-specific precompile code."""
    pytest.importorskip("ember_inductor")
    import pathlib

    from ember.plugins import ensure_loaded, plugin_manager

    ensure_loaded()
    impls = plugin_manager().hook.ember_precompile_graph.get_hookimpls()
    assert any(getattr(i.function, "__module__", "") == "ember_inductor.precompile"
               for i in impls), [i.function for i in impls]
    core = pathlib.Path(ember.__file__).parent / "precompile"
    for p in core.glob("*.py"):
        code = [ln for ln in p.read_text().splitlines() if not ln.lstrip().startswith(("#", '"'))]
        assert not any("import ember_inductor" in ln or "from ember_inductor" in ln
                       for ln in code), p
    # the hook answers only for inductor's compiled graphs
    from ember_inductor.precompile import ember_precompile_graph

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    assert ember_precompile_graph("inductor", "forward", gm, gm.forward, {}) is None


def test_patch_imports_binds_aliases() -> None:
    """A wrapper's ``from <runtime> import a, b as c`` reads both names from the artifact's
    provider (the CUDA wrapper imports ``capturing as _capturing``: the probe once failed on it)."""
    from ember.precompile.runtime import patch_imports

    src = ("from pkg.rt import load, capturing as _capturing,  on_device  as  _on_device\n"
           "x = 1\n")
    out = patch_imports(src, "pkg.rt", "P")
    assert out.splitlines()[0] == ("load = P.load; _capturing = P.capturing; "
                                   "_on_device = P.on_device")
    ns = {"P": type("P", (), {"load": 1, "capturing": 2, "on_device": 3})}
    exec(compile(out, "<t>", "exec"), ns)
    assert (ns["load"], ns["_capturing"], ns["_on_device"], ns["x"]) == (1, 2, 3, 1)
