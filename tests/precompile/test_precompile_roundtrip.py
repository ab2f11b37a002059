"""ember.precompile: precompile in this process, load in a fresh one, compare with eager."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ember
import pc_cases

HERE = os.path.dirname(os.path.abspath(__file__))


def _precompile_zoo(tmp_path, model: str, mode: str, backend: str = "aot_eager") -> str:
    m, inputs = pc_cases.build(model)
    with torch.set_grad_enabled(mode in pc_cases.GRAD_MODES):
        art = ember.precompile(pc_cases.FUNCS[mode], m, *inputs, backend=backend)
    d = str(tmp_path / f"{model}_{mode}_{backend}")
    art.save(d)
    return d


def _run_child(tmp_path, cases: list[dict]) -> list[dict]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": cases}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    env["PYTHONPATH"] = os.pathsep.join([HERE, pc_cases.ROOT] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    p = subprocess.run([sys.executable, os.path.join(HERE, "pc_cases.py"), str(spec)],
                       capture_output=True, text=True, env=env, cwd=pc_cases.ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


# CPU results are bitwise or nearly so; GPU kernels (TF32, cuDNN algorithms) are not
# deterministic between processes, so PC_DEVICE=cuda runs compare more loosely.
TOL = 1e-5 if os.environ.get("PC_DEVICE", "cpu") == "cpu" else 1e-3


def _assert_close(res: dict, case: dict) -> None:
    assert res["max_diff"] <= TOL, (case, res)
    if case["mode"] in pc_cases.GRAD_MODES:
        assert res["grad_missing"] == [], (case, res)
        assert res["grad_max_abs"] > 0, (case, res)  # gradients were produced at all
        assert res["grad_max_diff"] <= TOL * max(1.0, res["grad_max_abs"]), (case, res)
    assert not res["imported_capture"], "loading must not import capture or AOT tracing"


def test_zoo_models_fresh_process(tmp_path):
    """Inference and a training step, aot_eager and eager, new weights in the child: results
    and gradients equal eager's; the cache-less load rebuilds from the source."""
    cases = []
    for model, mode, backend in [("tiny_mlp", "infer", "aot_eager"),
                                 ("tiny_mlp", "train", "aot_eager"),
                                 ("tiny_mlp", "train", "eager"),
                                 ("convnet", "train", "aot_eager"),  # BatchNorm: buffer updates
                                 ("tiny_mlp", "step", "aot_eager"),  # backward() inside
                                 ("transformer_block", "step", "aot_eager"),
                                 ("transformer_block", "infer", "aot_eager")]:
        d = _precompile_zoo(tmp_path, model, mode, backend)
        cases.append({"dir": d, "model": model, "mode": mode, "seed": 7})
    cases.append(dict(cases[1], no_cache=True))
    assert [c["mode"] for c in cases].count("step") == 2
    results = _run_child(tmp_path, cases)
    for case, res in zip(cases, results):
        _assert_close(res, case)
    assert results[-1]["used_cache"] is False


@pytest.mark.slow
def test_hf_gpt2_fresh_process(tmp_path):
    cases = [{"dir": _precompile_zoo(tmp_path, "gpt2", mode), "model": "gpt2", "mode": mode,
              "seed": 3} for mode in ("infer", "train")]
    for case, res in zip(cases, _run_child(tmp_path, cases)):
        _assert_close(res, case)


def test_buffers_updated_like_eager():
    """Training-mode BatchNorm: the running statistics of the model passed are updated."""
    m, (x,) = pc_cases.build("convnet")
    m, x = m, x[:2]
    art = ember.precompile(pc_cases.train_loss, m, x)
    fn = art.load()
    import copy
    a, b = copy.deepcopy(m), copy.deepcopy(m)
    fn(a, x).backward()
    pc_cases.train_loss(b, x).backward()
    for (n, ba), bb, b0 in zip(a.named_buffers(), b.buffers(), m.buffers()):
        assert not torch.equal(ba, b0), n  # updated at all
        torch.testing.assert_close(ba, bb, rtol=1e-5, atol=1e-6, msg=n)


def test_module_as_fn_and_containers():
    """fn may be a module (called as loaded(model, *inputs)); arguments may be lists/dicts of
    tensors and plain values; outputs may alias inputs."""
    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    art = ember.precompile(lin, x)
    assert torch.allclose(art.load()(lin, x), lin(x))
    other = torch.nn.Linear(4, 3)
    assert torch.allclose(ember.precompile(lin.forward, x).load()(other, x), other(x))

    def f(model, batch, scale):
        y = model(batch["x"]) * scale + batch["extra"][0].sum()
        return {"y": y, "x": batch["x"]}, [y.shape[0]]

    batch = {"x": x, "extra": [torch.ones(3)]}
    fn = ember.precompile(f, lin, batch, 2.0).load()
    out, n = fn(lin, batch, 2.0)
    ref, n_ref = f(lin, batch, 2.0)
    assert torch.allclose(out["y"], ref["y"]) and out["x"] is x and n == n_ref


