"""Every pointwise and reduction op the C++ lowering supports is vector code, on this CPU's
instruction set, on AVX2 (``cpu_isa="x86-64-v3"``) and on plain x86-64 (SSE2; float floor, ceil,
trunc need SSE4.1 and stay scalar there): each op's kernel is generated as the
product generates it, all of them are built in one translation unit with the product's flags plus
``-fopt-info-vec-optimized``, and every innermost loop of every kernel must be one gcc reports as
vectorized. A change that leaves an op's loop scalar (a libm call without a vector variant, a
branch gcc cannot if-convert, a load it cannot move) fails here, naming the op and the loop.

Also the backward kernels of training steps that were scalar once: GELU (erf and tanh forms),
LayerNorm, softmax and log_softmax, and issue 21's ``(sin(x) * cos(y) + sigmoid(x) * 0.5)
.relu().sum(-1)``, whose fused backward read the incoming gradient once per row inside the inner
loop and left it scalar (14 ms instead of 1).

Ops left out on purpose (scalar today, by design): ``lgamma`` (no vector variant anywhere),
``fmod``/``remainder``/``floor_divide`` of floats (exact ``fmodf`` semantics, a libm call per
element), ``argmax``/``argmin`` (a value and an index carried together: gcc keeps them scalar)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.codegen.cpp import CPU_ISAS
from ember_inductor.compile_fx import generate_source
from ember_inductor.decompositions import decompositions
from ember_inductor.runtime import cache

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

_UNARY = ["abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
          "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
          "sqrt", "rsqrt", "reciprocal", "sigmoid", "erf", "erfc", "floor", "ceil", "trunc",
          "frac", "sign", "relu"]
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "mish": F.mish, "softplus": F.softplus, "elu": F.elu, "hardswish": F.hardswish,
    "logsigmoid": F.logsigmoid,
}
_BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "pow": torch.pow, "pow_scalar": lambda a, b: a ** 2.5, "atan2": torch.atan2,
    "hypot": torch.hypot, "maximum": torch.maximum, "minimum": torch.minimum, "div": torch.div,
    "where": lambda a, b: torch.where(a > b, a, b), "clamp": lambda a, b: a.clamp(-1, 1),
    "copysign": torch.copysign, "xlogy": torch.xlogy,
}
_REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum_rows": lambda t: t.sum(-1), "sum_cols": lambda t: t.sum(0),
    "mean_rows": lambda t: t.mean(-1), "amax_rows": lambda t: t.amax(-1),
    "amin_cols": lambda t: t.amin(0), "prod_rows": lambda t: t.prod(-1),
    "var_rows": lambda t: t.var(-1), "softmax": lambda t: t.softmax(-1),
    "log_softmax": lambda t: t.log_softmax(-1), "logsumexp": lambda t: t.logsumexp(-1),
    "layer_norm": lambda t: F.layer_norm(t, (256,)),
}


def _grad(f: Callable[..., torch.Tensor], n: int) -> Callable[..., Any]:
    """The input gradients of ``f``'s first ``n`` arguments, traced as one backward graph."""
    def bw(*args: torch.Tensor) -> Any:
        xs = [a.detach().requires_grad_() for a in args[:n]]
        out = f(*xs, *args[n:-1])
        return torch.autograd.grad(out, xs, args[-1])
    return bw


def _one(f: Callable[..., torch.Tensor]) -> Callable[..., tuple[torch.Tensor]]:
    def g(*args: torch.Tensor) -> tuple[torch.Tensor]:
        return (f(*args),)
    return g


