"""``TrainConfig``: every knob of a minirl RL run, with defaults and where they come from.

Load from YAML with ``TrainConfig.from_yaml(path)`` (flat keys, the field names below); an
unknown key fails with the closest valid name, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

from minirl.training import combinations, config_check, config_file


from minirl.algorithms import losses
CORRECTIONS = ("none", "tis", "mis", "icepop")
OLD_LOGPROBS = ("recompute", "bypass")
ROUTER_REPLAY = ("none", "r2", "r3")
LOSSES = ("ppo", "gspo", "espo")
ADVANTAGES = ("grpo", "drgrpo")
ZERO_VARIANCE = ("none", "filter", "reshape")
ROLLOUTS = ("sync", "c3po")
MODES = ("sync", "async", "ray")
DOWNSAMPLE = ("none", "roc")
ROC_MODES = ("sample", "lowest")
ESPO_GROUPINGS = ("top_fraction", "quantile")
ESPO_DENOMINATORS = ("current", "old")
DISPATCH = ("fifo", "longest_first")
REPORT_TO = ("none", "tensorboard")
SWITCHES = {"correction": CORRECTIONS, "old_logprobs": OLD_LOGPROBS, "router_replay": ROUTER_REPLAY,
            "advantage": ADVANTAGES, "agg": losses.AGGREGATIONS, "kl_estimator": losses.KL_ESTIMATORS,
            "report_to": REPORT_TO, "loss": LOSSES, "zero_variance": ZERO_VARIANCE, "rollout": ROLLOUTS,
            "mode": MODES, "downsample": DOWNSAMPLE, "roc_mode": ROC_MODES, "espo_grouping": ESPO_GROUPINGS,
            "espo_token_denominator": ESPO_DENOMINATORS, "dispatch": DISPATCH}
"""every field with a fixed set of values, and those values (``minirl.training.combinations`` says which combine)."""


@dataclass
class TrainConfig:
    # --- model and data
    model: str = ""
    """HF checkpoint directory (required), e.g. the path ``mlab zoo build tiny-qwen3-moe`` prints."""
    sft_steps: int = 100
    """task SFT warm-up steps before RL (cached), so RL starts from a policy that sometimes
    succeeds; 0 starts from ``model`` as is (e.g. a real instruct model)."""
    task: str = "arithmetic"
    """a ``minirl.tasks`` name: arithmetic, countdown, sorting, longtail_sorting, chat_arithmetic, python_tool
    (multi-turn: the model's ``<tool_call>`` code runs in ``minirl.sandbox``, rStar2-Agent §2.2.2); a name a
    ``setup_modules`` module registers; or your own task as an import path, ``my_pkg.my_tasks:MyTask``
    (docs/rl.md, "Adding a task")."""
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
    """``ppo`` (token clip), ``gspo`` (sequence ratio, Zheng et al. 2025) or ``espo`` (one ratio
    per entropy group of tokens, CompassMax §2.4.2; options ``espo_*``)."""
    advantage: str = "grpo"
    """``grpo`` (r - mean) / (std + 1e-6), or ``drgrpo`` (no std, Dr.GRPO §3.1)."""
    agg: str = "token-mean"
    """loss aggregation: token-mean (DAPO §3.3), seq-mean-token-mean, seq-mean-token-sum. Applies
    to ``ppo`` and the KL term; ``gspo`` always takes seq-mean-token-mean (its objective is a mean
    over sequences, GSPO eq. 5; verl forces the same) and ``espo`` its own mean over groups."""
    eps_low: float = 0.2
    eps_high: float = 0.28
    """clip-higher (DAPO §3.1: eps_low 0.2, eps_high 0.28)."""
    dual_clip: float | None = 3.0
    """dual-clip c for negative advantages (Ye et al. 2020 §3.2); None disables."""
    gspo_eps_low: float = 3e-4
    gspo_eps_high: float = 4e-4
    """GSPO's sequence-ratio clip range (GSPO paper §5.1)."""
    espo_grouping: str = "top_fraction"
    """ESPO token groups (CompassMax §2.4.2): ``top_fraction`` (the highest-entropy tokens get
    their own ratio, the rest share one) or ``quantile`` (``espo_n_groups`` entropy bins)."""
    espo_top_fraction: float = 0.2
    """ρ: share of a sequence's tokens with their own ratio (the 80/20 high-entropy-token rule)."""
    espo_n_groups: int = 4
    """K entropy bins per sequence for ``espo_grouping: quantile``."""
    espo_alpha: float = 0.2
    """α of ESPO Eq. 3 (entropy-adaptive clip ε_τ = α·mean entropy / log|V|)."""
    espo_clip_eps: float | None = None
    """a fixed ESPO clip ε instead of Eq. 3's entropy-adaptive one; None = Eq. 3."""
    espo_token_denominator: str = "current"
    """``current`` (GSPO-token form, default) or ``old`` (ESPO Eq. 1 as printed)."""
    kl_coef: float = 0.0
    """KL to the initial policy; 0 as in DAPO §3 and Ring-1T §2.4.1's baseline."""
    kl_estimator: str = "k3"

    # --- zero-variance groups (CompassMax §2.4.1)
    zero_variance: str = "none"
    """what to do with GRPO groups whose rewards are all equal (zero advantage): ``none``;
    ``filter`` (DAPO dynamic sampling: drop them and draw more prompts until ``prompts_per_step``
    informative groups or ``zero_variance_max_batches`` draws); ``reshape`` (RL-ZVP: all-correct
    groups get +α·entropy per token, all-wrong ones -α·(max entropy - entropy))."""
    zero_variance_max_batches: int = 4
    """most generation batches ``filter`` draws per step; short of groups, the step trains on fewer."""
    zero_variance_alpha: float = 0.1
    """α of ``reshape``'s entropy-shaped advantages."""
    adaptive_group: bool = False
    """grow the group size N (x2) while the smoothed zero-variance rate is above 0.3 and shrink it
    (never below ``group_size``) below 0.1 (CompassMax §2.4.1, rollout stage)."""
    adaptive_group_max: int = 32
    """largest N ``adaptive_group`` may reach."""

    # --- rollout schedule
    rollout: str = "sync"
    """``sync`` (every step generates whole groups under the current weights) or ``c3po``
    (C3PO++, Ring-1T §2.3.3 Algorithm 1: generate until ``c3po_token_budget`` completed tokens,
    train on the groups that finished, carry the unfinished rollouts to the next policy)."""
    c3po_token_budget: int = 256
    """Φ: completed tokens per C3PO++ iteration."""
    c3po_retention: int = 2
    """σ: iterations an unfinished rollout may be carried over before it is purged."""
    c3po_chunk_tokens: int = 8
    """tokens per engine call between budget checks (1 = Algorithm 1's per-token check)."""
    c3po_pool_capacity: int = 0
    """Ω: rollouts generated in parallel; 0 = one synchronous step's, prompts_per_step * group_size."""

    # --- tool use (rStar2-Agent §2.2)
    downsample: str = "none"
    """``none``, or ``roc`` (GRPO-RoC, rStar2-Agent §2.2.3: sample 2G rollouts per prompt, keep G:
    correct ones favouring few tool errors and clean answers, wrong ones uniformly)."""
    roc_mode: str = "sample"
    """``sample`` (the paper: positives drawn with weight 1/(penalty + 0.01)) or ``lowest``
    (the lowest-penalty positives; rStar's released code)."""
    tool_max_turns: int = 3
    """model turns per tool trajectory (each may end in one ``<tool_call>``)."""
    tool_timeout_s: float = 5.0
    """wall-clock limit of one sandboxed tool call."""

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

    # --- trainer compute (each changes float reduction order only; off = the reference path)
    shared_prefix: bool = False
    """trainer forwards pack each prompt once with its completions (block mask) instead of
    repeating it in every padded row: ~``group_size`` x fewer prompt tokens; same logprobs up to
    float reduction order (docs/measurements/2026-11-26-real-model-step.md). Not with router_replay."""

    # --- run mode (AsyncFlow §4)
    mode: str = "sync"
    """``sync`` (this process, lockstep), ``async`` (a producer thread generates up to
    ``max_staleness`` steps ahead, §4.2.2) or ``ray`` (rollout, reward and trainer as Ray actors)."""
    max_staleness: int = 1
    """most updates a trained token may lag the learner in ``async``/``ray`` (AsyncFlow §4.2.1:
    one step costs no convergence); ``sync`` is always 0."""
    reward_timeout_s: float = 30.0
    """``async``/``ray``: a verifier call slower than this gives reward 0 and is counted."""
    sample_timeout_s: float = 600.0
    """``async``/``ray``: a sample not complete this long after admission is dropped and reported."""
    queue_capacity: int = 1024
    """``async``/``ray``: samples (prompt groups) in flight at once (backpressure)."""
    ray_address: str | None = None
    """``ray``: None starts a local cluster of ``ray_num_cpus``; else ``host:port`` of a running one."""
    ray_num_cpus: int = 2
    rollout_actors: int = 1
    """``ray``: rollout engine actors."""
    cpus_per_actor: float = 1.0
    """``ray``: CPUs each rollout actor and the trainer actor reserve (more than the cluster has
    is an error at start)."""
    connect_timeout_s: float = 20.0
    """``ray``: how long ``ray_address`` may take to answer."""
    dispatch: str = "fifo"
    """``ray``: order of a step's prompts to idle rollout actors, ``fifo`` or ``longest_first``
    (predicted from a short draft, CompassMax §3.1.1; greedy LPT, within 4/3 of the best makespan)."""
    draft_tokens: int = 16
    """``ray``: tokens of the ``longest_first`` draft."""
    setup_modules: list[str] = field(default_factory=list)
    """modules imported before the config is checked, in this process and every Ray worker (e.g. one
    that ``minirl.tasks.register``s a task)."""

    # --- run control
    device: str = "auto"
    """where the trainer runs: ``auto`` = CUDA when present (the fused logprob kernel is Triton
    there), else CPU; or ``cpu`` / ``cuda`` / ``cuda:N``. The minirl rollout engine runs there too (one
    card holds both; the weight sync is a device-to-device copy, ``time_sync``); vLLM keeps its own."""
    steps: int = 10
    eval_every: int = 5
    """held-out greedy accuracy (exactly correct, ``minirl.tasks.is_correct``) and mean reward, before
    step 0's update, every N steps, and on the final policy after the last update; 0 = never."""
    checkpoint_every: int = 5
    """write ``<out_dir>/checkpoint`` every N steps and after the last one, so ``--resume`` can
    continue; 0 = never (the run cannot be resumed)."""
    max_nan_steps: int = 3
    """stop after this many consecutive steps with a non-finite loss (each one is skipped)."""
    out_dir: str = "runs/minirl"
    """the run directory: metrics.nc, config.yaml, checkpoint/, curves.png and a manifest of them,
    locked while a run is in it (docs/runs.md). A run there is continued with ``--resume``; ``mlab
    train`` replaces its files only with ``--overwrite`` (``minirl.train(..., resume=False)`` replaces
    them); files it did not write are never touched."""
    progress: bool = True
    """tqdm progress bars (training, SFT warm-up)."""
    report_to: str = "none"
    """``none`` or ``tensorboard``: also write every metric as a TensorBoard scalar, offline, to
    ``<out_dir>/tensorboard`` (``tensorboard --logdir <out_dir>``)."""

    def __post_init__(self) -> None:
        import_setup_modules(self.setup_modules)  # first: they may register the task checked next
        config_check.check(self)  # types from the annotations, ranges, task options
        check_engine(self.engine)
        for name, valid in SWITCHES.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"{name}={getattr(self, name)!r}; valid: {', '.join(valid)}")
        if self.device not in ("auto", "cpu", "cuda") and not (
                self.device.startswith("cuda:") and self.device[5:].isdigit()):
            raise ValueError(f"device={self.device!r}; valid: auto, cpu, cuda, cuda:N")
        if not 0 <= self.icepop_alpha < self.icepop_beta:
            raise ValueError(f"icepop_alpha={self.icepop_alpha} must be >= 0 and < icepop_beta="
                             f"{self.icepop_beta} (Ring-1T §2.3.4 uses 0.5 and 5)")
        if not 0 <= self.mis_low < self.mis_high:
            raise ValueError(f"mis_low={self.mis_low} must be >= 0 and < mis_high={self.mis_high}")
        if self.prompts_per_step * self.group_size > config_check.MAX_SAMPLES_PER_STEP:
            raise ValueError(f"prompts_per_step * group_size = {self.prompts_per_step * self.group_size}: one step's "
                             f"rollouts, generated and held as one batch, must be <= "
                             f"{config_check.MAX_SAMPLES_PER_STEP}; lower prompts_per_step or group_size")
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} must divide prompts_per_step * group_size = "
                             f"{self.prompts_per_step * self.group_size}")
        combinations.check(self)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """Build from a flat dict; an unknown key raises with a close-match suggestion."""
        if not isinstance(values, dict):
            raise ValueError(f"a config is a mapping of TrainConfig keys, got {type(values).__name__}")
        valid = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in valid:
                close = difflib.get_close_matches(str(key), valid, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
                raise ValueError(f"unknown config key {config_check.short(key)}: {hint}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "TrainConfig":
        """Build from a YAML file of flat keys (read by ``config_file.read_config_file``, checked
        like ``from_dict``)."""
        return cls.from_dict(config_file.read_config_file(path))

    def to_dict(self) -> dict:
        """The fields as plain YAML/JSON values (tuples as lists): ``from_dict(to_dict())`` round-trips."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def import_setup_modules(modules: object) -> None:
    """Import ``setup_modules`` (each may ``minirl.tasks.register`` a task) so that the checks,
    and every mode's workers, see what they define. A value that is not a list of names is left
    to ``config_check`` to report."""
    import importlib

    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        return
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ValueError(f"setup_modules: cannot import {name!r} ({e}); put its package on PYTHONPATH (or "
                             f"install it), or remove it from setup_modules") from None


def check_engine(spec: str) -> None:
    """Refuse an engine spec the trainer cannot build, before any model loads: an unknown kind
    (naming the valid ones), a bad preset or option. A plugin's spec is the plugin's to read."""
    from importlib.metadata import entry_points

    from minirl.engine.spec import EngineSpec

    head = spec.strip().split(",")[0].partition(":")[0].strip()
    plugins = sorted(ep.name for ep in entry_points(group="minirl.engines"))
    if head in plugins:
        return
    if head not in ("minirl", "vllm"):
        raise ValueError(f"engine={spec!r}: unknown engine kind {head!r}; valid kinds: "
                         f"{', '.join(['minirl', 'vllm', *plugins])} (e.g. engine: minirl:typical; other kinds come "
                         f"from the 'minirl.engines' entry points of installed packages)")
    EngineSpec.parse(spec)
