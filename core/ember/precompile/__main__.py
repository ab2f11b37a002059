"""``python -m ember precompile MODULE:FUNC [ARG ...] -o DIR`` (also ``python -m
ember.precompile``): precompile a function and save the artifact.

``FUNC`` is a factory called with the extra words ``ARG ...`` (strings) and returning
``(fn, example_inputs)`` or ``(fn, example_inputs, {"grad": bool})``; the artifact is written to
``DIR/artifact.py`` and ``DIR/artifact.cache``. ``--no-grad`` precompiles under
``torch.no_grad()`` (inference; a factory may say so itself with ``{"grad": False}``);
``--check`` loads the artifact back and compares one call (results and gradients) with eager
on copies of the example inputs.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import time
from typing import Any, Sequence

__all__ = ["main"]

_EXAMPLES = """examples (from the root of the Ember source tree):
  %(prog)s ember.precompile.recipes:demo_inference -o out/demo --check
  %(prog)s ember.precompile.recipes:zoo mlp infer -o out/mlp --backend inductor --check
  %(prog)s ember.precompile.recipes:zoo gpt2 step -o out/gpt2_step --check
"""


def _resolve(spec: str) -> Any:
    mod, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise SystemExit(f"expected MODULE:FUNC, got {spec!r}")
    if "" not in sys.path and "." not in sys.path:  # modules of the current folder, as python -m
        sys.path.insert(0, "")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _tensors(x: Any) -> list[Any]:
    import torch

    return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def _check(loaded: Any, fn: Any, example: tuple, grad: bool) -> tuple[bool, str]:
    """One call of the loaded artifact and one of ``fn``, each on its own copy of the inputs:
    same results, and (training) same gradients in the modules' parameters."""
    import torch

    mine, ref = copy.deepcopy(example), copy.deepcopy(example)
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        got = loaded(*mine)
    first = time.perf_counter() - t0
    with torch.set_grad_enabled(grad):
        want = fn(*ref)
    pairs = list(zip(_tensors(got), _tensors(want)))
    for a, b in zip(mine, ref):
        if isinstance(a, torch.nn.Module):
            pairs += [(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters())
                      if p.grad is not None or q.grad is not None]
    ok = len(_tensors(got)) == len(_tensors(want)) and all(
        a is not None and b is not None and torch.allclose(a.detach(), b.detach(), rtol=1e-4,
                                                           atol=1e-5) for a, b in pairs)
    return ok, f"{len(pairs)} tensors compared, first call {first:.3f} s"


def main(argv: Sequence[str] | None = None, prog: str = "python -m ember precompile") -> int:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EXAMPLES,
        description="Precompile fn(*example_inputs) from a factory MODULE:FUNC returning "
        "(fn, example_inputs); save the artifact (artifact.py + artifact.cache) to DIR.")
    p.add_argument("factory", metavar="MODULE:FUNC",
                   help="e.g. ember.precompile.recipes:demo_inference")
    p.add_argument("args", nargs="*", metavar="ARG", help="arguments of the factory (strings)")
    p.add_argument("-o", "--out", required=True, metavar="DIR",
                   help="output folder (artifact.py, artifact.cache)")
    p.add_argument("--backend", default="aot_eager", help="backend name (default aot_eager)")
    p.add_argument("--no-grad", action="store_true", help="precompile under torch.no_grad()")
    p.add_argument("--check", action="store_true", help="load the artifact back and compare "
                   "one call with eager")
    args = p.parse_args(argv)

    import torch

    import ember

    made = _resolve(args.factory)(*args.args)
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise SystemExit(f"{args.factory} must return (fn, example_inputs) or (fn, "
                         f"example_inputs, settings), got {type(made).__name__}")
    fn, example = made[0], tuple(made[1])
    grad = bool((made[2] if len(made) == 3 else {}).get("grad", True)) and not args.no_grad
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        art = ember.precompile(fn, *example, backend=args.backend)
    art.save(args.out)
    print(f"precompiled {art.meta['function']} with {art.meta['backend']} ({art.meta['kind']}"
          f"{', grad mode' if grad else ', no_grad'}) in {time.perf_counter() - t0:.2f} s -> "
          f"{args.out} (source {len(art.source)} chars, cache {len(art.cache)} bytes)")
    if args.check:
        loaded = ember.precompile.load(args.out)
        same, detail = _check(loaded, fn, example, grad)
        print(f"check: loaded artifact {'matches' if same else 'DIFFERS FROM'} eager ({detail})")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m ember.precompile"))
