"""What one call of a compiled model costs before its graph runs: the entry's guards, input
fetches and output handling, with the compiled graph replaced by a function that returns the
outputs it returned before (so the kernels cost nothing). On a GPU under CUDA graphs this is
most of what a replay adds over the kernels' own time.

    python -m benchmarks.guard_cost [bert gpt2 resnet50-like]    # CPU, inference

``resnet50-like`` is a torchvision-free ResNet-50 (bottleneck blocks 3-4-6-3, 1879 guards).
Prints microseconds a call (median of 7 runs of 2000 calls), the number of guards and whether
the parameters' metadata guard runs in C++ (ember/capture/tensor_check.py)."""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn as nn

import ember


class _Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = mid * 4
        self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = torch.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet50Like(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for mid, n, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for i in range(n):
                layers.append(_Bottleneck(cin, mid, stride if i == 0 else 1))
                cin = mid * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1)
        return self.fc(torch.flatten(x, 1))


def _model(name: str) -> tuple[nn.Module, tuple]:
    if name == "resnet50-like":
        return ResNet50Like().eval(), (torch.randn(1, 3, 32, 32),)
    from .zoo import get_spec

    m, inputs = get_spec(name).build("cpu", "small")
    return m.eval(), tuple(inputs)


def entry_cost(name: str, calls: int = 2000) -> dict:
    from ember.capture import tensor_check
    from ember.capture.frame import CompiledFunction

    torch.manual_seed(0)
    m, inputs = _model(name)
    # built (or loaded) before the entry is: entries split their guards only with it loaded
    tensor_check.extension(wait=300)
    f = ember.compile(m, backend="eager")
    with torch.no_grad():
        f(*inputs)
        cf = f.__dict__["_ember_call"]  # the module's CompiledFunction
        assert isinstance(cf, CompiledFunction) and cf.cache.entries
        entry = cf.cache.entries[0]
        g = entry.__globals__
        real = g["___compiled"]
        saved: list = []

        def record(*a):
            saved.append(real(*a))
            return saved[-1]

        g["___compiled"] = record
        f(*inputs)
        g["___compiled"] = lambda *a: saved[-1]
        for _ in range(200):
            f(*inputs)
        runs = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(calls):
                f(*inputs)
            runs.append((time.perf_counter() - t) / calls * 1e6)
        g["___compiled"] = real
    return {"model": name, "us": statistics.median(runs), "guards": len(entry.guards),
            "tensor_check": "C++" if tensor_check._ext is not None else "Python",
            "stable": "___stable_ok" in g}


def main(argv: list[str] | None = None) -> None:
    names = (argv if argv is not None else sys.argv[1:]) or ["bert", "gpt2", "resnet50-like"]
    torch.set_num_threads(1)
    for n in names:
        r = entry_cost(n)
        print(f"{r['model']:14} {r['us']:8.1f} us a call before the graph  ({r['guards']} guards, "
              f"tensor check in {r['tensor_check']}, "
              f"{'state-version check' if r['stable'] else 'all guards in Python'})", flush=True)


if __name__ == "__main__":
    main()
