"""An op-level sweep over PyTorch's OpInfo database through Ember (and torch.compile, the oracle).

For each OpInfo (float32 samples on CPU; gradients when the op supports autograd) and a bounded
number of its samples, a small function ``f(t0, t1, ...)`` calling the op on the sample's tensors
(non-tensor arguments baked in as constants) is compiled and run, and its outputs (and input
gradients for a fixed set of output cotangents) are compared with eager's. Each sample is
classified as

* ``right``: compiled, same results as eager;
* ``wrong``: a result differs from eager (value, dtype, shape, a gradient None where eager gives a
  tensor or the reverse, a FakeTensor leaking out). Must be 0;
* ``fallback``: Ember ran (part of) the function eagerly (a fallback or a graph break): the results
  are right but the op was not compiled;
* ``error``: the compiled function raised where eager did not;
* ``random``: a random op whose draws differ from eager's under the same seed (outputs' metadata
  match; torch.compile does not reproduce eager's random stream either): not counted as wrong;
* ``skip``: eager itself raises on the sample.

Run as a script (the full sweep, or the oracle)::

    .venv/bin/python tests/opinfo/sweep.py --backends eager,aot_eager --samples 3
    .venv/bin/python tests/opinfo/sweep.py --oracle aot_eager --samples 3   # rewrites oracle.json

The oracle (what torch.compile gets right on the same samples) is precomputed into
``tests/opinfo/oracle.json``: running torch.compile over op_db in CI is too slow.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import math
import os
import signal
import sys
import time
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
ORACLE = HERE / "oracle.json"
DTYPE = torch.float32
#: ``--device``: where the samples are made (``cuda``: the GPU targets, Triton's for inductor)
DEVICE = "cpu"
#: Ops whose outputs hold uninitialized memory: only their metadata is compared.
UNDEFINED_VALUES = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                    "new_empty_strided"}


# -- the cases -------------------------------------------------------------------------------

def op_key(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@dataclasses.dataclass
class Case:
    key: str  # "<op>[.<variant>]#<sample index>"
    op_key: str
    fn_source: str
    fn_globals: dict[str, Any]
    tensors: list[torch.Tensor]
    grad: bool  # compare input gradients too
    output_process: Callable[[Any], Any]

    @property
    def sig(self) -> str:
        """A fingerprint of the sample (source, tensor metadata, constants), so that an oracle
        computed elsewhere (another torch version) is used only for the very same sample."""
        import re

        parts = [self.fn_source] + [
            f"{t.dtype}{list(t.shape)}{t.layout}"
            f"{t.stride() if t.layout == torch.strided else ''}{t.requires_grad}"
            for t in self.tensors]
        parts += [f"{k}={v!r}" for k, v in sorted(self.fn_globals.items()) if k != "OP"]
        text = re.sub(r" at 0x[0-9a-f]+", "", "|".join(parts))
        return f"{zlib.crc32(text.encode()):08x}"

    def make_fn(self) -> Callable[..., Any]:
        """A fresh function (fresh code object: no compile cache shared across cases)."""
        ns = dict(self.fn_globals)
        code = compile(self.fn_source, f"<opinfo {self.key}>", "exec")
        exec(code, ns)
        return ns["f"]

    def inputs(self) -> list[torch.Tensor]:
        """Fresh copies of the inputs (ops may mutate them), leaves that require grad as the
        sample's do."""
        out = []
        for t in self.tensors:
            c = t.detach().clone()
            if t.requires_grad:
                c.requires_grad_(True)
            out.append(c)
        return out


def _build_source(sample: Any) -> tuple[str, dict[str, Any], list[torch.Tensor]]:
    tensors: list[torch.Tensor] = []
    consts: dict[str, Any] = {}

    def expr(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return f"t{len(tensors) - 1}"
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in
                                                pytree.tree_leaves(v)):
            inner = ", ".join(expr(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner},)"
        name = f"c{len(consts)}"
        consts[name] = v
        return name

    parts = [expr(sample.input)] + [expr(a) for a in sample.args]
    parts += [f"{k}={expr(v)}" for k, v in sample.kwargs.items()]
    params = ", ".join(f"t{i}" for i in range(len(tensors)))
    src = f"def f({params}):\n    return OP({', '.join(parts)})\n"
    return src, consts, tensors


