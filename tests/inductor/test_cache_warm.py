"""Warm starts through the whole inductor backend: a second process with the same EMBER_CACHE_DIR
runs no compiler and no lowering (the wrapper comes from the text store, the kernels from the
library cache) and gets the same results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import json, sys
    import torch
    import ember
    from ember_inductor.runtime import cache

    if sys.argv[1] == "warm":  # a warm start must not lower or generate anything
        import ember_inductor.compile_fx as cfx

        def no_codegen(*a, **k):
            raise AssertionError("warm start generated source")
        cfx.generate_source = no_codegen

    def f(x, y):
        return torch.sigmoid(x * 2.0 + y).sum(dim=1) / 3.0

    x = torch.arange(12.0).reshape(3, 4) / 7.0
    y = torch.linspace(-1.0, 1.0, 4)
    with ember.config.patch(suppress_errors=False):
        out = ember.compile(f, backend="inductor")(x, y)
    ok = torch.equal(out, f(x, y)) or torch.allclose(out, f(x, y), rtol=1e-6, atol=1e-7)
    from ember_inductor import calibrate  # the OpenMP threshold: one more library, cold only
    print(json.dumps({"ok": bool(ok), "out": out.tolist(), **cache.counters,
                      "calibrations": calibrate.counters["measured"]}))
""")


def _run(kind: str, cache_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    env["EMBER_CACHE_DIR"] = str(cache_dir)
    p = subprocess.run([sys.executable, "-c", PROGRAM, kind], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_second_process_builds_nothing(tmp_path: Path) -> None:
    cold = _run("cold", tmp_path)
    assert cold["ok"] and cold["builds"] >= 1
    assert list((tmp_path / "text" / "wrapper").glob("*.json"))
    warm = _run("warm", tmp_path)
    assert warm["ok"] and warm["out"] == cold["out"]
    assert warm["calibrations"] == 0
    assert warm["builds"] == 0 and warm["disk_hits"] == cold["builds"] - cold["calibrations"]
