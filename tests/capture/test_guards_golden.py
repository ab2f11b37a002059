"""Golden snapshots of generated guards and entry source ("process replay" for capture): a
change in what Ember generates for these programs shows up here as a diff to review.

To accept an intended change, print the new text (``ember.last_capture().entry_source``) and
paste it below."""

from __future__ import annotations

import difflib

import pytest
import torch

import ember


def add_scaled(x, y, alpha=2.0):
    return x + alpha * y


def make_mul(k):
    def mul(t):
        return t * k
    return mul


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, x):
        return torch.relu(self.fc(x)) + self.shift


def with_break(x):
    y = x.sin()
    print("side effect")
    return y.cos()


def _run_add():
    ember.compile(add_scaled, backend="eager")(torch.randn(3), torch.randn(3))
    return ember.last_capture().entry_source


def _run_closure():
    ember.compile(make_mul(1.5), backend="eager")(torch.randn(3))
    return ember.last_capture().entry_source


def _run_module():
    ember.compile(Block(), backend="eager")(torch.randn(2, 4))
    c = ember.last_capture()
    return c.entry_source + c.graph.code


def _run_break():
    f = ember.compile(with_break, backend="eager")
    f(torch.randn(3))
    return "".join(c.entry_source for c in ember.captures(f))


PROGRAMS = {"add": _run_add, "closure": _run_closure, "module": _run_module,
            "break": _run_break}

GOLDEN = {
    'add': (
        'def ___entry(___fn, x, y, alpha):\n'
        '    try:\n'
        '        if not (___fn.__defaults__ is ___defaults_4 and\n'
        '            ___torch.is_grad_enabled() is False and\n'
        '            ___torch.get_default_dtype() is ___dtype_0 and\n'
        "            not ___torch.is_autocast_enabled('cpu') and\n"
        "            not ___torch.is_autocast_enabled('cuda') and\n"
        '            type(x) is ___Tensor_1 and (x).dtype is ___dtype_0 and (x).device == ___device_2 and (x).shape == (3,) and (x).stride() == (1,) and (x).requires_grad is False and\n'
        '            type(y) is ___Tensor_1 and (y).dtype is ___dtype_0 and (y).device == ___device_3 and (y).shape == (3,) and (y).stride() == (1,) and (y).requires_grad is False and\n'
        '            type(alpha) is float and (alpha) == 2.0 and\n'
        '            len({id(x), id(y)}) == 2):\n'
        '            return ___MISS\n'
        '    except Exception:\n'
        '        return ___MISS\n'
        '    ___o = ___compiled(x, y)\n'
        '    ___p0 = ___o[0]\n'
        '    return ___p0\n'
    ),
    'closure': (
        'def ___entry(___fn, t):\n'
        '    try:\n'
        '        if not (___torch.is_grad_enabled() is False and\n'
        '            ___torch.get_default_dtype() is ___dtype_0 and\n'
        "            not ___torch.is_autocast_enabled('cpu') and\n"
        "            not ___torch.is_autocast_enabled('cuda') and\n"
        '            type(t) is ___Tensor_1 and (t).dtype is ___dtype_0 and (t).device == ___device_2 and (t).shape == (3,) and (t).stride() == (1,) and (t).requires_grad is False and\n'
        '            type(___fn.__closure__[0].cell_contents) is float and (___fn.__closure__[0].cell_contents) == 1.5):\n'
        '            return ___MISS\n'
        '    except Exception:\n'
        '        return ___MISS\n'
        '    ___o = ___compiled(t)\n'
        '    ___p0 = ___o[0]\n'
        '    return ___p0\n'
    ),
    'module': (
        'def ___entry(___fn, self, x):\n'
        '    try:\n'
        '        if not (___fn.__globals__ is ___G and\n'
        "            not (self)._forward_pre_hooks and not (self)._forward_hooks and not (self)._backward_hooks and not (self)._backward_pre_hooks and 'forward' not in (self).__dict__ and type(self).forward is ___fn and\n"
        '            not (___torch.nn.modules.module._global_forward_hooks or ___torch.nn.modules.module._global_forward_pre_hooks or ___torch.nn.modules.module._global_backward_hooks or ___torch.nn.modules.module._global_backward_pre_hooks) and\n'
        '            ___torch.is_grad_enabled() is False and\n'
        '            ___torch.get_default_dtype() is ___dtype_0 and\n'
        "            not ___torch.is_autocast_enabled('cpu') and\n"
        "            not ___torch.is_autocast_enabled('cuda') and\n"
        "            (___G['torch']) is ___torch_1 and\n"
        '            (self) is ___Block_3 and\n'
        "            (self._modules['fc']) is ___Linear_4 and\n"
        '            type(x) is ___Tensor_5 and (x).dtype is ___dtype_0 and (x).device == ___device_6 and (x).shape == (2, 4) and (x).stride() == (4, 1) and (x).requires_grad is False and\n'
        '            not ___Linear_4._forward_pre_hooks and not ___Linear_4._forward_hooks and not ___Linear_4._backward_hooks and not ___Linear_4._backward_pre_hooks and\n'
        '            not (___module_mod_7._global_forward_hooks or ___module_mod_7._global_forward_pre_hooks or ___module_mod_7._global_backward_hooks or ___module_mod_7._global_backward_pre_hooks) and\n'
        "            'forward' not in ___dict_8 and\n"
        '            type(___Linear_4) is ___Linear_9 and\n'
        '            ___Linear_9.forward is ___forward_10 and\n'
        "            (___Linear_4._parameters['weight']) is ___p_14 and\n"
        "            (___Linear_4._parameters['bias']) is ___p_16 and\n"
        "            (___Block_3._buffers['shift']) is ___p_18 and\n"
        '            ___tensors_ok((___p_14, ___p_16, ___p_18,), ___tmeta_20)):\n'
        '            return ___MISS\n'
        '    except Exception:\n'
        '        return ___MISS\n'
        '    ___o = ___compiled(x, ___p_14, ___p_16, ___p_18)\n'
        '    ___p0 = ___o[0]\n'
        '    return ___p0\n'
        '\n'
        '\n'
        '\n'
        'def forward(self, l_x, l_self_fc_weight, l_self_fc_bias, l_self_shift):\n'
        '    linear = torch._C._nn.linear(l_x, l_self_fc_weight, l_self_fc_bias);  l_x = l_self_fc_weight = l_self_fc_bias = None\n'
        '    relu = torch.relu(linear);  linear = None\n'
        '    add = relu + l_self_shift;  relu = l_self_shift = None\n'
        '    return (add,)\n'
        '    '
    ),
    'break': (
        'def ___entry(___fn, x):\n'
        '    try:\n'
        '        if not (___fn.__globals__ is ___G and\n'
        '            ___torch.is_grad_enabled() is False and\n'
        '            ___torch.get_default_dtype() is ___dtype_0 and\n'
        "            not ___torch.is_autocast_enabled('cpu') and\n"
        "            not ___torch.is_autocast_enabled('cuda') and\n"
        '            type(x) is ___Tensor_1 and (x).dtype is ___dtype_0 and (x).device == ___device_2 and (x).shape == (3,) and (x).stride() == (1,) and (x).requires_grad is False and\n'
        "            'print' not in ___G and\n"
        "            (___builtins_3['print']) is ___print_4):\n"
        '            return ___MISS\n'
        '    except Exception:\n'
        '        return ___MISS\n'
        '    ___o = ___compiled(x)\n'
        '    ___p0 = ___print_4\n'
        "    ___p1 = 'side effect'\n"
        '    ___p2 = x\n'
        '    ___p3 = ___o[0]\n'
        '    ___res = ___p0(___p1)\n'
        '    return ___resume_5(___p2, ___p3, ___res)\n'
        'def ___entry(___fn, x, y, ___stack2):\n'
        '    try:\n'
        '        if not (___torch.is_grad_enabled() is False and\n'
        '            ___torch.get_default_dtype() is ___dtype_0 and\n'
        "            not ___torch.is_autocast_enabled('cpu') and\n"
        "            not ___torch.is_autocast_enabled('cuda') and\n"
        '            type(y) is ___Tensor_1 and (y).dtype is ___dtype_0 and (y).device == ___device_2 and (y).shape == (3,) and (y).stride() == (1,) and (y).requires_grad is False):\n'
        '            return ___MISS\n'
        '    except Exception:\n'
        '        return ___MISS\n'
        '    ___o = ___compiled(y)\n'
        '    ___p0 = ___o[0]\n'
        '    return ___p0\n'
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_generated_source_matches_golden(name, capsys):
    ember.reset()
    torch.manual_seed(0)
    with torch.no_grad():
        got = PROGRAMS[name]()
    want = GOLDEN[name]
    if got != want:
        diff = "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "golden",
                                              "generated", lineterm=""))
        pytest.fail(f"generated source for {name!r} changed:\n{diff}")


