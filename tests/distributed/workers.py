"""What each spawned rank runs (tests/distributed/test_*.py). Each function batches several
checks into one spawn (spawned processes are expensive) and asserts on every rank."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks.accuracy import compare

STEPS = 3


# -- models -------------------------------------------------------------------------------------

class MLP(torch.nn.Module):
    def __init__(self, d: int = 64, layers: int = 4, unused: bool = False):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.head = torch.nn.Linear(d, 8)
        self.unused = torch.nn.Linear(d, d) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return self.head(x)


def mlp(**kw: Any) -> Callable[[], torch.nn.Module]:
    def make() -> torch.nn.Module:
        torch.manual_seed(0)
        return MLP(**kw)
    return make


def gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(cfg)


def mlp_batch(rank: int, step: int, dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return (torch.randn(8, 64, generator=g).to(dtype),)


def gpt2_batch(rank: int, step: int, dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return (torch.randint(0, 96, (2, 16), generator=g),)


def mlp_loss(out: Any, batch: tuple[Any, ...]) -> torch.Tensor:
    return out.pow(2).mean()


def gpt2_loss(out: Any, batch: tuple[Any, ...]) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out["logits"]
    ids = batch[0]
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             ids[:, 1:].reshape(-1))


# -- training loops -----------------------------------------------------------------------------

def train(make: Callable[[], torch.nn.Module], wrap: Callable[[torch.nn.Module], Any],
          batch: Callable[..., tuple[Any, ...]], loss_fn: Callable[..., torch.Tensor],
          rank: int, *, dtype: torch.dtype = torch.float32, accumulate: bool = False,
          steps: int = STEPS) -> list[list[Any]]:
    """Per optimizer step: [loss, grad of every parameter...] (in the model's parameter order).
    ``accumulate``: each step is two micro-batches, the first under ``no_sync()``."""
    model = make().to(dtype)
    names = [n for n, _ in model.named_parameters()]
    wrapped = wrap(model)
    # per-block compiles put an OptimizedModule (``_orig_mod``) in the path
    params = {n.replace("_orig_mod.", ""): p for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out: list[list[Any]] = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        if accumulate:
            ddp = wrapped if isinstance(wrapped, DDP) else getattr(wrapped, "_orig_mod", wrapped)
            with ddp.no_sync():
                b = batch(rank, 10 + step, dtype)
                loss_fn(wrapped(*b), b).backward()
        b = batch(rank, step, dtype)
        loss = loss_fn(wrapped(*b), b)
        loss.backward()
        grads = [params[n].grad for n in names]
        out.append([loss.detach().clone()] + [None if g is None else _full(g).clone()
                                              for g in grads])
        opt.step()
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's sharded gradient) gathered to the full tensor."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def check(name: str, res: list[list[Any]], ref32: list[list[Any]], ref64: list[list[Any]],
          rank: int, tol: float = 1e-2) -> None:
    for step, (a, b, c) in enumerate(zip(res, ref32, ref64)):
        r = compare(a, b, c, tol)
        assert r.ok, f"rank {rank} {name} step {step}: {r} (loss {a[0]} vs eager {b[0]})"


@contextlib.contextmanager
def counting():
    import ember
    from ember import events

    ember.reset()
    yield events.counters


def stats(counters: Any) -> dict[str, int]:
    s = dict(counters["stats"])
    return {"graphs": s.get("graphs", 0), "breaks": s.get("graph_breaks", 0),
            "fallbacks": s.get("fallbacks", 0), "pieces": counters["ddp"].get("pieces", 0),
            "split": counters["ddp"].get("split_graphs", 0)}


# -- DDP ----------------------------------------------------------------------------------------

def ddp_mlp(rank: int, world: int) -> None:
    """DDP on an MLP: both wrappings, aot_eager and inductor, the bucket split, no_sync,
    find_unused_parameters, static_graph; loss and every gradient on every rank, 3 steps."""
    import ember

    make = mlp()
    cap = 0.01  # MiB: ~10 KB buckets; each 16 KB layer closes one

    def ddp(**kw: Any) -> Callable[[torch.nn.Module], Any]:
        return lambda m: DDP(m, bucket_cap_mb=cap, **kw)

    def run(wrap: Any, **kw: Any) -> list[list[Any]]:
        return train(make if "make" not in kw else kw.pop("make"), wrap, mlp_batch, mlp_loss,
                     rank, **kw)

    ref32 = run(ddp())
    ref64 = run(ddp(), dtype=torch.float64)
    for backend in ("aot_eager", "inductor"):
        with counting() as c:
            res = run(lambda m: ember.compile(DDP(m, bucket_cap_mb=cap), backend=backend))
            s = stats(c)
        check(f"ember.compile(DDP) {backend}", res, ref32, ref64, rank)
        # one captured graph, no break, split in 4 pieces counted from the end:
        # (head + layer 4), layer 3, layer 2, layer 1
        assert s["graphs"] == 1 and s["breaks"] == 0 and s["fallbacks"] == 0, s
        assert s["split"] == 1 and s["pieces"] == 4, s
        with counting() as c:
            res = run(lambda m: DDP(ember.compile(m, backend=backend), bucket_cap_mb=cap))
            s = stats(c)
        check(f"DDP(ember.compile) {backend}", res, ref32, ref64, rank)
        assert s["graphs"] == 1 and s["breaks"] == 0 and s["split"] == 1 and s["pieces"] == 4, s

    # again in a fresh compile: the capture is rebuilt from the on-disk store (no example
    # values on its nodes) and still splits
    from ember.capture import persist

    hits = persist.counters["hits"]
    with counting() as c:
        res = run(lambda m: ember.compile(DDP(m, bucket_cap_mb=cap), backend="aot_eager"))
        s = stats(c)
    check("ember.compile(DDP) aot_eager, warm", res, ref32, ref64, rank)
    assert persist.counters["hits"] > hits, persist.counters  # rebuilt, not traced
    assert s["split"] == 1 and s["pieces"] == 4, s

    # a large bucket: one piece, no split
    with counting() as c:
        res = run(lambda m: ember.compile(DDP(m), backend="aot_eager"))
        s = stats(c)
    check("ember.compile(DDP) 25 MiB buckets", res, ref32, ref64, rank)
    assert s["graphs"] == 1 and s["split"] == 0, s

    # no_sync() accumulation
    ref32 = run(ddp(), accumulate=True)
    ref64 = run(ddp(), accumulate=True, dtype=torch.float64)
    res = run(lambda m: ember.compile(DDP(m, bucket_cap_mb=cap), backend="aot_eager"),
              accumulate=True)
    check("no_sync", res, ref32, ref64, rank)

    # find_unused_parameters=True with a parameter the forward never uses
    unused = mlp(unused=True)
    ref32 = run(ddp(find_unused_parameters=True), make=unused)
    ref64 = run(ddp(find_unused_parameters=True), make=unused, dtype=torch.float64)
    for backend in ("aot_eager",):
        res = run(lambda m: ember.compile(DDP(m, bucket_cap_mb=cap, find_unused_parameters=True),
                                          backend=backend), make=unused)
        check("find_unused_parameters", res, ref32, ref64, rank)
        assert res[-1][-1] is None and res[-1][-2] is None  # the unused layer has no grad

    # static_graph=True
    ref32 = run(ddp(static_graph=True))
    ref64 = run(ddp(static_graph=True), dtype=torch.float64)
    res = run(lambda m: ember.compile(DDP(m, bucket_cap_mb=cap, static_graph=True),
                                      backend="aot_eager"))
    check("static_graph", res, ref32, ref64, rank)


def ddp_gpt2(rank: int, world: int) -> None:
    """DDP on a GPT-2 from config: both wrappings (aot_eager), and inductor."""
    import ember

    cap = 0.02
    wrap_eager = lambda m: DDP(m, bucket_cap_mb=cap)  # noqa: E731
    ref32 = train(gpt2, wrap_eager, gpt2_batch, gpt2_loss, rank)
    ref64 = train(gpt2, wrap_eager, gpt2_batch, gpt2_loss, rank, dtype=torch.float64)
    cases = [("ember.compile(DDP) aot_eager",
              lambda m: ember.compile(DDP(m, bucket_cap_mb=cap), backend="aot_eager")),
             ("DDP(ember.compile) aot_eager",
              lambda m: DDP(ember.compile(m, backend="aot_eager"), bucket_cap_mb=cap)),
             ("ember.compile(DDP) inductor",
              lambda m: ember.compile(DDP(m, bucket_cap_mb=cap), backend="inductor"))]
    for name, wrap in cases:
        with counting() as c:
            res = train(gpt2, wrap, gpt2_batch, gpt2_loss, rank)
            s = stats(c)
        check(name, res, ref32, ref64, rank)
        assert s["graphs"] == 1 and s["breaks"] == 0 and s["fallbacks"] == 0, (name, s)
        assert s["split"] == 1 and s["pieces"] >= 2, (name, s)


# -- FSDP2 --------------------------------------------------------------------------------------

def _blocks(model: torch.nn.Module) -> tuple[torch.nn.ModuleList, str]:
    if isinstance(model, MLP):
        return model.layers, "layers"
    return model.transformer.h, "transformer.h"


def fsdp_wrap(mode: str, backend: str = "aot_eager", reshard: bool = True,
              mp: Any = None) -> Callable[[torch.nn.Module], Any]:
    """``mode``: "eager" (fully_shard each block, then the root), "block" (ember.compile each
    block, then fully_shard it: the common recipe), "whole" (shard as eager, then
    ember.compile the root)."""
    import ember
    from torch.distributed.fsdp import fully_shard

    from torch.distributed.device_mesh import init_device_mesh

    # the tests run on CPU tensors over gloo: a CPU mesh, also on a machine with a GPU (where
    # fully_shard's default mesh would be a CUDA one)
    kw: dict[str, Any] = {"reshard_after_forward": reshard,
                          "mesh": init_device_mesh("cpu", (torch.distributed.get_world_size(),))}
    if mp is not None:
        kw["mp_policy"] = mp

    def wrap(model: torch.nn.Module) -> Any:
        blocks, _ = _blocks(model)
        for i in range(len(blocks)):
            if mode == "block":
                blocks[i] = ember.compile(blocks[i], backend=backend)
            fully_shard(blocks[i], **kw)
        fully_shard(model, **kw)
        return ember.compile(model, backend=backend) if mode == "whole" else model
    return wrap


def fsdp_mlp(rank: int, world: int, ckpt_dir: str) -> None:
    """FSDP2 on an MLP: per-block compile and whole-model compile, reshard_after_forward either
    way, MixedPrecisionPolicy (bf16 params, fp32 reduce), inductor; a distributed checkpoint of
    the compiled model loads into an uncompiled one and back."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    make = mlp()

    def run(wrap: Any, **kw: Any) -> list[list[Any]]:
        return train(make, wrap, mlp_batch, mlp_loss, rank, **kw)

    for reshard in (True, False):
        ref32 = run(fsdp_wrap("eager", reshard=reshard))
        ref64 = run(fsdp_wrap("eager", reshard=reshard), dtype=torch.float64)
        for mode in ("block", "whole"):
            with counting() as c:
                res = run(fsdp_wrap(mode, reshard=reshard))
                s = stats(c)
            check(f"FSDP2 {mode} reshard={reshard}", res, ref32, ref64, rank)
            # block: one graph per compiled block; whole: the root's loop over its blocks is
            # run as Python (a break inside a loop) and the blocks (one class) compile twice:
            # the first instance, then one graph for the others
            assert s["graphs"] == (4 if mode == "block" else 2) and s["fallbacks"] == 0, (mode, s)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    ref64 = run(fsdp_wrap("eager"), dtype=torch.float64)
    refmp = run(fsdp_wrap("eager", mp=mp))
    for mode, backend in (("block", "aot_eager"), ("whole", "aot_eager"), ("whole", "inductor")):
        res = run(fsdp_wrap(mode, backend, mp=mp))
        check(f"FSDP2 {mode} {backend} bf16 mixed precision", res, refmp, ref64, rank, tol=4e-2)
    dcp_roundtrip(rank, make, ckpt_dir)


def dcp_roundtrip(rank: int, make: Callable[[], torch.nn.Module], ckpt_dir: str) -> None:
    import torch.distributed.checkpoint as dcp

    def full(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {k: _full(v).clone() for k, v in m.state_dict().items()}

    compiled_model = make()
    compiled = fsdp_wrap("whole")(compiled_model)
    b = mlp_batch(rank, 0)
    mlp_loss(compiled(*b), b).backward()  # compiled and trained a little: not the init values
    with torch.no_grad():
        for p in compiled_model.parameters():
            p.add_(0.01 * p.grad)
    dcp.save(compiled.state_dict(), checkpoint_id=f"{ckpt_dir}/a")
    torch.manual_seed(123)
    plain = fsdp_wrap("eager")(MLP())
    sd = plain.state_dict()
    dcp.load(sd, checkpoint_id=f"{ckpt_dir}/a")
    want = full(compiled_model)
    got = full(plain)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), f"rank {rank}: {k} differs after dcp load"
    # back: the uncompiled model changes, is saved, and loads into the compiled one
    with torch.no_grad():
        for p in plain.parameters():
            p.mul_(0.5)
    dcp.save(plain.state_dict(), checkpoint_id=f"{ckpt_dir}/b")
    sd = compiled.state_dict()
    dcp.load(sd, checkpoint_id=f"{ckpt_dir}/b")
    for k, v in full(plain).items():
        assert torch.equal(v, full(compiled_model)[k]), f"rank {rank}: {k} differs (load back)"
    with torch.no_grad():
        assert torch.allclose(compiled(*b), plain(*b), rtol=1e-5, atol=1e-6)


def fsdp_gpt2(rank: int, world: int) -> None:
    """FSDP2 on a GPT-2 from config: per-block and whole-model compile (aot_eager)."""
    ref32 = train(gpt2, fsdp_wrap("eager"), gpt2_batch, gpt2_loss, rank)
    ref64 = train(gpt2, fsdp_wrap("eager"), gpt2_batch, gpt2_loss, rank, dtype=torch.float64)
    for mode in ("block", "whole"):
        with counting() as c:
            res = train(gpt2, fsdp_wrap(mode), gpt2_batch, gpt2_loss, rank)
            s = stats(c)
        check(f"FSDP2 GPT-2 {mode}", res, ref32, ref64, rank)
        assert s["graphs"] >= 2 and s["fallbacks"] == 0, (mode, s)


# -- every rank compiles the same thing, once ---------------------------------------------------

def divergence(rank: int, world: int) -> None:
    """A graph that differs between ranks, and a recompile on one rank only, raise
    ember.RankDivergence naming them, instead of hanging."""
    import ember

    ember.config.dist_timeout = 5.0
    lin = torch.nn.Linear(16, 16)

    def f(x: torch.Tensor, scale: float) -> torch.Tensor:
        return lin(x) * scale

    cf = ember.compile(f, backend="aot_eager")
    x = torch.randn(4, 16)
    try:  # a Python value that differs between ranks: different graphs at the same point
        cf(x, 2.0 + rank)
        raise AssertionError(f"rank {rank}: no error for graphs that differ between ranks")
    except ember.RankDivergence as e:
        msg = str(e)
        assert "compiled different graphs" in msg and "rank 0" in msg and "rank 1" in msg, msg
    dist.barrier()

    def g(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(x))

    cg = ember.compile(g, backend="aot_eager", dynamic=False)
    cg(x)  # both ranks compile this one: agreed
    if rank == 0:  # a shape only rank 0 sees: it alone recompiles
        try:
            cg(torch.randn(5, 16))
            raise AssertionError("rank 0: no error for a recompile on one rank only")
        except ember.RankDivergence as e:
            msg = str(e)
            assert "did not compile" in msg and "[1]" in msg, msg
            assert "guard failed" in msg and "(x).shape == (4, 16)" in msg, msg
    dist.barrier()


def compile_once(rank: int, world: int) -> None:
    """With the cache directory shared by the ranks, rank 0 builds every kernel and rank 1
    waits and loads them; works inside a daemonic process (Ember builds with threads and
    compiler subprocesses, never child processes of multiprocessing)."""
    import multiprocessing

    import ember
    from ember_inductor.runtime import cache

    assert multiprocessing.current_process().daemon
    from ember import events
    from ember._workers import process_pool_allowed

    assert not process_pool_allowed()  # a process pool would fail here: callers fall back

    ember.reset()
    ember.config.dist_compile_once = True
    res = train(mlp(layers=2), lambda m: ember.compile(m, backend="inductor"), mlp_batch,
                mlp_loss, rank, steps=2)
    assert res[-1][0].isfinite()
    waited = events.counters["distributed"]["waited_for_rank0"]
    checked = events.counters["distributed"]["checked_graphs"]
    assert checked >= 1, dict(events.counters["distributed"])
    if rank == 0:
        assert cache.counters["builds"] >= 1 and waited == 0, (cache.counters, waited)
    else:
        # rank 1 compiled after rank 0, from its kernels: no build of its own
        assert cache.counters["builds"] == 0 and cache.counters["disk_hits"] >= 1, cache.counters
        assert waited == checked, dict(events.counters["distributed"])


def gpt2_all(rank: int, world: int) -> None:
    """GPT-2 under DDP and under FSDP2, in one spawn (spawning ranks is expensive)."""
    ddp_gpt2(rank, world)
    fsdp_gpt2(rank, world)


def ranks_all(rank: int, world: int) -> None:
    """Compile-once in daemonic ranks, then the divergence errors (after which the ranks'
    compile numbering is no longer aligned: last)."""
    compile_once(rank, world)
    divergence(rank, world)