def _issue21(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (torch.sin(x) * torch.cos(y) + torch.sigmoid(x) * 0.5).relu().sum(-1)


def _cases() -> dict[str, tuple[Callable[..., Any], list[torch.Tensor]]]:
    x, y = torch.randn(64, 256), torch.randn(64, 256)
    w, b = torch.randn(256), torch.randn(256)
    cases: dict[str, tuple[Callable[..., Any], list[torch.Tensor]]] = {}
    for name in _UNARY:
        cases[name] = (_one(getattr(torch, name)), [x])
    for name, f in {**_ACTIVATIONS, **_REDUCTIONS}.items():
        cases[name] = (_one(f), [x])
    for name, f in _BINARY.items():
        cases[name] = (_one(f), [x, y])
    cases["bw_gelu"] = (_grad(F.gelu, 1), [x, x])
    cases["bw_gelu_tanh"] = (_grad(lambda t: F.gelu(t, approximate="tanh"), 1), [x, x])
    cases["bw_layer_norm"] = (_grad(lambda t, w, b: F.layer_norm(t, (256,), w, b), 3),
                              [x, w, b, x])
    cases["bw_softmax"] = (_grad(lambda t: t.softmax(-1), 1), [x, x])
    cases["bw_log_softmax"] = (_grad(lambda t: t.log_softmax(-1), 1), [x, x])
    cases["bw_issue21"] = (_grad(_issue21, 2), [x, y, torch.randn(64)])
    return cases


def _functions(src: str) -> tuple[str, list[str]]:
    """(prelude, kernel functions) of a wrapper's C++."""
    m = re.search(r"^CPP_SOURCES = (\[.*?^\])", src, re.S | re.M)
    assert m, "no C++ in the wrapper"
    prelude, funcs = "", []
    for cpp in ast.literal_eval(m.group(1)):
        i = re.search(r'^extern "C" (void|int) kernel', cpp, re.M).start()  # type: ignore[union-attr]
        prelude = cpp[:i]
        funcs += re.findall(r'^extern "C" .*?^\}\n', cpp[i:], re.S | re.M)
    return prelude, funcs


def _innermost_loops(lines: list[str], start: int, end: int) -> list[int]:
    """0-based numbers of the ``for`` lines in lines[start:end] whose body holds no loop."""
    out = []
    for i in range(start, end):
        if not lines[i].strip().startswith("for ("):
            continue
        if not lines[i].rstrip().endswith("{"):
            out.append(i)  # a one-line loop
            continue
        depth, j, inner = 0, i, False
        while True:
            depth += lines[j].count("{") - lines[j].count("}")
            if j > i and lines[j].strip().startswith("for ("):
                inner = True
            if depth == 0 and j > i:
                break
            j += 1
        if not inner:
            out.append(i)
    return out


def _scalar_loops(isa: str, tmp_path: Path) -> dict[str, list[str]]:
    """For each case, the innermost loops of its kernels that gcc did not vectorize."""
    prelude, parts, owner = "", [], []
    for name, (fn, args) in _cases().items():
        gm = make_fx(fn, decomposition_table=decompositions())(*args)
        src, _ = generate_source(gm, key="test_vec_ops", options={"cpu_isa": isa})
        prelude, funcs = _functions(src)
        assert funcs, f"{name}: no C++ kernel (the op fell back to ATen?)"
        for f in funcs:
            parts.append(re.sub(r"\bkernel(\d+)\(", rf"k_{name}_\1(", f))
            owner.append(name)
    text = prelude
    spans = []
    for f in parts:
        start = text.count("\n")
        text += f
        spans.append((start, text.count("\n")))
    path = tmp_path / f"ops_{isa}.cpp"
    path.write_text(text)
    flags = [f for f in cache._flags((), "native" if isa == "native" else isa)
             if f not in ("-shared", "-fPIC")]
    r = subprocess.run([cache._compiler(), *flags, "-c", "-fopt-info-vec-optimized",
                        "-fopt-info-loop-optimized", str(path), "-o", str(tmp_path / "ops.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    # vectorized, or a loop that became a memset/memcpy call (an accumulator tile's
    # initialization, its copy to the output)
    done = {int(m.group(1)) for m in re.finditer(
        rf"{re.escape(path.name)}:(\d+):\d+: optimized: (loop vectorized|Loop \d+ distributed: "
        r"split to 0 loops and \d+ library calls)", r.stderr)}
    lines = text.splitlines()
    scalar: dict[str, list[str]] = {}
    for name, (start, end) in zip(owner, spans):
        for i in _innermost_loops(lines, start, end):
            # gcc names the loop's line, its "omp simd" pragma's, or (a loop OpenMP outlined)
            # its first statement's (1-based numbers)
            at = {i + 1, i + 2}
            if lines[i - 1].strip().startswith("#pragma omp simd"):
                at.add(i)
            if not at & done:
                scalar.setdefault(name, []).append(lines[i].strip())
    return scalar


# ops whose loop stays scalar on plain x86-64 (SSE2): float floor/ceil/trunc need SSE4.1's round
_SCALAR_ON = {"x86-64": {"floor", "ceil", "trunc", "frac"}}


@pytest.mark.parametrize("isa", ["native", "x86-64-v3", "x86-64"])
def test_every_op_is_vector_code(isa: str, tmp_path: Path) -> None:
    from ember.precompile.runtime import cpu_flags

    if isa != "native" and not set(CPU_ISAS[isa]) <= set(cpu_flags().split()):
        pytest.skip(f"this CPU cannot run {isa} code")
    scalar = _scalar_loops(isa, tmp_path)
    expected = _SCALAR_ON.get(isa, set())
    assert expected <= set(scalar), f"now vector code on {isa}: {expected - set(scalar)}"
    scalar = {k: v for k, v in scalar.items() if k not in expected}
    assert not scalar, "scalar inner loops:\n" + "\n".join(
        f"  {name}: {loops}" for name, loops in sorted(scalar.items()))


def test_backward_recomputation_computes_each_value_once() -> None:
    # issue 21's backward kernel recomputes the forward (sin x, cos y, sigmoid x) and needs
    # cos x and sin y for the gradients: each transcendental of each input once in the kernel
    x, y, g = torch.randn(64, 256), torch.randn(64, 256), torch.randn(64)
    gm = make_fx(_grad(_issue21, 2), decomposition_table=decompositions())(x, y, g)
    src, _ = generate_source(gm, key="test_vec_ops_cse")
    _, funcs = _functions(src)
    body = "".join(funcs)
    calls = re.findall(r"\b(e_sinf|e_cosf|e_vexpf)\(([^()]*)\)", body)
    assert sorted(calls) == sorted(set(calls)), calls
    assert len(calls) == 5, calls  # sin x, cos y, exp(-x) of the sigmoid, cos x, sin y
