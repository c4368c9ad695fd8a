"""Bf16Gemms: the trainer's bf16 GEMMs, forward and backward, as fp32 GEMMs on the bf16 operands.

The emulation needs no native bf16, so every test runs on every box; torch's own bf16 kernels
(which also run anywhere, slowly without native bf16) are the comparison: the same GEMMs up to
summation order (``assert_a_bf16_gemm``'s bound), the same float64 distance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels
from minirl.engine.bf16_gemm import GEMMS, Bf16Gemms
from tests.minirl.engine.test_prepack import assert_a_bf16_gemm


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()


class Counting(Bf16Gemms):
    """Bf16Gemms that counts the GEMM kernels it saw, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in GEMMS:
            self.seen[str(func)] = self.seen.get(str(func), 0) + 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def _linear_step(linear: torch.nn.Linear, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Forward and backward of ``linear`` at ``x`` with upstream gradient ``g`` -> (y, dx, dw, db)."""
    x = x.detach().requires_grad_()
    linear.zero_grad(set_to_none=True)
    y = linear(x)
    y.backward(g)
    return y.detach(), x.grad, linear.weight.grad, linear.bias.grad


def test_a_linear_layer_forward_and_backward_are_bf16_gemms():
    """``nn.Linear`` on 3-D bf16 input: y = x w^T + b, dx = g w, dw = g^T x, each an emulated bf16
    GEMM (bound against float64, and against torch's native bf16 autograd up to summation order);
    db is a reduction, not a GEMM: torch's own, the same bits."""
    n, k, o = 3 * 37, 96, 80
    linear = torch.nn.Linear(k, o).bfloat16()
    x, g = _bf16(3, 37, k, seed=1), _bf16(3, 37, o, seed=2)
    mode = Counting()
    with mode:
        y, dx, dw, db = _linear_step(linear, x, g)
    ny, ndx, ndw, ndb = _linear_step(linear, x, g)
    x2, g2, w = x.view(n, k), g.view(n, o), linear.weight.detach()
    assert_a_bf16_gemm(y.view(n, o), x2, w, linear.bias.detach(), "y", ny.view(n, o))
    assert_a_bf16_gemm(dx.view(n, k), g2, w.T, None, "dx", ndx.view(n, k))
    assert_a_bf16_gemm(dw, g2.T, x2.T, None, "dw", ndw)
    assert torch.equal(db, ndb)
    assert mode.seen == {"aten.addmm.default": 1, "aten.mm.default": 2}
    assert len(mode.copies) == 2  # the weight and the bias, kept in fp32


def test_the_fused_logprob_kernel_gemms_forward_and_backward():
    """The trainer's lm_head: the chunked log-prob kernel's forward GEMMs and its hand-written
    backward's (``mm`` and ``mm(out=)``) all run emulated, reading one kept copy of the weight
    through its views; log-probs and gradients sit as far from float64 as torch's bf16 kernels'."""
    vocab, hidden, n = 1000, 576, 300  # smollm2-135m's hidden size
    weight = torch.nn.Parameter(_bf16(vocab, hidden, seed=3))
    h = _bf16(n, hidden, seed=4)
    targets = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(5))
    fused = kernels.get("logprobs", "chunked", "auto")

    def run(w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = x.detach().requires_grad_()
        w.grad = None
        logp, _ = fused(x, w, targets, chunk_size=64)
        logp.sum().backward()
        return logp.detach().double(), x.grad.double(), w.grad.double()

    mode = Counting()
    with mode:
        emulated = run(weight, h)
    native = run(weight, h)
    exact = run(torch.nn.Parameter(weight.detach().double()), h.double())
    # forward: 5 row chunks; backward: 5 vocabulary blocks, each its logits, grad_h and grad_w (out=)
    assert mode.seen == {"aten.mm.default": 5 + 5 * 2, "aten.mm.out": 5}
    assert len(mode.copies) == 1
    for name, e, nat, ref in zip(("logp", "grad_h", "grad_w"), emulated, native, exact):
        gap, own = _rel(e, nat), _rel(nat, ref)
        assert 0 < own < 5e-2 and gap <= own and _rel(e, ref) <= 1.25 * own, (name, gap, own, _rel(e, ref))


def test_a_weight_written_in_place_is_read_anew():
    """The kept copy follows the weight's version counter (the trainer re-rounds its compute copy
    in place from the master after every optimizer step)."""
    linear, x = torch.nn.Linear(32, 16, bias=False).bfloat16(), _bf16(4, 32, seed=6)
    mode = Bf16Gemms()
    with mode, torch.no_grad():
        before = linear(x)
        linear.weight.mul_(1.5)
        after = linear(x)
    with Bf16Gemms(), torch.no_grad():
        assert torch.equal(after, linear(x)) and not torch.equal(after, before)
    assert len(mode.copies) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_other_dtypes_pass_through(dtype):
    linear, x = torch.nn.Linear(32, 16).to(dtype), torch.randn(4, 32, dtype=dtype)
    mode = Bf16Gemms()
    with mode, torch.no_grad():
        y = linear(x)
    assert torch.equal(y, F.linear(x, linear.weight, linear.bias)) and len(mode.copies) == 0


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())
