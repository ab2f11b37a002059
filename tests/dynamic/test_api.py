"""Dynamic shapes through ember.compile on small functions (eager backend): the three modes,
automatic dynamic, int arguments, the 0/1 specialization, mark_dynamic / mark_static and their
errors, guards and recompile reasons, data-dependent sizes."""

from __future__ import annotations

import logging

import pytest
import torch

import ember

from ._util import graphs


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()


def _f(x, y):
    n = x.size(1)
    z = x.view(x.size(0), n // 2, 2).sum(-1)
    return z + y[:, : n // 2], n * 3


def _check(cf, fn, *args):
    got, exp = cf(*args), fn(*args)
    if isinstance(exp, tuple):
        for a, b in zip(got, exp):
            if isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b)
            else:
                assert a == b and type(a) is type(b)
    else:
        torch.testing.assert_close(got, exp)


def test_automatic_dynamic_compiles_static_then_one_dynamic_graph():
    cf = ember.compile(_f, backend="eager")
    y = torch.randn(3, 40)
    for n in (4, 6, 8, 10, 22, 40):
        _check(cf, _f, torch.randn(3, n), y)
    assert graphs(cf) == 2
    static, dynamic = ember.captures(cf)[1], ember.captures(cf)[0]
    assert any("(x).shape == (3, 4)" in g for g in static.guards)
    assert any("(x).size(1) >= 2" in g for g in dynamic.guards)
    assert any("(x).size(0) == 3" in g for g in dynamic.guards)  # unchanged dim: static
    # the int the function returns is computed from the input in the entry, not baked in
    assert "3*(x).size(1)" in dynamic.entry_source.replace(" ", "")


def test_dynamic_false_is_static_every_time():
    cf = ember.compile(_f, backend="eager", dynamic=False)
    y = torch.randn(3, 40)
    for n in (4, 6, 8):
        _check(cf, _f, torch.randn(3, n), y)
    assert graphs(cf) == 3
    for c in ember.captures(cf):
        assert not any(".size(" in g for g in c.guards)
        assert all("val" not in n.meta for n in c.graph.graph.nodes)


def test_dynamic_true_is_symbolic_from_the_first_compile():
    cf = ember.compile(_f, backend="eager", dynamic=True)
    for b, n in ((3, 4), (5, 6), (7, 12)):
        _check(cf, _f, torch.randn(b, n), torch.randn(b, 40))
    assert graphs(cf) == 1
    ph = [n for n in ember.captures(cf)[0].graph.graph.nodes if n.op == "placeholder"]
    assert all(isinstance(s, torch.SymInt) for s in ph[0].meta["val"].shape)


def test_no_warning_for_dynamic_true(caplog):
    with caplog.at_level(logging.WARNING, logger="ember"):
        ember.compile(_f, backend="eager", dynamic=True)
    assert "static shapes only" not in caplog.text


def test_sizes_zero_and_one_are_specialized():
    def f(x):
        return x * x.size(0)
    cf = ember.compile(f, backend="eager", dynamic=True)
    for n in (1, 2, 3, 5, 0, 1):
        _check(cf, f, torch.randn(n, 2))
    # size 1, then one graph for every size >= 2, then size 0
    assert graphs(cf) == 3
    caps = ember.captures(cf)
    texts = [" ".join(c.guards) for c in caps]
    assert sum("(x).size(0) == 1" in g or "(x).shape == (1, 2)" in g for g in texts) == 1
    assert sum("(x).size(0) == 0" in g or "(x).shape == (0, 2)" in g for g in texts) == 1
    assert sum("(x).size(0) >= 2" in g for g in texts) == 1


def test_int_argument_becomes_symbolic_after_it_changes():
    def f(x, step):
        return x * step + step, step + 1
    cf = ember.compile(f, backend="eager")
    x = torch.randn(4)
    for step in range(1, 12):
        _check(cf, f, x, step)
    assert graphs(cf) == 2
    g = ember.captures(cf)[0].graph.graph
    ph = [n for n in g.nodes if n.op == "placeholder"]
    assert any(isinstance(n.meta.get("val"), torch.SymInt) for n in ph)
    assert any("type(step) is int" in s for s in ember.captures(cf)[0].guards)


def test_int_argument_dynamic_true_and_python_use_specializes_with_a_guard():
    def f(x, n):
        out = x
        for _ in range(n):  # Python needs the value: the graph is specialized to it, guarded
            out = out + 1
        return out
    cf = ember.compile(f, backend="eager", dynamic=True)
    x = torch.randn(3)
    for n in (2, 3, 2):
        _check(cf, f, x, n)
    assert graphs(cf) == 2  # one per value actually used, never a stale result


def test_int_argument_as_a_slice_bound():
    def f(x, k):
        return x[:k] * 2
    cf = ember.compile(f, backend="eager")
    x = torch.randn(30)
    for k in range(3, 20):
        _check(cf, f, x, k)
    assert graphs(cf) == 2


def test_mark_dynamic_makes_the_first_compile_dynamic():
    def f(x):
        return torch.nn.functional.relu(x).sum(0)
    cf = ember.compile(f, backend="eager")
    for b in (4, 7, 9):
        x = torch.randn(b, 3)
        ember.mark_dynamic(x, 0)
        _check(cf, f, x)
    assert graphs(cf) == 1


def test_mark_dynamic_min_max_bound_the_graph():
    def f(x):
        return x + 1
    cf = ember.compile(f, backend="eager")
    for b in (4, 8, 16):
        x = torch.randn(b)
        ember.mark_dynamic(x, 0, min=2, max=8)
        _check(cf, f, x)
    assert graphs(cf) == 2  # 16 is outside [2, 8]
    assert any("(x).size(0) <= 8" in g for g in ember.captures(cf)[1].guards)


def test_mark_dynamic_forced_constant_names_dimension_line_and_way_out():
    def f(x):
        return x + torch.ones(8)  # broadcasting forces x.size(0) == 8
    cf = ember.compile(f, backend="eager")
    x = torch.randn(8)
    ember.mark_dynamic(x, 0)
    with pytest.raises(ember.DynamicShapeError) as ei:
        cf(x)
    msg = str(ei.value)
    assert "dimension 0 of x" in msg
    assert f"{__file__}:" in msg and "torch.ones(8)" in msg
    assert "mark_dynamic" in msg and "constant 8" in msg
    assert "ShapeEnv" not in msg and "Constraint" not in msg


def test_mark_static_wins_over_dynamic_true():
    def f(x):
        return x * 2
    cf = ember.compile(f, backend="eager", dynamic=True)
    for b in (3, 4, 5):
        x = torch.randn(b, 6)
        ember.mark_static(x, 0)
        _check(cf, f, x)
    assert graphs(cf) == 3
    assert any("(x).size(0) == 5" in g for g in ember.captures(cf)[0].guards)


def test_mark_dynamic_bad_dim():
    with pytest.raises(IndexError, match="out of range"):
        ember.mark_dynamic(torch.randn(3), 2)


def test_recompile_reason_names_the_guard_and_its_line(caplog):
    def f(x):
        if x.size(0) > 8:  # the guard's line
            return x * 2
        return x + 1
    cf = ember.compile(f, backend="eager", dynamic=True)
    with caplog.at_level(logging.INFO, logger="ember.recompiles"):
        for n in (3, 5, 9):
            _check(cf, f, torch.randn(n))
    assert graphs(cf) == 2
    reasons = [r.getMessage() for r in caplog.records if r.name == "ember.recompiles"]
    assert len(reasons) == 1
    assert "(x).size(0) <= 8" in reasons[0]
    assert f"{__file__}:" in reasons[0] and "if x.size(0) > 8:" in reasons[0]


def test_guards_log_shows_shape_guards_with_their_lines(caplog):
    def f(x, y):
        return x + y  # broadcasting two dynamic sizes: they must be equal
    cf = ember.compile(f, backend="eager", dynamic=True)
    with caplog.at_level(logging.INFO, logger="ember.guards"):
        _check(cf, f, torch.randn(5), torch.randn(6)[:5])
    text = caplog.text
    assert "(x).size(0)" in text and "(y).size(0)" in text
    assert "return x + y" in text


def test_ember_logs_guards_prints_shape_guards(py):
    r = py("""
        import torch, ember
        def f(x):
            if x.size(0) > 8:
                return x * 2
            return x
        ember.compile(f, backend="eager", dynamic=True)(torch.randn(4))
    """, env={"EMBER_LOGS": "guards"})
    assert r.returncode == 0, r.stderr
    assert "(x).size(0) <= 8  # <string>:" in r.stderr, r.stderr
    assert "(x).size(0) >= 2" in r.stderr


def test_data_dependent_sizes_break_the_graph_and_stay_right():
    def f(x):
        y = x[x > 0]  # nonzero: a size only the data knows
        return y * 2, x.sum()
    cf = ember.compile(f, backend="eager", dynamic=True)
    for n in (4, 6, 9):
        x = torch.randn(n)
        got, exp = cf(x), f(x)
        torch.testing.assert_close(got[0], exp[0])
        torch.testing.assert_close(got[1], exp[1])


def test_item_used_as_a_size_is_never_wrong():
    def f(x, k):
        n = int(k.sum().item())
        return torch.arange(n) + x.size(0)
    cf = ember.compile(f, backend="eager", dynamic=True)
    for n, k in ((3, 2), (4, 5), (5, 7)):
        x, kt = torch.randn(n), torch.tensor([k])
        torch.testing.assert_close(cf(x, kt), f(x, kt))


def test_compile_context_carries_the_fake_mode():
    seen = []

    def backend(gm, example_inputs, *, context=None):
        seen.append((context.fake_mode, [i.kind for i in context.inputs], list(example_inputs)))
        return gm.forward
    be = ember.Backend(name="ctx_probe", compile=backend)

    def f(x, n):
        return x * n
    cf = ember.compile(f, backend=be, dynamic=True)
    cf(torch.randn(4), 3)
    fm, kinds, ex = seen[-1]
    assert fm is not None and fm.shape_env is not None
    assert "symint" in kinds
    assert all(type(v) in (torch.Tensor, int) for v in ex)  # real values, not fakes
    ember.reset()
    seen.clear()
    cf2 = ember.compile(f, backend=be, dynamic=False)
    cf2(torch.randn(4), 3)
    assert seen[-1][0] is None


def test_mark_dynamic_is_honoured_with_dynamic_false():
    def f(x):
        return x.sum(0)
    cf = ember.compile(f, backend="eager", dynamic=False)
    for b in (3, 4, 5):
        x = torch.randn(b, 2)
        ember.mark_dynamic(x, 0)
        _check(cf, f, x)
    assert graphs(cf) == 1


def test_resume_functions_follow_the_dynamic_mode():
    def f(x):
        y = x * 2
        print("graph break")  # the rest runs in a resume function Ember compiles
        return y + x.size(0)
    for mode, expected in ((False, 6), (None, 4)):
        ember.reset()
        cf = ember.compile(f, backend="eager", dynamic=mode)
        for n in (3, 4, 5):
            _check(cf, f, torch.randn(n))
        assert graphs(cf) == expected, mode  # two graphs per compile of the frame


def test_a_resume_function_rebuilt_from_disk_recompiles_as_a_traced_one(tmp_path, monkeypatch):
    """A capture rebuilt from the on-disk cache remembers every size the traced one saw, also a
    tensor's that is no graph input (only ``x.size(0)`` read): its first recompile makes both
    sizes symbolic at once, as after a traced first capture, instead of compiling a third time."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))

    def f(x):
        y = x * 2
        print("graph break")
        return y + x.size(0)
    for run in ("traced", "rebuilt"):
        ember.reset()  # the in-process caches go; what was persisted stays
        cf = ember.compile(f, backend="eager")
        for n in (3, 4, 5):
            _check(cf, f, torch.randn(n))
        assert graphs(cf) == 4, run


def test_a_dynamic_capture_that_fails_compiles_static_shapes_instead():
    table = {}

    def f(x, n):
        table[n] = True  # a SymInt is not hashable: the dynamic capture fails, static works
        return x + n
    cf = ember.compile(f, backend="eager")
    x = torch.randn(3)
    for n in (1, 2, 3):
        _check(cf, f, x, n)
    assert graphs(cf) == 3
    assert ember.events.counters["stats"].get("fallbacks", 0) == 0


def test_sizes_turned_into_text_or_returned_in_containers_are_the_real_values():
    def f(x):
        return f"shape={x.shape}", [x.size(0), x.shape], str(x.size(1)), x * 2
    cf = ember.compile(f, backend="eager")
    for n in (2, 3, 4, 6):
        x = torch.randn(n, n + 1)
        got, exp = cf(x), f(x)
        assert got[:3] == exp[:3]
        assert type(got[1][1]) is torch.Size
        torch.testing.assert_close(got[3], exp[3])
