"""A warm start of a static graph never imports sympy (0.5-0.7 s of a sub-second warm start):
neither capture nor AOT nor inductor may reach torch.fx.experimental.symbolic_shapes, or sympy
itself, unless the graph has symbolic sizes. Two fresh processes over one empty cache folder: the
first fills it, the second must compile from it without importing sympy, in inference and in
training."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import sys, torch, ember
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    f = ember.compile(m)  # inductor, the default
    x = torch.randn(4, 8)
    if sys.argv[1] == "infer":
        with torch.no_grad():
            assert torch.allclose(f(x), m(x), atol=1e-5)
    else:
        f(x).sum().backward()
    print("sympy" in sys.modules)
""")


def _run(cache: str, mode: str) -> str:
    env = {**os.environ, "EMBER_CACHE_DIR": cache}
    r = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_warm_start_of_static_graph_imports_no_sympy(tmp_path, mode: str) -> None:
    # (one compile per process: a recompile in a process captures as usual, persist.py)
    _run(str(tmp_path), mode)  # cold: fills the cache (may import sympy)
    assert _run(str(tmp_path), mode) == "False"
