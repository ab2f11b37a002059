"""One table from an inference report and a training report of the same models: each Ember
build's speedup over eager beside torch.compile's, their ratio, and the compile probes.

    python -m benchmarks summary docs/benchmarks/cpu-infer-wide.json docs/benchmarks/cpu-train-wide.json

prints a markdown table per Ember build found in the reports (``ember-inductor``,
``ember-inductor+x86-64-v3``, ...), each against ``torch-inductor`` (``--peer``), with the
geometric means and the models below a floor (``--floor``, default 0.95× eager) listed after
it. Only rows whose accuracy passed count; a row that did not run or failed shows its status.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .report import geomean

__all__ = ["summarize"]


def _rows(path: Path | None) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    if path is None:
        return {}, {}
    res = json.loads(path.read_text())
    return {(r["model"], r["backend"]): r for r in res["rows"]}, res


def _ok(r: dict[str, Any] | None) -> bool:
    return bool(r and r.get("speedup") and str(r.get("accuracy", "")).startswith("pass"))


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}"


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def summarize(infer: Path | None, train: Path | None, peer: str = "torch-inductor",
              floor: float = 0.95) -> str:
    """The markdown tables (one per Ember build present in either report)."""
    inf, inf_res = _rows(infer)
    trn, trn_res = _rows(train)
    models = list(dict.fromkeys(m for m, _ in [*inf, *trn]))
    builds = [b for b in dict.fromkeys(b for _, b in [*inf, *trn]) if b.startswith("ember-")]
    out: list[str] = []
    for res, what in ((inf_res, "inference"), (trn_res, "training")):
        if res:
            out.append(f"* {what}: `{res['commands'][0]}` — {res['machine'].get('cpu', '?')}; "
                       f"ISA {res['machine'].get('isa', '?')}; {res['machine'].get('date', '')}")
    for b in builds:
        out += ["", f"**{b}** against **{peer}** (speedup over eager; ratio = {b} / {peer})", "",
                "| model | inference: eager ms | Ember | torch.compile | ratio | training: eager ms "
                "| Ember | torch.compile | ratio | cold compile s: Ember | torch.compile "
                "| warm start s: Ember | torch.compile |",
                "|" + "---|" * 13]
        means: dict[str, list[float]] = {k: [] for k in ("ie", "ip", "te", "tp")}
        low: list[str] = []
        for m in models:
            cells = [m]
            for rows, (ke, kp), what in ((inf, ("ie", "ip"), "inference"),
                                         (trn, ("te", "tp"), "training")):
                e, p, eg = rows.get((m, b)), rows.get((m, peer)), rows.get((m, "eager"))
                se = e["speedup"] if _ok(e) else None
                sp = p["speedup"] if _ok(p) else None
                if se and sp:  # geomeans over the models both ran
                    means[ke].append(se)
                    means[kp].append(sp)
                if se is not None and se < floor:
                    low.append(f"{m} {what} {se:.2f}×")
                status = "" if e is None or _ok(e) else f" ({e.get('status') or e.get('accuracy')})"
                cells += [_s(eg and eg.get("median_ms")), _x(se) + status, _x(sp), _ratio(se, sp)]
            e, p = inf.get((m, b)) or {}, inf.get((m, peer)) or {}
            cells += [_s(e.get("cold_compile_s")), _s(p.get("cold_compile_s")),
                      _s(e.get("warm_compile_s")), _s(p.get("warm_compile_s"))]
            out.append("| " + " | ".join(cells) + " |")
        gi = [geomean(means[k]) for k in ("ie", "ip", "te", "tp")]
        out.append(f"| **geomean** | | **{_x(gi[0])}** | **{_x(gi[1])}** | **{_ratio(gi[0], gi[1])}** "
                   f"| | **{_x(gi[2])}** | **{_x(gi[3])}** | **{_ratio(gi[2], gi[3])}** | | | | |")
        out += ["", f"Below {floor:.2f}× eager: " + (", ".join(low) if low else "none") + "."]
    return "\n".join(out) + "\n"
