"""One training step of a zoo model on the GPU, float32 without TF32: the outputs and every
parameter's gradient of eager, Ember's inductor and torch.compile, each compared with the same
step in float64 (the accuracy rule: a compiler's error is judged against eager float32's own
error, not against eager float32's values).

    python3 scripts/gpu_accuracy.py --models resnet50,convnet [--size small]

Prints, per model and backend, the largest relative error over outputs and over gradients
(max |g - g64| / max |g64| per tensor) and the five worst parameters, so a large difference
between Ember and eager float32 is told apart from a gradient that is ill-conditioned in float32
for every backend.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.getcwd())


def _step(model, inputs, fn=None):
    from benchmarks import zoo as Z

    fn = model if fn is None else fn
    model.zero_grad(set_to_none=True)
    out = Z.flatten_outputs(fn(*inputs))
    Z.reduce_to_loss(out).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return [o.detach().clone() for o in out if isinstance(o, torch.Tensor)], grads


def _rel(a, b):
    return float((a.double() - b.double()).abs().max() / (b.double().abs().max() + 1e-30))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet50")
    p.add_argument("--size", default="small")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import ember
    from benchmarks import zoo as Z

    for name in a.models.split(","):
        model, inputs = Z.get_spec(name).build(a.device, a.size)
        model.train()
        base = copy.deepcopy(model.state_dict())
        runs = {}
        m64 = copy.deepcopy(model).double()
        in64 = [x.double() if x.is_floating_point() else x for x in inputs]
        runs["fp64"] = _step(m64, in64)
        for backend in ("eager", "ember", "torch"):
            model.load_state_dict(base)
            fn = None
            if backend == "ember":
                fn = ember.compile(model)
            elif backend == "torch":
                fn = torch.compile(model)
            if fn is not None:
                _step(model, inputs, fn)  # compile (and one step's BatchNorm update)
                model.load_state_dict(base)
            runs[backend] = _step(model, inputs, fn)
        o64, g64 = runs["fp64"]
        print(f"== {name} ({a.size}, float32, TF32 off): relative error vs float64")
        for backend in ("eager", "ember", "torch"):
            outs, grads = runs[backend]
            oerr = max(_rel(x, y) for x, y in zip(outs, o64))
            gerrs = sorted(((_rel(grads[n], g64[n]), n) for n in g64 if n in grads), reverse=True)
            print(f"{backend:6} out {oerr:.2e}  grad max {gerrs[0][0]:.2e}  worst: "
                  + ", ".join(f"{n} {e:.1e}" for e, n in gerrs[:5]))
        # Ember against eager float32 directly, as the check script measures it
        _, ge = runs["eager"]
        _, gm = runs["ember"]
        d = sorted(((_rel(gm[n], ge[n]), n) for n in ge if n in gm), reverse=True)[:3]
        print("ember vs eager fp32: " + ", ".join(f"{n} {e:.1e}" for e, n in d))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