def selected_ops(names: set[str] | None = None) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    ops = [op for op in op_db if DTYPE in op.supported_dtypes(DEVICE)]
    if names:
        ops = [op for op in ops if op_key(op) in names or op.name in names]
    return ops


#: EMBER_OPINFO_GRAD=0 (or --no-grad): samples without requires_grad (the inference path of AOT
#: autograd: one forward graph) and no gradients compared.
GRAD = os.environ.get("EMBER_OPINFO_GRAD", "1") != "0"
#: EMBER_OPINFO_INPLACE=1 (or --inplace): the ops' in-place variants (``x.add_(y)``), without
#: grad; the inputs after the call and whether the result is the input itself are compared too
#: (AOT's input mutations and aliased outputs).
INPLACE = os.environ.get("EMBER_OPINFO_INPLACE", "0") == "1"


def cases_for(op: Any, n_samples: int) -> Iterator[Case]:
    """The first ``n_samples`` samples of ``op``, generated under a seed derived from its name (the
    same samples on every run with the same torch)."""
    key = op_key(op)
    if INPLACE and op.inplace_variant is None:
        return
    torch.manual_seed(zlib.crc32(key.encode()))
    grad = bool(op.supports_autograd) and GRAD and not INPLACE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gen = op.sample_inputs(DEVICE, DTYPE, requires_grad=grad)
        samples = list(itertools.islice(gen, n_samples))
    for i, s in enumerate(samples):
        src, consts, tensors = _build_source(s)
        consts["OP"] = op.inplace_variant if INPLACE else op.op
        yield Case(f"{key}#{i}", key, src, consts, tensors,
                   grad and any(t.requires_grad for t in tensors),
                   s.output_process_fn_grad)


# -- running and comparing ------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    outputs: Any = None
    grads: list[Any] | None = None
    error: BaseException | None = None


def _grad_outputs(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device, o.dtype)
            if not o.is_complex() else torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device)
            for o in outs]


def run_case(case: Case, fn: Callable[..., Any], seed: int = 0) -> Run:
    xs = case.inputs()
    torch.manual_seed(seed)
    try:
        out = fn(*xs)
    except Exception as e:  # noqa: BLE001 - classified by the caller
        return Run(error=e)
    r = Run(outputs=out)
    if INPLACE:  # the mutated inputs, and whether the result is the first input itself
        r.outputs = (out, [x.detach() for x in xs], out is xs[0] if xs else None)
    if case.grad:
        try:
            processed = case.output_process(out)
            diff = [o for o in pytree.tree_leaves(processed)
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            leaves = [x for x in xs if x.requires_grad]
            if diff and leaves:
                r.grads = list(torch.autograd.grad(diff, leaves, _grad_outputs(diff),
                                                   allow_unused=True))
            else:
                r.grads = []
        except Exception as e:  # noqa: BLE001
            r.error = e
    return r


def _is_fake(t: Any) -> bool:
    from torch._subclasses import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t, (FakeTensor, FunctionalTensor))


def compare(actual: Any, expected: Any, what: str, values: bool = True) -> str | None:
    """None when equal (torch.testing tolerances), else the first difference."""
    fa, sa = pytree.tree_flatten(actual)
    fe, se = pytree.tree_flatten(expected)
    if len(fa) != len(fe):
        return f"{what}: {len(fa)} leaves, eager has {len(fe)}"
    for i, (a, e) in enumerate(zip(fa, fe)):
        where = f"{what}[{i}]"
        if _is_fake(a):
            return f"{where}: a {type(a).__name__} reached the user"
        if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
            if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
                return f"{where}: {type(a).__name__}, eager gives {type(e).__name__}"
            if a.dtype != e.dtype or a.shape != e.shape:
                return f"{where}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
            if not values or e.is_sparse or e.layout != torch.strided:
                continue
            try:
                torch.testing.assert_close(a.detach(), e.detach(), equal_nan=True)
            except AssertionError as err:
                msg = str(err).strip().splitlines()
                return f"{where}: " + " ".join(m.strip() for m in msg[:3])
        elif e is None or a is None:
            if (a is None) != (e is None):
                return f"{where}: {a!r}, eager gives {e!r}"
        elif isinstance(e, float) and isinstance(a, float):
            if not (a == e or (math.isnan(a) and math.isnan(e))) and values:
                return f"{where}: {a!r}, eager gives {e!r}"
        elif values and a != e:
            return f"{where}: {a!r}, eager gives {e!r}"
    return None


