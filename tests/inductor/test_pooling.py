"""Pooling lowered to generated code (lowering/pooling.py): max_pool2d_with_indices,
avg_pool2d, _adaptive_avg_pool2d and their backward ops against eager, forward and gradient,
across padding, stride, dilation, ceil_mode, count_include_pad, divisor_override, contiguous and
channels-last inputs, unbatched inputs, NaN, -inf and ties (max pooling's index is eager's:
the first maximum, the last NaN, the first element inside the input of an all -inf window).
Each family is one compiled graph of several configurations (each on its own input, so a wrong
gradient names its configuration). Also: no pooling op is left to ATen, what the lowering does
not handle falls back to ATen (right results), the kernels' inner loops are vector code, one
kernel's generated code is pinned by a snapshot, and a few cases run through the Triton target
under Triton's interpreter."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source, load_wrapper
from ember_inductor.decompositions import decompositions
from inductor_util import assert_same, compile_strict

aten = torch.ops.aten

# (kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    (2, None, 0, 1, False),
    (3, 2, 1, 1, False),
    ((3, 2), (2, 1), (1, 0), (2, 1), True),
    (3, 2, 1, 1, True),
    (1, 2, 0, 1, False),
]
# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CASES = [
    (2, None, 0, False, True, None),
    (3, 2, 1, False, True, None),
    (3, 2, 1, True, False, None),
    ((2, 3), (1, 2), (1, 0), False, True, 5),
    (3, 1, 1, True, False, None),
    (1, 2, 0, False, True, None),
]
# adaptive output sizes on a 9x10 map: divisible, ragged, larger than the input, global
ADAPTIVE_CASES = [(3, 5), (4, 3), (13, 11), 1]


def _special(shape: Sequence[int], seed: int) -> torch.Tensor:
    """Small integers (many ties), NaNs (two in one window), an all -inf corner."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, tuple(shape), generator=g).float()
    x[..., :3, :3] = float("-inf")
    x[..., 4, 5] = float("nan")
    x[..., 5, 5] = float("nan")
    x[..., 6, 1] = float("inf")
    return x


def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _check_family(fn: Callable[..., Any], inputs: list[torch.Tensor], names: list[str]) -> None:
    """Forward outputs and every input's gradient, compiled against eager."""
    xe = [x.clone().requires_grad_() for x in inputs]
    xc = [x.clone().requires_grad_() for x in inputs]
    out_e = fn(*xe)
    out_c = compile_strict(fn)(*xc)
    assert_same(out_c, out_e)
    grads = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i))
             for i, o in enumerate(out_e) if o.dtype.is_floating_point]
    floats_e = [o for o in out_e if o.dtype.is_floating_point]
    floats_c = [o for o in out_c if o.dtype.is_floating_point]
    torch.autograd.backward(floats_e, grads)
    torch.autograd.backward(floats_c, grads)
    for name, a, b in zip(names, xc, xe):
        assert a.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool(channels_last: bool) -> None:
    def fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs: list[torch.Tensor] = []
        for x, (k, s, p, d, c) in zip(xs, MAX_CASES + [(3, 2, 1, 1, False)]):
            v, i = F.max_pool2d(x, k, s, p, d, c, return_indices=True)
            outs += [v, i]
        return tuple(outs)

    inputs = [_layout(_special((2, 3, 9, 10), n), channels_last) for n in range(len(MAX_CASES))]
    inputs.append(_special((3, 9, 10), 99))  # unbatched
    _check_family(fn, inputs, [str(c) for c in MAX_CASES] + ["unbatched"])


@pytest.mark.parametrize("channels_last", [False, True])
def test_avg_pool(channels_last: bool) -> None:
    def fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(F.avg_pool2d(x, k, s, p, c, cip, div) for x, (k, s, p, c, cip, div)
                     in zip(xs, AVG_CASES + [(3, 2, 1, False, False, None)]))

    g = torch.Generator().manual_seed(0)
    inputs = [_layout(torch.randn(2, 3, 9, 10, generator=g), channels_last) for _ in AVG_CASES]
    inputs.append(torch.randn(3, 9, 10, generator=g))  # unbatched
    _check_family(fn, inputs, [str(c) for c in AVG_CASES] + ["unbatched"])


