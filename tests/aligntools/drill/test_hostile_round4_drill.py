"""Hostile inputs, round 4 (issue 48), the drill: a NaN inside the module is a divergence of its
own, never agreement (NaN against NaN passes every limit test), and every bad argument is refused
by name before a model loads. ``L``: tiny-llama (dense, vocabulary 512)."""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import aligntools
from aligntools.gates.inputs import UsageError

ALIGNED = {"train": "hf:float32,attn=eager", "infer": "minirl:aligned,attention=eager"}


@pytest.fixture(scope="module")
def llama(zoo):
    return zoo("tiny-llama")


@pytest.fixture(scope="module")
def nan_llama(llama, tmp_path_factory):
    """tiny-llama with one NaN in layer 0's q_proj: both engines read it."""
    out = tmp_path_factory.mktemp("nan_llama") / "model"
    shutil.copytree(llama, out)
    for f in out.glob("*.safetensors"):
        w = load_file(f)
        for name in w:
            if "layers.0.self_attn.q_proj.weight" in name:
                w[name][3, 5] = math.nan
        save_file(w, f, metadata={"format": "pt"})
    return out


def test_DR15_a_nan_op_output_is_the_first_divergence(nan_llama):
    result = aligntools.drill(nan_llama, "L0.attn_out", ids=torch.arange(5, 29), **ALIGNED)
    first = result.first
    assert first is not None, str(result)
    assert (first.op, first.role) == ("gemm", "linear") and first.fed_finite, str(result)
    assert first.nonfinite[0] == 24  # one NaN weight: its output column, every token
    assert "first non-finite op gemm (linear): NaN/inf output elements 24 in train" in str(result)
    assert result.table.loc[first.row, "jumps"] and result.table.loc[first.row, "error"] == np.inf
    output = result.table[result.table["op"] == "output"].iloc[0]
    assert output["error"] == np.inf  # the module's output is not "equal" either


def test_DR15_the_clean_model_names_no_non_finite_op(llama):
    result = aligntools.drill(llama, "L0.attn_out", ids=torch.arange(5, 29), **ALIGNED)
    assert result.first is None or result.first.nonfinite is None, str(result)
    assert np.isfinite(result.table["error"].dropna()).all()


BAD_ARGUMENTS = [
    ("DR05", {"site": "L0.router_logits"}, re.escape("L0.router_logits: layer 0 has a dense MLP, no router (a dense "
                                                      "model: the model has no router sites); drill L0.mlp_out")),
    ("DR16", {"threshold": 0}, "threshold=0: the growth factor .* must be a finite number > 1"),
    ("DR17", {"threshold": float("nan")}, "threshold=nan: .* finite number > 1"),
    ("DR18", {"threshold": -1}, "threshold=-1: .* finite number > 1"),
    ("DR16b", {"threshold": 1.0}, "threshold=1.0: .* > 1"),
    ("DR27", {"ids": torch.ones(8, dtype=torch.bool)}, "ids must be integer token ids .* got torch.bool"),
    ("DR08", {"ids": torch.tensor([1, 2, 999999])}, r"token id 999999 is outside the vocabulary \(size 512\)$"),
    ("DR09", {"ids": torch.tensor([-1, 2, 3])}, r"token id -1 is outside the vocabulary \(size 512\)$"),
    ("DR26", {"ids": torch.tensor([200, 2, 3]).to(torch.int8)},
     r"token id -56 is outside the vocabulary \(size 512\) \(a int8 tensor wraps larger ids around"),
    ("DR19", {"site": None}, "site must be a string such as 'L0.attn_out'; got NoneType"),
    ("DR25", {"tolerance": "tight"}, "tolerance must be a Tolerance"),
    ("DR-layer", {"site": "L9.attn_out"}, r"L9.attn_out: the model has 4 decoder layers \(L0 to L3\)"),
]
"""(case id, drill arguments, the message it must raise)."""


@pytest.mark.parametrize("case, kwargs, message", BAD_ARGUMENTS, ids=[c[0] for c in BAD_ARGUMENTS])
def test_DR_bad_arguments_are_refused_by_name(llama, monkeypatch, case, kwargs, message):
    """Every one is refused before a model loads (loading would fail the test)."""
    import aligntools.gates.inputs as inputs

    monkeypatch.setattr(inputs, "load_hf", lambda *a, **k: pytest.fail(f"{case}: a model loaded"))
    call = {"site": "L0.attn_out", **kwargs}
    with pytest.raises(UsageError, match=message):
        aligntools.drill(llama, call.pop("site"), **call)


def test_DR15_the_gate_fails_a_nan_both_engines_compute(nan_llama):
    """The alignment gate on the same model: L0.q is NaN at the same 2 x 48 elements in both
    engines, which rel_l2 leaves out (it reads 0); the site fails as non-finite, is the first
    divergence and the diagnosis names it, and the verdict does not quote 'rel. L2 0 > limit'."""
    gate = aligntools.check_alignment(nan_llama, infer="minirl:aligned", tokens=48, progress=False)
    assert not gate.passed
    assert not gate.table.loc["L0.q", "passes"] and gate.first_divergence.site == "L0.q"
    finding = gate.comparison.diagnosis[0]
    assert (finding.cause, finding.site) == ("nonfinite_both", "L0.q")
    assert "96 elements are NaN/Inf in a and 96 in b" in finding.evidence
    assert "worst L0.q: NaN/Inf values > limit" in gate.verdict and "rel. L2 0 >" not in gate.verdict
