"""What eager refuses, compiled kernels refuse too: an index out of range (embedding, gather,
index_select, ``x[idx]``) and an integer division by zero raise eager's exception instead of
reading out of bounds or returning a made-up value. Kernels flag these in a status they return
and the wrapper raises (one branch per index, never taken on good data)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember_inductor.compile_fx import generate_source
from ember_inductor.decompositions import decompositions
from inductor_util import compile_strict


def _source(fn: Callable[..., Any], *args: torch.Tensor) -> str:
    gm = make_fx(fn, decomposition_table=decompositions())(*args)
    return generate_source(gm, key="checks")[0]


def _raises_like_eager(fn: Callable[..., Any], *args: Any) -> None:
    with pytest.raises((IndexError, RuntimeError)) as eager:
        fn(*args)
    with pytest.raises((IndexError, RuntimeError)) as ours:
        compile_strict(fn)(*args)
    if "ZeroDivisionError" in str(eager.value):
        assert "ZeroDivisionError" in str(ours.value)
    else:
        assert isinstance(ours.value, IndexError), ours.value
        assert "out of range" in str(ours.value)


W = torch.randn(10, 4)
X = torch.randn(5, 3)


def emb(w: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(i, w) * 2


def gather(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 0, i) + 1


def index_select(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.index_select(x, 0, i) + 1


def getitem(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return x[i] + 1


@pytest.mark.parametrize("fn,args,bad", [
    (emb, (W, torch.tensor([1, 2, 9])), [torch.tensor([1, 10]), torch.tensor([-1, 0])]),
    (gather, (X, torch.tensor([[4, 0, 1]])), [torch.tensor([[5, 0, 0]]), torch.tensor([[-1, 0, 0]])]),
    (index_select, (X, torch.tensor([4, 0])), [torch.tensor([5]), torch.tensor([-1])]),
    (getitem, (X, torch.tensor([0, 4, -5, -1])), [torch.tensor([5]), torch.tensor([-6])]),
], ids=["embedding", "gather", "index_select", "getitem"])
def test_out_of_range_index_raises(fn: Callable[..., Any], args: tuple, bad: list) -> None:
    torch.testing.assert_close(compile_strict(fn)(*args), fn(*args))
    for idx in bad:
        _raises_like_eager(fn, args[0], idx)
    # and the compiled function still works afterwards
    torch.testing.assert_close(compile_strict(fn)(*args), fn(*args))


@pytest.mark.parametrize("op", ["floordiv", "remainder", "fmod", "trunc"])
def test_integer_division_by_zero_raises(op: str) -> None:
    fns = {"floordiv": lambda a, b: a // b + 1, "remainder": lambda a, b: a % b + 1,
           "fmod": lambda a, b: torch.fmod(a, b) + 1,
           "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc") + 1}
    fn = fns[op]
    a = torch.tensor([5, -7, 9, 0])
    assert torch.equal(compile_strict(fn)(a, torch.tensor([2, 3, -4, 1])),
                       fn(a, torch.tensor([2, 3, -4, 1])))
    _raises_like_eager(fn, a, torch.tensor([2, 0, 4, 1]))


def test_float_division_by_zero_is_not_an_error() -> None:
    fn = lambda a, b: a // b + a % b  # noqa: E731
    a, b = torch.tensor([1.0, -1.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])
    torch.testing.assert_close(compile_strict(fn)(a, b), fn(a, b), equal_nan=True)


def test_checks_only_where_needed() -> None:
    # a constant divisor cannot be zero; plain pointwise code returns no status
    src = _source(lambda a: (a // 3 + a % 7,), torch.arange(8))
    assert "e_status" not in src and "_kernel_failed" not in src
    src = _source(lambda a, b: (a // b,), torch.arange(8), torch.arange(1, 9))
    assert "int e_status = 0;" in src and "_kernel_failed(status" in src
    src = _source(lambda w, i: (torch.nn.functional.embedding(i, w),), W, torch.tensor([1, 2]))
    assert "__atomic_store_n(&e_status, 1" in src
    assert ".restype = ctypes.c_int" in src