def _grads_differ(a: list[Any], e: list[Any]) -> str | None:
    for i, (x, y) in enumerate(zip(a, e)):
        if (x is None) != (y is None):
            z = x if x is not None else y
            zeros = " (all zeros)" if bool((z == 0).all()) else ""
            return (f"grad[{i}]: {'None' if x is None else 'tensor' + zeros}, eager gives "
                    f"{'None' if y is None else 'tensor' + zeros}")
    return compare(a, e, "grad")


@dataclasses.dataclass
class Result:
    status: str  # right | wrong | fallback | error | random | skip
    reason: str = ""
    seconds: float = 0.0


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    if not seconds or not hasattr(signal, "SIGALRM") or os.name != "posix":
        yield
        return

    def on_alarm(*_: Any) -> None:
        raise TimeoutError(f"sample took over {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _short(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


class _SeededOps(TorchDispatchMode):
    """Notes whether any kernel that draws random numbers runs."""

    found = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.found = True
        return func(*args, **(kwargs or {}))


def _eager_reference(case: Case) -> tuple[Run, bool, bool]:
    """Eager results, whether they are deterministic at all (empty/uninitialized values are not),
    and whether the op draws random numbers (results change with the seed)."""
    fn = case.make_fn()
    ref = run_case(case, fn, seed=0)
    if ref.error is not None:
        return ref, True, False
    if case.op_key.split(".")[0] in UNDEFINED_VALUES:
        return ref, False, False
    again = run_case(case, fn, seed=0)
    deterministic = (again.error is None and compare(again.outputs, ref.outputs, "out") is None
                     and (not case.grad
                          or _grads_differ(again.grads or [], ref.grads or []) is None))
    seeded = _SeededOps()
    xs = case.inputs()
    torch.manual_seed(0)
    with seeded:  # the op alone (the gradient cotangents are drawn with randn)
        fn(*xs)
    random_op = deterministic and seeded.found
    return ref, deterministic, random_op


def judge(case: Case, compiled: Callable[..., Any], ref: Run, deterministic: bool,
          random_op: bool) -> tuple[str, str]:
    got = run_case(case, compiled, seed=0)
    if got.error is not None:
        return "error", _short(got.error)
    values = deterministic
    diff = compare(got.outputs, ref.outputs, "out", values=values)
    if diff is None and case.grad:
        if len(got.grads or []) != len(ref.grads or []):
            diff = f"grads: {len(got.grads or [])}, eager {len(ref.grads or [])}"
        else:
            diff = _grads_differ(got.grads or [], ref.grads or [])
            if diff is not None and not values and "None" not in diff:
                diff = None
    if diff is not None:
        if random_op and compare(got.outputs, ref.outputs, "out", values=False) is None:
            return "random", diff
        if values and _within_fp32_error(case, got, ref):
            return "right", "differs from eager fp32 by no more than eager's own float32 error"
        return "wrong", diff
    return "right", ""


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.detach().double() - b.detach().double())
    d = d[~(torch.isnan(d) | torch.isinf(d))] if d.numel() else d
    return float(d.pow(2).mean().sqrt()) if d.numel() else 0.0


