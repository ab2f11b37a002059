"""docs/precompile.md's complete example runs as written: precompile in one process, serve from
the artifact in another."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _block_after(text: str, marker: str) -> str:
    i = text.index(marker)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, i)
    assert m is not None, marker
    return m.group(1)


def test_docs_example_runs(tmp_path):
    text = (ROOT / "docs" / "precompile.md").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    for name in ("`precompile_mlp.py`", "`serve_mlp.py`"):
        p = subprocess.run([sys.executable, "-c", _block_after(text, name)], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, (name, p.stderr[-2000:])
    assert (tmp_path / "artifacts" / "mlp" / "artifact.py").exists()
    assert "(32, 10)" in p.stdout


def test_docs_training_step_example_runs(tmp_path):
    """The training-step example (backward() inside the precompiled step) runs as written."""
    text = (ROOT / "docs" / "precompile.md").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    code = _block_after(text, "### Training") + (
        "\nassert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())"
        "\nprint('loss', float(loss))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "loss" in p.stdout and (tmp_path / "artifacts" / "mlp_step" / "artifact.py").exists()
