"""The cudagraphs runtime's bookkeeping on the CPU, with fake graphs (cudagraph_fakes.py here):
warm-up then record then replay per input shape, the recording limit, parameter addresses,
outputs invalidated only when a later replay may overwrite them and only from earlier steps,
pending backwards, in-place reads of another recording's outputs."""

from __future__ import annotations

import logging

import pytest
import torch

import ember
from ember_cudagraphs import runtime
from ember_cudagraphs.runtime import CUDAGraphed, Pool

from cudagraph_fakes import FakeOps, was_killed

CPU = torch.device("cpu")


@pytest.fixture
def fake():
    ops = FakeOps()
    prev = runtime.set_ops(ops)
    yield ops
    runtime.set_ops(prev)


def _graphed(fn, *, kind="inference", static=(), limit=16, pool=None, name="g.inference"):
    return CUDAGraphed(fn, name=name, kind=kind, pool=pool or Pool("g", CPU),
                       static_inputs=static, max_recordings=limit)


def _affine(x, w):
    return (x * w + 1, (x * w).sum(0))


def test_warmup_then_record_then_replay_per_shape(fake):
    w = torch.randn(3)
    g = _graphed(_affine, static=[1])
    for n in (2, 2, 2, 4, 4, 2):
        x = torch.randn(n, 3)
        out = g(x, w)
        torch.testing.assert_close(out[0], x * w + 1)
        torch.testing.assert_close(out[1], (x * w).sum(0))
        assert isinstance(out, tuple)
        del out  # (kept across the next call, it would be invalidated: see below)
    assert g.stats == {"warmup": 2, "record": 2, "replay": 2, "eager": 0, "killed": 0}
    assert len(fake.graphs) == 2 and fake.graphs[0].replays == 3


def test_replayed_outputs_are_fresh_tensors_over_the_recording_memory(fake):
    w = torch.randn(3)
    g = _graphed(_affine, static=[1])
    x = torch.randn(2, 3)
    g(x, w), g(x, w)
    a = g(x, w)
    b = g(x, w)
    assert a[0] is not b[0]
    assert a[0].data_ptr() == b[0].data_ptr()  # same static memory ...
    assert a[0].untyped_storage()._cdata != b[0].untyped_storage()._cdata  # ... own storages
    # a's outputs were referenced when b's replay overwrote them: invalidated, not silently
    # changed (the inference graph starts a new step on every call)
    assert was_killed(fake, a[0]) and was_killed(fake, a[1])
    assert not was_killed(fake, b[0])


def test_outputs_dropped_before_the_next_call_are_not_invalidated(fake):
    w = torch.randn(3)
    g = _graphed(_affine, static=[1])
    x = torch.randn(2, 3)
    for _ in range(5):
        g(x, w)  # result dropped at once
    assert g.stats["replay"] == 3 and g.stats["killed"] == 0 and not fake.killed


def test_user_inputs_are_copied_and_parameters_read_in_place(fake):
    w = torch.randn(3)
    g = _graphed(_affine, static=[1])
    x = torch.randn(2, 3)
    g(x, w), g(x, w)
    rec = next(iter(g.recordings.values()))
    assert [r[0] for r in rec.in_place] == [1] and [i for i, _ in rec.copied] == [0]
    x2 = torch.randn(2, 3)
    torch.testing.assert_close(g(x2, w)[0], x2 * w + 1)  # the new value reached the buffer
    with torch.no_grad():
        w.mul_(2)  # an optimizer step: in place, same address
    torch.testing.assert_close(g(x2, w)[0], x2 * w + 1)


def test_a_moved_parameter_records_again(fake, caplog):
    w = torch.randn(3)
    g = _graphed(_affine, static=[1])
    x = torch.randn(2, 3)
    g(x, w), g(x, w)
    w2 = torch.randn(3)  # replaced (load_state_dict(assign=True), .to(), ...)
    with caplog.at_level(logging.INFO, logger="ember.cudagraphs"):
        out = g(x, w2)
    torch.testing.assert_close(out[0], x * w2 + 1)
    assert "moved" in caplog.text and "recording again" in caplog.text
    assert g.stats["record"] == 2 and len(g.recordings) == 1


