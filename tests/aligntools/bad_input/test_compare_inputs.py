"""compare / mlab diff / replay refuse inputs that would give a wrong answer without an error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import aligntools
from aligntools import Capture
from aligntools.analyzer.comparison import DifferentModelsError
from aligntools.analyzer.tolerance import Tolerance

IDS = torch.randint(3, 500, (2, 8), generator=torch.Generator().manual_seed(0))  # 16 token rows


@pytest.fixture(scope="module")
def caps(zoo, tmp_path_factory):
    """Saved captures: tiny-llama twice (a, b) and tiny-qwen3 (other model), same ids."""
    import transformers

    root = tmp_path_factory.mktemp("caps")
    out = {}
    for key, name in (("a", "tiny-llama"), ("other", "tiny-qwen3")):
        model = transformers.AutoModelForCausalLM.from_pretrained(zoo(name), dtype=torch.float32).eval()
        out[key] = aligntools.capture(model, IDS, sites="L*.resid_post,final_norm,logits").save(root / f"{key}.nc")
    out["b"] = Capture.load(out["a"]).save(root / "b.nc")
    return out


def _with_nan_logit_rows(path, rows, dest):
    cap = Capture.load(path)
    cap.dataset["logits"][rows] = np.nan
    return cap.save(dest)


def test_different_models_are_refused_unless_allowed(caps, mlab):
    with pytest.raises(DifferentModelsError, match="different models"):
        aligntools.compare(caps["a"], caps["other"])
    code, _, err = mlab("diff", caps["a"], caps["other"], "--reference", caps["other"])
    assert code == 2 and "different models" in err and "--allow-different-models" in err
    code, out, _ = mlab("diff", caps["a"], caps["other"], "--allow-different-models")
    assert code == 1 and "FAIL" in out  # allowed: compared, and of course far apart


def test_replay_refuses_weights_of_another_model(caps, zoo):
    cap = Capture.load(caps["a"])
    with pytest.raises(ValueError, match="not the model this capture was taken from"):
        aligntools.replay(cap, "logits", model=zoo("tiny-qwen3"))
    assert aligntools.replay(cap, "logits", model=zoo("tiny-llama")).errors["rel_l2"] < 1e-5


def test_nan_logit_rows_the_engine_emitted_fail(caps, tmp_path, mlab):
    bad = _with_nan_logit_rows(caps["b"], slice(4, 8), tmp_path / "nan4.nc")  # 4 of 16 rows
    code, out, _ = mlab("diff", caps["a"], bad)
    assert code == 1 and "logits" in out.splitlines()[-1]
    everything = _with_nan_logit_rows(caps["b"], slice(None), tmp_path / "nanall.nc")
    code, out, _ = mlab("diff", caps["a"], everything, "--sites", "logits")
    assert code == 1 and out.splitlines()[-1].startswith("FAIL")


def test_rows_an_engine_did_not_emit_are_not_a_failure():
    from tests.aligntools.bad_input.test_capture_output import _sparse_logits_capture

    a = _sparse_logits_capture()
    assert aligntools.compare(a, a.dataset.copy(deep=True)).passes  # rows 0-1: NaN on both, never emitted
    b = a.dataset.copy(deep=True)
    b["emitted.logits"].values[:] = 1  # b claims to have emitted them: NaN is a blow-up there
    b["logits"][0] = 0.5
    blown = a.dataset.copy(deep=True)
    blown["logits"][2] = np.nan
    assert not aligntools.compare(a, blown).passes


def test_empty_site_selection_is_an_error(caps, mlab):
    with pytest.raises(ValueError, match="selects no site"):
        aligntools.compare(caps["a"], caps["b"], sites="")
    code, _, err = mlab("diff", caps["a"], caps["b"], "--sites", "")
    assert code == 2 and "selects no site" in err


@pytest.mark.parametrize("spec,message", [
    ({"default": {"k": -1}}, "k must be finite and >= 0"),
    ({"sites": {"logits": {"atol": -1e-6}}}, "atol must be finite and >= 0"),
    ({"default": {"k": "abc"}}, "k must be a number"),
    ({"dtypes": {"float17": {"floor": 1}}}, "unknown dtype 'float17'"),
    ([], "JSON object"),
])
def test_bad_tolerance_files_are_rejected_at_load(tmp_path, spec, message):
    path = tmp_path / "tol.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=message):
        Tolerance.load(path)


def test_bad_tolerance_stops_the_gate_before_it_runs(zoo, tmp_path, mlab, monkeypatch):
    import aligntools.gates.alignment as gate

    path = tmp_path / "tol.json"
    path.write_text('{"default": {"k": "abc"}}')
    monkeypatch.setattr(gate, "load_hf", lambda *a, **k: pytest.fail("the gate ran"))
    code, _, err = mlab("check", "--model", zoo("tiny-llama"), "--tolerance", path)
    assert code == 2 and "k must be a number" in err


def test_bad_tolerance_in_diff_is_exit_2(caps, tmp_path, mlab):
    path = tmp_path / "tol.json"
    path.write_text('{"default": {"atol": -1}}')
    code, _, err = mlab("diff", caps["a"], caps["b"], "--tolerance", path)
    assert code == 2 and "atol must be finite and >= 0" in err and str(path) in err


def test_identical_captures_pass(caps, mlab):
    assert mlab("diff", caps["a"], caps["b"], "--reference", caps["a"])[0] == 0
