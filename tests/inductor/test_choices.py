"""Choices decided by timing on the machine at hand (ember_inductor/autotune.py): a fake timer
decides (nothing here asserts a time), the winner is cached on disk under a key that names the
CPU model, its ISA, the thread count and torch's version, a second compile -- in this process or
a new one -- reads it and times nothing, the per-compile budget bounds the timing, and options
force a choice."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch
from torch import nn

import ember
from ember_inductor import autotune, layout, patterns


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "cache"))
    ember.reset()
    yield
    ember.reset()


def _fake(monkeypatch, prefer: dict[str, str] | str) -> list[list[str]]:
    """The timer replaced: the candidate named ``prefer`` (or, by candidate set, ``prefer[x]``
    for the set containing x) wins; candidates are never run. Returns what it was asked."""
    asked: list[list[str]] = []

    def fake(cands):
        names = sorted(cands)
        asked.append(names)
        want = prefer if isinstance(prefer, str) else next(
            (v for v in prefer.values() if v in names), names[0])
        return {n: (1.0 if n == want else 2.0) for n in names}

    monkeypatch.setattr(autotune, "_time_all", fake)
    return asked


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def test_fake_timer_decides_and_the_entry_names_the_machine(monkeypatch, tmp_path):
    asked = _fake(monkeypatch, "b")
    cands = {"a": lambda: None, "b": lambda: None}
    timed = autotune.counters["timed"]
    assert autotune.choose("unit", ("sig", 1), cands) == "b"
    assert asked == [["a", "b"]] and autotune.counters["timed"] == timed + 1
    recs = [json.loads(json.loads(p.read_text())["text"])
            for p in (tmp_path / "cache").rglob("*.json")]
    rec = next(r for r in recs if isinstance(r, dict) and r.get("kind") == "unit")
    assert rec["choice"] == "b"
    m = rec["machine"]
    assert m["threads"] == torch.get_num_threads() and m["torch"] == torch.__version__
    assert len(m["isa"]) == 16
    if _cpu_model():
        assert m["cpu"] == _cpu_model()
    # the second time it is read, not timed
    cached = autotune.counters["cached"]
    assert autotune.choose("unit", ("sig", 1), cands) == "b"
    assert len(asked) == 1 and autotune.counters["cached"] == cached + 1


def test_key_changes_with_cpu_isa_and_threads(monkeypatch):
    asked = _fake(monkeypatch, "a")
    cands = {"a": lambda: None, "b": lambda: None}
    autotune.choose("unit", "s", cands)
    key = autotune.machine_key()
    model, isa = autotune._cpu()
    assert repr(model) in key and repr(isa) in key
    # another CPU model, another ISA, another thread count: each decides again
    for cpu in [("Another CPU", isa), (model, "0" * 16)]:
        monkeypatch.setattr(autotune, "_cpu", lambda cpu=cpu: cpu)
        autotune.choose("unit", "s", cands)
    monkeypatch.setattr(autotune, "_cpu", lambda: (model, isa))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 977)
    assert "977" in autotune.machine_key()
    autotune.choose("unit", "s", cands)
    assert len(asked) == 4


def test_spent_budget_takes_the_default_untimed(monkeypatch):
    asked = _fake(monkeypatch, "b")
    cands = {"a": lambda: None, "b": lambda: None}
    with autotune.session(0.0):
        assert autotune.choose("unit", "budget", cands, default="a") == "a"
    assert asked == []
    assert autotune.lookup("unit", "budget", list(cands)) is None  # and nothing cached


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 6 * 6, 256)
        self.fc2 = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc(y)))


def _compile_and_check(options=None) -> None:
    torch.manual_seed(0)
    eager = Net().eval()
    f = ember.compile(copy.deepcopy(eager), backend="inductor", options=options or {})
    x = torch.randn(64, 4, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(f(x), eager(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("conv_layout", ["channels_last", "contiguous"])
def test_compile_follows_the_timing_then_a_warm_compile_times_nothing(monkeypatch,
                                                                      conv_layout):
    asked = _fake(monkeypatch, {"conv": conv_layout, "linear": "transposed",
                                "lib": "onednn"})
    convs = layout.counters["conv"]
    _compile_and_check()
    kinds = {tuple(a) for a in asked}
    assert ("channels_last", "contiguous") in kinds
    assert any("mkl_packed" in a or "transposed" in a for a in kinds)  # frozen linears
    assert (layout.counters["conv"] > convs) == (conv_layout == "channels_last")
    # a second compile of the same model (as a new process would do it: fresh in-memory
    # state, same disk cache) reads every choice and times nothing
    ember.reset()
    n, timed = len(asked), autotune.counters["timed"]
    cached = autotune.counters["cached"]
    _compile_and_check()
    assert len(asked) == n and autotune.counters["timed"] == timed
    assert autotune.counters["cached"] > cached


def test_options_force_the_choices(monkeypatch):
    asked = _fake(monkeypatch, "onednn")
    _compile_and_check({"onednn_linear": False, "layout_opt": False})
    assert asked == []


@pytest.mark.skipif(patterns.linear_op() is None, reason="torch built without oneDNN")
def test_warm_start_in_a_new_process_times_nothing(py, tmp_path):
    code = textwrap.dedent("""
        import json, torch, ember
        from torch import nn
        from ember_inductor import autotune
        from ember_inductor.runtime import cache
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).eval()
        f = ember.compile(m, backend="inductor")
        with torch.no_grad():
            torch.testing.assert_close(f(torch.ones(64, 256)), m(torch.ones(64, 256)),
                                       rtol=1e-4, atol=1e-4)
        print(json.dumps({**autotune.counters, "builds": cache.counters["builds"]}))
    """)
    env = {"EMBER_CACHE_DIR": str(tmp_path / "shared")}
    runs = []
    for _ in range(2):
        r = py(code, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs[0].get("timed", 0) >= 1
    assert runs[1].get("timed", 0) == 0 and runs[1].get("cached", 0) >= 1
    assert runs[1]["builds"] == 0


# -- the OpenMP threshold, calibrated once per machine -----------------------------------------

def test_threshold_from_measurements():
    from ember_inductor.calibrate import MAX_WORK, MIN_WORK, threshold_from

    # parallel faster from 32768 elements on (the 8192 win is not kept: 16384 loses)
    times = {1 << k: (1.0, 2.0) for k in range(10, 15)}
    times.update({1 << 13: (1.0, 0.5), 1 << 15: (2.0, 1.0), 1 << 16: (4.0, 2.0)})
    assert threshold_from(times) == 1 << 15
    assert threshold_from({1 << 10: (2.0, 1.0), 1 << 20: (2.0, 1.0)}) == MIN_WORK
    assert threshold_from({1 << 20: (1.0, 1.5)}) == MAX_WORK  # never pays: clamped


def test_calibration_is_measured_once_and_cached(monkeypatch):
    from ember_inductor import calibrate

    monkeypatch.setattr(calibrate, "override", [None])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    calls = []

    def fake():
        calls.append(1)
        return {1 << 12: (1.0, 2.0), 1 << 13: (2.0, 1.0), 1 << 14: (4.0, 1.0)}

    monkeypatch.setattr(calibrate, "_measure", fake)
    calibrate._calibrated.cache_clear()
    assert calibrate.parallel_min_work() == 1 << 13
    calibrate._calibrated.cache_clear()  # a new process: read from disk, not measured
    assert calibrate.parallel_min_work() == 1 << 13 and len(calls) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert calibrate.parallel_min_work() == calibrate.SERIAL  # one thread: never parallel
    assert len(calls) == 1
    calibrate._calibrated.cache_clear()


def test_generated_code_reads_the_threshold():
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember_inductor.compile_fx import generate_source

    def f(x):
        return (torch.exp(x) * 2 + 1,)

    gm = make_fx(f)(torch.randn(64, 64))  # 4096 elements
    srcs = [generate_source(gm, key=f"thr{n}", options={"parallel_min_work": n})[0]
            for n in (1024, 1 << 20)]
    assert "omp parallel for" in srcs[0] and "omp parallel for" not in srcs[1]


@pytest.mark.parametrize("check", ["content", "version"])
def test_derived_weight_variants_pay_for_the_content_check(monkeypatch, check):
    # a pre-transposed or packed weight makes the weight a watched input (freezing's per-call
    # content check): the timed call of those variants includes the comparison
    from ember_inductor.runtime import compare

    compared = []
    real = compare.same_contents
    monkeypatch.setattr(compare, "same_contents", lambda a, b: compared.append(1) or real(a, b))
    ran: dict[str, int] = {}

    def once(cands):
        for name, fn in cands.items():
            n = len(compared)
            fn()
            ran[name] = len(compared) - n
        return {n: 1.0 for n in cands}

    monkeypatch.setattr(autotune, "_time_all", once)
    W, B = torch.randn(64, 32), torch.randn(64)
    xm = torch.empty(4, 32)
    names = ["addmm", "transposed"] + (["mkl_packed"] if torch.backends.mkl.is_available()
                                       else [])
    autotune._time_linear(("t", check), names, xm, W, B, 4, None, check)
    derived = 1 if check == "content" else 0
    assert ran["addmm"] == 0 and ran["transposed"] == derived
    if "mkl_packed" in ran:
        assert ran["mkl_packed"] == derived


@pytest.mark.parametrize("winner", ["aten", "onednn"])
def test_convolution_library_follows_the_timing(monkeypatch, winner):
    # a 1x1 convolution with a bias, channels-last: aten.convolution or oneDNN's own entry,
    # as timed; either gives eager's result
    asked = _fake(monkeypatch, {"layout": "channels_last", "lib": winner})
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(8, 16, 1), nn.Hardtanh(0.0, 6.0), nn.Conv2d(16, 8, 3, padding=1,
                                                                          groups=8)).eval()
    before = layout.counters["conv_onednn"]
    f = ember.compile(copy.deepcopy(m), backend="inductor", options={"freezing": False})
    x = torch.randn(2, 8, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    assert any(a == ["aten", "onednn"] for a in asked)
    assert (layout.counters["conv_onednn"] - before == 2) == (winner == "onednn")
