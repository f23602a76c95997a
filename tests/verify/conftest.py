"""Fixtures of the verify tests."""

from __future__ import annotations

import pytest


@pytest.fixture()
def cache(demo, monkeypatch):
    """The demo's cache (its worlds, adapters and indexes), as GRADIAN_CACHE for the test."""
    monkeypatch.setenv("GRADIAN_CACHE", str(demo[0] / "cache"))
    return demo[0] / "cache"
