"""``python -m ember backends`` and ``python -m ember demo``; the bundled model."""

from __future__ import annotations

import torch

from ember.__main__ import format_table, main
from ember.examples import DemoModel, example_input, make_model


def test_backends_table_has_every_column_and_backend(capsys):
    assert main(["backends"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["BACKEND", "DISTRIBUTION", "LEVEL", "TRAINING", "DEVICES", "TAGS",
                                "LOADS"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert rows["eager"] == ["eager", "ember-eager", "0.1.0", "torch", "yes", "cpu,cuda", "-",
                             "ok"]
    assert rows["aot_eager"][1:4] == ["ember-aot-eager", "0.1.0", "aten"]
    assert rows["inductor"][1:4] == ["ember-inductor", "0.1.0", "aten"]
    assert rows["inductor"][-1] == "ok"
    assert rows["cudagraphs"][-2:] == ["-", "ok"]  # no tag: the crash script passes on an H100
    assert rows["cudagraphs"][5] == "cuda"


def test_backends_describe_adds_descriptions(capsys):
    assert main(["backends", "--describe"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[-1] == "DESCRIPTION"
    assert "inside recorded CUDA graphs" in out


def test_format_table_aligns_and_keeps_long_errors_whole():
    rows = [dict(name="a", distribution="d", version="1", level="torch", training="yes",
                 devices="cpu", tags="", status="ok"),
            dict(name="long_name", distribution="dist-two", version="2.0", level="?",
                 training="?", devices="?", tags="", status="FAILED: " + "x" * 200)]
    lines = format_table(rows).splitlines()
    assert len(lines) == 3
    assert lines[1].index("d 1") == lines[2].index("dist-two 2.0")
    assert lines[2].endswith("x" * 200)


def test_python_dash_m_ember_backends(py):
    res = py("", args=["-m", "ember", "backends"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("BACKEND")


def test_cli_usage_errors(py):
    res = py("", args=["-m", "ember"])
    assert res.returncode == 2 and "usage: ember" in res.stderr
    res = py("", args=["-m", "ember", "frobnicate"])
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_bundled_model_is_deterministic_and_small():
    m1, m2 = make_model(), make_model()
    x = example_input()
    with torch.no_grad():
        assert torch.equal(m1(x), m2(x))
    assert isinstance(m1, DemoModel) and not m1.training
    assert m1(x).shape == x.shape
    assert sum(p.numel() for p in m1.parameters()) < 1_000_000


def test_demo_rejects_unknown_backend(capsys):
    from ember.examples import run_demo

    try:
        run_demo(backends=["no_such_backend"], iters=1)
    except Exception as e:  # the BackendNotFound message reaches the user as is
        assert "unknown ember backend 'no_such_backend'" in str(e)
    else:
        raise AssertionError("run_demo accepted an unknown backend")
