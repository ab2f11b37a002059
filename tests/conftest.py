"""Shared test helpers: run Python in a fresh subprocess (for anything that touches import-time
state, environment variables or installed distributions)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterable

import pytest

# The Triton target's tests (tests/inductor_triton) run Triton's interpreter on CPU tensors, and
# TRITON_INTERPRET is read when triton is first imported (its own jit helpers, tl.rand among
# them, are decorated then): set it here, before anything in the suite can import triton, on a
# machine without CUDA (the GPU machine runs those tests with EMBER_TRITON_DEVICE=cuda).
if os.environ.get("EMBER_TRITON_DEVICE", "cpu") == "cpu":
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def run_python(code: str, *, pythonpath: Iterable[str | os.PathLike] = (),
               env: dict[str, str] | None = None, args: Iterable[str] = (),
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` with this interpreter in a new process; ``pythonpath`` entries go first."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    full_env.update(env or {})
    paths = [str(p) for p in pythonpath]
    if full_env.get("PYTHONPATH"):
        paths.append(full_env["PYTHONPATH"])
    if paths:
        full_env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [sys.executable, *args] if not code else [sys.executable, "-c",
                                                     textwrap.dedent(code), *args]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT))


@pytest.fixture
def fresh_aot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty on-disk cache directory for this test (``EMBER_CACHE_DIR``), the AOT cache on,
    and its counters at zero; returns the directory."""
    import ember
    from ember.aot import cache

    d = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(d))
    monkeypatch.setattr(ember.config, "aot_cache", True)
    for k in cache.counters:
        monkeypatch.setitem(cache.counters, k, 0)
    return d


@pytest.fixture
def py():
    """``py(code, pythonpath=..., env=...)`` runs code in a subprocess and returns the result;
    asserts nothing, so tests can check failures too."""
    return run_python


def pytest_report_header(config):  # noqa: ANN001, ANN201
    try:
        import ember

        return f"ember {ember.__version__}; backends: {ember.list_backends(exclude_tags=())}"
    except Exception as e:  # the header must never break collection
        return f"ember: import failed: {type(e).__name__}: {e}"
