"""``vllm[:DTYPE][,option=value]`` wherever an engine is named, and what a capture records."""

from __future__ import annotations

import json

import aligntools
from tests.vllm.needs import needs_vllm

pytestmark = needs_vllm


def test_mlab_capture_with_a_vllm_engine_records_version_and_settings(zoo, tmp_path):
    from labs.cli import main

    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps([list(range(5, 21)), list(range(30, 46))]))
    out = tmp_path / "cap.nc"
    assert main(["capture", "--model", str(zoo("tiny-llama")), "--engine", "vllm:bfloat16,max_model_len=64",
                 "--ids", str(ids), "--sites", "L0.*,logprobs", "--out", str(out)]) == 0
    cap = aligntools.Capture.load(out)
    knobs = json.loads(cap.dataset.attrs["knobs"])
    assert cap.dataset.attrs["engine"] == "vllm" and cap.dataset.attrs["dtype"] == "bfloat16"
    assert knobs["vllm_version"].startswith("0.") and knobs["enforce_eager"] and not knobs["prefix_caching"]
    assert knobs["max_model_len"] == 64 and knobs["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert cap.dataset["logprobs"].shape[0] == 32


def test_mlab_capture_reports_a_bad_vllm_option(zoo, tmp_path, capsys):
    from labs.cli import main

    assert main(["capture", "--model", str(zoo("tiny-llama")), "--engine", "vllm,blocks=3", "--text", "hi",
                 "--out", str(tmp_path / "c.nc")]) == 2
    assert "unknown vllm option 'blocks'" in capsys.readouterr().err
