"""``trainer_dtype: bfloat16`` on a CPU without native bf16: the compute copy's GEMMs (nn.Linear
forward and backward, the fused lm_head's) run as fp32 GEMMs on bf16 operands (``Bf16Gemms``).
Both paths run on every box, forced through ``MINIRL_BF16_GEMM``; one step of each on the same
rollouts, against the float64 transcription of ``test_trainer_dtype``."""

from __future__ import annotations

import contextlib

import torch

from minirl.engine import prepack
from minirl.engine.bf16_gemm import Bf16Gemms
from tests.minirl.training.test_trainer_dtype import REWARDS, _float64_reference, _rel, _trainer


def _grads(trainer) -> dict[str, torch.Tensor]:
    return {k: p.grad for k, p in trainer.master.named_parameters()}


def test_an_emulated_bf16_step_against_the_native_one(zoo, tmp_path, monkeypatch):
    """Every GEMM output of the emulation is within one bf16 ulp of the native kernel's, and
    differs only where the two fp32 sums straddle a rounding boundary, while the native kernel
    rounds every output by up to half an ulp: so the step's gradient sits no further from the
    native one than the native one sits from float64, and as far from float64 as it."""
    path = zoo("tiny-qwen3")
    steps = {}
    for choice in ("native", "emulated"):
        monkeypatch.setenv(prepack.ENV, choice)
        trainer = _trainer(path, tmp_path / choice, "bfloat16")
        if choice == "native":
            rollouts = trainer.groups.collect(0, 0).rollouts
            before = {k: v.detach().clone() for k, v in trainer.master.named_parameters()}
            assert isinstance(trainer.gemms, contextlib.nullcontext)
        trainer.learn(0, rollouts, REWARDS)
        steps[choice] = _grads(trainer), trainer
    emulated, native = steps["emulated"][0], steps["native"][0]
    gemms = steps["emulated"][1].gemms
    assert isinstance(gemms, Bf16Gemms)
    compute = steps["emulated"][1].model
    embed, head = compute.get_input_embeddings().weight, compute.get_output_embeddings().weight
    matrices = [p for p in compute.parameters() if p.dim() == 2 and (p is not embed or p is head)]
    assert len(gemms.copies) == len(matrices)  # each weight matrix a GEMM reads (an untied embedding: a lookup)
    _, grad64 = _float64_reference(steps["native"][1], rollouts, before)
    gap, own = _rel(emulated, native), _rel(native, grad64)
    assert 0 < gap <= own and _rel(emulated, grad64) <= 1.25 * own, (gap, own, _rel(emulated, grad64))


def test_an_fp32_trainer_never_emulates(zoo, tmp_path, monkeypatch):
    monkeypatch.setenv(prepack.ENV, "emulated")
    assert isinstance(_trainer(zoo("tiny-qwen3"), tmp_path, "float32").gemms, contextlib.nullcontext)
