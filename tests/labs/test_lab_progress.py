"""Every lab's ``progress`` switch reaches the loaders it calls (``minirl.quiet.quiet_when_asked``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import labs


def test_every_lab_with_a_progress_switch_silences_loader_bars_with_it():
    """A lab function taking ``progress`` is called as ``progress=False`` by notebooks, scripts and
    ``make reproduce``; undecorated, the models it loads draw their bars anyway."""
    missing = []
    for info in pkgutil.iter_modules(labs.__path__):
        module = importlib.import_module(f"labs.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_") and \
                    "progress" in inspect.signature(fn).parameters and not hasattr(fn, "__wrapped__"):
                missing.append(f"labs.{info.name}.{name}")
    assert not missing, f"add @quiet_when_asked to {missing}"