@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_avg_pool(channels_last: bool) -> None:
    def fn(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = [F.adaptive_avg_pool2d(x, o) for x, o in zip(xs, ADAPTIVE_CASES)]
        # a window past the unroll limit (24x20 to 1x2): a reduction; and an unbatched input
        outs.append(F.adaptive_avg_pool2d(xs[-2], (1, 2)))
        outs.append(F.adaptive_avg_pool2d(xs[-1], (4, 3)))
        return tuple(outs)

    g = torch.Generator().manual_seed(1)
    inputs = [_layout(torch.randn(2, 3, 9, 10, generator=g), channels_last)
              for _ in ADAPTIVE_CASES]
    inputs.append(_layout(torch.randn(2, 3, 24, 40, generator=g), channels_last))
    inputs.append(torch.randn(3, 9, 10, generator=g))
    _check_family(fn, inputs, [str(c) for c in ADAPTIVE_CASES] + ["reduction", "unbatched"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_pooling_dtypes(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (F.max_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
                + F.adaptive_avg_pool2d(x, 5)) * 2

    x = torch.randn(2, 3, 10, 10, generator=torch.Generator().manual_seed(2)).to(dtype)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yc = fn(xe), compile_strict(fn)(xc)
    assert_same(yc, ye)
    gr = torch.randn(ye.shape).to(dtype)
    ye.backward(gr)
    yc.backward(gr)
    assert_same(xc.grad, xe.grad)


def _source(fn: Callable[..., Any], *args: torch.Tensor, options: Any = None) -> str:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    src, _ = generate_source(gm, key="test_pooling", options=options or {})
    return src


def test_no_pooling_op_left_to_aten() -> None:
    x = torch.randn(2, 3, 9, 10)

    def fwd(x: torch.Tensor) -> Any:
        v, i = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
        return (v, i, aten.avg_pool2d(x, [3, 3], [2, 2], [1, 1]),
                aten._adaptive_avg_pool2d(x, [4, 3]))

    v, i, a, ad = fwd(x)

    def bwd(x: torch.Tensor, v: torch.Tensor, i: torch.Tensor, a: torch.Tensor,
            ad: torch.Tensor) -> Any:
        return (aten.max_pool2d_with_indices_backward(v, x, [3, 3], [2, 2], [1, 1], [1, 1],
                                                      False, i),
                aten.avg_pool2d_backward(a, x, [3, 3], [2, 2], [1, 1], False, True, None),
                aten._adaptive_avg_pool2d_backward(ad, x))

    for src in (_source(fwd, x), _source(bwd, x, v, i, a, ad)):
        assert "pool" not in "".join(re.findall(r"torch\.ops\.aten\.\w+", src)), src[-2000:]


def test_unhandled_cases_fall_back_to_aten() -> None:
    # a 9x9 window (past the unroll limit) and an integer input: ATen's kernels, right results
    def fn(x: torch.Tensor, n: torch.Tensor) -> Any:
        return F.max_pool2d(x, 9, 1, 4), F.avg_pool2d(x, 9, 1, 4), F.max_pool2d(n, 2)

    x = torch.randn(1, 2, 12, 12)
    n = torch.randint(-5, 5, (1, 2, 6, 6))
    src = _source(fn, x, n)
    assert "max_pool2d_with_indices" in src and "avg_pool2d" in src
    assert_same(compile_strict(fn)(x, n), fn(x, n))


def _vector_check(cases: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]],
                  isa: str, tmp_path: Path) -> dict[str, list[str]]:
    from test_vec_ops import _functions, _innermost_loops
    from ember_inductor.runtime import cache

    prelude, parts, owner = "", [], []
    for name, (fn, args) in cases.items():
        prelude, funcs = _functions(_source(fn, *args, options={"cpu_isa": isa}))
        for f in funcs:
            parts.append(re.sub(r"\bkernel(\d+)\(", rf"k_{name}_\1(", f))
            owner.append(name)
    text, spans = prelude, []
    for f in parts:
        start = text.count("\n")
        text += f
        spans.append((start, text.count("\n")))
    path = tmp_path / "pool.cpp"
    path.write_text(text)
    flags = [f for f in cache._flags((), "native" if isa == "native" else isa)
             if f not in ("-shared", "-fPIC")]
    r = subprocess.run([cache._compiler(), *flags, "-c", "-fopt-info-vec-optimized", str(path),
                        "-o", str(tmp_path / "pool.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    done = {int(m.group(1)) for m in re.finditer(
        rf"{re.escape(path.name)}:(\d+):\d+: optimized: loop vectorized", r.stderr)}
    lines = text.splitlines()
    scalar: dict[str, list[str]] = {}
    for name, (start, end) in zip(owner, spans):
        for i in _innermost_loops(lines, start, end):
            at = {i + 1, i + 2}
            if lines[i - 1].strip().startswith("#pragma omp simd"):
                at.add(i)
            if not at & done:
                scalar.setdefault(name, []).append(lines[i].strip())
    return scalar


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("isa", ["native", "x86-64-v3"])
def test_pooling_kernels_are_vector_code(isa: str, tmp_path: Path) -> None:
    from ember.precompile.runtime import cpu_flags
    from ember_inductor.codegen.cpp import CPU_ISAS

    if isa != "native" and not set(CPU_ISAS[isa]) <= set(cpu_flags().split()):
        pytest.skip(f"this CPU cannot run {isa} code")
    cl = torch.channels_last
    x = torch.randn(2, 32, 16, 16).contiguous(memory_format=cl)
    v, i = aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    a = aten.avg_pool2d(x, [3, 3], [2, 2], [1, 1])
    ad = aten._adaptive_avg_pool2d(x, [4, 4])
    cases: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
        "max": (lambda x: (F.max_pool2d(x, 2),), (x,)),
        "max_pad_indices": (lambda x: aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1]),
                            (x,)),
        "avg_pad": (lambda x: (F.avg_pool2d(x, 3, 2, 1),), (x,)),
        "adaptive": (lambda x: (aten._adaptive_avg_pool2d(x, [4, 4]),), (x,)),
        "max_bwd": (lambda g, x, i: (aten.max_pool2d_with_indices_backward(
            g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i),), (v, x, i)),
        "avg_bwd": (lambda g, x: (aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], False,
                                                           True, None),), (a, x)),
        "adaptive_bwd": (lambda g, x: (aten._adaptive_avg_pool2d_backward(g, x),), (ad, x)),
    }
    scalar = _vector_check(cases, isa, tmp_path)
    assert not scalar, "scalar inner loops:\n" + "\n".join(
        f"  {name}: {loops}" for name, loops in sorted(scalar.items()))


