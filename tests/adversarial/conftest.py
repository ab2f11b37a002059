"""Every adversarial case starts and ends with no compiled entries (ember.reset())."""

from __future__ import annotations

import pytest

import ember


@pytest.fixture(autouse=True)
def _fresh():
    ember.reset()
    yield
    ember.reset()
