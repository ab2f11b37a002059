"""A Triton compile worker: ``python -m ember_inductor.runtime.triton_worker``. Reads one JSON
job per line on stdin (the arguments of ``runtime.triton._worker_build``), compiles the kernel
for the given GPU target, publishes its files in Ember's cache, and answers one JSON line
(``{"ok": "built" | "hit"}`` or ``{"error": ...}``). A process of its own (not
``multiprocessing``), so a user's script is never re-imported in a worker."""

from __future__ import annotations

import json
import sys


def main() -> None:
    from ember_inductor.runtime.triton import _worker_build

    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            job["target"] = tuple(job["target"])
            out = {"ok": _worker_build(**job)}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which compiles itself
            out = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
