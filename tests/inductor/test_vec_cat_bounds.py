"""A concatenation reads each input only where it lies. The generated loop selects between its
inputs; a load of the last input that is not under a mask reads before that buffer's first
element for the outputs of the earlier inputs (index ``x - start`` < 0): harmless where the
memory before the buffer is mapped, a crash where it is not. The check puts the last input at the
start of a page whose predecessor is unreadable, in a child process (a crash is a failure, not
the end of the test session)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                                reason="needs g++ and mprotect (Linux)")

SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys, torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from ember_inductor.compile_fx import generate_source, load_wrapper
    from ember_inductor.decompositions import decompositions
    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None)
    buf = mmap.mmap(-1, 3 * PAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(ctypes.c_void_p(addr), PAGE, 0) == 0  # PROT_NONE
    n = PAGE // 4
    last = torch.frombuffer(buf, dtype=torch.float32, count=n, offset=PAGE).view(16, n // 16)
    last.copy_(torch.randn(16, n // 16))
    first, mid = torch.randn(16, 40), torch.randn(16, 8)
    dim = int(sys.argv[1])
    if dim == 0:
        first, mid, last = first.t().contiguous(), mid.t().contiguous(), last.view(n // 16, 16)
    fn = lambda a, b, c: (torch.cat([a, b, c], dim) * 2,)
    gm = make_fx(fn, decomposition_table=decompositions())(first, mid, last)
    src, _ = generate_source(gm, key="cat_bounds")
    out = load_wrapper(src, gm, "cat_bounds")(first, mid, last)[0]
    assert torch.equal(out, fn(first, mid, last)[0])
    print("ok")
""")


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_never_reads_before_its_last_input(dim: int) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(dim)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
