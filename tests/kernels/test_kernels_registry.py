"""The registry contract other packages code against (docs/architecture.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels

REPO = Path(__file__).resolve().parents[2]

CONTRACT = {
    "rmsnorm": ["bf16_compute", "fp32_residual", "fused_add", "hf", "reference", "triton"],
    "rope": ["cached_table", "fp32_compute", "hf", "reference", "triton"],
    "router_topk": ["stable", "torch", "triton", "unstable"],
    "logprobs": ["chunked", "naive", "triton"],
}


def test_ops_and_variants_match_the_contract():
    assert kernels.ops() == sorted(CONTRACT)
    for op, names in CONTRACT.items():
        assert kernels.variants(op) == names


def test_every_variant_documents_who_does_it_that_way():
    for op in kernels.ops():
        for name in kernels.variants(op):
            doc = kernels.get(op, name).__doc__ or ""
            assert "Who" in doc, f"{op}/{name} docstring does not say who computes it this way"


def test_unknown_names_raise_with_the_known_ones():
    with pytest.raises(KeyError, match="known ops"):
        kernels.variants("layernorm")
    with pytest.raises(KeyError, match="variants: .*'hf'"):
        kernels.get("rmsnorm", "apex")


def test_register_requires_a_docstring():
    with pytest.raises(TypeError, match="docstring"):
        kernels.register("rmsnorm", "undocumented")(lambda x: x)
    assert "undocumented" not in kernels.variants("rmsnorm")


def test_every_triton_kernel_has_a_torch_twin_and_cpu_dispatch_uses_it():
    assert sorted(kernels.TORCH_TWIN) == kernels.ops()
    for op, twin in kernels.TORCH_TWIN.items():
        assert twin in kernels.variants(op)
        assert kernels.fast_variant(op, "cpu") == twin
        assert kernels.fast(op, torch.device("cpu")) is kernels.get(op, twin)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_import_does_not_import_triton_and_cpu_launch_without_interpreter_is_refused():
    code = (
        "import sys, torch, kernels\n"
        "assert 'triton' not in sys.modules, 'import kernels pulled in triton'\n"
        "try:\n"
        "    kernels.get('rmsnorm', 'triton')(torch.ones(2, 4), torch.ones(4), 1e-6)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    out = _python(code, TRITON_INTERPRET="0")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in out.stdout and "'reference'" in out.stdout


def test_trusted_skips_checks_only_inside_the_block_and_changes_no_result():
    import kernels

    x, w = torch.randn(4, 8), torch.ones(8)
    bad_w = torch.ones(7)  # wrong hidden size
    norm = kernels.get("rmsnorm", "hf")
    with pytest.raises(ValueError, match="weight"):
        norm(x, bad_w, 1e-6)
    with kernels.trusted():
        assert torch.equal(norm(x, w, 1e-6), kernels.get("rmsnorm", "hf")(x, w, 1e-6))
        with pytest.raises(RuntimeError):  # no friendly check: torch itself fails
            norm(x, bad_w, 1e-6)
    with pytest.raises(ValueError, match="weight"):  # checks are back after the block
        norm(x, bad_w, 1e-6)
