from __future__ import annotations


def output_code_enabled() -> bool:
    try:
        from ember._logging import enabled
    except ImportError:  # pragma: no cover
        return False
    return enabled("output_code")
