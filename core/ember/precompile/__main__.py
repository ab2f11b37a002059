"""``python -m ember.precompile MODULE:FACTORY -o DIR``: precompile a function and save it.

``FACTORY`` is a zero-argument callable returning ``(fn, example_inputs)``; the artifact is
written to ``DIR/artifact.py`` and ``DIR/artifact.cache``. ``--no-grad`` precompiles under
``torch.no_grad()`` (inference); ``--check`` loads the artifact back and compares one call
with eager.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Sequence

__all__ = ["main"]


def _resolve(spec: str):  # noqa: ANN202
    mod, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise SystemExit(f"expected MODULE:FACTORY, got {spec!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    import ember

    p = argparse.ArgumentParser(prog="python -m ember.precompile",
                                description="Precompile fn(*example_inputs) from a factory "
                                "MODULE:FACTORY returning (fn, example_inputs); save the artifact.")
    p.add_argument("factory", help="e.g. ember.precompile.recipes:demo_inference")
    p.add_argument("-o", "--out", required=True, help="output folder (artifact.py, artifact.cache)")
    p.add_argument("--backend", default="aot_eager", help="backend name (default aot_eager)")
    p.add_argument("--no-grad", action="store_true", help="precompile under torch.no_grad()")
    p.add_argument("--check", action="store_true", help="load the artifact back and compare "
                   "one call with eager")
    args = p.parse_args(argv)
    fn, example = _resolve(args.factory)()
    t0 = time.perf_counter()
    with torch.set_grad_enabled(not args.no_grad):
        art = ember.precompile(fn, *example, backend=args.backend)
    art.save(args.out)
    print(f"precompiled {art.meta['function']} with {art.meta['backend']} ({art.meta['kind']}) "
          f"in {time.perf_counter() - t0:.2f} s -> {args.out} (source {len(art.source)} chars, "
          f"cache {len(art.cache)} bytes)")
    if args.check:
        loaded = ember.precompile.load(args.out)
        with torch.set_grad_enabled(not args.no_grad):
            got, want = loaded(*example), fn(*example)
        same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(
            torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want))
            if isinstance(a, torch.Tensor))
        print(f"check: loaded artifact {'matches' if same else 'DIFFERS FROM'} eager")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
