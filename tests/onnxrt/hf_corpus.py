"""The Hugging Face corpus (tests/hf/models.py) in eval through ``onnxrt``: accuracy against eager
(the corpus' rule: 1e-3, then the float64 rule) and the share of ops ONNX Runtime ran.

    python -m tests.onnxrt.hf_corpus [NAME ...]          # all models by default
    python -m tests.onnxrt.hf_corpus --markdown           # the table for docs

Also used by tests/onnxrt/test_hf_onnxrt.py on a subset.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import time


@dataclasses.dataclass
class Row:
    name: str
    accuracy: str
    ort_ops: int
    total_ops: int
    subgraphs: int
    graphs: int
    fallbacks: int
    seconds: float
    aten_ops: dict[str, str]
    error: str = ""

    @property
    def share(self) -> float:
        return self.ort_ops / self.total_ops if self.total_ops else 0.0

    @property
    def ok(self) -> bool:
        return not self.error and self.accuracy.startswith("pass") and self.fallbacks == 0


def run(name: str) -> Row:
    from ember_onnxrt import backend as B

    from tests.hf import harness

    B.last_compiled.clear()
    t0 = time.perf_counter()
    r = harness.run_ember(name, "eval", "onnxrt")
    comps = list(B.last_compiled)
    aten: dict[str, str] = {}
    for c in comps:
        for k, v in c.aten_ops.items():
            aten.setdefault(k, v)
    return Row(name, r.accuracy, sum(c.ort_ops for c in comps),
               sum(c.total_ops for c in comps), sum(c.subgraphs for c in comps), r.graphs,
               r.fallbacks, time.perf_counter() - t0, aten, r.error)


def table(rows: list[Row], markdown: bool = False) -> str:
    head = ["model", "result", "ops in ORT", "share", "subgraphs", "ATen ops (why)"]
    lines = []
    for r in rows:
        why = "; ".join(f"{k}: {v[:60]}" for k, v in sorted(r.aten_ops.items())) or "-"
        result = r.error[:60] if r.error else ("fallback" if r.fallbacks else r.accuracy)
        lines.append([r.name, result, f"{r.ort_ops}/{r.total_ops}", f"{100 * r.share:.0f}%",
                      str(r.subgraphs), why])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(x.replace("|", "\\|") for x in line) + " |" for line in lines]
        return "\n".join(out)
    return "\n".join("  ".join(x for x in line) for line in [head] + lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    import torch

    from tests.hf import models

    torch.manual_seed(0)
    names = args.names or list(models.SPECS)
    rows = []
    for n in names:
        try:
            row = run(n)
        except Exception as e:  # noqa: BLE001  every model is listed
            row = Row(n, "", 0, 0, 0, 0, 0, 0.0, {}, f"{type(e).__name__}: {e}")
        rows.append(row)
        print(f"{n}: {row.error or row.accuracy} {row.ort_ops}/{row.total_ops} "
              f"({100 * row.share:.0f}%) {row.seconds:.1f}s", file=sys.stderr, flush=True)
    print(table(rows, args.markdown))
    wrong = [r.name for r in rows if not r.ok]
    full = sum(1 for r in rows if r.ok and r.ort_ops == r.total_ops)
    ops = collections.Counter()
    for r in rows:
        for k in r.aten_ops:
            ops[k] += 1
    print(f"\n{len(rows)} models, {len(rows) - len(wrong)} right, not right: {wrong}; "
          f"{full} wholly in ORT; ops kept in ATen (models): {dict(ops.most_common())}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
