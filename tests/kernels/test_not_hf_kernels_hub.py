"""transformers must not mistake our ``kernels`` package for Hugging Face's ``kernels`` hub.

transformers 5.23 probes ``is_kernels_available()``: ``find_spec("kernels")`` finds *our*
package, then it looks for a version (distribution metadata, else ``kernels.__version__`` after
importing it) and requires 0.18.2 <= version < 0.19. Ours has no ``__version__`` (and the
``mismatch-lab`` distribution is 0.x far below), so the probe must say "unavailable", the
hub integration must fall back to its no-op decorators, and models must run unchanged.
Runs in a fresh interpreter so no earlier import decides the probe's cached answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
import torch
spec = importlib.util.find_spec("kernels")
from transformers.utils import import_utils
from transformers.utils.import_utils import is_kernels_available
import transformers.integrations.hub_kernels as hub
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    logits = model(torch.arange(10)[None]).logits
import kernels
print(json.dumps({
    "origin": spec.origin,
    "probe": list(import_utils._is_package_available("kernels", return_version=True)),
    "available": is_kernels_available(),
    "hub_has_get_kernel": hasattr(hub, "get_kernel_hub"),
    "logits_shape": list(logits.shape),
    "logits_finite": bool(torch.isfinite(logits).all()),
    "ours": kernels.variants("rmsnorm"),
    "norm_forward_is_plain": type(model.model.norm).forward.__qualname__,
}))
"""


def test_transformers_does_not_take_our_kernels_for_the_hub_package():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(report["origin"]) == REPO / "kernels" / "__init__.py"  # the probe does see ours
    exists, version = report["probe"]
    assert exists  # found by find_spec, so only the version keeps it out
    if version != "N/A":  # e.g. the editable mismatch-lab distribution's version
        assert not Version("0.18.2") <= Version(version) < Version("0.19.0")
    assert report["available"] is False
    assert report["hub_has_get_kernel"] is False  # the `from kernels import ...` branch was skipped
    assert report["norm_forward_is_plain"] == "LlamaRMSNorm.forward"  # not replaced by a hub layer
    assert report["logits_shape"] == [1, 10, 64] and report["logits_finite"]
    assert "fused_add" in report["ours"]
