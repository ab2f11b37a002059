"""The tensor-metadata guard (ember/capture/tensor_check.py): one guard for the dtype, device,
shape, strides and requires_grad of every parameter and buffer an entry is specialized on,
compared in C++ once Ember's extension is built, in Python before (or without) it. Both must
agree with the per-tensor guards they replace, and a compiled module must still follow every
change of a parameter's tensor."""

from __future__ import annotations

import itertools

import pytest
import torch

import ember
from ember.capture import tensor_check as tc


def _tensors():
    base = [torch.zeros(()), torch.zeros(0, 3), torch.randn(4, 5), torch.randn(4, 5).t(),
            torch.randn(2, 3, 4)[:, 1], torch.zeros(3, dtype=torch.bfloat16),
            torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.complex64), torch.randn(6)[::2],
            torch.nn.Parameter(torch.randn(3, 3)), torch.randn(3, 3, requires_grad=True),
            torch.randn(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)]
    return base


@pytest.fixture(scope="module")
def ext():
    e = tc.extension(wait=600)
    # CI has a compiler and torch's headers: the extension must build there
    assert e is not None, f"the C++ tensor check did not build ({tc._state})"
    return e


def test_extension_agrees_with_python_on_every_pair(ext):
    ts = _tensors()
    metas = [tc.meta_of(t) for t in ts]
    for t, m in itertools.product(ts, metas):
        want = tc._check_py((t,), (m,))
        assert ext.check((t,), ext.pack((m,))) is want, (t.shape, t.stride(), t.dtype, m)
    # all at once, and with one wrong in the middle
    assert ext.check(tuple(ts), ext.pack(tuple(metas))) is True
    bad = list(ts)
    bad[5] = bad[5].float()
    assert ext.check(tuple(bad), ext.pack(tuple(metas))) is False
    # length mismatches and non-tensors never pass
    assert ext.check(tuple(ts[:-1]), ext.pack(tuple(metas))) is False
    assert ext.check(tuple(ts) + (ts[0],), ext.pack(tuple(metas))) is False
    assert ext.check((1.0,), ext.pack((metas[0],))) is False
    assert tc._check_py((1.0,), (metas[0],)) is False
    # tensors without strides (a parameter whose data became sparse) miss, never crash
    sparse = torch.randn(4, 5).to_sparse()
    assert ext.check((sparse,), ext.pack((metas[2],))) is False
    assert tc.tensors_ok((sparse,), (metas[2],)) is False
    assert tc._check_py((sparse,), (metas[2],)) is False


def test_the_entry_checks_parameters_with_one_guard():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    f = ember.compile(m, backend="eager")
    with torch.no_grad():
        f(torch.randn(3, 4))
    cap = ember.last_capture()
    assert cap.entry_source.count("___tensors_ok(") == 1
    import re

    guards = cap.entry_source.split("___compiled")[0]
    assert not re.search(r"___p_\d+\.stride\(\)", guards), guards


@pytest.mark.parametrize("impl", ["cpp", "python"])
def test_parameter_changes_are_caught(impl, ext, monkeypatch):
    if impl == "python":
        monkeypatch.setattr(tc, "_ext", None)
        monkeypatch.setattr(tc, "_state", "failed")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    x = torch.randn(3, 4)
    f = ember.compile(m, backend="eager")

    seen = [0]

    def same(new=1):
        # a change of metadata must miss the entry's guards: a new capture (the graph was
        # specialized to the old metadata), with eager's result
        with torch.no_grad():
            got, want = f(x), m(x)
        assert got.dtype == want.dtype and torch.allclose(got, want, atol=1e-3), (got, want)
        n = len(ember.captures(f))
        assert n == seen[0] + new, f"{n} captures after {seen[0]} (expected {new} more)"
        seen[0] = n

    same()
    with torch.no_grad():
        m[0].weight.data = m[0].weight.data.t()        # same object, other strides
    same()
    with torch.no_grad():
        m[2].weight.data = torch.randn(4, 4)[:, :4]     # a new tensor, same metadata:
    same(new=0)                                         # the entry serves it
    m[2].bias.requires_grad_(False)                     # requires_grad changed
    same()
    m.double()                                          # dtype changed in place
    x = x.double()
    same()


