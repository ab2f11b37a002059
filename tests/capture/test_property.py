"""Property test: random programs (Python source built by hypothesis) compiled by Ember equal eager.

A program is straight-line tensor code on (2, 3) float tensors, mixed with Python control flow on
constants, arguments (an int, a bool), containers (a local list and dict, a caller's list that is
mutated) and module attributes (``m.scale``, ``m.k``, ``m.use``, ``m.lin``). The source is exec'd
into a function, compiled with the eager backend, and run on several inputs (including new Python
values, which recompile) next to an eager run on an identical second instance.
"""

from __future__ import annotations

import itertools
import linecache

import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import ember
import ember.events

from ._harness import M, Program, compare_records, run_program, t

_ids = itertools.count()

UNARY = ["torch.relu({a})", "torch.tanh({a})", "torch.sigmoid({a})", "{a}.sin()", "{a}.abs()",
         "-{a}", "{a}.exp().clamp(max=10.0)", "{a}.softmax(-1)", "{a} * m.scale", "m.lin({a})",
         "{a}.reshape(3, 2).t()", "{a}.cumsum(1)", "({a} * 2).round()", "F.gelu({a})"]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.where({a} > 0, {a}, {b})",
          "torch.maximum({a}, {b})", "{a}[:, :1] * {b}", "{a}.sum(-1, keepdim=True) + {b}",
          "torch.cat([{a}[:, :2], {b}[:, 2:]], dim=1)"]
CONDS = ["n > {c}", "flag", "not flag", "m.use", "m.k == {c}", "len(lst) > {c}", "n % 2 == 0",
         "'a' in d", "x.shape[0] == 2", "isinstance(n, int) and n < {c}"]


class Gen:
    def __init__(self, draw):  # noqa: ANN001
        self.draw = draw
        self.vars = ["x", "y"]
        self.lines: list[str] = []

    def var(self) -> str:
        return self.draw(st.sampled_from(self.vars))

    def new(self) -> str:
        v = f"v{len(self.vars)}"
        self.vars.append(v)
        return v

    def expr(self) -> str:
        kind = self.draw(st.integers(0, 2))
        if kind == 0:
            return self.draw(st.sampled_from(UNARY)).format(a=self.var())
        if kind == 1:
            return self.draw(st.sampled_from(BINARY)).format(a=self.var(), b=self.var())
        return f"{self.var()} * {self.draw(st.sampled_from(['2', '0.5', 'n', '-1.5', 'm.k']))}"

    def stmt(self, indent: str = "    ", depth: int = 0) -> None:
        kind = self.draw(st.integers(0, 9 if depth < 2 else 4))
        L = self.lines.append
        if kind <= 3:
            e = self.expr()
            L(f"{indent}{self.new()} = {e}")
        elif kind == 4:
            L(f"{indent}lst.append({self.var()})")
        elif kind == 5:
            cond = self.draw(st.sampled_from(CONDS)).format(c=self.draw(st.integers(0, 3)))
            e1, e2 = self.expr(), self.expr()
            v = self.new()
            L(f"{indent}if {cond}:")
            L(f"{indent}    {v} = {e1}")
            L(f"{indent}else:")
            L(f"{indent}    {v} = {e2}")
        elif kind == 6:
            src, step = self.var(), self.var()
            k = self.draw(st.integers(1, 3))
            v = self.new()
            L(f"{indent}{v} = {src}")
            L(f"{indent}for i in range({k}):")
            L(f"{indent}    {v} = {v} + {step} * i")
            if self.draw(st.booleans()):
                L(f"{indent}    lst.append({v})")
        elif kind == 7:
            key = self.draw(st.sampled_from(["a", "b"]))
            L(f"{indent}d[{key!r}] = {self.var()}")
            v = self.new()  # reads d only
            L(f"{indent}{v} = d.get('a', x) + d.get('b', y)")
        elif kind == 8:
            src, other = self.var(), self.var()
            v = self.new()
            L(f"{indent}{v} = {src}.clone()")
            L(f"{indent}{v}.{self.draw(st.sampled_from(['add_', 'mul_', 'sub_']))}({other})")
        else:
            out = self.var()
            L(f"{indent}out.append({out}.sum())")
            L(f"{indent}out.append(len(lst))")


@st.composite
def programs(draw):  # noqa: ANN001, ANN201
    g = Gen(draw)
    g.lines = ["def f(x, y, n, flag, out):", "    lst = []", "    d = {}"]
    for _ in range(draw(st.integers(2, 10))):
        g.stmt()
    ret = draw(st.sampled_from([
        "    return {a}, {b}",
        "    return {a} + {b}, len(lst), sorted(d)",
        "    return [{a}, {b}] + lst",
        "    return {{'r': {a}, 'n': n}}"]))
    # "+ 1" keeps at least one tensor op in every program, so a graph must be captured.
    g.lines.append(ret.format(a=f"({g.vars[-1]} + 1)", b=g.var()))
    return "\n".join(g.lines) + "\n"


def make_program(src: str) -> Program:
    filename = f"<ember-property-{next(_ids)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)

    def factory():  # noqa: ANN202
        m = nn.Module()
        m.lin = nn.Linear(3, 3)
        m.scale, m.k, m.use = 1.5, 2, True
        g = {"torch": torch, "F": torch.nn.functional, "m": m}
        exec(compile(src, filename, "exec"), g)
        calls = [M(t(2, 3), t(2, 3), 2, True, []), M(t(2, 3), t(2, 3), 2, True, []),
                 M(t(2, 3), t(2, 3), 3, False, []), M(t(2, 3), t(2, 3), 2, True, [])]
        return g["f"], calls, lambda: (m.scale, m.k, m.use)
    return Program("property", factory)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_eager(src: str) -> None:
    note(src)
    prog = make_program(src)
    expected = run_program(prog)
    ember.reset()
    got = run_program(prog, wrap=lambda f: ember.compile(f, backend="eager"))
    compare_records(got, expected)
    c = ember.events.counters
    assert c["stats"]["fallbacks"] == 0, f"fell back on:\n{src}"
    assert sum(c["graph_breaks"].values()) == 0, f"graph breaks {dict(c['graph_breaks'])}:\n{src}"
    assert c["stats"]["graphs"] >= 1, f"no graph captured:\n{src}"
