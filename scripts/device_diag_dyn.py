"""Diagnose the dynamic-shape sweep on the GPU machine's torch: which guard sends length 4 to a
third graph (EMBER_LOGS=guards,recompiles printed to stderr)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import torch  # noqa: E402

import ember  # noqa: E402
from hf import models as hf_models  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
model, _ = hf_models.build(name)
model.eval()
compiled = ember.compile(model, backend="eager")
with torch.no_grad():
    for length in (2, 3, 4, 5):
        ids = torch.randint(3, hf_models.VOCAB, (2, length))
        print(f"--- length {length}", file=sys.stderr, flush=True)
        compiled(input_ids=ids)
