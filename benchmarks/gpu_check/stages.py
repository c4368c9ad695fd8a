"""The stages of ``python -m benchmarks.gpu_check``, in run order, with their budgets on the card.

The budgets add up to ``TOTAL_S`` so that the whole check, worker start-ups and the wheel
install included, stays within 8 minutes on an H100 (a lent card gives 10 minutes per command).
"""

from __future__ import annotations

from benchmarks.gpu_check.runner import Stage

#: The whole run's cap (seconds); a stage gets less than its budget when less is left.
TOTAL_S = 450.0  # budgets below rebalanced after the H100 run of 2026-11-26 (docs/gpu.md)

STAGES = [
    Stage("prepare", "benchmarks.gpu_check.model_stages:prepare", 40,
          "the zoo checkpoints build here (CPU work, kept out of the later stages' budgets)"),
    Stage("gpu_tests", "benchmarks.gpu_check.gpu_tests:gpu_tests", 100,
          "every `gpu`-marked test passes (on CPU: each is collected and skips with its reason)"),
    Stage("kernels", "benchmarks.gpu_check.kernel_stages:kernels_stage", 170,
          "each Triton kernel matches its torch twin at real shapes; its speed and bandwidth"),
    Stage("logprob_memory", "benchmarks.gpu_check.kernel_stages:logprob_memory", 30,
          "the fused logprob kernel's peak memory, forward + backward, vs the naive log_softmax"),
    Stage("engine", "benchmarks.gpu_check.model_stages:engine", 40,
          "minirl decode vs transformers generate; Knobs.aligned() fp32 vs transformers fp32"),
    Stage("trainer", "benchmarks.gpu_check.model_stages:trainer", 40,
          "3 RL steps with IcePop + R3 on device auto: finite loss, Triton logprob path taken"),
    Stage("tracker", "benchmarks.gpu_check.model_stages:tracker", 30,
          "a Tracker capture of transformers on the device (stats and tensor) and its overhead"),
]
