"""Compile through the inductor backend's Triton target (interpreter on the CPU, kernels on a
GPU with EMBER_TRITON_DEVICE=cuda), with internal errors raised, and compare with eager."""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

import ember

DEVICE = os.environ.get("EMBER_TRITON_DEVICE", "cpu")
_runs = {"n": 0, "triton": 0}


def _backend(gm: Any, example_inputs: Any, **options: Any) -> Any:
    from ember_inductor import compile_inductor

    fn = compile_inductor(gm, example_inputs, **options)
    src = getattr(fn, "__globals__", {}).get("TRITON_SOURCE")

    def run(*args: Any) -> Any:
        _runs["n"] += 1
        if src is not None:
            _runs["triton"] += 1
        return fn(*args)
    return run


def _decompositions() -> Any:
    from ember_inductor.decompositions import decompositions

    return decompositions()


ember.register_backend("inductor_triton_counted", _backend, level="aten",
                       decompositions=_decompositions, override=True)


def compile_triton(fn: Callable[..., Any], dynamic: bool | None = None,
                   kernels: bool = True) -> Callable[..., Any]:
    """``fn`` compiled through the Triton target; running it asserts compiled code ran (and,
    with ``kernels``, that it ran Triton kernels)."""
    opts = {"cpu_codegen": "triton"} if DEVICE == "cpu" else {}
    compiled = ember.compile(fn, backend="inductor_triton_counted", options=opts,
                             dynamic=dynamic)

    def run(*args: Any) -> Any:
        before, tb = _runs["n"], _runs["triton"]
        with ember.config.patch(suppress_errors=False, recompile_limit=10**6):
            out = compiled(*args)
        assert _runs["n"] > before, "the program did not run through inductor's compiled code"
        if kernels:
            assert _runs["triton"] > tb, "no graph of the program ran Triton kernels"
        return out
    return run


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.bfloat16, torch.float16):
        return {"atol": 2e-2, "rtol": 2e-2}
    if dtype == torch.float64:
        return {"atol": 1e-10, "rtol": 1e-10}
    return {"atol": 1e-5, "rtol": 1e-5}


def assert_same(actual: Any, expected: Any, **tol: float) -> None:
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, **tol)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), type(actual)
        assert actual.shape == expected.shape, (actual.shape, expected.shape)
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        t = tol or tolerances(expected.dtype)
        torch.testing.assert_close(actual, expected, equal_nan=True, **t)
        return
    assert actual == expected
