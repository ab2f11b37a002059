"""Oracle tables collected by the oracle tests and printed in pytest's terminal summary."""

from __future__ import annotations

TABLES: dict[str, dict[str, list]] = {}


def add_row(table: str, header: list[str], row: list) -> None:
    TABLES.setdefault(table, {"header": header, "rows": []})["rows"].append(row)


def render(table: str, only_diff: bool = True) -> str:
    t = TABLES.get(table)
    if not t:
        return ""
    header, rows = t["header"], t["rows"]
    shown = [r for r in rows if not only_diff or r[-1]]
    cells = [header] + [[str(c) for c in r[:-1]] + [str(r[-1])] for r in shown]
    widths = [max(len(str(r[i])) for r in cells) for i in range(len(header))]
    lines = [f"{table}: {len(shown)} of {len(rows)} programs differ from torch.compile"]
    for r in cells:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)
