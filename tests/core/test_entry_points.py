"""Third-party plugins installed with pip (into temporary --target folders, put on PYTHONPATH of
a subprocess): found through entry points with no change to Ember, broken ones isolated,
conflicting ones named."""

from __future__ import annotations

import sys
from pathlib import Path

FIXTURE_SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "ember_fixture_plugin"


def test_fixture_plugin_is_a_complete_distribution_under_40_lines():
    files = sorted(p for p in FIXTURE_SOURCE.iterdir() if p.is_file())
    assert [p.name for p in files] == ["ember_fixture_plugin.py", "pyproject.toml"]
    assert sum(len(p.read_text().splitlines()) for p in files) < 40


def test_fixture_plugin_is_listed_with_its_distribution(py, fixture_sites):
    res = py("""
        import ember
        from ember.plugins import backend_table
        print("LIST", ember.list_backends())
        row = next(r for r in backend_table() if r["name"] == "fixture_counting")
        print("ROW", row["distribution"], row["version"], row["plugin"], row["status"])
    """, pythonpath=[fixture_sites["good"]])
    assert res.returncode == 0, res.stderr
    assert "'fixture_counting'" in res.stdout and "'eager'" in res.stdout
    assert "ROW ember-fixture-plugin 0.1.0 fixture_counting ok" in res.stdout


def test_fixture_plugin_not_visible_without_its_install(py):
    # the dev environment is never polluted by the fixture installs
    res = py("import ember; print(ember.list_backends(exclude_tags=()))")
    assert res.returncode == 0, res.stderr
    assert "fixture" not in res.stdout


COMPILE_THROUGH_FIXTURE = """
    import torch, ember, ember_fixture_plugin

    def f(x, y):
        return torch.relu(x @ y) + torch.sin(x).sum()

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    fast = ember.compile(f, backend="fixture_counting")
    out = fast(x, y)
    assert torch.allclose(out, f(x, y)), "results differ from eager"
    print("COMPILES", ember_fixture_plugin.compile_count)
"""


def test_compile_runs_through_the_fixture_backend(py, fixture_sites):
    res = py(COMPILE_THROUGH_FIXTURE, pythonpath=[fixture_sites["good"]])
    assert res.returncode == 0, res.stderr
    count = int(res.stdout.split("COMPILES")[1])
    assert count >= 1, f"the fixture backend never compiled a graph:\n{res.stderr}"


def test_broken_plugin_is_reported_and_others_keep_working(py, fixture_sites):
    res = py("""
        import ember, torch
        from ember.plugins import backend_table
        names = ember.list_backends()
        assert "fixture_counting" in names and "eager" in names, names
        row = next(r for r in backend_table() if r["name"] == "fixture_broken")
        print("ROW", row["distribution"], row["version"], "|", row["status"])
        try:
            ember.compile(lambda x: x, backend="fixture_broken")
        except ember.BackendLoadError as e:
            print("LOADERROR", e)
        try:
            ember.compile(lambda x: x, backend="not_there")
        except ember.BackendNotFound as e:
            print("NOTFOUND", e)
        fast = ember.compile(lambda x: x * 2, backend="fixture_counting")
        assert torch.equal(fast(torch.ones(2)), torch.full((2,), 2.0))
    """, pythonpath=[fixture_sites["good"], fixture_sites["broken"]])
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert ("ROW ember-fixture-broken 0.2.0 | FAILED: ImportError: ember_fixture_broken: "
            "deliberately broken") in out
    load_error = out.split("LOADERROR")[1].splitlines()[0]
    assert "'fixture_broken'" in load_error and "ember-fixture-broken 0.2.0" in load_error
    assert "deliberately broken" in load_error
    assert "fixture_counting" in load_error  # the backends one can use instead
    not_found = out.split("NOTFOUND")[1].splitlines()[0]
    assert "failed to load" in not_found and "ember-fixture-broken" in not_found
    # the failure is logged once, with name, distribution and error
    assert res.stderr.count("'fixture_broken' (distribution ember-fixture-broken 0.2.0) failed "
                            "to load") == 1, res.stderr


def test_conflict_names_both_distributions(py, fixture_sites):
    res = py("""
        import ember, torch
        try:
            ember.compile(lambda x: x, backend="eager")
        except ember.BackendConflict as e:
            print("CONFLICT", e)
        ok = ember.compile(lambda x: x + 1, backend="fixture_conflict_ok")
        assert torch.equal(ok(torch.zeros(1)), torch.ones(1))
        assert "fixture_counting" in ember.list_backends()
        assert "aot_eager" in ember.list_backends()
    """, pythonpath=[fixture_sites["good"], fixture_sites["conflict"]])
    assert res.returncode == 0, res.stderr
    msg = res.stdout.split("CONFLICT")[1]
    assert "'eager'" in msg
    assert "ember-eager 0.1.0" in msg and "ember-fixture-conflict 0.3.0" in msg


def test_cli_shows_fixture_failure_and_conflict(py, fixture_sites):
    res = py("", args=["-m", "ember", "backends"],
             pythonpath=[fixture_sites["good"], fixture_sites["broken"],
                         fixture_sites["conflict"]])
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0] + "|" + ln.split()[1]: ln for ln in res.stdout.splitlines()[1:]}
    assert "ok" in lines["fixture_counting|ember-fixture-plugin"]
    assert "FAILED: ImportError" in lines["fixture_broken|ember-fixture-broken"]
    assert "CONFLICT: also declared by ember-fixture-conflict 0.3.0" in lines["eager|ember-eager"]
    assert "CONFLICT: also declared by ember-eager 0.1.0" in lines[
        "eager|ember-fixture-conflict"]
    assert "cannot be used" in res.stderr


def test_same_entry_point_name_in_two_distributions_is_kept(tmp_path, py, pip_target):
    """A second distribution reusing an entry-point name must not hide its backends."""
    src = tmp_path / "dup"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        (Path(__file__).resolve().parents[1] / "fixtures" / "ember_fixture_conflict"
         / "pyproject.toml").read_text()
        .replace("ember-fixture-conflict", "ember-fixture-dup")
        .replace('fixture_conflict = "ember_fixture_conflict"', 'eager = "ember_fixture_dup"')
        .replace('"ember_fixture_conflict"', '"ember_fixture_dup"'))
    (src / "ember_fixture_dup.py").write_text(
        "import ember\n"
        "@ember.hookimpl\n"
        "def ember_backends():\n"
        "    return [ember.Backend(name='eager', compile=lambda gm, ex, **o: gm.forward)]\n")
    pip_target(src, tmp_path / "site")
    res = py("""
        import ember
        try:
            ember.compile(lambda x: x, backend="eager")
        except ember.BackendConflict as e:
            print("CONFLICT", e)
    """, pythonpath=[tmp_path / "site"])
    assert res.returncode == 0, res.stderr
    assert "ember-eager" in res.stdout and "ember-fixture-dup" in res.stdout


def test_console_script_lists_backends():
    import subprocess

    script = Path(sys.executable).parent / "ember"
    assert script.exists(), f"the 'ember' console script is not installed next to {sys.executable}"
    res = subprocess.run([str(script), "backends"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].split() == ["BACKEND", "DISTRIBUTION", "LEVEL", "TRAINING",
                                                  "DEVICES", "TAGS", "LOADS"]
    assert any(ln.startswith("eager ") and "ember-eager 0.1.0" in ln
               for ln in res.stdout.splitlines())
