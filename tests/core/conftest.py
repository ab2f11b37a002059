"""Fixtures for tests of the core distribution: fixture plugins installed with pip into
temporary --target directories (never into the environment running the tests), and a clean
registry/compile state around every test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ember
from ember import plugins

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_DISTS = {
    "good": "ember_fixture_plugin",
    "broken": "ember_fixture_broken",
    "conflict": "ember_fixture_conflict",
}


def pip_install_target(src: Path, target: Path) -> None:
    """``pip install --no-deps --no-build-isolation --target target src`` from a copy of src
    (a build writes into its source folder; the checkout stays clean)."""
    work = target.parent / f"src-{src.name}"
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                             "__pycache__"))
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--no-build-isolation", "--disable-pip-version-check",
                          "--target", str(target), str(work)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"pip install of {src.name} failed:\n{res.stdout}\n{res.stderr}"


@pytest.fixture
def pip_target():
    """``pip_target(src, target)`` installs the distribution at src into the folder target."""
    return pip_install_target


@pytest.fixture(scope="session")
def fixture_sites(tmp_path_factory) -> dict[str, Path]:
    """{"good" | "broken" | "conflict": a --target directory holding that fixture plugin}."""
    root = tmp_path_factory.mktemp("fixture-plugins")
    sites = {}
    for key, folder in FIXTURE_DISTS.items():
        target = root / key
        pip_install_target(FIXTURES / folder, target)
        sites[key] = target
    return sites


@pytest.fixture(autouse=True)
def _clean_ember_state():
    """Each test starts with no compiled entries and leaves no in-process backends behind."""
    local = dict(plugins._registry.local)
    pm = plugins.plugin_manager()
    before = set(pm.get_plugins())
    ember.reset()
    yield
    ember.reset()
    plugins._registry.local.clear()
    plugins._registry.local.update(local)
    for p in set(pm.get_plugins()) - before:
        pm.unregister(p)
