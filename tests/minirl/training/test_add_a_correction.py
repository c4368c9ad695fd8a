"""Adding a correction is one registered function (plus fields, when it has knobs of its own):
docs/rl.md's worked example, verl's geometric-mean sequence-level TIS, registered from the page for
this test only, trains through ``TrainConfig(correction="geo_tis")``, and its weights match a
float64 transcription of the formula."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from minirl.algorithms import corrections
from minirl.algorithms.corrections import register_correction
from minirl.driver import train
from minirl.training.train_config import TrainConfig

DOCS = Path(__file__).resolve().parents[3] / "docs" / "rl.md"


def example() -> str:
    """The Python block between the example-correction markers of docs/rl.md."""
    block = DOCS.read_text().split("<!-- example-correction:start -->", 1)[1].split("<!-- example-correction:end -->")[0]
    return block.split("```python\n", 1)[1].rsplit("```", 1)[0]


@pytest.fixture
def calls(monkeypatch):
    """The page's ``geo_tis`` registered for this test only (the table is restored after it: the docs
    table test reads the registry), each call's inputs and weights recorded."""
    monkeypatch.setattr(corrections.CORRECTIONS, "entries", dict(corrections.CORRECTIONS.entries))
    exec(compile(example(), str(DOCS), "exec"), {})  # noqa: S102 - the documented block, as a user pastes it
    entry, seen = corrections.CORRECTIONS.entries["geo_tis"], []

    def recorded(logp_train, logp_infer, mask, cap):
        out = entry.fn(logp_train, logp_infer, mask, cap=cap)
        seen.append((logp_train.detach().clone(), logp_infer.clone(), mask.clone(), cap, out[0].clone()))
        return out

    corrections.CORRECTIONS.entries["geo_tis"] = dataclasses.replace(entry, fn=recorded)
    return seen


def reference(logp_train: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """w_{i,t} = min((prod_{t in y_i} rho_t)^(1/|y_i|), C) for t in y_i, else 0: float64, token by token."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.shape[0]):
        tokens = [t for t in range(mask.shape[1]) if mask[i, t] > 0]
        prod = 1.0
        for t in tokens:
            prod *= math.exp(float(logp_train[i, t].double() - logp_infer[i, t].double()))
        for t in tokens:
            out[i, t] = min(prod ** (1.0 / len(tokens)), cap)
    return out


def test_the_documented_correction_trains_and_matches_its_float64_formula(quick_config, calls):
    config = quick_config(correction="geo_tis", tis_cap=1.0, steps=2)  # C = 1: sequences with rho_geo > 1 truncated
    rows = train(config).rows
    assert len(calls) == 2  # one lookup per step
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    for logp_train, logp_infer, mask, cap, weights in calls:
        assert cap == 1.0
        torch.testing.assert_close(weights.double(), reference(logp_train, logp_infer, mask, cap), rtol=1e-5, atol=1e-6)
        assert (weights[mask > 0] != 1.0).any()  # the bfloat16 engine's mismatch reaches the weights


def test_an_unregistered_correction_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match="correction='geo_tis'; valid: icepop, tis, mis, none; set correction to"):
        TrainConfig(correction="geo_tis")


def test_a_registration_names_real_parameters_and_a_new_name():
    with pytest.raises(ValueError, match="correction 'tis' is already registered"):
        register_correction("tis")(corrections.tis)
    with pytest.raises(TypeError, match="has no parameter threshold"):
        register_correction("tis_2", threshold="tis_cap")(corrections.tis)
    assert "tis_2" not in corrections.CORRECTIONS
