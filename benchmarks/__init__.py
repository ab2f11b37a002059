"""Ember's benchmark runner and model zoo.

    python -m benchmarks run --device cpu --mode infer \
        --backends eager,ember-eager,ember-aot-eager,torch-eager,torch-aot-eager,\
ember-inductor,torch-inductor
    python -m benchmarks demo      # the bundled model: eager vs ember-inductor vs torch-inductor

Times eager PyTorch, Ember (``ember-<backend>``) and torch.compile (``torch-<backend>``) on the same
models in one process, interleaved, checks accuracy against an fp64 reference, measures cold and
warm compile seconds in fresh processes, and writes a markdown table, a CSV and a PNG plot under
docs/benchmarks/. See docs/benchmarks.md.
"""
