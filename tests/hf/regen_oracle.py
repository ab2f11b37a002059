"""Regenerate tests/hf/oracle.json: torch.compile's graph and break counts on every corpus model
in eval and train (``torch.compile(backend=<counting eager backend>)``, one call each).

    .venv/bin/python -m tests.hf.regen_oracle [NAME ...]

Run it after changing a model's config or inputs in tests/hf/models.py, or after upgrading
torch or transformers; the test suite reads the file and does not run torch.compile itself.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import transformers

from . import harness, models


def main(names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    data = harness.load_oracle()
    data["_versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in names or list(models.SPECS):
        entry = data.setdefault(name, {})
        for mode in ("eval", "train"):
            try:
                entry[mode] = harness.run_torch(name, mode)
            except Exception as e:  # recorded: the test then has no oracle for it
                entry[mode] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(name, mode, entry[mode], flush=True)
        harness.ORACLE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