def test_python_fallback_when_turned_off(monkeypatch, tmp_path):
    import subprocess
    import sys

    code = ("import torch, ember\n"
            "from ember.capture import tensor_check as tc\n"
            "m = torch.nn.Linear(3, 3); f = ember.compile(m, backend='eager')\n"
            "x = torch.randn(2, 3)\n"
            "with torch.no_grad():\n"
            "    assert torch.allclose(f(x), m(x)); m.weight.data = m.weight.data.t()\n"
            "    assert torch.allclose(f(x), m(x))\n"
            "    for _ in range(2 * tc.START_AFTER): f(x)\n"
            "print(tc._state, tc._ext)\n")
    env = {**__import__("os").environ, "EMBER_TENSOR_CHECK": "py",
           "EMBER_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["failed", "None"]


def test_persisted_entry_keeps_the_tensor_guard(tmp_path):
    """A capture stored on disk and rebuilt in a fresh process carries its metadata tuple: the
    rebuilt entry serves the same parameters and misses a changed one."""
    import os
    import subprocess
    import sys

    code = ("import sys, torch, ember\n"
            "from ember.capture import persist\n"
            "torch.manual_seed(0)\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))\n"
            "f = ember.compile(m, backend='eager'); x = torch.randn(2, 4)\n"
            "with torch.no_grad():\n"
            "    assert torch.allclose(f(x), m(x))\n"
            "    if sys.argv[1] == 'second':\n"
            "        assert persist.counters['hits'] == 1, dict(persist.counters)\n"
            "        assert '___tensors_ok(' in ember.captures(f)[0].entry_source\n"
            "        m[1].weight.data = m[1].weight.data.t()\n"
            "        assert torch.allclose(f(x), m(x))\n"
            "        assert len(ember.captures(f)) == 2, len(ember.captures(f))\n"
            "print('ok')\n")
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path), "EMBER_PERSIST_CAPTURE": "1"}
    for run in ("first", "second"):
        r = subprocess.run([sys.executable, "-c", code, run], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0 and r.stdout.strip() == "ok", (run, r.stdout, r.stderr[-2000:])


def test_a_build_in_another_process_is_waited_for_not_repeated(tmp_path):
    """Processes sharing a cache: while one holds the build's file lock, another keeps the Python
    comparison (and tries again later) instead of running a second compiler; once the library
    is there, every process loads it without building."""
    import fcntl
    import os
    import subprocess
    import sys

    folder = tmp_path / "ext"
    folder.mkdir()
    name = f"ember_tensor_check_{tc._key()}"
    import sysconfig

    so = folder / (name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    code = ("from ember.capture import tensor_check as tc\n"
            "e = tc.extension(wait=300)\n"
            "print(tc._state, e is not None, tc._next_try > tc.START_AFTER)\n")
    env = {**os.environ, "EMBER_CACHE_DIR": str(tmp_path)}
    with open(folder / f".{so.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" is building
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.stdout.split() == ["idle", "False", "True"], (r.stdout, r.stderr[-1000:])
        assert not so.exists()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.stdout.split() == ["ready", "True", "False"], (r.stdout, r.stderr[-1000:])
    assert so.exists()
    mtime = so.stat().st_mtime_ns
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.stdout.split() == ["ready", "True", "False"] and so.stat().st_mtime_ns == mtime
    # a corrupt library (a truncated copy, another machine's) is rebuilt, not trusted
    so.write_bytes(b"not a shared library")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.stdout.split() == ["ready", "True", "False"], (r.stdout, r.stderr[-1000:])
    assert so.stat().st_size > 1000
