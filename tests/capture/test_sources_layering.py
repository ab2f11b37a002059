"""Layering (issue 9 §4): capture modules do not import the runtime or the API layer above
them, nor the stages after capture (AOT autograd, precompile). What they need from there is
passed in (``compile_graph`` from the runtime, ``compile_fn``/``reset_fn`` for explain,
``DynamicPolicy.allowed`` for whether a backend takes symbolic graphs).

``capture/frame.py`` is the runtime (``CompiledFunction``: guard check, cached entry, capture
on a miss, then compile through ``ember.backends``) and ``capture/persist.py`` its warm start
(entries rebuilt from the on-disk store of ``ember.aot.cache``, called only from frame.py); they
live in the capture folder for now and are the modules allowed to reach the layers above."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import ember.capture

CAPTURE = pathlib.Path(ember.capture.__file__).parent
RUNTIME_MODULES = {"frame.py", "persist.py"}
FORBIDDEN = ("ember.api", "ember.backends", "ember.aot", "ember.precompile")


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """Absolute names of the ember modules ``path`` imports, at any depth (lazy imports in
    functions count), with their line numbers."""
    pkg = "ember.capture"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # ``from .. import aot`` imports the module ember.aot
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names] + [(node.lineno, mod)]
    return out


def _violations(path: pathlib.Path) -> list[str]:
    return [f"{path.name}:{line}: imports {name}" for line, name in _imports(path)
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]


def test_capture_modules_do_not_import_runtime_api_or_later_stages():
    files = sorted(p for p in CAPTURE.glob("*.py") if p.name not in RUNTIME_MODULES)
    assert len(files) >= 10
    bad = [v for p in files for v in _violations(p)]
    assert not bad, "capture modules import layers above them:\n" + "\n".join(bad)


def test_scanner_sees_relative_and_lazy_imports(tmp_path):
    p = tmp_path / "mod.py"
    p.write_text("def f():\n    from ..backends import compile_graph\n"
                 "from .. import aot\nimport ember.api\nfrom .sources import Local\n")
    assert sorted(_violations(p)) == ["mod.py:2: imports ember.backends",
                                      "mod.py:2: imports ember.backends.compile_graph",
                                      "mod.py:3: imports ember.aot",
                                      "mod.py:4: imports ember.api"]


def test_tracing_a_function_loads_no_backend_or_aot_module():
    """Capturing alone (the artifact, no backend) runs without the runtime's modules: checked
    in a fresh interpreter where importing them fails."""
    code = r"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("ember.backends", "ember.aot") or name.startswith(("ember.aot.", "ember.precompile")):
            raise ImportError(f"capture imported {name}")
        return None
import torch
import ember  # the package itself imports its API (not under test)
for m in [m for m in list(sys.modules) if m.startswith(("ember.backends", "ember.aot", "ember.precompile"))]:
    del sys.modules[m]
sys.meta_path.insert(0, Block())
from ember.capture import convert
from ember.capture.interpreter import Tracer
from ember.capture.output import OutputGraph
def f(x, y):
    return (x + y).relu() * 2
tracer = Tracer(OutputGraph(f.__globals__), f)
tracer.out.tracer = tracer
frame = convert._root_frame(f, (torch.randn(3), torch.randn(3)), {}, tracer)
result = frame.run()
ops = [n for n in tracer.out.graph.nodes if n.op in ("call_function", "call_method")]
print("OPS", len(ops))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OPS 3" in r.stdout, r.stdout