def test_recording_limit_then_runs_without_graphs_with_one_warning(fake, caplog):
    g = _graphed(lambda x: (x + 1,), limit=2)
    with caplog.at_level(logging.WARNING, logger="ember.cudagraphs"):
        for n in (1, 1, 2, 2, 3, 3, 4, 4, 1):
            x = torch.randn(n)
            torch.testing.assert_close(g(x)[0], x + 1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "max_recordings=2" in msg and "mark_dynamic" in msg and "pad" in msg
    assert g.stats["record"] == 2 and g.stats["eager"] == 4 and g.stats["replay"] == 1


def test_forward_called_twice_before_backward_runs_the_second_without_graphs(fake):
    """The activations the first call saved are still referenced (its backward is pending):
    a replay would overwrite them, so the second call runs as it is."""
    pool = Pool("m", CPU)
    fw = _graphed(lambda x: (x * 2, x.sin()), kind="forward", pool=pool, name="m.forward")
    bw = _graphed(lambda s, t: (s.cos() * t,), kind="backward", pool=pool, name="m.backward")
    x = torch.randn(4)
    for _ in range(2):  # warm-up, then recording of both graphs
        out, saved = fw(x)
        bw(saved, torch.ones(4))
    rec_fw = next(iter(fw.recordings.values()))
    rec_bw = next(iter(bw.recordings.values()))
    assert rec_fw.saved_groups == {1}  # the backward reads the saved sine in place
    assert [r[3] for r in rec_bw.in_place] == ["pool"]
    del out, saved
    out1, saved1 = fw(x)  # replay, new step
    out2, saved2 = fw(x + 1)  # saved1 pending: no replay over it
    assert fw.stats["eager"] == 1
    torch.testing.assert_close(saved1, x.sin())
    torch.testing.assert_close(bw(saved1, torch.ones(4))[0], x.sin().cos())
    torch.testing.assert_close(bw(saved2, torch.ones(4))[0], (x + 1).sin().cos())
    assert not was_killed(fake, saved1) and not was_killed(fake, out1)


def test_mark_step_begin_lets_a_replay_reuse_what_is_still_referenced(fake):
    pool = Pool("m", CPU)
    fw = _graphed(lambda x: (x.sin(),), kind="forward", pool=pool, name="m.forward")
    bw = _graphed(lambda s: (s.cos(),), kind="backward", pool=pool, name="m.backward")
    x = torch.randn(4)
    for _ in range(2):
        (s,) = fw(x)
        bw(s)
    del s  # backward done, activation released
    (kept,) = fw(x)  # a forward whose backward never runs, its activation kept
    (again,) = fw(x)
    assert fw.stats["eager"] == 1  # same step: not overwritten
    ember.cudagraph_mark_step_begin()
    (third,) = fw(x)
    assert fw.stats["replay"] == 2 and was_killed(fake, kept)
    torch.testing.assert_close(third, x.sin())


def test_a_later_recording_outputs_conflict_with_an_earlier_replay(fake):
    """Outputs of recordings made after R may lie in R's temporaries: R's replay invalidates
    them (earlier step), while R's outputs never move under a later recording's replay."""
    g = _graphed(lambda x: (x + 1,))
    a, b = torch.randn(2), torch.randn(3)
    g(a), g(a), g(b), g(b)  # records shape 2, then shape 3
    out2 = g(a)[0]
    out3 = g(b)[0]  # the later recording: does not overwrite out2
    assert not was_killed(fake, out2)
    out2b = g(a)[0]  # the earlier one: out3 may be in its temporaries
    assert was_killed(fake, out3) and was_killed(fake, out2) and not was_killed(fake, out2b)


def test_outputs_that_are_inputs_or_views_of_inputs_follow_the_call(fake):
    w = torch.randn(2, 3)
    g = _graphed(lambda x, w: (x, w, w[0], x[1:], x * w), static=[1])
    for _ in range(3):
        x = torch.randn(2, 3)
        out = g(x, w)
        assert out[0] is x and out[1] is w
        assert out[2].data_ptr() == w.data_ptr() and out[3].data_ptr() == x[1:].data_ptr()
        torch.testing.assert_close(out[4], x * w)


def test_non_tensor_outputs_and_none(fake):
    g = _graphed(lambda x: [x * 2, None, 3])
    x = torch.randn(2)
    for _ in range(3):
        out = g(x)
        assert isinstance(out, list) and out[1] is None and out[2] == 3
        torch.testing.assert_close(out[0], x * 2)


def test_a_refused_graph_runs_as_it_is(fake, caplog):
    with caplog.at_level(logging.INFO, logger="ember.cudagraphs"):
        g = CUDAGraphed(lambda x: (x + 1,), name="r.inference", kind="inference",
                        pool=Pool("r", CPU), refused="it synchronizes with the host: item")
    x = torch.randn(2)
    for _ in range(3):
        torch.testing.assert_close(g(x)[0], x + 1)
    assert g.stats["eager"] == 3 and not fake.graphs
    assert "runs without CUDA graphs: it synchronizes" in caplog.text


def test_a_failed_recording_falls_back_for_that_shape(fake, caplog, monkeypatch):
    g = _graphed(lambda x: (x + 1,))
    x = torch.randn(2)
    g(x)

    def boom(*a, **k):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(fake, "record", boom)
    with caplog.at_level(logging.WARNING, logger="ember.cudagraphs"):
        for _ in range(2):
            torch.testing.assert_close(g(x)[0], x + 1)
    assert "recording g.inference failed" in caplog.text and g.stats["eager"] == 2


def test_inside_a_user_capture_the_callable_runs_as_is(fake):
    g = _graphed(lambda x: (x + 1,))
    fake.capturing = True
    g(torch.randn(2)), g(torch.randn(2))
    assert not fake.graphs and g.stats["warmup"] == 0


def test_an_internal_failure_while_replaying_runs_as_is_from_then_on(fake, caplog, monkeypatch):
    g = _graphed(lambda x: (x + 1,))
    x = torch.randn(3)
    g(x), g(x)

    def broken(*a):
        raise TypeError("incompatible function arguments")

    monkeypatch.setattr(fake, "alias_storage", broken)
    with caplog.at_level(logging.WARNING, logger="ember.cudagraphs"):
        for _ in range(3):
            torch.testing.assert_close(g(x)[0], x + 1)
    assert "from now on after an internal error: TypeError" in caplog.text
    assert g.refused and not g.recordings


def test_a_program_error_propagates_and_keeps_the_graphs(fake):
    g = _graphed(lambda x: (x.view(5),))  # needs 5 elements
    g(torch.randn(5)), g(torch.randn(5))
    with pytest.raises(RuntimeError, match="invalid for input of size 3"):
        g(torch.randn(3))
    assert g.refused is None and g.recordings


def test_a_backward_records_again_when_its_forward_did(fake):
    """A parameter only the forward reads moves: the forward records again, so the
    activations move; the backward must follow (not run without graphs for ever)."""
    from ember_cudagraphs.runtime import for_graph
    from ember.context import InputInfo

    fw = for_graph(lambda x, w: ((x * w).sum(), (x * w).sin()), name="p.forward",
                   kind="forward", device=CPU,
                   inputs=[InputInfo("user", "x", False), InputInfo("parameter", "w", True)])
    bw = for_graph(lambda s, t: (s.cos() * t,), name="p.backward", kind="backward", device=CPU,
                   inputs=[InputInfo("activation", "", False), InputInfo("tangent", "", False)])
    assert bw.pool is fw.pool and fw.saved_tail == 1
    x, w = torch.randn(4), torch.randn(4)
    t = torch.ones(4)
    for step in range(6):
        if step == 3:
            w = w.clone()  # moved (as p.data = ... would)
        _, s = fw(x, w)
        torch.testing.assert_close(bw(s, t)[0], (x * w).sin().cos())
        del s
    assert fw.stats["record"] == 2 and bw.stats["record"] == 2
    assert fw.stats["eager"] == 0 and bw.stats["eager"] == 0
    assert fw.stats["replay"] == 3 and bw.stats["replay"] == 3  # steps 2, 4 and 5


def test_an_output_that_is_also_saved_and_kept_does_not_block_the_next_step(fake):
    """tanh's output is returned and saved for the backward: keeping the returned one across
    the next step (out = f(x) in a loop) must not look like a pending backward."""
    from ember_cudagraphs.runtime import for_graph
    from ember.context import InputInfo

    def tanh_twice(x):
        y = x.tanh()
        return (y, y)  # one node, returned and saved

    fw = for_graph(tanh_twice, name="q.forward", kind="forward", device=CPU,
                   inputs=[InputInfo("user", "x", False)])
    bw = for_graph(lambda y, t: ((1 - y * y) * t,), name="q.backward", kind="backward",
                   device=CPU, inputs=[InputInfo("activation", "", False),
                                       InputInfo("tangent", "", False)])
    x, t = torch.randn(4), torch.ones(4)
    out = None
    for _ in range(5):
        out, saved = fw(x)  # the previous `out` is still referenced during this call
        bw(saved, t)
        del saved
    assert fw.stats["eager"] == 0 and fw.stats["replay"] == 3
    rec = next(iter(fw.recordings.values()))
    assert len(rec.groups) == 2 and rec.saved_groups == {1}


def test_recorded_under_inference_mode_replays_outside_it(fake):
    w = torch.randn(3)
    g = _graphed(_affine, static=[1])
    with torch.inference_mode():
        x = torch.randn(2, 3)
        g(x, w), g(x, w)  # warm-up, recording: the static buffer is not an inference tensor
        torch.testing.assert_close(g(x, w)[0], x * w + 1)
    x2 = torch.randn(2, 3)
    torch.testing.assert_close(g(x2, w)[0], x2 * w + 1)
    assert g.stats["replay"] == 2 and g.stats["eager"] == 0


def test_a_backward_records_though_an_activation_is_empty_or_moved_device(fake):
    """cuDNN batch norm saves an empty reserve tensor (no memory: never "ours"), and SDPA's seed
    comes from the CPU when the forward ran eagerly, from the GPU when it was replayed (a new
    key, but no second warm-up)."""
    from ember_cudagraphs.runtime import _key, _warm_key, for_graph
    from ember.context import InputInfo

    fw = for_graph(lambda x: (x.sum(), x.sin(), x.new_empty(0)), name="e.forward",
                   kind="forward", device=CPU, inputs=[InputInfo("user", "x", False)])
    bw = for_graph(lambda s, r, t: (s.cos() * t,), name="e.backward", kind="backward",
                   device=CPU, inputs=[InputInfo("activation", "", False),
                                       InputInfo("activation", "", False),
                                       InputInfo("tangent", "", False)])
    x, t = torch.randn(4), torch.ones(())
    for _ in range(4):
        _, s, r = fw(x)
        torch.testing.assert_close(bw(s, r, t)[0], x.sin().cos())
        del s, r
    assert bw.stats["record"] == 1 and bw.stats["replay"] == 2 and bw.stats["eager"] == 0
    k_cpu = _key([torch.ones(2)])
    k_meta = _key([torch.ones(2, device="meta")])
    assert k_cpu != k_meta and _warm_key(k_cpu) == _warm_key(k_meta)


def test_a_backward_whose_activations_never_come_from_the_recording_records_anyway(fake):
    """Its forward is recorded but always runs as is (its activations are never where the
    recording put them): after a few calls the backward records with copied inputs."""
    from ember_cudagraphs.runtime import for_graph
    from ember.context import InputInfo

    fw = for_graph(lambda x: (x.sum(), x.sin()), name="d.forward", kind="forward", device=CPU,
                   inputs=[InputInfo("user", "x", False)])
    bw = for_graph(lambda s, t: (s.cos() * t,), name="d.backward", kind="backward", device=CPU,
                   inputs=[InputInfo("activation", "", False), InputInfo("tangent", "", False)])
    x, t = torch.randn(4), torch.ones(())
    fw(x), fw(x)  # the forward is recorded
    for _ in range(7):
        s = x.sin()  # ... but these activations are not its outputs
        torch.testing.assert_close(bw(s, t)[0], x.sin().cos())
    assert bw.stats["eager"] == 3 and bw.stats["record"] == 1 and bw.stats["replay"] == 2


def test_warmups_and_captures_run_between_cleared_cublas_workspaces(monkeypatch):
    """A capture must not bake in a cuBLAS workspace that torch owns and others may free
    (torch's CUDA graph trees clear them around their recordings: the GPT-2 training crash with
    three CUDA-graph backends in one process). The real CudaOps clears them before and after
    each warm-up and capture; torch's CUDA calls are stubbed here (no GPU)."""
    import contextlib

    events = []

    class Graph:
        def register_generator_state(self, g):
            pass

    @contextlib.contextmanager
    def scope(*a, **k):
        events.append("enter")
        yield
        events.append("exit")

    class Stream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces",
                        lambda: events.append("clear"), raising=False)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", scope)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: Stream())
    ops = runtime.CudaOps()
    monkeypatch.setattr(ops, "side_stream", lambda d: Stream())

    def fn(x):
        events.append("run")
        return (x + 1,)

    with ops.warmup(CPU):
        fn(torch.ones(2))
    assert events == ["clear", "run", "clear"]
    events.clear()
    ops.record(fn, [torch.ones(2)], pool=None, device=CPU, gens=[])
    assert events == ["clear", "enter", "run", "exit", "clear"]
