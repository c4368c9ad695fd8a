"""Hostile files are never executed: no pickle/eval/shell on file content, no .bin checkpoints,
no remote code, no zarr pickle codec, and paths are escaped in HTML reports."""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from aligntools import Capture, CaptureFileError

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("aligntools", "labs", "minirl", "kernels")


class _Marker:
    """Unpickling this creates ``path``: proof that a pickle was run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def test_no_pickle_eval_or_shell_in_the_packages():
    bad = []
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            for node, name in _calls(ast.parse(f.read_text())):
                kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
                restricted = name == "torch.load" and kw.get("weights_only") == "True"  # torch's restricted unpickler
                if (name in ("eval", "exec", "pickle.load", "pickle.loads", "torch.load", "marshal.loads") and not restricted
                        or kw.get("shell") == "True" or kw.get("allow_pickle") == "True"
                        or kw.get("trust_remote_code") == "True"):
                    bad.append(f"{f.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not bad


def test_a_pickle_checkpoint_is_refused_not_run(llama, tmp_path, mlab):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(llama / "config.json", ckpt)
    marker = tmp_path / "PWNED"
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(_Marker(marker)))
    for args in (["capture", "--text", "hi", "--out", tmp_path / "c.nc"], ["check"]):
        code, _, err = mlab(args[0], "--model", ckpt, *args[1:])
        assert code == 2 and "no *.safetensors" in err
    assert not marker.exists()


def test_auto_map_remote_code_is_not_run(llama, tmp_path, mlab):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama, ckpt)
    marker = tmp_path / "PWNED"
    (ckpt / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                  "from transformers import LlamaForCausalLM as EvilModel\n")
    config = json.loads((ckpt / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel", "AutoConfig": "evil.EvilModel"}
    (ckpt / "config.json").write_text(json.dumps(config))
    code, _, _ = mlab("capture", "--model", ckpt, "--text", "hi", "--sites", "logits", "--out", tmp_path / "c.nc")
    assert code in (0, 2)
    assert not marker.exists()


def test_a_zarr_pickle_codec_is_refused(tmp_path):
    import numpy as np

    store = tmp_path / "evil.zarr"
    (store / "embed").mkdir(parents=True)
    (store / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (store / ".zattrs").write_text(json.dumps({"engine": "hf", "mode": "tensor", "dtype": "float32", "knobs": "{}",
                                               "versions": "{}", "model_hash": "x", "complete": 1}))
    (store / "embed" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "|O", "compressor": None, "fill_value": None,
        "order": "C", "filters": [{"id": "pickle", "protocol": 5}]}))
    (store / "embed" / ".zattrs").write_text(json.dumps({"_ARRAY_DIMENSIONS": ["token"]}))
    marker = tmp_path / "PWNED"
    (store / "embed" / "0").write_bytes(pickle.dumps(np.array([_Marker(marker)], dtype=object)))
    for lazy in (False, True):
        with pytest.raises(CaptureFileError, match="evil.zarr"):
            Capture.load(store, lazy=lazy)
    assert not marker.exists()


def test_a_journal_with_a_pickled_array_is_refused(tmp_path):
    import numpy as np

    journal = tmp_path / ".cap.nc.partial"
    journal.mkdir()
    marker = tmp_path / "PWNED"
    np.save(journal / "x.npy", np.array([_Marker(marker)], dtype=object), allow_pickle=True)
    os.rename(journal / "x.npy", journal / "rows-000000.npz.npy")
    import zipfile

    with zipfile.ZipFile(journal / "rows-000000.npz", "w") as z:
        z.write(journal / "rows-000000.npz.npy", "embed.npy")
    (journal / "journal.json").write_text(json.dumps({
        "format": 1, "n_rows": 1, "attrs": {"engine": "hf", "mode": "tensor", "dtype": "float32", "knobs": "{}",
                                            "versions": "{}", "model_hash": "x", "complete": 0},
        "entries": [["rows", "rows-000000.npz", 1]],
        "specs": {"embed": {"dims": ["token"], "dtype": "|O", "attrs": {}}}}))
    with pytest.raises(CaptureFileError, match="Object arrays cannot be loaded"):
        Capture.load(tmp_path / "cap.nc")
    assert not marker.exists()


def test_script_in_a_path_is_escaped_in_the_html_report(tmp_path):
    import pandas as pd

    from aligntools.viz.report import Report

    evil = "/runs/<script>alert(1)</script>/model"
    page = (Report(f"alignment gate: {evil}").text(f"model {evil}")
            .table(pd.DataFrame({"passes": [True]}, index=pd.Index([evil], name="site"))).render())
    assert "<script>" not in page and "&lt;script&gt;" in page
