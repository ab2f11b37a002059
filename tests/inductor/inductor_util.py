"""Helpers for inductor tests: compile through ``ember.compile(backend="inductor")`` with internal
errors raised (never a silent fallback to eager), and compare against eager."""

from __future__ import annotations

from typing import Any, Callable

import torch

import ember


_runs = {"n": 0}


def _counting_backend(gm: Any, example_inputs: Any, **options: Any) -> Any:
    """The inductor compiler, counting runs of what it compiled: a test can then tell that its
    program ran compiled (not eagerly after a recompile limit or a fallback)."""
    from ember_inductor import compile_inductor

    fn = compile_inductor(gm, example_inputs, **options)

    def run(*args: Any) -> Any:
        _runs["n"] += 1
        return fn(*args)
    return run


def _decompositions() -> Any:
    from ember_inductor.decompositions import decompositions

    return decompositions()


ember.register_backend("inductor_counted", _counting_backend, level="aten",
                       decompositions=_decompositions, override=True)


def compile_strict(fn: Callable[..., Any], options: dict[str, Any] | None = None
                   ) -> Callable[..., Any]:
    """``fn`` compiled by inductor (with ``options``: ``{"cpu_codegen": "triton"}`` for the
    Triton target under the interpreter); running it asserts that compiled code ran."""
    compiled = ember.compile(fn, backend="inductor_counted", options=options)

    def run(*args: Any) -> Any:
        before = _runs["n"]
        with ember.config.patch(suppress_errors=False, recompile_limit=10**6):
            out = compiled(*args)
        assert _runs["n"] > before, "the program did not run through inductor's compiled code"
        return out
    return run


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.bfloat16, torch.float16):
        return {"atol": 2e-2, "rtol": 2e-2}
    if dtype == torch.float64:
        return {"atol": 1e-10, "rtol": 1e-10}
    return {"atol": 1e-5, "rtol": 1e-5}


def assert_same(actual: Any, expected: Any, check_stride: bool = False, **tol: float) -> None:
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, check_stride, **tol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert isinstance(actual, torch.Tensor)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if check_stride and expected.numel() > 1:
        assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
    if expected.dtype.is_floating_point:
        t = tol or tolerances(expected.dtype)
        torch.testing.assert_close(actual, expected, equal_nan=True, **t)
    else:
        assert torch.equal(actual, expected), (actual, expected)


def check(fn: Callable[..., Any], *args: Any, check_stride: bool = False, **tol: float) -> Any:
    """Compile ``fn`` with inductor, run it under no_grad and compare with eager."""
    with torch.no_grad():
        expected = fn(*args)
        actual = compile_strict(fn)(*args)
    assert_same(actual, expected, check_stride, **tol)
    return actual
