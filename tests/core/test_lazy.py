"""Discover eagerly, import lazily: listing backends imports no heavy module (no triton, none of
torch's own compiler), and entry-point discovery alone imports no plugin at all."""

from __future__ import annotations

import json

HEAVY = ["triton", "torch._inductor", "torch._dynamo", "torch._functorch.aot_autograd",
         "torch._functorch.partitioners"]


def _fake_triton(tmp_path):
    """A stand-in 'triton' package that any import would load into sys.modules (the real one
    need not be installed for the test to catch an import of it)."""
    pkg = tmp_path / "fake_triton" / "triton"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("IMPORTED = True\n")
    return tmp_path / "fake_triton"


def test_listing_backends_imports_no_heavy_module(py, tmp_path):
    res = py(f"""
        import json, sys
        import ember
        from ember.plugins import backend_table
        names = ember.list_backends(exclude_tags=())
        table = backend_table()
        heavy = [m for m in {HEAVY!r} if m in sys.modules]
        import triton  # the fake is importable: an import by a plugin would have shown above
        print(json.dumps(dict(names=names, heavy=heavy,
                              inductor_loaded="ember_inductor" in sys.modules)))
    """, pythonpath=[_fake_triton(tmp_path)])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert "inductor" in out["names"] and out["inductor_loaded"]
    assert out["heavy"] == []


def test_listing_from_the_command_line_imports_no_triton(py, tmp_path):
    res = py("""
        import runpy, sys
        sys.argv = ["ember", "backends"]
        try:
            runpy.run_module("ember", run_name="__main__")
        except SystemExit as e:
            assert not e.code, e.code
        print("TRITON", "triton" in sys.modules, "INDUCTOR", "torch._inductor" in sys.modules)
    """, pythonpath=[_fake_triton(tmp_path)])
    assert res.returncode == 0, res.stderr
    assert "inductor " in res.stdout
    assert "TRITON False INDUCTOR False" in res.stdout


def test_discovery_reads_metadata_without_importing_plugins(py):
    res = py("""
        import sys
        import ember
        from ember import plugins
        recs = plugins._registry.discover()
        print("FOUND", sorted(r.name for r in recs))
        print("IMPORTED", sorted(m for m in sys.modules if m.startswith("ember_")))
    """)
    assert res.returncode == 0, res.stderr
    assert "FOUND ['aot_eager', 'cudagraphs', 'eager', 'inductor', 'onnxrt']" in res.stdout
    assert "IMPORTED []" in res.stdout


def test_importing_ember_imports_no_plugin_and_no_heavy_module(py):
    res = py(f"""
        import sys
        import ember
        print("PLUGINS", sorted(m for m in sys.modules if m.startswith("ember_")))
        print("HEAVY", [m for m in {HEAVY!r} if m in sys.modules])
    """)
    assert res.returncode == 0, res.stderr
    assert "PLUGINS []" in res.stdout and "HEAVY []" in res.stdout


def test_inductor_plugin_module_stays_light(py):
    """Importing the plugin module (what listing does) loads nothing beyond ember itself."""
    res = py("""
        import sys
        import ember
        before = set(sys.modules)
        import ember_inductor, ember_cudagraphs, ember_onnxrt
        print("NEW", sorted(m for m in set(sys.modules) - before
                            if not m.startswith(("ember_inductor", "ember_cudagraphs",
                                                 "ember_onnxrt"))))
    """)
    assert res.returncode == 0, res.stderr
    assert "NEW []" in res.stdout
