"""How much the rounding details of minirl's quantizers matter on a real checkpoint.

    .venv/bin/python benchmarks/quant_rounding.py [--model smollm2-135m] [--tokens 512] [--parts 1,2,3]

1. **fp32 quotient vs exact quotient.** minirl rounds ``fl32(w / s)`` as vLLM / compressed-tensors
   do; rounding the exact quotient instead moves some elements by one step (the ones whose exact
   quotient lies within half an fp32 ulp of a tie). Prints how many, per format, and how far
   the fp32 engine's token logprobs move when the exact-quotient weights are used instead.
2. **A bf16 engine rounds the dequantized weights again** (``q * s`` has more bits than bf16).
   Prints, per format, the size of that second rounding against the format's own weight error,
   how much it adds to the total weight error, and to the logprob gap: fp32 activations with the
   dequantized weights in fp32 vs the same weights rounded to bf16 (``weight_dtype="bfloat16"``),
   each against the unquantized fp32 engine.
3. **W8A8 vs weights only** (``--parts 3``): the fp32 engine with fp8 weights (per channel, per
   tensor) with and without per-token fp8 inputs (``activations="fp8"``), against the unquantized
   fp32 engine: how much a weight-only emulation understates FlashRL-style FP8 rollouts.

All parts run on the fp32 engine (``Knobs.aligned()``) so nothing else rounds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from aligntools.gates.inputs import prepare_tokens
from labs import zoo
from minirl import Engine, Knobs
from minirl.engine.quantize import FP8_MAX, INT8_MAX, fake_quantize

FORMATS = ("int8", "fp8_e4m3", "fp8_e4m3_tensor")
FP32 = Knobs.aligned()  # fp32 everywhere: nothing rounds but the quantizers under study


def exact_quotient(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """``fmt`` with minirl's fp32 scale but the quotient ``w / s`` rounded exactly (float64, which
    holds the sign of the distance to a tie for fp32 operands), dequantized in float64."""
    x = w.double()
    amax = x.abs().amax((-2, -1) if fmt == "fp8_e4m3_tensor" else -1, keepdim=True)
    qmax = INT8_MAX if fmt == "int8" else FP8_MAX
    s = torch.where(amax > 0, (amax.float() / qmax).double(), torch.ones_like(amax))  # the fp32 scale
    y = x / s
    if fmt == "int8":
        return y.round().clamp(-INT8_MAX, INT8_MAX) * s
    y = y.clamp(-FP8_MAX, FP8_MAX)
    step = 2.0 ** (torch.floor(torch.log2(y.abs().clamp_min(2.0 ** -6))) - 3)  # e4m3 spacing
    return torch.round(y / step) * step * s


def gap(engine: Engine, base: list[torch.Tensor], seqs: list[list[int]]) -> tuple[float, float]:
    """(mean, max) |Δ token logprob| of ``engine`` against ``base``."""
    d = (torch.cat(engine.score(seqs)) - torch.cat(base)).abs()
    return d.mean().item(), d.max().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=512, help="built-in text scored, in 4 sequences")
    ap.add_argument("--parts", default="1,2,3", help="which measurements, comma separated (see the docstring)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    path = zoo.build(args.model)
    seqs = prepare_tokens(path, args.tokens, n_seqs=4).tolist()
    plain = Engine.from_pretrained(path, dtype="float32", knobs=FP32)
    base = plain.score(seqs)
    names = [n for n, t in plain.model.w.items() if plain.model._quantized(n, t)]
    print(f"{args.model}: {len(names)} quantized matrices, "
          f"{sum(plain.model.w[n].numel() for n in names):,} elements; {sum(map(len, base))} scored tokens")

    if "1" in parts:
        quotient_rounding(path, names, plain, seqs)
    if "2" in parts:
        second_rounding(path, names, plain, base, seqs)
    if "3" in parts:
        w8a8(path, base, seqs)


def quotient_rounding(path: Path, names: list[str], plain: Engine, seqs: list[list[int]]) -> None:
    """Part 1: the engine's weights overwritten in place with their exact-quotient image."""
    print("\n1. fp32 quotient (minirl, vLLM) vs exact quotient")
    for fmt in FORMATS:
        engine = Engine.from_pretrained(path, dtype="float32", knobs=FP32.replace(weights=fmt))
        ours = engine.score(seqs)
        moved = 0
        for n in names:
            exact = exact_quotient(plain.model.w[n], fmt).float()  # q * s rounded to fp32, as the engine's
            moved += int((engine.model.w[n] != exact).sum())
            engine.model.w[n].copy_(exact)
        mean, worst = gap(engine, ours, seqs)
        print(f"  {fmt:16s} elements moved one step: {moved:,}; token logprobs move by mean {mean:.2e}, "
              f"max {worst:.2e}")


def w8a8(path: Path, base: list[torch.Tensor], seqs: list[list[int]]) -> None:
    """Part 3: fp8 weights with and without per-token fp8 inputs, against the fp32 engine."""
    print("\n3. W8A8: per-token fp8 inputs on top of fp8 weights (mean / max |Δ logprob| vs fp32)")
    for fmt in ("fp8_e4m3", "fp8_e4m3_tensor"):
        row = [gap(Engine.from_pretrained(path, dtype="float32", knobs=FP32.replace(weights=fmt, activations=act)),
                   base, seqs) for act in ("none", "fp8")]
        print(f"  weights={fmt:16s} weights only {row[0][0]:.4g} / {row[0][1]:.3g}; with activations=fp8 "
              f"{row[1][0]:.4g} / {row[1][1]:.3g} ({row[1][0] / row[0][0]:.2f}x the mean)")


def second_rounding(path: Path, names: list[str], plain: Engine, base: list[torch.Tensor],
                    seqs: list[list[int]]) -> None:
    """Part 2: the dequantized weights in fp32 vs rounded to bf16, activations fp32 in both."""
    print("\n2. bf16 rounding of the dequantized weights: its share of the quantization error")
    bf16_only = gap(Engine.from_pretrained(path, dtype="float32", knobs=FP32.replace(weight_dtype="bfloat16")),
                    base, seqs)
    print(f"  bf16 weights, no quantization: mean |Δ logprob| {bf16_only[0]:.4g}")
    for fmt in FORMATS + ("int4",):
        err_q = err_qb = err_b = ref = 0.0
        for n in names:
            w = plain.model.w[n].double()
            q = fake_quantize(plain.model.w[n], fmt).double()
            qb = q.bfloat16().double()
            err_q += ((q - w) ** 2).sum().item()
            err_qb += ((qb - w) ** 2).sum().item()
            err_b += ((qb - q) ** 2).sum().item()
            ref += (w ** 2).sum().item()
        exact = gap(Engine.from_pretrained(path, dtype="float32", knobs=FP32.replace(weights=fmt)), base, seqs)
        rounded = gap(Engine.from_pretrained(path, dtype="float32",
                                             knobs=FP32.replace(weights=fmt, weight_dtype="bfloat16")), base, seqs)
        print(f"  {fmt:16s} the second rounding alone is {np.sqrt(err_b / err_q):.1%} of the format's weight "
              f"error (rel-L2); total weight rel-L2 {np.sqrt(err_q / ref):.4g} -> {np.sqrt(err_qb / ref):.4g} "
              f"(+{np.sqrt(err_qb / err_q) - 1:.1%}: nearly independent errors add in quadrature); "
              f"mean |Δ logprob| {exact[0]:.4g} -> {rounded[0]:.4g} (+{rounded[0] / exact[0] - 1:.1%}); "
              f"max {exact[1]:.3g} -> {rounded[1]:.3g}")


if __name__ == "__main__":
    main()
