"""ember.config (defaults, EMBER_* environment overrides, patch) and EMBER_LOGS."""

from __future__ import annotations

import logging

import pytest

import ember
from ember import _logging, config


def test_defaults(py):
    # a fresh process without EMBER_* settings (the test session sets its own EMBER_CACHE_DIR)
    res = py("""
        from ember import config
        print(repr((config.recompile_limit, config.suppress_errors, config.verbose,
                    config.cache_dir.endswith("ember"))))
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "(8, True, False, True)"


def test_environment_overrides_are_typed(py):
    res = py("""
        from ember import config
        print(repr((config.recompile_limit, config.suppress_errors, config.verbose,
                    config.cache_dir, config.max_inline_depth)))
    """, env={"EMBER_RECOMPILE_LIMIT": "3", "EMBER_SUPPRESS_ERRORS": "0",
              "EMBER_VERBOSE": "yes", "EMBER_CACHE_DIR": "/tmp/ember-x",
              "EMBER_MAX_INLINE_DEPTH": "5"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "(3, False, True, '/tmp/ember-x', 5)"


def test_bad_environment_value_names_the_variable(py):
    res = py("import ember", env={"EMBER_RECOMPILE_LIMIT": "many"})
    assert res.returncode != 0
    assert "many" in res.stderr


def test_patch_sets_and_restores_even_on_error():
    with pytest.raises(KeyError):
        with config.patch(recompile_limit=2, verbose=True):
            assert config.recompile_limit == 2 and config.verbose is True
            raise KeyError("inside")
    assert config.recompile_limit == 8 and config.verbose is False


def test_patch_rejects_unknown_settings():
    with pytest.raises(AttributeError, match="recompile_limt"):
        with config.patch(recompile_limt=2):
            pass
    assert ember.config is config


# -- EMBER_LOGS --------------------------------------------------------------------------------

def test_ember_logs_enables_named_artifacts(py):
    res = py("""
        import logging
        import ember
        from ember import _logging
        print("ENABLED", sorted(_logging._enabled), _logging.enabled("graph"),
              _logging.enabled("guards"))
        logging.getLogger("ember.graph").info("captured graph text here")
        logging.getLogger("ember.guards").info("guard text must not show")
    """, env={"EMBER_LOGS": "graph,recompiles"})
    assert res.returncode == 0, res.stderr
    assert "ENABLED ['graph', 'recompiles'] True False" in res.stdout
    assert "captured graph text here" in res.stderr
    assert "guard text must not show" not in res.stderr


def test_ember_logs_plus_all_turns_on_debug(py):
    res = py("""
        import logging
        import ember
        from ember import _logging
        print("ALL", all(_logging.enabled(a) for a in _logging.ARTIFACTS),
              logging.getLogger("ember").getEffectiveLevel() == logging.DEBUG)
    """, env={"EMBER_LOGS": "+all"})
    assert res.returncode == 0, res.stderr
    assert "ALL True True" in res.stdout


def test_without_ember_logs_nothing_is_printed(py):
    res = py("""
        import logging
        import ember
        logging.getLogger("ember.graph").info("should stay quiet")
    """)
    assert res.returncode == 0
    assert "should stay quiet" not in res.stderr


def test_set_logs_at_run_time():
    try:
        ember.set_logs("aot")
        assert _logging.enabled("aot") and not _logging.enabled("bytecode")
        assert logging.getLogger("ember.aot").isEnabledFor(logging.INFO)
    finally:
        ember.set_logs(None)
        logging.getLogger("ember.aot").setLevel(logging.NOTSET)
    assert not _logging._enabled
