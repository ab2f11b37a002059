"""The state-version check of ember/capture/stable.py against Python's own evaluation, under
random changes, on any CPython: its C++ part is built alone (no torch) for the running
interpreter, then a state graph of one object (a dict of hooks, a dict of parameters, an
attribute, its class's method) is checked after each of 20000 random changes and must answer
exactly as evaluating its four guards in Python does.

    python scripts/stable_fuzz.py            # changes to the object and its class
    python scripts/stable_fuzz.py inst       # the object only (the fast path stays in use)

CI runs the same property on its own Python through the real extension
(tests/capture/test_stable_guards.py); this script is how other Pythons (3.12 as on the GPU
machine, 3.13 where the check is off) are tried without a torch for them."""

from __future__ import annotations

import collections
import gc
import importlib.util
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))


def _build() -> object:
    src = open(os.path.join(HERE, "..", "core", "ember", "capture", "stable.py")).read()
    c = src[src.index('C_SOURCE = r"""') + len('C_SOURCE = r"""'):]
    c = c[:c.index('"""')]
    code = ("#include <Python.h>\n#include <vector>\n#include <cstdint>\n"
            "#define THPDtype_Check(x) 0\n#define THPDevice_Check(x) 0\n" + c +
            '\nstatic struct PyModuleDef md = {PyModuleDef_HEAD_INIT, "st", NULL, -1, NULL};\n'
            "PyMODINIT_FUNC PyInit_st(void) { PyObject *m = PyModule_Create(&md);"
            " if (m && stable_ready(m) < 0) return NULL; return m; }\n")
    tmp = tempfile.mkdtemp()
    cpp, so = os.path.join(tmp, "st.cpp"), os.path.join(tmp, "st" + sysconfig.get_config_var("EXT_SUFFIX"))
    open(cpp, "w").write(code)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-w", cpp,
                    f"-I{sysconfig.get_paths()['include']}", "-o", so], check=True)
    spec = importlib.util.spec_from_file_location("st", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(st: object, instance_only: bool, steps: int = 20000, seed: int = 0) -> dict:
    def F(self): pass
    def G(self): pass

    class M:
        forward = F

    class M2(M):
        pass

    W = object()
    m = M()
    m.hooks, m.params, m.scale = collections.OrderedDict(), {"w": W}, 2.0
    # the nodes stable.py's analysis makes for the four guards below
    nodes = ((1, -1, weakref.ref(m), 0), (3, 0, M, 0), (2, 0, None, 0), (5, 2, "hooks", 2),
             (7, 3, None, 0), (5, 2, "params", 2), (7, 5, None, 0), (5, 6, "w", 0),
             (5, 2, "scale", 1), (0, -1, M, 0), (4, 9, None, 0), (6, 10, "forward", 8))
    conj = ((0, 1, 2, 3, 4), (0, 1, 2, 5, 6, 7), (0, 1, 2, 8), (9, 10, 11))
    exprs = [lambda: not m.hooks, lambda: m.params["w"] is W, lambda: m.scale == 2.0,
             lambda: M.forward is F]
    calls: list[list[int]] = []

    def recheck(idx):
        calls.append(list(idx))
        return all(exprs[i]() for i in idx)

    s = st.Stable(nodes, conj, recheck, collections.OrderedDict)

    def oracle() -> bool:
        try:
            return all(e() for e in exprs)
        except Exception:
            return False

    muts = [
        lambda: m.hooks.__setitem__(rnd.randrange(3), 1),
        lambda: m.hooks.pop(rnd.randrange(3), None),
        lambda: m.hooks.clear(),
        lambda: setattr(m, "scale", rnd.choice([2.0, 3.0, 2, [2.0], "2"])),
        lambda: m.params.__setitem__("w", rnd.choice([W, object()])),
        lambda: m.params.__setitem__("x", 1),
        lambda: setattr(m, "params", {"w": W}),
        lambda: setattr(m, "hooks", rnd.choice([collections.OrderedDict(), {}, [], {1: 2}])),
        lambda: setattr(m, "__dict__", dict(m.__dict__)),
        lambda: setattr(m, "other", rnd.random()),
    ]
    if not instance_only:
        muts += [lambda: setattr(M, "forward", rnd.choice([F, G])),
                 lambda: setattr(m, "__class__", rnd.choice([M, M2])),
                 lambda: setattr(M2, "forward", G),
                 lambda: delattr(M2, "forward") if "forward" in M2.__dict__ else None]
    rnd = random.Random(seed)
    bad, passing, fast = 0, 0, 0
    for _ in range(steps):
        try:
            rnd.choice(muts)()
        except Exception:
            pass
        if rnd.random() < 0.3:  # back to a passing state, often
            if rnd.random() < 0.5:
                m.hooks = collections.OrderedDict()
            if rnd.random() < 0.5:
                m.scale = 2.0
            if rnd.random() < 0.5:
                m.params = {"w": W}
            if not instance_only and rnd.random() < 0.5 and M.__dict__["forward"] is not F:
                M.forward = F
        want = oracle()
        for _ in range(2):
            if s.check() is not want:
                bad += 1
        if want:
            passing += 1
            n = len(calls)
            s.check()
            fast += len(calls) == n
    del m
    gc.collect()
    return {"mismatches": bad, "passing": passing, "fast": fast}


if __name__ == "__main__":
    st = _build()
    if not hasattr(st, "Stable"):
        print(sys.version.split()[0], "no state-version check on this Python (stable.supported())")
        sys.exit(0)
    r = run(st, instance_only="inst" in sys.argv[1:])
    print(sys.version.split()[0], r)
    sys.exit(1 if r["mismatches"] else 0)
