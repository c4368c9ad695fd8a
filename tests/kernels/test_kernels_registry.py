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
    "rmsnorm": ["bf16_compute", "fp32_residual", "fused_add", "hf", "reference"],
    "rope": ["cached_table", "fp32_compute", "hf", "reference"],
    "router_topk": ["stable", "torch", "unstable"],
    "logprobs": ["chunked", "naive"],
}
#: variants that also have a Triton implementation (tested equal to the torch one through the interpreter)
TRITON = {
    "rmsnorm": ["fp32_residual", "fused_add", "hf", "reference"],
    "rope": ["fp32_compute", "hf"],
    "router_topk": ["stable"],
    "logprobs": ["chunked"],
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


def test_variants_name_numerics_and_list_their_implementations():
    for op in kernels.ops():
        for name in kernels.variants(op):
            want = ["torch", "triton"] if name in TRITON[op] else ["torch"]
            assert kernels.impls(op, name) == want, (op, name)
            for impl in want:
                assert "Who" in (kernels.get(op, name, impl=impl).__doc__ or ""), (op, name, impl)


def test_auto_returns_the_torch_function_itself_without_a_triton_one():
    """CPU callers (the engine's decode loop) pay nothing for the dispatch."""
    assert kernels.get("rmsnorm", "bf16_compute") is kernels.get("rmsnorm", "bf16_compute", impl="torch")
    auto = kernels.get("rmsnorm", "hf")
    assert auto is not kernels.get("rmsnorm", "hf", impl="torch")
    assert auto.__wrapped__ is kernels.get("rmsnorm", "hf", impl="torch")


class _FakeCuda:
    """Stands in for a CUDA tensor: the dispatch reads only ``is_cuda``."""

    is_cuda = True


def test_auto_runs_triton_on_cuda_tensors_and_torch_elsewhere():
    from kernels import registry

    run = registry._auto(lambda x: "torch", lambda x: "triton")
    assert run(torch.ones(2)) == "torch"  # CPU: torch even under TRITON_INTERPRET (the interpreter is slow)
    assert run(_FakeCuda()) == ("triton" if registry.triton_available() else "torch")
    x, w = torch.randn(3, 8), torch.ones(8)
    assert torch.equal(kernels.get("rmsnorm", "hf")(x, w, 1e-6), kernels.get("rmsnorm", "hf", impl="torch")(x, w, 1e-6))


def test_forcing_a_missing_or_unknown_implementation_raises():
    with pytest.raises(KeyError, match="bf16_compute.*no triton implementation.*\\['torch'\\]"):
        kernels.get("rmsnorm", "bf16_compute", impl="triton")
    with pytest.raises(ValueError, match="impl must be 'auto'"):
        kernels.get("rmsnorm", "hf", impl="cuda")
    with pytest.raises(KeyError, match="variants: "):
        kernels.get("rmsnorm", "triton")  # a device is no longer a variant name

    def orphan(x):
        """Who: nobody; a Triton implementation without a torch variant."""

    with pytest.raises(KeyError, match="before its Triton one"):
        kernels.register("rmsnorm", "not_there", impl="triton")(orphan)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_import_does_not_import_triton_and_cpu_launch_without_interpreter_is_refused():
    code = (
        "import sys, torch, kernels\n"
        "assert 'triton' not in sys.modules, 'import kernels pulled in triton'\n"
        "try:\n"
        "    kernels.get('rmsnorm', 'reference', impl='triton')(torch.ones(2, 4), torch.ones(4), 1e-6)\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    out = _python(code, TRITON_INTERPRET="0")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in out.stdout and "impl='torch'" in out.stdout


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
