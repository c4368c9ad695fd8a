"""``TrainConfig``: every knob of a minirl RL run, with defaults and where they come from.

Load from YAML with ``TrainConfig.from_yaml(path)`` (flat keys, the field names below); an
unknown key fails with the closest valid name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from minirl import losses

CORRECTIONS = ("none", "tis", "mis", "icepop")
OLD_LOGPROBS = ("recompute", "bypass")
ROUTER_REPLAY = ("none", "r2", "r3")
LOSSES = ("ppo", "gspo")
ADVANTAGES = ("grpo", "drgrpo")


@dataclass
class TrainConfig:
    # --- model and data
    model: str = ""
    """HF checkpoint directory (required), e.g. the path ``mlab zoo build tiny-qwen3-moe`` prints."""
    sft_steps: int = 100
    """task SFT warm-up steps before RL (cached), so RL starts from a policy that sometimes
    succeeds; 0 starts from ``model`` as is (e.g. a real instruct model)."""
    task: str = "arithmetic"
    """a ``minirl.tasks`` name: arithmetic, countdown, sorting, longtail_sorting."""
    task_kwargs: dict = field(default_factory=lambda: {"digits": 1})
    n_train: int = 100
    n_eval: int = 32
    """held-out problems, disjoint from training (``minirl.tasks.splits``)."""
    seed: int = 0

    # --- rollout (the inference engine is the experiment variable)
    engine: str = "minirl:typical"
    """``minirl[:PRESET][,knob=value...]``, presets typical / aligned / hf_exact (``Knobs``);
    e.g. ``minirl:typical,tp=2,topk=unstable`` (Ring-linear §5.2.1 lists the knobs); or real vLLM,
    ``vllm[,max_model_len=N,max_num_seqs=N,seed=N]`` (its dtype is ``engine_dtype``)."""
    engine_dtype: str = "bfloat16"
    """rollout dtype; bf16 vs the fp32 trainer is the basic mismatch (Ring-linear §5.2.1)."""
    prompts_per_step: int = 8
    group_size: int = 8
    """samples per prompt (GRPO group, DeepSeekMath §4.1.2); must be >= 2."""
    max_new_tokens: int = 8
    temperature: float = 1.0

    # --- objective
    loss: str = "ppo"
    """``ppo`` (token clip) or ``gspo`` (sequence ratio, Zheng et al. 2025)."""
    advantage: str = "grpo"
    """``grpo`` (r - mean) / (std + 1e-6), or ``drgrpo`` (no std, Dr.GRPO §3.1)."""
    agg: str = "token-mean"
    """loss aggregation: token-mean (DAPO §3.3), seq-mean-token-mean, seq-mean-token-sum."""
    eps_low: float = 0.2
    eps_high: float = 0.28
    """clip-higher (DAPO §3.1: eps_low 0.2, eps_high 0.28)."""
    dual_clip: float | None = 3.0
    """dual-clip c for negative advantages (Ye et al. 2020 §3.2); None disables."""
    gspo_eps_low: float = 3e-4
    gspo_eps_high: float = 4e-4
    """GSPO's sequence-ratio clip range (GSPO paper §5.1)."""
    kl_coef: float = 0.0
    """KL to the initial policy; 0 as in DAPO §3 and Ring-1T §2.4.1's baseline."""
    kl_estimator: str = "k3"

    # --- mismatch handling
    old_logprobs: str = "recompute"
    """``recompute`` (trainer forward gives pi_old) or ``bypass`` (the rollout logprobs are
    pi_old, Ring-linear §5.2.2 eq. 5: right once the engines are aligned)."""
    correction: str = "icepop"
    """none / tis / mis / icepop (Ring-1T §2.3.2)."""
    correction_level: str = "token"
    """token / sequence (/ geometric for mis)."""
    icepop_alpha: float = 0.5
    icepop_beta: float = 5.0
    """IcePop band (Ring-1T §2.3.4: alpha = 0.5, beta = 5)."""
    tis_cap: float = 2.0
    """TIS truncation C (Yao et al. 2025 recommend 2)."""
    mis_low: float = 0.5
    mis_high: float = 2.0
    router_replay: str = "none"
    """none / r2 (replay the trainer's own old-pass routing) / r3 (replay the rollout engine's
    routing; CompassMax §2.4.4: ~10x smaller logprob gap)."""

    # --- optimisation
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas (Ring-1T §2.3.4 uses 0.9, 0.999)."""
    grad_clip: float = 1.0
    minibatches: int = 2
    """optimizer steps per RL step (the batch is split in this many minibatches)."""
    epochs: int = 1

    # --- run control
    device: str = "auto"
    """where the trainer runs: ``auto`` = CUDA when present (the fused logprob kernel is Triton
    there), else CPU; or ``cpu`` / ``cuda`` / ``cuda:N``. The rollout engine keeps its own device."""
    steps: int = 10
    eval_every: int = 5
    """greedy accuracy on the held-out split every N steps (and at step 0 and the end); 0 = never."""
    checkpoint_every: int = 5
    max_nan_steps: int = 3
    """stop after this many consecutive steps with a non-finite loss (each one is skipped)."""
    out_dir: str = "runs/minirl"
    progress: bool = True

    def __post_init__(self) -> None:
        choices = {"correction": CORRECTIONS, "old_logprobs": OLD_LOGPROBS, "router_replay": ROUTER_REPLAY,
                   "loss": LOSSES, "advantage": ADVANTAGES, "agg": losses.AGGREGATIONS,
                   "kl_estimator": losses.KL_ESTIMATORS}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"{name}={getattr(self, name)!r}; valid: {', '.join(valid)}")
        if self.device not in ("auto", "cpu", "cuda") and not (
                self.device.startswith("cuda:") and self.device[5:].isdigit()):
            raise ValueError(f"device={self.device!r}; valid: auto, cpu, cuda, cuda:N")
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size}: GRPO needs >= 2 samples per prompt (with 1, "
                             f"every advantage is 0 and nothing is learned); set group_size >= 2")
        if not 0 <= self.icepop_alpha < self.icepop_beta:
            raise ValueError(f"icepop_alpha={self.icepop_alpha} must be >= 0 and < icepop_beta="
                             f"{self.icepop_beta} (Ring-1T §2.3.4 uses 0.5 and 5)")
        if not 0 <= self.mis_low < self.mis_high:
            raise ValueError(f"mis_low={self.mis_low} must be >= 0 and < mis_high={self.mis_high}")
        if self.old_logprobs == "bypass" and self.router_replay == "r2":
            raise ValueError("router_replay='r2' records routing in the old-logprob forward, which "
                             "old_logprobs='bypass' skips; use 'r3' or old_logprobs='recompute'")
        for name in ("prompts_per_step", "max_new_tokens", "minibatches", "epochs", "n_train", "max_nan_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} must divide prompts_per_step * group_size = "
                             f"{self.prompts_per_step * self.group_size}")
        self.betas = tuple(self.betas)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Build from a flat dict; an unknown key raises with a close-match suggestion."""
        valid = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in valid:
                close = difflib.get_close_matches(key, valid, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
                raise ValueError(f"unknown config key {key!r}: {hint}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "TrainConfig":
        text = Path(path).read_text()
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of config keys, got {type(values).__name__}")
        return cls.from_dict(values)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d
