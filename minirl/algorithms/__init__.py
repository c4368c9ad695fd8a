"""The RL math: advantages, policy losses, train-inference corrections, router replay and the
rollout-side algorithms (C3PO++, ESPO, zero-variance handling, GRPO-RoC), one idea per module."""
