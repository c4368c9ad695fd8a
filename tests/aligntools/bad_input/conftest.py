"""Fixtures of the bad-input tests: the tiny Llama checkpoint, a CLI runner, small captures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def llama(zoo) -> Path:
    return zoo("tiny-llama")


@pytest.fixture(scope="session")
def llama_model(llama):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()


@pytest.fixture
def mlab(capsys):
    """``mlab(*args) -> (exit code, stdout, error)`` run in process (no console-script start-up);
    ``error`` is the stderr line(s) mlab wrote (progress bars of the libraries left out)."""
    from labs.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, "\n".join(line for line in err.replace("\r", "\n").splitlines() if line.startswith("mlab"))

    return run
