"""The inductor's on-disk cache: hits and misses, keys, corrupt entries, concurrent processes, the
text store and ``ember cache info|clear``. Tiny C++ sources keep every build well under a second."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ember_inductor.runtime import cache

ROOT = Path(__file__).resolve().parents[2]

ADD = 'extern "C" int add(int a, int b) { return a + b; }\n'


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("EMBER_CACHE_DIR", str(d))
    cache._forget()  # the per-process memo would hide what is on disk
    yield d
    cache._forget()


def _entry_files(root: Path, suffix: str) -> list[Path]:
    return sorted(p for p in (root / "cpp").rglob(f"*{suffix}") if not p.name.startswith("."))


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    real = cache.subprocess.run

    def spy(cmd, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(list(cmd))
        return real(cmd, *a, **k)

    monkeypatch.setattr(cache.subprocess, "run", spy)
    return calls


def test_cache_dir_env_and_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("EMBER_CACHE_DIR")
    # as in a process started without EMBER_CACHE_DIR (the test session sets one of its own)
    import ember.config
    monkeypatch.setattr(ember.config, "cache_dir",
                        str(Path(os.path.expanduser("~")) / ".cache" / "ember"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "ember"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "ember"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBER_CACHE_DIR", "rel")
    assert cache.cache_dir() == tmp_path / "rel"


def test_miss_then_hit(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _count_builds(monkeypatch)
    path = cache.compile_cpp(ADD)
    assert path.is_file() and path.is_relative_to(tmp_cache)
    assert len([c for c in builds if "-shared" in c]) == 1
    assert cache.load_cpp(ADD).add(40, 2) == 42
    assert cache.load_cpp(ADD) is cache.load_cpp(ADD)
    cache._forget()  # as a fresh process would: found on disk, not rebuilt
    before = dict(cache.counters)
    assert cache.compile_cpp(ADD) == path
    assert len([c for c in builds if "-shared" in c]) == 1
    assert cache.counters["disk_hits"] == before["disk_hits"] + 1
    assert cache.counters["builds"] == before["builds"]
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["size"] == path.stat().st_size
    assert "-ffast-math" not in meta["flags"] and "-march=native" in meta["flags"]


def test_changed_flag_is_a_different_entry(tmp_cache: Path) -> None:
    src = 'extern "C" int value() { return VALUE; }\n'
    assert cache.cpp_key(src, ["-DVALUE=1"]) != cache.cpp_key(src, ["-DVALUE=2"])
    assert cache.cpp_key(src, ["-DVALUE=1"]) == cache.cpp_key(src, ["-DVALUE=1"])
    a, b = cache.compile_cpp(src, ["-DVALUE=1"]), cache.compile_cpp(src, ["-DVALUE=2"])
    assert a != b
    assert cache.load_cpp(src, ["-DVALUE=1"]).value() == 1
    assert cache.load_cpp(src, ["-DVALUE=2"]).value() == 2
    assert cache.cpp_key(src + " ") != cache.cpp_key(src)


def test_key_covers_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    text = cache._toolchain(cache._compiler())
    import torch

    assert torch.__version__ in text and f"format={cache.FORMAT_VERSION}" in text
    before = cache.cpp_key(ADD)
    monkeypatch.setattr(cache, "_toolchain", lambda compiler: text + "\nanother cpu")
    assert cache.cpp_key(ADD) != before


@pytest.mark.parametrize("damage", ["truncate", "garbage", "no_meta", "bad_meta"])
def test_corrupt_entry_is_rebuilt(tmp_cache: Path, damage: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = cache.compile_cpp(ADD)
    good = path.read_bytes()
    meta = path.with_suffix(".json")
    if damage == "truncate":
        path.write_bytes(good[: len(good) // 3])
    elif damage == "garbage":
        path.write_bytes(bytes(len(good)))  # same size, wrong bytes
    elif damage == "no_meta":
        meta.unlink()
    else:
        meta.write_text('{"format": 1, "sha2')
    cache._forget()
    builds = _count_builds(monkeypatch)
    rebuilds = cache.counters["rebuilds"]
    again = cache.compile_cpp(ADD)
    assert again == path and len([c for c in builds if "-shared" in c]) == 1
    assert cache.counters["rebuilds"] == rebuilds + 1
    assert cache._valid(again, meta)
    lib = ctypes.CDLL(str(again))
    assert lib.add(1, 2) == 3


def test_stale_temporaries_of_a_dead_build_are_removed(tmp_cache: Path) -> None:
    path = cache.compile_cpp(ADD)
    stale = path.parent / f".{path.stem}.abc123.so.tmp"
    stale.write_bytes(b"half a library")
    path.write_bytes(b"")  # and the entry itself damaged
    cache._forget()
    assert cache.compile_cpp(ADD) == path
    assert not stale.exists()
    assert cache.load_cpp(ADD).add(3, 4) == 7


def test_unwritable_cache_dir_is_a_clear_error(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(cache.CompileError, match="EMBER_CACHE_DIR"):
        cache.compile_cpp(ADD)
    cache.put_text("wrapper", "k", "text")  # the text store only logs: it is an optimization
    assert cache.get_text("wrapper", "k") is None


def test_compile_error_names_source_and_stderr(tmp_cache: Path) -> None:
    with pytest.raises(cache.CompileError) as ei:
        cache.compile_cpp('extern "C" int broken() { return undefined_name; }\n')
    msg = str(ei.value)
    assert "undefined_name" in msg and "was not declared" in msg
    src = next(w.rstrip(":") for w in msg.split() if w.endswith(".cpp:"))
    assert Path(src).is_file() and "undefined_name" in Path(src).read_text()
    assert _entry_files(tmp_cache, ".so") == []
    assert not [p for p in (tmp_cache / "cpp").rglob(".*.tmp")]


def test_compile_many(tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srcs = [f'extern "C" int f() {{ return {i}; }}\n' for i in range(3)]
    builds = _count_builds(monkeypatch)
    paths = cache.compile_cpp_many([srcs[0], srcs[1], srcs[0], srcs[2]])
    assert len([c for c in builds if "-shared" in c]) == 3
    assert paths[0] == paths[2] and len(set(paths)) == 3
    assert [ctypes.CDLL(str(p)).f() for p in paths] == [0, 1, 0, 2]
    assert cache.compile_cpp_many([]) == []


def test_concurrent_processes_build_once(tmp_cache: Path, tmp_path: Path) -> None:
    """Several processes compile the same source at the same moment: one build, all load it."""
    go = tmp_path / "go"
    worker = textwrap.dedent(f"""
        import sys, time, pathlib
        from ember_inductor.runtime import cache
        builds = []
        real = cache.subprocess.run
        def spy(cmd, *a, **k):
            if "-shared" in cmd:
                builds.append(cmd)
            return real(cmd, *a, **k)
        cache.subprocess.run = spy
        cache._toolchain(cache._compiler())  # warm up before the start line
        pathlib.Path(sys.argv[1]).touch()
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.005)
        lib = cache.load_cpp({ADD!r})
        print(len(builds), lib.add(2, 3), cache.compile_cpp({ADD!r}))
    """)
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_cache))
    n = 2
    procs = [subprocess.Popen([sys.executable, "-c", worker, str(tmp_path / f"ready{i}")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(n)):
            assert time.monotonic() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [o[0].split() for o in outs]
    assert sum(int(r[0]) for r in results) == 1  # the flock serialized them: one gcc run
    assert {r[1] for r in results} == {"5"}
    assert len({r[2] for r in results}) == 1
    assert len(_entry_files(tmp_cache, ".so")) == 1
    assert not [p for p in (tmp_cache / "cpp").rglob(".*.tmp")]


def test_memo_notices_a_cleared_cache(tmp_cache: Path) -> None:
    path = cache.compile_cpp(ADD)
    lib = cache.load_cpp(ADD)
    for p in path.parent.iterdir():  # as `ember cache clear` in another process would
        p.unlink()
    assert cache.compile_cpp(ADD) == path and path.is_file()
    assert lib.add(2, 2) == 4  # the loaded library is unaffected


def test_openmp_kernel_shares_torchs_runtime(tmp_cache: Path) -> None:
    """Our libraries bind to the libgomp torch loaded: one OpenMP thread pool, not two."""
    import torch

    src = textwrap.dedent("""
        #include <omp.h>
        extern "C" int threads() {
            int n = 0;
            #pragma omp parallel
            {
                #pragma omp single
                n = omp_get_num_threads();
            }
            return n;
        }
        extern "C" void twice(float* __restrict x, long n) {
            #pragma omp parallel for simd
            for (long i = 0; i < n; i++) x[i] = x[i] * 2.0f;
        }
    """)
    lib = cache.load_cpp(src)
    x = torch.randn(1000)
    y = x.clone()
    lib.twice(ctypes.c_void_p(y.data_ptr()), ctypes.c_long(y.numel()))
    assert torch.equal(y, x * 2)
    assert lib.threads() == torch.get_num_threads()
    gomp = {ln.split()[-1] for ln in open("/proc/self/maps") if "libgomp" in ln}
    assert len(gomp) == 1, gomp


def test_text_store_round_trip_and_corruption(tmp_cache: Path) -> None:
    assert cache.get_text("wrapper", "graph-1") is None
    body = "def call(args):\n    return [args[0] + 1]  # ünïcode\n"
    cache.put_text("wrapper", "graph-1", body)
    assert cache.get_text("wrapper", "graph-1") == body
    assert cache.get_text("wrapper", "graph-2") is None
    assert cache.get_text("autotune", "graph-1") is None
    cache.put_text("wrapper", "graph-1", "v2")  # overwrite
    assert cache.get_text("wrapper", "graph-1") == "v2"

    (path,) = (tmp_cache / "text" / "wrapper").glob("*.json")
    record = json.loads(path.read_text())
    record["text"] = "tampered"
    path.write_text(json.dumps(record))
    assert cache.get_text("wrapper", "graph-1") is None
    path.write_bytes(path.read_bytes()[:10])
    assert cache.get_text("wrapper", "graph-1") is None
    cache.put_text("wrapper", "graph-1", "v3")
    assert cache.get_text("wrapper", "graph-1") == "v3"
    with pytest.raises(ValueError):
        cache.put_text("../escape", "k", "t")


def test_info_and_clear(tmp_cache: Path) -> None:
    assert cache.info()["entries"]["so"] == 0
    cache.compile_cpp(ADD)
    cache.put_text("wrapper", "k", "text")
    st = cache.info()
    assert st["dir"] == str(tmp_cache)
    assert st["entries"]["so"] == 1 and st["entries"]["text"] == 1
    assert st["bytes"]["so"] == cache.compile_cpp(ADD).stat().st_size
    assert st["text_namespaces"] == {"wrapper": 1}
    keep = tmp_cache / "not-ours.txt"  # clear() removes only the cache's own folders
    keep.write_text("x")
    assert cache.clear() >= 4
    assert cache.info()["total_bytes"] == 0 and keep.exists()
    assert cache.get_text("wrapper", "k") is None
    assert cache.load_cpp(ADD).add(1, 1) == 2  # rebuilt after clear


def test_cli_info_and_clear(tmp_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ember.__main__ import main

    cache.compile_cpp(ADD)
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_cache) in out and "compiled libraries" in out
    assert [ln for ln in out.splitlines() if "compiled libraries" in ln][0].split()[2] == "1"
    cache.put_text("autotune", "k", "choice")
    assert main(["cache", "info"]) == 0
    assert "text namespace 'autotune': 1 entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 5 file(s)" in capsys.readouterr().out
    assert cache.info()["entries"]["so"] == 0


def test_cli_without_plugin(monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    from ember.__main__ import main

    monkeypatch.setitem(sys.modules, "ember_inductor.runtime", None)
    # the core's own entries (AOT graphs, persisted captures) are still shown; kernels are not
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "inductor plugin is not installed" in out and "'aot'" in out