def _within_fp32_error(case: Case, got: Run, ref: Run, multiplier: float = 2.0,
                       rtol: float = 1e-6) -> bool:
    """PyTorch's accuracy rule (benchmarks/accuracy.py): float32 eager is itself an
    approximation, so a float32 result that differs from it (a reduction in another order) is
    right when its error against a float64 run of the same op is at most ``multiplier`` times
    eager float32's own error, plus ``rtol`` times the float64 result's root mean square. Only for float32 cases whose other leaves (None,
    integers, shapes, NaN positions) already agree."""
    xs = case.inputs()
    if not any(x.dtype == torch.float32 for x in xs):
        return False
    xs64 = [x.detach().double().requires_grad_(x.requires_grad) if x.dtype == torch.float32
            else x for x in xs]
    fn = case.make_fn()
    torch.manual_seed(0)
    try:
        out64 = fn(*xs64)
        grads64: list[Any] = []
        if case.grad:
            diff = [o for o in pytree.tree_leaves(case.output_process(out64))
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            leaves = [x for x in xs64 if x.requires_grad]
            if diff and leaves:
                grads64 = list(torch.autograd.grad(diff, leaves, _grad_outputs(diff),
                                                   allow_unused=True))
    except Exception:  # noqa: BLE001 - no float64 kernel: no second opinion
        return False
    triples = list(zip(pytree.tree_leaves(got.outputs), pytree.tree_leaves(ref.outputs),
                       pytree.tree_leaves(out64)))
    if case.grad:
        triples += list(zip(got.grads or [], ref.grads or [], grads64))
    for a, e, f in triples:
        if not isinstance(e, torch.Tensor) or not e.is_floating_point():
            continue
        if not isinstance(a, torch.Tensor) or not isinstance(f, torch.Tensor) \
                or a.shape != f.shape or a.dtype != e.dtype \
                or not torch.equal(torch.isnan(a), torch.isnan(e)):
            return False
        if e.dtype != torch.float32:
            if not torch.allclose(a.detach(), e.detach(), equal_nan=True):
                return False
            continue
        if _rmse(a, f) > multiplier * _rmse(e, f) + rtol * _rmse(f, torch.zeros_like(f)):
            return False
    return True


def direct_aot(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    """AOT autograd without Ember's capture (a diagnostic: isolates AOT bugs from capture gaps).
    The function is traced to an ATen graph with make_fx on the first call's (real) inputs; that
    graph goes through ``ember.aot.aot_compile`` as a captured graph would."""
    import ember
    from ember.aot import aot_compile
    from torch.fx.experimental.proxy_tensor import make_fx

    state: dict[str, Any] = {}

    def call(*xs: Any) -> Any:
        if "compiled" not in state:
            def flat(*ts: Any) -> Any:
                out, spec = pytree.tree_flatten(fn(*ts))
                state["spec"] = spec
                return tuple(out)
            # tracing runs the ops (keep the RNG stream); inputs keep requires_grad, since
            # Python-level code may decide what to compute from it
            with torch.random.fork_rng(devices=[]):
                gm = make_fx(flat)(*xs)
            state["compiled"] = aot_compile(gm, list(xs), backend=ember.get_backend(backend))
        return pytree.tree_unflatten(list(state["compiled"](*xs)), state["spec"])

    return call


def make_compiled(case: Case, backend: str) -> Callable[..., Any]:
    """``backend``: an Ember backend name, or ``aot:<name>`` for AOT autograd without capture."""
    import ember

    if backend.startswith("aot:"):
        return direct_aot(case.make_fn(), backend[4:])
    return ember.compile(case.make_fn(), backend=backend, options=dict(OPTIONS) or None,
                         dynamic=DYNAMIC)


#: options of every Ember compile (``--options``: ``{"cpu_codegen": "triton"}`` sends the sweep
#: through inductor's Triton target, under TRITON_INTERPRET=1 on a CPU)
OPTIONS: dict[str, Any] = {}
#: ``--dynamic``: every size symbolic from the first compile (symbolic index arithmetic)
DYNAMIC: bool | None = None


def run_ember(case: Case, backend: str, ref_info: tuple[Run, bool, bool] | None = None,
              time_limit: float | None = None) -> Result:
    import ember
    from ember import events

    t0 = time.perf_counter()
    ref, det, rnd = ref_info or _eager_reference(case)
    if ref.error is not None:
        return Result("skip", "eager raises: " + _short(ref.error))
    ember.reset()
    seen: list[tuple[str, str]] = []
    emit = events.emit

    def spy(kind: str, **data: Any) -> None:
        if kind in ("fallback", "graph_break"):
            seen.append((kind, str(data.get("reason", ""))))
        emit(kind, **data)

    events.emit = spy
    try:
        with _time_limit(time_limit):
            status, reason = judge(case, make_compiled(case, backend), ref, det, rnd)
    except TimeoutError as e:
        status, reason = "error", str(e)
    finally:
        events.emit = emit
    if status == "right" and seen:
        kind, why = seen[0]
        status, reason = "fallback", f"{kind}: {why.splitlines()[0] if why else ''}"[:400]
    ember.reset()
    return Result(status, reason, time.perf_counter() - t0)


def run_torch(case: Case, backend: str, ref_info: tuple[Run, bool, bool] | None = None,
              time_limit: float | None = None) -> Result:
    """torch.compile on the same case (the oracle). Graph breaks are allowed (torch.compile's
    result counts as right when it is right)."""
    import torch._dynamo

    t0 = time.perf_counter()
    ref, det, rnd = ref_info or _eager_reference(case)
    if ref.error is not None:
        return Result("skip", "eager raises: " + _short(ref.error))
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        with _time_limit(time_limit):
            status, reason = judge(case, torch.compile(case.make_fn(), backend=backend), ref, det,
                                   rnd)
    except TimeoutError as e:
        status, reason = "error", str(e)
    breaks = sum(counters["graph_break"].values())
    if status == "right" and (breaks or not counters["stats"]["unique_graphs"]):
        why = next(iter(counters["graph_break"]), "no graph compiled")
        status, reason = "fallback", f"graph_break: {why}"[:400]
    return Result(status, reason, time.perf_counter() - t0)


# -- the oracle ------------------------------------------------------------------------------

def load_oracle() -> dict[str, Any]:
    if not ORACLE.exists():
        return {"results": {}}
    return json.loads(ORACLE.read_text())


# -- script ------------------------------------------------------------------------------------

def _sweep(args: argparse.Namespace) -> int:
    names = set(args.ops.split(",")) if args.ops else None
    ops = selected_ops(names)
    if args.shard:
        k, n = (int(x) for x in args.shard.split("/"))
        ops = ops[k::n]
    backends = [b for b in args.backends.split(",") if b] if args.backends else []
    oracle_backends = [b for b in args.oracle.split(",") if b] if args.oracle else []
    results: dict[str, dict[str, Any]] = {}
    totals = {b: collections.Counter() for b in backends + [f"torch:{b}" for b in oracle_backends]}
    t_start = time.perf_counter()
    reached = 0
    for op in ops:
        if args.deadline and time.perf_counter() - t_start > args.deadline:
            break
        reached += 1
        try:
            cases = list(cases_for(op, args.samples))
        except Exception as e:  # noqa: BLE001 - a broken sample generator is not ours
            print(f"# {op_key(op)}: samples failed: {_short(e)}", file=sys.stderr)
            continue
        for case in cases:
            row: dict[str, Any] = {}
            try:
                ref_info = _eager_reference(case)
            except Exception as e:  # noqa: BLE001
                print(f"# {case.key}: eager reference failed: {_short(e)}", file=sys.stderr)
                continue
            for b in backends:
                r = run_ember(case, b, ref_info, args.time_limit)
                row[b] = dataclasses.asdict(r)
                totals[b][r.status] += 1
            for b in oracle_backends:
                try:
                    r = run_torch(case, b, ref_info, args.time_limit)
                except Exception as e:  # noqa: BLE001 - dynamo crash: no oracle for the sample
                    r = Result("error", "torch.compile crashed: " + _short(e))
                row[f"torch:{b}"] = dataclasses.asdict(r)
                totals[f"torch:{b}"][r.status] += 1
            row["sig"] = case.sig
            results[case.key] = row
            if args.verbose:
                print(case.key, {k: v["status"] for k, v in row.items() if k != "sig"}, flush=True)
    elapsed = time.perf_counter() - t_start
    for b, c in totals.items():
        print(f"{b}: {dict(c)}  ({sum(c.values())} samples)")
    print(f"elapsed: {elapsed:.0f}s, {reached} of {len(ops)} ops reached")
    if args.out:
        Path(args.out).write_text(json.dumps({"torch": torch.__version__, "samples": args.samples,
                                              "device": DEVICE, "ops_reached": reached,
                                              "ops": len(ops),
                                              "results": results}, indent=0, sort_keys=True))
    if args.write_oracle:
        old = load_oracle()
        merged = old.get("results", {})
        for key, row in results.items():
            entry = merged.setdefault(key, {})
            if entry.get("sig") not in (None, row["sig"]):
                entry.clear()  # another sample under this key: the old results are not its own
            entry["sig"] = row["sig"]
            for b in oracle_backends:
                r = row[f"torch:{b}"]
                entry[b] = r["status"] if not r["reason"] else [r["status"], r["reason"][:200]]
        versions = old.get("torch_versions", {})
        versions.update({b: torch.__version__ for b in oracle_backends})
        ORACLE.write_text(json.dumps({"torch_versions": versions, "results": merged},
                                     indent=0, sort_keys=True) + "\n")
    return 0


def merge_oracle(paths: list[str], backend: str) -> tuple[int, int]:
    """Merge ``torch:<backend>`` results from sweep outputs made elsewhere (another machine or
    torch version) into oracle.json, keeping only samples identical to this torch's (same sig).
    Returns (merged, dropped)."""
    rows: dict[str, Any] = {}
    versions = set()
    for p in paths:
        d = json.loads(Path(p).read_text())
        versions.add(d.get("torch", "?"))
        rows.update(d["results"])
    ops = {op_key(op): op for op in selected_ops()}
    by_op: dict[str, list[str]] = collections.defaultdict(list)
    for key in rows:
        by_op[key.rsplit("#", 1)[0]].append(key)
    old = load_oracle()
    merged = old.get("results", {})
    n = dropped = 0
    for name, keys in by_op.items():
        if name not in ops:
            dropped += len(keys)
            continue
        n_samples = 1 + max(int(k.rsplit("#", 1)[1]) for k in keys)
        local = {c.key: c.sig for c in cases_for(ops[name], n_samples)}
        for key in keys:
            r = rows[key].get(f"torch:{backend}")
            if r is None or local.get(key) != rows[key].get("sig"):
                dropped += 1
                continue
            entry = merged.setdefault(key, {})
            entry.setdefault("sig", local[key])
            entry[backend] = r["status"] if not r["reason"] else [r["status"], r["reason"][:200]]
            n += 1
    vers = old.get("torch_versions", {})
    vers[backend] = ",".join(sorted(versions))
    ORACLE.write_text(json.dumps({"torch_versions": vers, "results": merged}, indent=0,
                                 sort_keys=True) + "\n")
    return n, dropped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="", help="Ember backends, comma-separated")
    p.add_argument("--oracle", default="", help="torch.compile backends to run as the oracle")
    p.add_argument("--write-oracle", action="store_true", help="merge the oracle into oracle.json")
    p.add_argument("--samples", type=int, default=3, help="samples per op")
    p.add_argument("--ops", default="", help="only these ops (comma-separated names)")
    p.add_argument("--shard", default="", help="k/n: every n-th op starting at k")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per sample")
    p.add_argument("--out", default="", help="write every result to this JSON file")
    p.add_argument("--merge-oracle", nargs="*", default=None, metavar="FILE",
                   help="merge torch:<--oracle backend> results of these --out files")
    p.add_argument("--no-grad", action="store_true",
                   help="samples that do not require grad (AOT's inference path)")
    p.add_argument("--inplace", action="store_true",
                   help="the ops' in-place variants (input mutations, aliased results)")
    p.add_argument("--options", default="",
                   help='options of every Ember compile, as JSON: \'{"cpu_codegen": "triton"}\'')
    p.add_argument("--dynamic", action="store_true",
                   help="compile with dynamic=True (every size symbolic)")
    p.add_argument("--dtype", default="float32",
                   help="the samples' dtype (float32, float64, int64, int32, uint8, bool, ...); "
                        "not a floating dtype: no gradients")
    p.add_argument("--device", default="cpu",
                   help="where the samples are made (cuda: inductor's Triton target on a GPU)")
    p.add_argument("--deadline", type=float, default=0.0,
                   help="seconds after which no new op starts (0: none)")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    global GRAD, INPLACE, DYNAMIC, DTYPE, DEVICE
    DEVICE = args.device
    DTYPE = getattr(torch, args.dtype)
    if not DTYPE.is_floating_point:
        GRAD = False
    if args.dynamic:
        DYNAMIC = True
    if args.no_grad:
        GRAD = False
    if args.inplace:
        INPLACE = True
    if args.options:
        OPTIONS.update(json.loads(args.options))
    if args.merge_oracle is not None:
        n, dropped = merge_oracle(args.merge_oracle, args.oracle)
        print(f"merged {n} samples, dropped {dropped} (not the same sample here)")
        return 0
    return _sweep(args)


if __name__ == "__main__":
    sys.exit(main())
