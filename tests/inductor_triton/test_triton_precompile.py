"""ember.precompile through the Triton target: the artifact embeds the wrapper and its kernel
module; on a GPU it also carries the binaries and tuning choices (runtime/triton.py
``artifact_entries``/``install_artifact``; without a GPU those are checked with sm_90 binaries
in test_triton_gpu_build.py). Here: the hook reads a Triton wrapper without loading its kernels,
and the loaded artifact computes what eager does."""

from __future__ import annotations

import torch

import ember

from triton_util import DEVICE, assert_same


def test_precompiled_triton_graph_runs():
    def f(x, w):
        return torch.softmax(torch.relu(x @ w) * 2, -1).sum(0) + torch.var_mean(x, 0)[0].sum()

    x = torch.randn(8, 16, device=DEVICE)
    w = torch.randn(16, 12, device=DEVICE)
    opts = {"cpu_codegen": "triton"} if DEVICE == "cpu" else {}
    art = ember.precompile(f, x, w, backend="inductor", options=opts)
    assert "TRITON_SOURCE" in art.source and "tl.reduce" in art.source
    with ember.config.patch(suppress_errors=False):
        got = art.load()(x, w)
    assert_same(got, f(x, w))
