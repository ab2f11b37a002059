"""The bucket split's partition, without processes: buckets counted from the end of the graph."""

from __future__ import annotations

import torch

from ember.distributed.ddp import bucket_partition, maybe_split


def _graph() -> torch.fx.GraphModule:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(64, 64)   # 16.6 KB
            self.b = torch.nn.Linear(64, 64)
            self.c = torch.nn.Linear(64, 8)    # 2 KB

        def forward(self, x):
            f = torch.nn.functional.linear
            x = torch.relu(f(x, self.a.weight, self.a.bias))
            x = torch.relu(f(x, self.b.weight, self.b.bias))
            return f(x, self.c.weight, self.c.bias)

    return torch.fx.symbolic_trace(Net())


def _params(gm: torch.fx.GraphModule) -> dict[str, tuple[int, int]]:
    out = {}
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            p = gm.get_parameter(n.target)
            out[n.name] = (id(p), p.numel() * p.element_size())
    return out


def _lift(gm: torch.fx.GraphModule, sizes: dict | None = None) -> torch.fx.GraphModule:
    """Parameters as placeholders, as a captured graph has them (``sizes`` re-keyed by the
    placeholders' names)."""
    g = gm.graph
    for n in list(g.nodes):
        if n.op == "get_attr":
            with g.inserting_before(next(iter(g.nodes))):
                ph = g.placeholder("p_" + n.name)
            n.replace_all_uses_with(ph)
            if sizes is not None:
                sizes[ph.name] = sizes.pop(n.name)
            g.erase_node(n)
    gm.recompile()
    return gm


def test_buckets_close_at_the_cap_from_the_end():
    gm = _graph()
    sizes = _params(gm)
    gm = _lift(gm, sizes)
    names = lambda bs: [[n.name for n in b] for b in bs]  # noqa: E731
    # cap 10 KB: the head and layer b close the first bucket, layer a the second
    buckets = bucket_partition(gm, sizes, cap=10_000, first_cap=10_000)
    assert len(buckets) == 2, names(buckets)
    assert [n.name for n in buckets[0]] == ["linear", "relu"]  # layer a
    # a huge cap: one bucket (no split)
    assert len(bucket_partition(gm, sizes, cap=10**9, first_cap=10**9)) == 1
    # every node is in exactly one bucket, in program order
    flat = [n for b in buckets for n in b]
    order = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    assert flat == order


def test_no_split_outside_a_ddp_forward():
    gm = _lift(_graph())
    called = []
    assert maybe_split(gm, [], [], "g", lambda *a, **k: called.append(a)) is None
    assert not called


def test_process_pools_allowed_outside_daemonic_processes():
    from ember._workers import process_pool_allowed

    assert process_pool_allowed()  # pytest's own process (the daemonic case: test_ranks.py)
