"""The graph-break corpus: programs that cannot be one graph (prints, .item(), data-dependent
branches, generators, C functions, logging...), with their inputs.

Same conventions as tests/capture/corpus.py: each factory returns ``(callable, calls[, state])``;
``state()`` returns the caller-visible side effects (event lists, logged messages, attributes).
Printed output is compared separately (captured stdout per call). Calls carry no recompile
expectations here (``M``): breaks make recompile counts an implementation detail.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import functools
import itertools
import json
import logging
import random
import sys
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from capture._harness import M, Program, program, t

PROGRAMS: dict[str, Program] = {}
_logger_ids = itertools.count()


def prog(fn=None, **opts):  # noqa: ANN001, ANN201
    if fn is None:
        return lambda f: program(PROGRAMS, **opts)(f)
    return program(PROGRAMS)(fn)


def calls(*argsets) -> list:  # noqa: ANN002
    return [M(*a) for a in argsets]


def pos_neg(*shape: int) -> list:
    """Inputs that drive data-dependent code both ways: positive, negative, positive again."""
    a, b, c = t(*shape).abs() + 0.1, -(t(*shape).abs() + 0.1), t(*shape).abs() + 0.2
    return calls((a,), (b,), (c,))


def three(*shape: int) -> list:
    return calls((t(*shape),), (t(*shape),), (t(*shape[:-1], shape[-1] + 1),))


def list_logger():  # noqa: ANN201
    """A fresh logger recording formatted messages into a list (state)."""
    msgs: list[str] = []

    class H(logging.Handler):
        def emit(self, record):  # noqa: ANN001, ANN202
            msgs.append(f"{record.levelname}:{record.getMessage()}")
    lg = logging.getLogger(f"breaks.corpus.{next(_logger_ids)}")
    lg.setLevel(logging.INFO)
    lg.propagate = False
    lg.addHandler(H())
    return lg, msgs


# ==================================================================================================
# print
# ==================================================================================================

@prog
def print_between_ops():
    def f(x):
        y = x * 2
        print("between")
        return y + 1
    return f, three(3)


@prog
def print_tensor_value():
    def f(x):
        y = x.round()
        print("y =", y)
        return y.sum()
    return f, calls((torch.tensor([1.0, 2.0]),), (torch.tensor([3.0, -1.0]),))


@prog
def print_fstring_shape():
    def f(x):
        h = x.relu()
        print(f"shape={tuple(h.shape)} dtype={h.dtype}")
        return h * 3
    return f, three(2, 2)


@prog
def print_in_loop():
    def f(x):
        for i in range(3):
            x = x + i
            print("iter", i)
        return x
    return f, three(2)


@prog
def print_in_helper():
    def helper(v):
        print("helper got", v.shape[0])
        return v * 2

    def f(x):
        a = x + 1
        b = helper(a)
        return b - 1
    return f, three(3)


@prog
def print_two_frames_deep():
    def inner(v):
        print("inner")
        return v.exp()

    def middle(v):
        return inner(v + 1) * 2

    def f(x):
        return middle(x.sin()).sum(), x.cos()
    return f, three(3)


@prog
def print_inside_no_grad():
    def f(x):
        with torch.no_grad():
            y = x * 2
            print("no grad block")
            z = y + x
        return z, x * 3
    return f, calls((t(2, rg=True),), (t(2, rg=True),), (t(2),))


@prog
def print_inside_autocast():
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            print("autocast", c.dtype)
            d = c @ b.t()
        return c, d
    return f, calls((t(2, 3), t(3, 3)), (t(2, 3), t(3, 3)))


class PrintModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 2)

    def forward(self, x):
        h = self.a(x).relu()
        print("hidden norm positive:", bool(h.norm() >= 0))
        return self.b(h)


@prog
def print_in_module_forward():
    return PrintModule(), three(2, 3)[:2]


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        print("noisy submodule")
        return self.lin(x)


@prog
def print_in_submodule():
    m = nn.Sequential(nn.Linear(2, 2), Noisy(), nn.Tanh())
    return m, calls((t(1, 2),), (t(3, 2),))


@prog
def print_with_side_effect_order():
    events = []

    def f(x):
        events.append("a")
        y = x + 1
        print("first")
        events.append("b")
        y = y * 2
        print("second")
        events.append("c")
        return y
    return f, three(2), lambda: list(events)


@prog
def print_kwargs_sep_end_file():
    def f(x):
        print("a", "b", sep="-", end="!\n", file=sys.stdout)
        return x - 1
    return f, three(2)


@prog
def print_before_return_only():
    def f(x):
        y = (x @ x.t()).trace()
        print("done")
        return y
    return f, three(2, 2)


@prog
def print_at_function_start():
    def f(x):
        print("start")
        return x.sigmoid() * 2
    return f, three(3)


# ==================================================================================================
# .item(), .tolist(), conversions to Python
# ==================================================================================================

@prog
def item_in_python_arith():
    def f(x):
        s = x.sum().item()
        return x * (s * 2 + 1)
    return f, three(3)


@prog
def item_float_max():
    def f(x):
        m = float(x.max())
        return x / (abs(m) + 1), m
    return f, three(4)


@prog
def item_int_index():
    def f(x):
        i = int(x.argmax())
        return x[i] * 2, x[:i + 1].sum()
    return f, three(5)


@prog
def tolist_sum():
    def f(x):
        vals = x.round().tolist()
        return x + sum(vals), len(vals)
    return f, three(3)


@prog
def item_while_loop():
    def f(x):
        n = 0
        while x.abs().sum().item() < 20 and n < 10:
            x = x * 2 + 0.1
            n += 1
        return x, n
    return f, three(2)


@prog
def bool_any_if():
    def f(x):
        if bool((x > 1).any()):
            return x - 1
        return x + 1
    return f, calls((torch.tensor([0.5, 2.0]),), (torch.tensor([0.5, 0.2]),),
                    (torch.tensor([3.0, 0.1]),))


@prog
def item_in_helper():
    def scale_of(v):
        return v.std().item()

    def f(x):
        y = x * 2
        return y / scale_of(y) + 1
    return f, three(4)


@prog
def item_under_no_grad():
    def f(x):
        with torch.no_grad():
            c = x.mean().item()
        return x - c
    return f, calls((t(3, rg=True),), (t(3, rg=True),))


@prog
def numpy_conversion():
    def f(x):
        a = x.detach().numpy()
        return x * float(a.sum()), a.shape
    return f, three(3)


@prog
def item_then_tensor_creation():
    def f(x):
        n = int(x.abs().max().item() * 2) + 1
        return torch.arange(n) * 1.0, x + n
    return f, calls((torch.tensor([0.2, 1.6]),), (torch.tensor([2.4, -0.2]),))


# ==================================================================================================
# Data-dependent control flow on tensor values
# ==================================================================================================

@prog
def dd_if_sum_positive():
    def f(x):
        y = x * 2
        if y.sum() > 0:
            return y + 1
        return y - 1
    return f, pos_neg(3)


@prog
def dd_if_and_python_flag():
    def f(x, flag):
        if x.max() > 0.5 and flag:
            return x * 10
        return x
    a = torch.tensor([1.0, 0.0])
    return f, calls((a, True), (a, False), (torch.tensor([0.1, 0.2]), True))


@prog
def dd_in_loop():
    def f(x):
        out = torch.zeros_like(x)
        for i in range(x.shape[0]):
            if x[i] > 0:
                out[i] = x[i] * 2
            else:
                out[i] = -x[i]
        return out
    return f, calls((torch.tensor([1.0, -2.0, 3.0]),), (torch.tensor([-1.0, -2.0, 0.5]),))


@prog
def dd_in_nested_call():
    def clip(v):
        if (v > 1).any():
            return v.clamp(max=1)
        return v

    def f(x):
        return clip(x * 3) + clip(x)
    return f, pos_neg(3)


class DDModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        h = self.lin(x)
        if h.mean() > 0:
            h = h.relu()
        else:
            h = h.tanh()
        return h * 2


@prog
def dd_in_module_forward():
    return DDModule(), calls((t(2, 2),), (t(2, 2) * 5,), (-t(2, 2),))


@prog
def dd_while_tensor_condition():
    def f(x):
        steps = 0
        while x.norm() > 1:
            x = x / 2
            steps += 1
        return x, steps
    return f, calls((torch.tensor([3.0, 4.0]),), (torch.tensor([0.1, 0.1]),),
                    (torch.tensor([30.0, 4.0]),))


@prog
def dd_ternary():
    def f(x):
        return x * 2 if x.mean() > 0 else x * -2
    return f, pos_neg(4)


@prog
def dd_tensor_truthiness():
    def f(x):
        if x.any():
            return x + 1
        return x - 1
    return f, calls((torch.tensor([0.0, 1.0]),), (torch.tensor([0.0, 0.0]),))


@prog
def dd_assert_on_values():
    def f(x):
        y = x.abs()
        assert (y >= 0).all(), "non-negative"
        return y.sqrt()
    return f, three(3)


@prog
def dd_early_return():
    def f(x):
        y = x.relu()
        if y.sum() == 0:
            return y
        y = y / y.sum()
        return y * 3
    return f, calls((torch.tensor([-1.0, -2.0]),), (torch.tensor([1.0, 3.0]),))


@prog
def dd_boolean_mask_dynamic_shape():
    def f(x):
        pos = x[x > 0]
        return pos.sum() + x.mean(), pos.shape[0]
    return f, calls((torch.tensor([1.0, -1.0, 2.0]),), (torch.tensor([-1.0, -1.0, 2.0]),))


@prog
def dd_nonzero_unique():
    def f(x):
        idx = torch.nonzero(x > 0)
        u = torch.unique(x.round())
        return idx, u
    return f, calls((torch.tensor([1.0, -1.0, 2.2]),), (torch.tensor([0.7, 0.6, -0.3]),))


# ==================================================================================================
# Breaks in loops
# ==================================================================================================

@prog
def loop_accumulate_with_print():
    def f(xs):
        acc = 0
        for i, x in enumerate(xs):
            acc = acc + x * i
            print("step", i)
        return acc
    return f, calls(([t(2), t(2), t(2)],), ([t(2), t(2), t(2)],))


@prog
def loop_item_over_list():
    def f(xs):
        total = 0.0
        for x in xs:
            total += x.sum().item()
        return torch.stack(xs) * total
    return f, calls(([t(2), t(2)],), ([t(2), t(2)],))


@prog
def loop_while_python_counter_with_print():
    def f(x):
        i = 0
        while i < 3:
            x = x.sin()
            if i == 1:
                print("half way")
            i += 1
        return x
    return f, three(3)


class PrintLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            print("layer", i, tuple(x.shape))
        return x


@prog
def loop_modulelist_print():
    return PrintLayers(), calls((t(1, 2),), (t(2, 2),))


@prog
def loop_nested_break_inner():
    def f(x):
        for i in range(3):
            for j in range(3):
                x = x + 1
                if j == i:
                    print("break", i, j)
                    break
        return x
    return f, three(2)


@prog
def loop_data_dependent_continue():
    def f(xs):
        out = []
        for x in xs:
            if x.sum() < 0:
                continue
            out.append(x * 2)
        return out
    return f, calls(([torch.ones(2), -torch.ones(2), torch.ones(2) * 3],),
                    ([-torch.ones(2), torch.ones(2)],))


@prog
def loop_break_on_item():
    def f(x):
        steps = []
        for i in range(5):
            x = x * 1.5
            steps.append(i)
            if x.max().item() > 4:
                break
        return x, steps
    return f, calls((torch.tensor([1.0, 2.0]),), (torch.tensor([0.1, 0.2]),))


# ==================================================================================================
# Breaks in nested calls
# ==================================================================================================

@prog
def nested_helper_called_twice():
    def helper(v, tag):
        print("helper", tag)
        return v + 1

    def f(x):
        a = helper(x * 2, "a")
        b = helper(a * 3, "b")
        return a + b
    return f, three(2)


@prog
def nested_returns_tuple():
    def stats(v):
        m = v.mean()
        print("stats")
        return m, v.std()

    def f(x):
        m, s = stats(x)
        return (x - m) / s
    return f, three(4)


@prog
def nested_object_method():
    class Norm:
        def __init__(self):
            self.calls = 0

        def __call__(self, v):
            self.calls += 1
            print("norm call", self.calls)
            return v / v.norm()
    n = Norm()

    def f(x):
        return n(x) + n(x * 2)
    return f, three(3), lambda: n.calls


@prog
def nested_lambda_with_print():
    def f(x):
        g = lambda v: print("lambda", v.shape[0]) or v * 2  # noqa: E731
        return g(x) + 1
    return f, three(3)


@prog
def nested_decorated_helper():
    def logged(fn):
        @functools.wraps(fn)
        def wrapper(*a):
            print("calling", fn.__name__)
            return fn(*a)
        return wrapper

    @logged
    def scale(v):
        return v * 3

    def f(x):
        return scale(x) + scale(x + 1)
    return f, three(2)


@prog
def nested_break_then_more_work():
    def prep(v):
        v = v * 2
        print("prep")
        v = v + 1
        return v

    def f(x):
        y = prep(x)
        z = y.tanh() @ y.t()
        return z.softmax(-1)
    return f, three(2, 2)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            y = y * 2
        return y


class TwoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1 = Block()
        self.b2 = Block()

    def forward(self, x):
        return self.b2(self.b1(x) + 1)


@prog
def nested_module_data_dependent():
    return TwoBlocks(), calls((t(1, 2),), (t(1, 2) * 3,), (-t(1, 2),))


# ==================================================================================================
# Breaks inside context managers
# ==================================================================================================

@prog
def ctx_no_grad_then_ops_keep_mode():
    def f(x):
        with torch.no_grad():
            a = x * 2
            print("inside")
            b = a * x
        c = x * 3
        return a, b, c
    return f, calls((t(2, rg=True),), (t(2, rg=True),))


@prog
def ctx_item_in_enable_grad_in_no_grad():
    def f(x):
        with torch.no_grad():
            with torch.enable_grad():
                y = x * 2
                s = y.sum().item()
            z = y * s
        return y, z
    return f, calls((t(2, rg=True),), (t(2, rg=True),))


@prog
def ctx_autocast_item():
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            k = c.float().abs().max().item()
            d = (c @ b.t()) / (k + 1)
        return c, d
    return f, calls((t(2, 3), t(3, 3)), (t(2, 3), t(3, 3)))


@prog
def ctx_set_grad_enabled_false_print():
    def f(x):
        with torch.set_grad_enabled(False):
            y = x + 1
            print("grad off")
            z = y * x
        return z, x + z
    return f, calls((t(2, rg=True),), (t(2, rg=True),))


@prog
def ctx_user_contextmanager():
    trace = []

    @contextlib.contextmanager
    def section(name):
        trace.append("enter " + name)
        yield
        trace.append("exit " + name)

    def f(x):
        with section("a"):
            y = x * 2
        return y + 1
    return f, three(2), lambda: list(trace)


@prog
def ctx_user_class_context():
    class Timer:
        def __init__(self, log):
            self.log = log

        def __enter__(self):
            self.log.append("in")
            print("enter timer")
            return self

        def __exit__(self, *exc):
            self.log.append("out")
            return False
    log = []

    def f(x):
        with Timer(log):
            y = x.exp()
        return y - 1
    return f, three(2), lambda: list(log)


@prog
def ctx_no_grad_data_dependent():
    def f(x):
        with torch.no_grad():
            y = x * 2
            if y.sum() > 0:
                y = y + 1
        return y, x * y
    return f, calls((t(3, rg=True).detach().abs().requires_grad_(),),
                    ((-t(3).abs()).requires_grad_(),))


# ==================================================================================================
# Generators
# ==================================================================================================

@prog
def gen_consumed_by_list():
    def gen(v):
        for i in range(3):
            yield v * i

    def f(x):
        return torch.stack(list(gen(x)))
    return f, three(2)


@prog
def gen_with_print():
    def gen(v):
        for i in range(2):
            print("yield", i)
            yield v + i

    def f(x):
        total = 0
        for y in gen(x):
            total = total + y
        return total
    return f, three(2)


@prog
def gen_itertools_islice_count():
    def f(x):
        ks = list(itertools.islice(itertools.count(1, 2), 3))
        return x * sum(ks), ks
    return f, three(2)


@prog
def gen_yield_from():
    def inner(v):
        yield v
        yield v * 2

    def outer(v):
        yield from inner(v)
        yield v * 3

    def f(x):
        return sum(outer(x))
    return f, three(2)


@prog
def gen_next_manual():
    def counter(v):
        while True:
            v = v + 1
            yield v

    def f(x):
        g = counter(x)
        a = next(g)
        b = next(g)
        return a * b
    return f, three(2)


# ==================================================================================================
# Unsupported builtins and C functions
# ==================================================================================================

@prog
def cfn_id_compare():
    def f(x, y):
        same = id(x) == id(y)
        return x * (2 if same else 3)
    a = t(2)
    return f, calls((a, a), (a, t(2)))


@prog
def cfn_bisect():
    bounds = [1, 3, 5, 8]

    def f(x):
        k = bisect.bisect_left(bounds, x.shape[0])
        return x * k, k
    return f, three(2)[:2] + calls((t(5),))


@prog
def cfn_deepcopy_list():
    def f(x, lst):
        c = copy.deepcopy(lst)
        c.append(5)
        return x * len(c), c
    return f, calls((t(2), [1, 2]), (t(2), [1, 2, 3]))


@prog
def cfn_json_dumps():
    def f(x):
        s = json.dumps({"n": x.shape[0], "k": [1, 2]}, sort_keys=True)
        return x * len(s), s
    return f, three(2)


@prog
def cfn_zlib_crc32():
    def f(x, name):
        h = zlib.crc32(name.encode()) % 7
        return x + h
    return f, calls((t(2), "abc"), (t(2), "xyz"))


@prog
def cfn_getsizeof():
    def f(x):
        n = sys.getsizeof(1) > 0
        return x * (2 if n else 1)
    return f, three(2)


@prog
def cfn_data_ptr():
    def f(x):
        y = x * 2
        ok = x.data_ptr() != 0
        return y + (1 if ok else 0)
    return f, three(2)


@prog
def cfn_sorted_with_c_key():
    def f(x, names):
        order = sorted(names, key=str.lower)
        return x * len(order[0]), order
    return f, calls((t(2), ["b", "Aa", "c"]), (t(2), ["zz", "Y"]))


@prog
def cfn_tensor_hash_in_set():
    def f(x, y):
        s = {x, y}
        return x + y, len(s)
    a = t(2)
    return f, calls((a, t(2)), (a, a))


@prog
def cfn_isinstance_numpy_and_str_format():
    def f(x):
        s = "{:.2f}".format(float(x.sum()))
        return x * len(s), s
    return f, three(2)


# ==================================================================================================
# logging
# ==================================================================================================

@prog
def log_info_args():
    lg, msgs = list_logger()

    def f(x):
        y = x * 2
        lg.info("computed %s values", y.numel())
        return y + 1
    return f, three(3), lambda: list(msgs)


@prog
def log_warning_in_nested():
    lg, msgs = list_logger()

    def check(v):
        if v.shape[0] > 2:
            lg.warning("large input: %d", v.shape[0])
        return v.relu()

    def f(x):
        return check(x) * 2
    return f, calls((t(2),), (t(3),), (t(2),)), lambda: list(msgs)


@prog
def log_in_loop():
    lg, msgs = list_logger()

    def f(x):
        for i in range(3):
            x = x + i
            lg.info("iter %d", i)
        return x
    return f, three(2), lambda: list(msgs)


@prog
def log_debug_disabled():
    lg, msgs = list_logger()

    def f(x):
        lg.debug("not shown %s", x.shape)
        return x * 2
    return f, three(2), lambda: list(msgs)


# ==================================================================================================
# Side effects across breaks
# ==================================================================================================

@prog
def se_list_append_around_print():
    out = []

    def f(x):
        out.append(x.sum())
        print("mid")
        out.append(x.mean())
        return x * 2
    return f, three(3), lambda: list(out)


@prog
def se_dict_mutation_read_after_break():
    def f(x, d):
        d["before"] = x * 2
        print("break")
        return d["before"] + d.get("extra", 0)
    return f, calls((t(2), {}), (t(2), {"extra": 1.0}))


@prog
def se_attribute_mutation_across_break():
    class State:
        def __init__(self):
            self.n = 0
            self.vals = []
    st = State()

    def f(x):
        st.n += 1
        st.vals.append(st.n)
        y = x * st.n
        if y.sum() > 0:
            st.n += 10
        return y + st.n
    return f, pos_neg(2), lambda: (st.n, list(st.vals))


@prog
def se_global_counter_across_break():
    g = {"torch": torch, "COUNT": 0, "print": print}
    src = (
        "def f(x):\n"
        "    global COUNT\n"
        "    COUNT += 1\n"
        "    print('count', COUNT)\n"
        "    COUNT += 1\n"
        "    return x * COUNT\n")
    exec(compile(src, "<breaks:global_counter>", "exec"), g)
    return g["f"], three(2), lambda: g["COUNT"]


@prog
def se_input_mutation_across_break():
    def f(x):
        x.add_(1)
        print("mutated once")
        x.mul_(2)
        return x.sum()
    return f, three(3)


@prog
def se_caller_list_and_print_order():
    def f(x, log):
        log.append("start")
        print("p1")
        y = x.relu()
        log.append("mid")
        if y.sum() > 0.5:
            log.append("big")
        print("p2")
        log.append("end")
        return y
    return f, calls((t(3).abs() + 1, []), (-t(3).abs(), []))


@prog
def se_module_buffer_and_print():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(()))
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            self.n += 1
            print("calls so far:", int(self.n))
            return self.lin(x) * self.n
    return Counter(), calls((t(1, 2),), (t(1, 2),), (t(1, 2),))


@prog
def se_closure_list_in_helper_with_item():
    seen = []

    def record(v):
        seen.append(round(v.sum().item(), 4))
        return v

    def f(x):
        a = record(x * 2)
        b = record(a + 1)
        return a * b
    return f, three(2), lambda: list(seen)


@prog
def se_print_then_exception_free_return_of_list():
    def f(x):
        parts = []
        for i in range(2):
            parts.append(x + i)
            print(len(parts))
        return parts
    return f, three(2)


@prog
def se_multiple_breaks_kinds():
    lg, msgs = list_logger()
    events = []

    def f(x):
        events.append(1)
        print("one")
        s = x.sum().item()
        events.append(2)
        lg.info("sum sign %s", s > 0)
        if x.mean() > 0:
            events.append(3)
        return x * s
    return f, pos_neg(3), lambda: (list(events), list(msgs))


@prog
def se_break_in_training_module():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.steps = 0

        def forward(self, x):
            y = self.lin(x)
            self.steps += 1
            print("train step", self.steps)
            return F.mse_loss(y, torch.zeros_like(y))
    return M(), calls((t(2, 2),), (t(2, 2),))


@prog(backward=True)
def se_backward_through_break():
    def f(x, w):
        y = x @ w
        print("between matmuls")
        return (y @ w.t()).sum()
    return f, calls((t(2, 2), t(2, 2, rg=True)), (t(2, 2), t(2, 2, rg=True)))