def test_source_imports_only_torch_and_runtime():
    m, (x,) = pc_cases.build("tiny_mlp")
    src = ember.precompile(pc_cases.train_loss, m, x).source
    import ast

    imports = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            imports |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imports |= {f"{node.module}.{a.name}" for a in node.names}
    assert imports == {"torch", "ember.precompile.runtime"}, imports
    assert "torch.ops.aten" in src and "class CompiledGraph(torch.autograd.Function)" in src


def test_cli_recipe(tmp_path):
    """``python -m ember precompile`` (and ``python -m ember.precompile``) on recipes: the
    bundled demo model (training: loss) and a zoo training step with backward() inside."""
    runs = [(["-m", "ember", "precompile", "ember.precompile.recipes:demo_training"], "demo"),
            (["-m", "ember.precompile", "ember.precompile.recipes:zoo", "tiny_mlp", "step"],
             "zoo_step")]
    for cmd, name in runs:
        out = tmp_path / name
        p = subprocess.run([sys.executable, *cmd, "-o", str(out), "--check"],
                           capture_output=True, text=True, cwd=pc_cases.ROOT, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        assert "matches eager" in p.stdout, p.stdout
        assert (out / "artifact.py").exists() and (out / "artifact.cache").exists()
    assert "backward()" in (tmp_path / "zoo_step" / "artifact.py").read_text()
    p = subprocess.run([sys.executable, "-m", "ember", "precompile", "-h"], capture_output=True,
                       text=True, cwd=pc_cases.ROOT, timeout=120)
    assert p.returncode == 0 and "MODULE:FUNC" in p.stdout, p.stderr


def test_inductor_fresh_process(tmp_path):
    """backend="inductor": the wrapper is in the source, the built kernels in the cache; loaded
    with the cache (no C++ build: inductor's build cache stays empty) and without it (built
    from the source), equal eager."""
    pytest.importorskip("ember_inductor")
    cases = []
    for mode in ("infer", "train"):
        d = _precompile_zoo(tmp_path, "tiny_mlp", mode, "inductor")
        cases.append({"dir": d, "model": "tiny_mlp", "mode": mode, "seed": 11,
                      "build_dir": str(tmp_path / f"build_{mode}")})
    from ember.precompile import container
    manifest, _ = container.read_manifest((tmp_path / "tiny_mlp_train_inductor" /
                                           "artifact.cache").read_bytes())
    names = sorted(e["name"] for e in manifest["entries"])
    assert any(n.startswith("forward/kernels/") for n in names), names
    assert any(n.startswith("backward/kernels/") for n in names), names
    cases.append(dict(cases[1], no_cache=True, build_dir=str(tmp_path / "build_none")))
    results = _run_child(tmp_path, cases)
    for case, res in zip(cases, results):
        _assert_close(res, case)
    assert [r["used_cache"] for r in results] == [True, True, False]
    assert [r["built_files"] > 0 for r in results] == [False, False, True], results


def test_argument_names_never_clash_with_generated_code():
    def f(inputs, r, check):
        return inputs + r * check, inputs

    a, b = torch.ones(2), torch.full((2,), 2.0)
    fn = ember.precompile(f, a, b, 3).load()
    out, same = fn(a, b, 3)
    assert same is a and torch.equal(out, torch.full((2,), 7.0))


def test_training_step_with_backward_inside(tmp_path):
    """precompile(lambda m, x, y: step(m, x, y)) where step calls loss.backward(): precompiling
    runs no backward; the loaded artifact accumulates .grad like eager (twice: accumulation),
    and the source replays the call on the graph's loss output."""
    import copy

    def step(m, x, y):
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        return loss

    m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    art = ember.precompile(lambda m, x, y: step(m, x, y), m, x, y)
    assert all(p.grad is None for p in m.parameters())
    assert art.meta["kind"] == "training" and art.meta["backward_in_function"] == 1
    assert ".backward()" in art.source[art.source.index("def call("):]
    fn = art.load()
    a, b = copy.deepcopy(m), copy.deepcopy(m)
    for _ in range(2):
        torch.testing.assert_close(fn(a, x, y), step(b, x, y))
        for (n, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_loading_imports_no_compiler(tmp_path):
    """A fresh process that imports ember, loads an artifact and calls it imports neither
    capture, AOT autograd, symbolic shapes (sympy) nor the inductor compiler."""
    d = str(tmp_path / "art")
    lin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    ember.precompile(lambda m, x: m(x).sum(), lin, torch.randn(2, 4)).save(d)
    code = (
        "import sys, torch, ember\n"
        f"fn = ember.precompile.load({d!r})\n"
        "lin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())\n"
        "fn(lin, torch.randn(2, 4)).backward()\n"
        "bad = [m for m in ('ember.capture', 'ember.aot', 'sympy', 'ember_inductor.compile_fx',\n"
        "       'torch.fx.experimental.symbolic_shapes', 'torch._dynamo') if m in sys.modules]\n"
        "print('IMPORTED', bad)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "IMPORTED []" in p.stdout, p.stdout
