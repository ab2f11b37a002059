"""Triton target tests. On a CPU-only machine they run Triton's interpreter on CPU tensors
(``options={"cpu_codegen": "triton"}``); with ``EMBER_TRITON_DEVICE=cuda`` (scripts/
gpu_triton.sh) the same tests compile real kernels for the GPU. ``TRITON_INTERPRET`` must be set
before triton is first imported, so it is set here, at collection."""

from __future__ import annotations

import os

DEVICE = os.environ.get("EMBER_TRITON_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):  # noqa: ANN001
    try:
        import triton  # noqa: F401
    except ImportError as e:
        skip = pytest.mark.skip(reason=f"triton is not installed ({e}): the Triton target "
                                       "cannot be tested")
        for item in items:
            if "inductor_triton" in str(item.fspath):
                item.add_marker(skip)
        return
    if DEVICE == "cuda":
        import torch
        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="EMBER_TRITON_DEVICE=cuda but no CUDA device")
            for item in items:
                if "inductor_triton" in str(item.fspath):
                    item.add_marker(skip)
