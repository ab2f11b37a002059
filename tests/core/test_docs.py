"""The docs show the code that the tests run: the backend-author guide embeds the fixture plugin
verbatim, and the README's two commands exist."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "ember_fixture_plugin"


def test_author_guide_embeds_the_fixture_plugin_verbatim():
    guide = (ROOT / "docs" / "backend_author_guide.md").read_text()
    for name in ("pyproject.toml", "ember_fixture_plugin.py"):
        assert (FIXTURE / name).read_text().rstrip() in guide, name


def test_readme_commands_exist():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/demo.sh" in readme and "bash scripts/test.sh" in readme
    for script in ("demo.sh", "test.sh", "setup.sh"):
        assert (ROOT / "scripts" / script).is_file()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def _unbuilt(name: str) -> bool:
    """Whether backend ``name`` says NotImplementedYet when asked to compile a one-op graph."""
    import torch

    import ember

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (x + 1,))(torch.ones(2))  # an ATen graph with tensor metadata
    try:
        ember.get_backend(name).compile(gm, [torch.ones(2)])
    except ember.NotImplementedYet:
        return True
    except ember.DeviceUnavailable:  # built, but needs a device this machine lacks (cudagraphs)
        return False
    return False


def test_docs_say_which_backends_are_unbuilt():
    """A backend row says NotImplementedYet exactly when the backend raises it."""
    unbuilt = {name: _unbuilt(name) for name in ("inductor", "cudagraphs")}
    assert not unbuilt["inductor"]  # the default backend is built
    for doc in ("README.md", "docs/user_guide.md"):
        text = (ROOT / doc).read_text()
        for line in text.splitlines():
            for name, is_unbuilt in unbuilt.items():
                if line.startswith(f"| `{name}`"):
                    assert ("NotImplementedYet" in line) == is_unbuilt, (doc, line)
