"""Ember's command line: ``python -m ember backends`` / ``ember backends``, ``ember demo``,
``ember cache info|clear``, ``ember precompile MODULE:FUNC -o DIR``."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

__all__ = ["main", "format_table", "format_options"]

_COLUMNS = (("name", "BACKEND"), ("provider", "DISTRIBUTION"), ("level", "LEVEL"),
            ("training", "TRAINING"), ("devices", "DEVICES"), ("tags", "TAGS"),
            ("status", "LOADS"))


def format_table(rows: Sequence[dict[str, Any]], *, describe: bool = False) -> str:
    """Render :func:`ember.plugins.backend_table` rows as an aligned text table."""
    cols = list(_COLUMNS) + ([("description", "DESCRIPTION")] if describe else [])
    cells = []
    for r in rows:
        r = dict(r, provider=f"{r['distribution']} {r['version']}".strip())
        cells.append([str(r.get(k, "")) or "-" for k, _ in cols])
    header = [h for _, h in cols]
    # The last column (status / description) is not padded: errors may be long.
    widths = [max([len(header[i])] + [len(c[i]) for c in cells]) for i in range(len(cols) - 1)]

    def line(values: Sequence[str]) -> str:
        return "  ".join([v.ljust(w) for v, w in zip(values, widths)] + [values[-1]]).rstrip()

    return "\n".join([line(header)] + [line(c) for c in cells])


def format_options(rows: Sequence[dict[str, Any]]) -> str:
    """Each usable backend's options (``ember.compile(options={...})``), one per line."""
    from .plugins import get_backend

    out = []
    for r in rows:
        if r["status"] != "ok":
            continue
        accepted = get_backend(r["name"]).accepted_options()
        out.append(f"\n{r['name']}:")
        if accepted is None:
            out.append("  (not declared: the backend takes any option)")
        elif not accepted:
            out.append("  (no options)")
        for k, doc in sorted((accepted or {}).items()):
            out.append(f"  {k:<24} {doc}".rstrip())
    return "\n".join(out)


def _cmd_backends(args: argparse.Namespace) -> int:
    from .plugins import backend_table

    rows = backend_table()
    if not rows:
        print("no ember backends installed: pip install ./plugins/eager (from the Ember source "
              "tree) or another ember plugin package")
        return 1
    print(format_table(rows, describe=args.describe))
    for r in rows:  # backends on an external runtime: which one, and what it offers
        if r.get("runtime"):
            print(f"runtime of {r['name']}: {r['runtime']}")
    if args.options:
        print(format_options(rows))
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        print(f"\n{len(failed)} backend(s) or plugin(s) cannot be used; see LOADS above.",
              file=sys.stderr)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .examples import run_demo

    return run_demo(backends=args.backend or None, iters=args.iters)


def _core_cache(action: str) -> int:
    """Without the inductor plugin: the core's own entries (AOT graphs, persisted captures)."""
    import shutil

    from .aot.cache import cache_dir

    root = cache_dir() / "text"
    files = {ns: sorted((root / ns).glob("*.json")) for ns in ("aot", "capture")}
    if action == "clear":
        for ns in files:
            shutil.rmtree(root / ns, ignore_errors=True)
        print(f"removed {sum(len(f) for f in files.values())} file(s) from {cache_dir()}")
        return 0
    print(f"cache dir: {cache_dir()} (the inductor plugin is not installed: its kernels and "
          "wrappers are not listed)")
    for ns, f in files.items():
        print(f"  text namespace {ns!r}: {len(f)} entries")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    # Kernels and wrappers belong to the inductor plugin (whose text store also holds the core's
    # AOT graphs and persisted captures); the core must work without it.
    try:
        from ember_inductor.runtime import cache
    except ImportError:
        return _core_cache(args.action)
    if args.action == "clear":
        n = cache.clear()
        print(f"removed {n} file(s) from {cache.cache_dir()}")
        return 0
    st = cache.info()
    print(f"cache dir: {st['dir']}")
    labels = {"so": "compiled libraries", "cpp": "C++ sources", "meta": "library metadata",
              "text": "text (wrappers, tuning, AOT, captures)", "other": "locks and temporaries"}
    for kind, label in labels.items():
        print(f"  {label:<42} {st['entries'][kind]:>7} files {_human(st['bytes'][kind]):>10}")
    print(f"  {'total':<42} {sum(st['entries'].values()):>7} files "
          f"{_human(st['total_bytes']):>10}")
    for ns, n in st.get("text_namespaces", {}).items():
        print(f"  text namespace {ns!r}: {n} entries")
    return 0


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _cmd_precompile(args: argparse.Namespace) -> int:
    from .precompile.__main__ import main as precompile_main

    return precompile_main(args.args, prog="python -m ember precompile")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["precompile"]:  # its own parser (options such as -h belong to it)
        return _cmd_precompile(argparse.Namespace(args=argv[1:]))
    parser = argparse.ArgumentParser(prog="ember", description="Ember, a compiler for PyTorch "
                                     "programs.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("backends", help="list every installed backend and whether it loads")
    p.add_argument("-d", "--describe", action="store_true", help="add a description column")
    p.add_argument("--options", action="store_true",
                   help="also list each backend's options (ember.compile(options={...}))")
    p.set_defaults(func=_cmd_backends)
    p = sub.add_parser("demo", help="compile the bundled model; print correctness and speed")
    p.add_argument("--backend", action="append", help="backend to run (repeatable); default: "
                   "inductor (eager and aot_eager where inductor is not available)")
    p.add_argument("--iters", type=int, default=50, help="timed calls per variant (default 50)")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("cache", help="show or empty the on-disk compile cache (EMBER_CACHE_DIR)")
    p.add_argument("action", choices=("info", "clear"), help="info: where it is and how big; "
                   "clear: remove every entry")
    p.set_defaults(func=_cmd_cache)
    p = sub.add_parser("precompile", add_help=False, help="precompile a function ahead of time "
                       "into an artifact (source + cache); 'ember precompile -h' for more")
    p.set_defaults(func=_cmd_precompile, args=[])
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
