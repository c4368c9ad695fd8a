"""``TrainConfig``: every knob of a minirl RL run, with defaults and where they come from.

Load from YAML with ``TrainConfig.from_yaml(path)`` (flat keys, the field names below); an
unknown key fails with the closest valid name, so a typo never silently falls back to a default.

Each field declares what is valid beside itself (``ranged``, ``one_of``, ``non_empty`` from
``minirl.training.config_check``, which checks them all before a model loads). The algorithm
switches ``correction``, ``loss`` and ``advantage`` take any name registered in their table
(``minirl.algorithms.registry``); a new entry's knobs are fields here.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field

from minirl.algorithms import advantages, corrections, espo, losses  # espo: registers loss: espo
from minirl.algorithms.registry import import_extension
from minirl.sandbox.runner import MAX_TIMEOUT_S
from minirl.training import combinations, config_check, config_file, monitor
from minirl.training.config_check import non_empty, one_of, ranged

_PROBLEMS = ("the problems are drawn up front, about 20 us each, before the first step: a million is "
             "20 s; more only hangs the start")
MAX_SAMPLES_PER_STEP = 1 << 20
"""prompts_per_step * group_size: one step's rollouts, generated and held as one batch."""


@dataclass
class TrainConfig:
    # --- model and data
    model: str = ""
    """HF checkpoint directory (required), e.g. the path ``mlab zoo build tiny-qwen3-moe`` prints."""
    sft_steps: int = ranged(100, 0, why="0 starts RL from `model` as is")
    """task SFT warm-up steps before RL (cached), so RL starts from a policy that sometimes
    succeeds; 0 starts from ``model`` as is (e.g. a real instruct model)."""
    task: str = "arithmetic"
    """a ``minirl.tasks`` name: arithmetic, countdown, sorting, longtail_sorting, chat_arithmetic, python_tool
    (multi-turn: the model's ``<tool_call>`` code runs in ``minirl.sandbox``, rStar2-Agent §2.2.2); a name a
    ``setup_modules`` module registers; or your own task as an import path, ``my_pkg.my_tasks:MyTask``
    (docs/rl.md, "Adding a task")."""
    task_kwargs: dict = field(default_factory=lambda: {"digits": 1})
    n_train: int = ranged(100, 1, 1_000_000, why=_PROBLEMS)
    n_eval: int = ranged(32, 0, 1_000_000, why=f"held-out problems; 0 = no held-out evaluation; {_PROBLEMS}")
    """held-out problems, disjoint from training (``minirl.tasks.splits``)."""
    seed: int = ranged(0, 0, 2**63 - 1)

    # --- rollout (the inference engine is the experiment variable)
    engine: str = "minirl:typical"
    """``minirl[:PRESET][,knob=value...]``, presets typical / aligned / hf_exact (``Knobs``);
    e.g. ``minirl:typical,tp=2,topk=unstable`` (Ring-linear §5.2.1 lists the knobs); or real vLLM,
    ``vllm[:DTYPE][,max_model_len=N,max_num_seqs=N,seed=N]`` (``minirl.engines.KINDS``)."""
    engine_dtype: str | None = None
    """rollout dtype when the ``engine`` spec names none (they must agree if both do); None = the
    kind's default, as in ``mlab check``: bfloat16 for minirl:typical and vllm (bf16 vs the fp32
    trainer is the basic mismatch, Ring-linear §5.2.1), float32 for minirl:aligned / hf_exact."""
    prompts_per_step: int = ranged(8, 1, 65_536, why="each step rolls out every prompt as one batch")
    group_size: int = ranged(8, 2, 4096,
                             why="GRPO needs >= 2 samples per prompt: with 1, every advantage is 0 and nothing is "
                                 "learned; each sample of a group is held in one step's batch")
    """samples per prompt (GRPO group, DeepSeekMath §4.1.2); must be >= 2."""
    max_new_tokens: int = ranged(8, 1, 1 << 20, why="a completion's token budget, past any context length here")
    temperature: float = ranged(1.0, 0.01, finite=True,
                                why="0 is greedy decoding: every sample of a group is the same, so every advantage "
                                    "is 0 and nothing is learned; below 0.01 a logit gap of 1 becomes e^-100, zero "
                                    "in float32, so sampling is greedy in effect")

    # --- objective
    loss: str = one_of("ppo", losses.POLICY_LOSSES)
    """``ppo`` (token clip), ``gspo`` (sequence ratio, Zheng et al. 2025) or ``espo`` (one ratio
    per entropy group of tokens, CompassMax §2.4.2; options ``espo_*``)."""
    advantage: str = one_of("grpo", advantages.ADVANTAGES)
    """``grpo`` (r - mean) / (std + 1e-6), or ``drgrpo`` (no std, Dr.GRPO §3.1)."""
    agg: str = one_of("token-mean", losses.AGGREGATIONS)
    """loss aggregation: token-mean (DAPO §3.3), seq-mean-token-mean, seq-mean-token-sum. Applies
    to ``ppo`` and the KL term; ``gspo`` always takes seq-mean-token-mean (its objective is a mean
    over sequences, GSPO eq. 5; verl forces the same) and ``espo`` its own mean over groups."""
    eps_low: float = ranged(0.2, 0, 1, high_open=True,
                            why="the ratio is clipped below at 1 - eps_low, which must stay > 0")
    eps_high: float = ranged(0.28, 0, finite=True)
    """clip-higher (DAPO §3.1: eps_low 0.2, eps_high 0.28)."""
    dual_clip: float | None = ranged(3.0, 1, low_open=True, finite=True,
                                     why="dual-clip c > 1 (Ye et al. 2020 §3.2); null disables")
    """dual-clip c for negative advantages (Ye et al. 2020 §3.2); None disables."""
    gspo_eps_low: float = ranged(3e-4, 0, 1, high_open=True)
    gspo_eps_high: float = ranged(4e-4, 0, finite=True)
    """GSPO's sequence-ratio clip range (GSPO paper §5.1)."""
    espo_grouping: str = one_of("top_fraction", espo.GROUPINGS)
    """ESPO token groups (CompassMax §2.4.2): ``top_fraction`` (the highest-entropy tokens get
    their own ratio, the rest share one) or ``quantile`` (``espo_n_groups`` entropy bins)."""
    espo_top_fraction: float = ranged(0.2, 0, 1)
    """ρ: share of a sequence's tokens with their own ratio (the 80/20 high-entropy-token rule)."""
    espo_n_groups: int = ranged(4, 1)
    """K entropy bins per sequence for ``espo_grouping: quantile``."""
    espo_alpha: float = ranged(0.2, 0, low_open=True, finite=True)
    """α of ESPO Eq. 3 (entropy-adaptive clip ε_τ = α·mean entropy / log|V|)."""
    espo_clip_eps: float | None = ranged(None, 0, low_open=True, finite=True)
    """a fixed ESPO clip ε instead of Eq. 3's entropy-adaptive one; None = Eq. 3."""
    espo_token_denominator: str = one_of("current", ("current", "old"))
    """``current`` (GSPO-token form, default) or ``old`` (ESPO Eq. 1 as printed)."""
    kl_coef: float = ranged(0.0, 0, finite=True, why="a negative coefficient rewards moving away from the reference")
    """KL to the initial policy; 0 as in DAPO §3 and Ring-1T §2.4.1's baseline."""
    kl_estimator: str = one_of("k3", losses.KL_ESTIMATORS)

    # --- zero-variance groups (CompassMax §2.4.1)
    zero_variance: str = one_of("none", ("none", "filter", "reshape"))
    """what to do with GRPO groups whose rewards are all equal (zero advantage): ``none``;
    ``filter`` (DAPO dynamic sampling: drop them and draw more prompts until ``prompts_per_step``
    informative groups or ``zero_variance_max_batches`` draws); ``reshape`` (RL-ZVP: all-correct
    groups get +α·entropy per token, all-wrong ones -α·(max entropy - entropy))."""
    zero_variance_max_batches: int = ranged(4, 1)
    """most generation batches ``filter`` draws per step; short of groups, the step trains on fewer."""
    zero_variance_alpha: float = ranged(0.1, 0, finite=True)
    """α of ``reshape``'s entropy-shaped advantages."""
    adaptive_group: bool = False
    """grow the group size N (x2) while the smoothed zero-variance rate is above 0.3 and shrink it
    (never below ``group_size``) below 0.1 (CompassMax §2.4.1, rollout stage)."""
    adaptive_group_max: int = ranged(32, 2)
    """largest N ``adaptive_group`` may reach."""

    # --- rollout schedule
    rollout: str = one_of("sync", ("sync", "c3po"))
    """``sync`` (every step generates whole groups under the current weights) or ``c3po``
    (C3PO++, Ring-1T §2.3.3 Algorithm 1: generate until ``c3po_token_budget`` completed tokens,
    train on the groups that finished, carry the unfinished rollouts to the next policy)."""
    c3po_token_budget: int = ranged(256, 1)
    """Φ: completed tokens per C3PO++ iteration."""
    c3po_retention: int = ranged(2, 1)
    """σ: iterations an unfinished rollout may be carried over before it is purged."""
    c3po_chunk_tokens: int = ranged(8, 1)
    """tokens per engine call between budget checks (1 = Algorithm 1's per-token check)."""
    c3po_pool_capacity: int = ranged(0, 0, why="0 = one synchronous step's rollouts, prompts_per_step * group_size")
    """Ω: rollouts generated in parallel; 0 = one synchronous step's, prompts_per_step * group_size."""

    # --- tool use (rStar2-Agent §2.2)
    downsample: str = one_of("none", ("none", "roc"))
    """``none``, or ``roc`` (GRPO-RoC, rStar2-Agent §2.2.3: sample 2G rollouts per prompt, keep G:
    correct ones favouring few tool errors and clean answers, wrong ones uniformly)."""
    roc_mode: str = one_of("sample", ("sample", "lowest"))
    """``sample`` (the paper: positives drawn with weight 1/(penalty + 0.01)) or ``lowest``
    (the lowest-penalty positives; rStar's released code)."""
    tool_max_turns: int = ranged(3, 1)
    """model turns per tool trajectory (each may end in one ``<tool_call>``)."""
    tool_timeout_s: float = ranged(5.0, 0, MAX_TIMEOUT_S, low_open=True,
                                   why="the sandbox's limit for one tool call; longer is a stuck rollout")
    """wall-clock limit of one sandboxed tool call."""

    # --- mismatch handling
    old_logprobs: str = one_of("recompute", ("recompute", "bypass"))
    """``recompute`` (trainer forward gives pi_old) or ``bypass`` (the rollout logprobs are
    pi_old, Ring-linear §5.2.2 eq. 5: right once the engines are aligned)."""
    correction: str = one_of("icepop", corrections.CORRECTIONS)
    """none / tis / mis / icepop (Ring-1T §2.3.2), or any name registered with
    ``minirl.algorithms.corrections.register_correction`` (docs/rl.md, "Adding a correction")."""
    correction_level: str = one_of("token", corrections.LEVELS)
    """token / sequence (/ geometric for mis)."""
    icepop_alpha: float = ranged(0.5, 0, finite=True)
    icepop_beta: float = ranged(5.0, 0, low_open=True)
    """IcePop band (Ring-1T §2.3.4: alpha = 0.5, beta = 5)."""
    tis_cap: float = ranged(2.0, 0, low_open=True)
    """TIS truncation C (Yao et al. 2025 recommend 2)."""
    mis_low: float = ranged(0.5, 0, finite=True)
    mis_high: float = ranged(2.0, 0, low_open=True)
    router_replay: str = one_of("none", ("none", "r2", "r3"))
    """none / r2 (replay the trainer's own old-pass routing) / r3 (replay the rollout engine's
    routing; CompassMax §2.4.4: ~10x smaller logprob gap)."""

    # --- optimisation
    lr: float = ranged(2e-4, 0, low_open=True, finite=True)
    weight_decay: float = ranged(0.0, 0, finite=True)
    betas: tuple[float, float] = ranged((0.9, 0.999), 0, 1, high_open=True,
                                        why="AdamW's two decay rates, each in [0, 1)")
    """AdamW betas (Ring-1T §2.3.4 uses 0.9, 0.999)."""
    grad_clip: float = ranged(1.0, 0, low_open=True, finite=True,
                              why="the gradient norm is clipped to it; NaN would make every weight NaN and a "
                                  "negative value reverses every update")
    minibatches: int = ranged(2, 1)
    """optimizer steps per RL step (the batch is split in this many minibatches)."""
    epochs: int = ranged(1, 1, 1000,
                         why="passes over each step's batch; past a few the policy only overfits that batch")

    # --- trainer compute (each changes float reduction order only; off = the reference path)
    micro_batch_size: int = ranged(0, 0, why="0 = each minibatch in one forward and backward")
    """rows per trainer forward and backward inside a minibatch (gradient accumulation, verl's
    ``ppo_micro_batch_size``): peak memory follows it, not the group. The loss is normalised as one
    batch (the minibatch's token or sequence count, every ``agg`` mode), so the update is the
    unsplit one up to float rounding; 0 = the whole minibatch at once. Not with ``loss: espo``."""
    trainer_dtype: str = one_of("float32", ("float32", "bfloat16", "float16"))
    """what the trainer computes in. ``bfloat16`` is mixed precision as verl's FSDP MixedPrecision
    (param_dtype bf16): a bf16 copy of the weights, loaded as ``mlab check --train hf:bfloat16``
    loads the model, runs the forward and backward (every matmul and activation bf16; the lm_head
    GEMM in bf16, its log-softmax and the loss in fp32); fp32 master weights and AdamW state take the
    update, gradients accumulate in fp32. ``float16``: the same with an fp16 copy and dynamic loss
    scaling (``minirl/training/loss_scale.py``: an overflowing step is skipped and the scale halves;
    Qi et al. 2025 propose fp16 to remove most of the mismatch). Not the default: it changes the
    numbers (docs/rl.md)."""
    trainer_attention: str = one_of("auto", ("auto", "sdpa", "eager"))
    """the trainer's attention kernel, named as transformers names it (``mlab check --train
    hf:DTYPE,attn=...`` runs the same one). ``auto``: ``sdpa`` where the model's transformers class
    supports it, ``eager`` where transformers refuses sdpa (Gemma 2, gpt-oss); the run's saved
    config names the kernel it resolved to. ``sdpa``: transformers' default. ``eager``: two GEMMs
    around an fp32 softmax, the same math in another rounding order; on a CPU at RL lengths its
    bf16 forward + backward takes a third of ``sdpa``'s (whose CPU flash backward is slow on short
    rows: docs/measurements/2026-12-02-bf16-step-speed.md). Part of the trainer's numerics: a
    resume refuses to change it."""
    trainer_forward: str = one_of("batched", ("batched", "per_token"))
    """how the trainer's forward is shaped. ``batched``: the sequences right-padded into one forward
    (or packed, ``shared_prefix``), the lm_head and log-softmax through the fused chunked kernel.
    ``per_token``: each completion token from its own forward of its prefix, the head on that last
    row, ``log_softmax`` in fp32 (``trainer_forward.forward_per_token``): the shapes an engine with
    ``decode=recompute`` and ``batch_invariant`` computes, so with ``engine:
    minirl:hf_exact,dtype=bfloat16,decode=recompute``, ``trainer_dtype: bfloat16`` and ``trainer_attention:
    eager`` the recomputed log-probs equal the engine's bit for bit (slime's true on-policy, on CPU;
    docs/rl.md). One forward and backward per completion token, on torch's own bf16 kernels (never the
    AVX2 emulation, as the ``hf_exact`` engine): for the tiny models and short completions. Shown exact
    on Qwen3, Qwen3-MoE, Mixtral, Llama, Gemma 3 and BailingHybrid (docs/rl.md). Not with
    ``shared_prefix`` or router replay; the KL reference stays batched."""
    shared_prefix: bool = False
    """trainer forwards pack each prompt once with its completions (block mask) instead of
    repeating it in every padded row: ~``group_size`` x fewer prompt tokens; same logprobs up to
    float reduction order (docs/measurements/2026-11-26-real-model-step.md). Not with router_replay."""

    # --- run mode (AsyncFlow §4)
    mode: str = one_of("sync", ("sync", "async", "ray"))
    """``sync`` (this process, lockstep), ``async`` (a producer thread generates up to
    ``max_staleness`` steps ahead, §4.2.2) or ``ray`` (rollout, reward and trainer as Ray actors)."""
    max_staleness: int = ranged(1, 0, why="0 = synchronous, 1 = AsyncFlow's one-step-off update")
    """most updates a trained token may lag the learner in ``async``/``ray`` (AsyncFlow §4.2.1:
    one step costs no convergence); ``sync`` is always 0."""
    reward_timeout_s: float = ranged(30.0, 0, low_open=True)
    """``async``/``ray``: a verifier call slower than this gives reward 0 and is counted."""
    sample_timeout_s: float = ranged(600.0, 0, low_open=True)
    """``async``/``ray``: a sample not complete this long after admission is dropped and reported."""
    queue_capacity: int = ranged(1024, 1)
    """``async``/``ray``: samples (prompt groups) in flight at once (backpressure)."""
    ray_address: str | None = None
    """``ray``: None starts a local cluster of ``ray_num_cpus``; else ``host:port`` of a running one."""
    ray_num_cpus: int = ranged(2, 1)
    rollout_actors: int = ranged(1, 1)
    """``ray``: rollout engine actors."""
    cpus_per_actor: float = ranged(1.0, 0, low_open=True, finite=True)
    """``ray``: CPUs each rollout actor and the trainer actor reserve (more than the cluster has
    is an error at start)."""
    connect_timeout_s: float = ranged(20.0, 0, low_open=True)
    """``ray``: how long ``ray_address`` may take to answer."""
    dispatch: str = one_of("fifo", ("fifo", "longest_first"))
    """``ray``: order of a step's prompts to idle rollout actors, ``fifo`` or ``longest_first``
    (predicted from a short draft, CompassMax §3.1.1; greedy LPT, within 4/3 of the best makespan)."""
    draft_tokens: int = ranged(16, 1)
    """``ray``: tokens of the ``longest_first`` draft."""
    setup_modules: list[str] = field(default_factory=list)
    """modules imported before the config is checked, in this process and every Ray worker (e.g. one
    that ``minirl.tasks.register``s a task)."""

    # --- run control
    device: str = "auto"
    """where the trainer runs: ``auto`` = CUDA when present (the fused logprob kernel is Triton
    there), else CPU; or ``cpu`` / ``cuda`` / ``cuda:N``. The minirl rollout engine runs there too (one
    card holds both; the weight sync is a device-to-device copy, ``time_sync``); vLLM keeps its own."""
    steps: int = ranged(10, 1)
    eval_every: int = ranged(5, 0, why="0 = never evaluate")
    """held-out greedy accuracy (exactly correct, ``minirl.tasks.is_correct``) and mean reward, before
    step 0's update, every N steps, and on the final policy after the last update; 0 = never."""
    checkpoint_every: int = ranged(5, 0, why="0 = never write a checkpoint (the run cannot be resumed)")
    """write ``<out_dir>/checkpoint`` every N steps and after the last one, so ``--resume`` can
    continue; 0 = never (the run cannot be resumed)."""
    max_nan_steps: int = ranged(3, 1)
    """stop after this many consecutive steps with a non-finite loss (each one is skipped)."""
    out_dir: str = non_empty("runs/minirl", "'' would write the run's files into the current directory",
                             "a directory path")
    """the run directory: metrics.nc, config.yaml, checkpoint/, curves.png and a manifest of them,
    locked while a run is in it (docs/runs.md). A run there is continued with ``--resume``; ``mlab
    train`` replaces its files only with ``--overwrite`` (``minirl.train(..., resume=False)`` replaces
    them); files it did not write are never touched."""
    progress: bool = True
    """tqdm progress bars (training, SFT warm-up)."""
    report_to: str = one_of("none", ("none", "tensorboard"))
    """``none`` or ``tensorboard``: also write every metric as a TensorBoard scalar, offline, to
    ``<out_dir>/tensorboard`` (``tensorboard --logdir <out_dir>``)."""
    record_rollouts: bool = False
    """write every step's rollouts as audit records (docs/audit.md), one JSON Lines file per step,
    ``<out_dir>/rollouts/step-000003.jsonl``, written whole (a killed run leaves no half file): token ids,
    the engine's raw logprob of each sampled token, the sampling settings, routed experts (MoE); audit one
    with ``mlab audit FILE --model CHECKPOINT`` (the weights that step was sampled with)."""

    # --- mismatch monitor (issue 40)
    monitor_every: int = ranged(0, 0, why="0 = off")
    """read the trainer against the rollout engine on a fixed held-out probe at every step divisible
    by N (step 0 and the final policy included), after the weight sync; per-site error, first
    divergence and routing flips go to ``metrics.nc`` (docs/runs.md). Needs aligntools; 0 = off."""
    monitor_sites: str = non_empty(monitor.DEFAULT_SITES, "the monitor would watch nothing",
                                   f"glob patterns of sites, e.g. '{monitor.DEFAULT_SITES}' (the default)", ",")
    """the sites the monitor compares (glob patterns, docs/sites.md); patterns the model lacks are skipped."""
    monitor_tokens: int = ranged(64, 2, 4096, why="the probe is one sequence of this many held-out tokens, "
                                                 "run on both sides at every reading")
    """probe size in tokens (held-out problems and their answers, one sequence)."""
    monitor_mode: str = one_of("stats", ("stats", "tensor"))
    """how the monitor captures the probe: ``stats`` keeps per-token summaries (errors are lower
    bounds, ~10x under on a deep residual stream), ``tensor`` keeps the tensors (exact errors; 64
    tokens of a 135M model are ~13 MB a side). docs/runs.md."""

    def __post_init__(self) -> None:
        import_setup_modules(self.setup_modules)  # first: they may register the task checked next
        config_check.check(self)  # types from the annotations, what each field declares, task options
        for table in (corrections.CORRECTIONS, losses.POLICY_LOSSES, advantages.ADVANTAGES):
            table.check_fields(getattr(self, table.kind), self)  # a setup module's entry may read a typo
        check_engine(self)
        monitor.check(self)
        if self.device not in ("auto", "cpu", "cuda") and not (
                self.device.startswith("cuda:") and self.device[5:].isdigit()):
            raise ValueError(f"device={self.device!r}; valid: auto, cpu, cuda, cuda:N")
        if not 0 <= self.icepop_alpha < self.icepop_beta:
            raise ValueError(f"icepop_alpha={self.icepop_alpha} must be >= 0 and < icepop_beta="
                             f"{self.icepop_beta} (Ring-1T §2.3.4 uses 0.5 and 5)")
        if not 0 <= self.mis_low < self.mis_high:
            raise ValueError(f"mis_low={self.mis_low} must be >= 0 and < mis_high={self.mis_high}")
        if self.prompts_per_step * self.group_size > MAX_SAMPLES_PER_STEP:
            raise ValueError(f"prompts_per_step * group_size = {self.prompts_per_step * self.group_size}: one step's "
                             f"rollouts, generated and held as one batch, must be <= "
                             f"{MAX_SAMPLES_PER_STEP}; lower prompts_per_step or group_size")
        if (self.prompts_per_step * self.group_size) % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} must divide prompts_per_step * group_size = "
                             f"{self.prompts_per_step * self.group_size}")
        if self.micro_batch_size and self.loss == "espo":
            raise ValueError(f"micro_batch_size={self.micro_batch_size} with loss: espo: ESPO averages over entropy "
                             f"groups of the whole minibatch, which micro-batches would split; set micro_batch_size: "
                             f"0, or use loss: ppo or gspo")
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
    to ``config_check`` to report; whatever an import does is named by ``import_extension``."""
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        return
    for name in modules:
        import_extension(name, "setup_modules")


def check_engine(config: TrainConfig) -> None:
    """Refuse an engine the trainer cannot build, before any warm-up or model load: an unknown
    kind (naming the valid ones), a bad preset or option, a spec dtype that ``engine_dtype``
    contradicts (``minirl.engines.resolve``). A plugin's spec is the plugin's to read."""
    from minirl.engines import resolve

    try:
        resolve(config.engine, config.engine_dtype, rollouts=True)
    except ValueError as e:
        raise ValueError(f"engine: {e}") from None
