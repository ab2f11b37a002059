"""Inductor tests: generated code must not depend on the machine the tests run on, so the OpenMP
parallel threshold and the tile of column reductions (calibrated once per machine in real use,
ember_inductor/calibrate.py) are the fixed defaults here; tests/inductor/test_choices.py tests the calibration itself."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fixed_parallel_threshold():
    from ember_inductor import calibrate

    prev = calibrate.override[0], calibrate.tile_override[0]
    calibrate.override[0] = calibrate.DEFAULT
    calibrate.tile_override[0] = calibrate.DEFAULT_TILE  # the column reductions' tile too
    yield
    calibrate.override[0], calibrate.tile_override[0] = prev
