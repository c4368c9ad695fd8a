"""Fixtures for the labs tests: a zoo recipe short enough to build several times per test."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture
def short_zoo_recipe(monkeypatch):
    """``short_zoo_recipe(name)``: this test's builds of ``name`` train 3 steps instead of 60.

    Why: byte-identity, atomic rebuild and the CLI's output are properties of the build
    machinery, not of how long it trains (a 60-step build is ~8 s quiet, ~60 s on a loaded
    2-core box, and some tests build three). The spec goes through the public ``SPECS`` table,
    so the fingerprint (which covers ``train_steps``) keeps these builds apart from the cache.
    """
    from labs import zoo

    def shorten(name: str) -> None:
        monkeypatch.setitem(zoo.SPECS, name, dataclasses.replace(zoo.SPECS[name], train_steps=3))

    return shorten