def test_capture_artifact_describes_inputs():
    ember.reset()
    m = Block()
    with torch.no_grad():
        ember.compile(m, backend="eager")(torch.randn(2, 4))
    cap = ember.last_capture()
    assert [i.kind for i in cap.inputs] == ["user", "parameter", "parameter", "buffer"]
    assert cap.inputs[0].source == "x" and not cap.inputs[0].stable_address
    assert cap.inputs[3].source == "self._buffers['shift']" and cap.inputs[3].stable_address
    assert cap.parameter_sources == ["self._modules['fc']._parameters['weight']",
                                     "self._modules['fc']._parameters['bias']",
                                     "self._buffers['shift']"]
    assert cap.example_inputs is None  # not kept alive after compiling
    assert cap.graph_id.startswith("forward_test_guards_golden_")
    assert "def ___entry(___fn, self, x):" in cap.entry_source
    assert any("is ___Block" in g for g in cap.guards)
    text = cap.readable()
    assert "class EmberGraph" in text and "# guards" in text and "# entry" in text


def test_graph_nodes_carry_the_users_file_and_line():
    ember.reset()
    with torch.no_grad():
        ember.compile(Block(), backend="eager")(torch.randn(2, 4))
    gm = ember.last_capture().graph
    relu = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.relu)
    trace = relu.meta["stack_trace"]
    assert __file__ in trace and "in forward" in trace
    assert "return torch.relu(self.fc(x)) + self.shift" in trace
    assert "test_guards_golden.py" in gm.print_readable(print_output=False)


def test_captures_lists_the_graphs_around_a_break():
    ember.reset()
    f = ember.compile(with_break, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(f(x), x.sin().cos())
    caps = ember.captures(f)
    assert len(caps) == 2
    assert caps[0].break_reason and "print" in caps[0].break_reason
    assert all(c.graph is not None for c in caps)
