"""The stages of ``python -m benchmarks.gpu_check``, in run order, with their budgets on the card.

The budgets add up to ``TOTAL_S`` so that the whole check, worker start-ups and the wheel
install included, stays within 8 minutes on an H100 (a lent card gives 10 minutes per command).
"""

from __future__ import annotations

from benchmarks.gpu_check.runner import Stage

#: The whole run's cap (seconds); a stage gets less than its budget when less is left.
TOTAL_S = 450.0  # rebudgeted for the one-card RL arms and the decode table (docs/gpu.md)

STAGES = [
    Stage("prepare", "benchmarks.gpu_check.model_stages:prepare", 30,
          "the zoo checkpoints and the RL arms' SFT-warmed model are there (carried, or built: CPU work)"),
    Stage("gpu_tests", "benchmarks.gpu_check.gpu_tests:gpu_tests", 60,
          "every `gpu`-marked test passes (on CPU: each is collected and skips with its reason)"),
    Stage("kernels", "benchmarks.gpu_check.kernel_stages:kernels_stage", 100,
          "each Triton kernel matches its torch twin and the anchors (Liger-Kernel, Cut Cross-Entropy); speeds"),
    Stage("logprob_memory", "benchmarks.gpu_check.kernel_stages:logprob_memory", 20,
          "the fused logprob kernel's peak memory, forward + backward, vs the naive log_softmax"),
    Stage("engine", "benchmarks.gpu_check.model_stages:engine", 60,
          "Knobs.aligned() fp32 matches transformers fp32 (mean |dlogp| <= 1e-5); greedy decode table vs generate"),
    Stage("gpu_rl", "benchmarks.gpu_check.rl_stage:gpu_rl", 150,
          "GRPO vs GRPO + IcePop + R3, engine and trainer on one device: learning signal, flips, time split"),
    Stage("tracker", "benchmarks.gpu_check.model_stages:tracker", 20,
          "a Tracker capture of transformers on the device (stats and tensor) and its overhead"),
]
