"""``minirl``'s front door opens on first use: the names and old module paths still work, and a
torch-free module (the Ray transfer queue's actors import one) does not import torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import minirl


def test_a_ray_queue_actor_process_does_not_import_torch_or_transformers():
    code = ("import sys, minirl.scale_out.ray_queue; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", minirl.__all__)
def test_every_front_door_name_resolves_to_its_module_attribute(name):
    value = getattr(minirl, name)
    assert value.__name__ == name and name in dir(minirl)


@pytest.mark.parametrize("old", ["advantages", "corrections", "espo", "losses"])
def test_no_alias_for_module_paths_that_never_shipped(old):
    """0.1.0 is untagged: the algorithms live in ``minirl.algorithms`` and nowhere else."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"minirl.{old}")
    assert importlib.import_module(f"minirl.algorithms.{old}")


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        minirl.Trainer  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("minirl.no_such_module")