def test_snapshot_max_pool_channels_last() -> None:
    """The generated code of a channels-last 3x3/2 max pooling with padding and indices (the
    padded copy, then unmasked window loads)."""
    x = torch.randn(2, 8, 6, 6, generator=torch.Generator().manual_seed(0)).contiguous(
        memory_format=torch.channels_last)

    def fn(x: torch.Tensor) -> Any:
        return aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])

    gm = make_fx(fn, decomposition_table=decompositions())(x)
    src, _ = generate_source(gm, key="snapshot")
    path = Path(__file__).parent / "snapshots" / "max_pool2d_channels_last.py.txt"
    if os.environ.get("EMBER_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        path.write_text(src)
    assert src == path.read_text(), f"generated code changed; see {path}"
    out = load_wrapper(src, gm, "snapshot")(x)
    assert_same(tuple(out), tuple(fn(x)))


_TRITON_SCRIPT = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, torch.nn.functional as F
sys.path.insert(0, {tests!r})
from inductor_triton.triton_util import compile_triton
bad = []
def check(name, fn, *xs):
    xe = [x.clone().requires_grad_() for x in xs]
    xc = [x.clone().requires_grad_() for x in xs]
    ye, yc = fn(*xe), compile_triton(fn)(*xc)
    ok = torch.allclose(yc, ye, atol=1e-5, rtol=1e-5, equal_nan=True)
    g = torch.randn(ye.shape)
    ye.backward(g); yc.backward(g)
    ok = ok and all(torch.allclose(a.grad, b.grad, atol=1e-5, rtol=1e-5) for a, b in zip(xc, xe))
    print(name, "ok" if ok else "WRONG", flush=True)
    if not ok: bad.append(name)
x = torch.randint(-3, 4, (2, 3, 9, 10)).float()
x[..., 4, 5] = float("nan")
check("max_pad_ceil", lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), x)
check("avg_nopad_count", lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False),
      torch.randn(2, 3, 9, 10))
check("adaptive_ragged", lambda t: F.adaptive_avg_pool2d(t, (4, 3)), torch.randn(2, 3, 9, 10))
sys.exit(1 if bad else 0)
"""


def test_pooling_triton_target() -> None:
    """Forward and gradient through the Triton target (interpreter; a subprocess, so that
    TRITON_INTERPRET is set before triton is imported whatever ran before)."""
    pytest.importorskip("triton")
    tests = str(Path(__file__).parent.parent)
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([tests, str(Path(tests) / "inductor_triton"),
                                         env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT.format(tests=tests)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count(" ok") == 3, r.stdout
