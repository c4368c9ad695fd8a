"""What one run measures and at which sizes: the card's realistic shapes, or the dry run's tiny ones.

Why one object: the dry run must execute exactly the code the GPU run executes, so every size,
dtype and model choice lives here and nowhere in the stages. The plan travels to the worker
process as JSON (``to_json`` / ``from_json``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

#: Qwen's vocabulary: the size at which the fused logprob kernel's memory saving matters.
QWEN_VOCAB = 151_936


@dataclass(frozen=True)
class Plan:
    dry: bool
    device: str  # "cuda" on the card, "cpu" in the dry run
    repeats: int  # timed calls per measurement (median)
    copy_mib: int  # size of the copy that sets the bandwidth yardstick
    compile_backend: str  # torch.compile backend of the compiled baseline
    budget_scale: float  # stage budgets (set for the card) times this; the interpreter is slow
    # kernels: op -> shape parameters (see kernel_stages.kernel_cases and logprob_anchors)
    rmsnorm: dict = field(default_factory=dict)  # rows, width, bandwidth_rows (bf16 bandwidth goal only)
    rope: dict = field(default_factory=dict)  # tokens, heads, head_dim
    router: dict = field(default_factory=dict)  # tokens, experts (list), k
    logprobs: dict = field(default_factory=dict)  # tokens, hidden, vocab, anchor_shapes ([tokens, hidden, dtype])
    logprob_memory: dict = field(default_factory=dict)  # n, hidden, vocab, dtype
    # models
    zoo_models: tuple[str, ...] = ()  # built by the prepare stage, reused by the later ones
    engine_models: tuple[str, ...] = ()
    decode: dict = field(default_factory=dict)  # model, batches, prompt_len, new_tokens, repeats (best of), goal
    gpu_rl: dict = field(default_factory=dict)  # model, task, task_kwargs, sft_steps, config, arms, window
    tracker: dict = field(default_factory=dict)  # hidden, layers, vocab, seq, batch

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def from_json(cls, path: Path) -> "Plan":
        values = json.loads(Path(path).read_text())
        return cls(**{**values, "zoo_models": tuple(values["zoo_models"]),
                      "engine_models": tuple(values["engine_models"])})


#: The two arms of the ``gpu_rl`` stage: what each changes in the shared config.
_ARMS = {"grpo": {"correction": "none", "router_replay": "none"},
         "grpo+icepop+r3": {"correction": "icepop", "router_replay": "r3"}}


def _rl(model: str, steps: int, seconds: float, window: int, **config: object) -> dict:
    """The ``gpu_rl`` stage's spec: 1-digit arithmetic from a 100-step SFT warm-up (so rewards vary
    within a group at temperature 1), bf16 minirl rollouts, fp32 trainer, ``device: auto``; the
    arms stop at ``steps`` or after ``seconds``, whichever comes first; the verdict compares their
    last ``window`` steps."""
    shared = dict(sft_steps=0, n_train=64, n_eval=4, engine="minirl:typical", engine_dtype="bfloat16",
                  temperature=1.0, eval_every=0, checkpoint_every=0, device="auto", progress=False, seed=0)
    task = dict(task="arithmetic", task_kwargs={"digits": 1})
    return dict(model=model, **task, sft_steps=100, arms=_ARMS, seconds=seconds, window=window,
                config={**shared, **task, "steps": steps, **config})


def gpu_plan() -> Plan:
    """The card: the shapes the issue names (RMSNorm 4096 wide, 128-dim RoPE heads, top-8 of
    64/128 experts, V = 151,936), greedy decode of 128 new tokens at batch 1, 32 and 256, two RL arms of
    100 steps each on the 16-layer, 64-expert tiny MoE."""
    return Plan(dry=False, device="cuda", repeats=20, copy_mib=1024, compile_backend="inductor", budget_scale=1.0,
                rmsnorm=dict(rows=4096, width=4096, bandwidth_rows=[16384]),
                rope=dict(tokens=4096, heads=32, head_dim=128),
                router=dict(tokens=8192, experts=[64, 128], k=8),
                logprobs=dict(tokens=2048, hidden=2048, vocab=QWEN_VOCAB,
                              anchor_shapes=[[2048, 2048, "bfloat16"], [8192, 1024, "bfloat16"],
                                             [2048, 2048, "float32"]]),
                logprob_memory=dict(n=4096, hidden=1024, vocab=QWEN_VOCAB, dtype="bfloat16"),
                zoo_models=("tiny-qwen3-moe", "smollm2-135m"),
                engine_models=("tiny-qwen3-moe", "smollm2-135m"),
                decode=dict(model="tiny-qwen3-moe", batches=[1, 32, 256], prompt_len=32, new_tokens=128, repeats=2,
                            goal=1.5),
                gpu_rl=_rl("tiny-moe-deep", steps=100, seconds=120, window=20, prompts_per_step=8, group_size=8,
                           max_new_tokens=6),
                tracker=dict(hidden=1024, layers=4, vocab=8192, seq=256, batch=2))


def dry_plan() -> Plan:
    """The CPU stand-in: every stage at sizes the Triton interpreter and 2 busy cores finish in
    seconds. torch.compile uses ``aot_eager`` (Dynamo tracing + AOT autograd, no C++ codegen):
    what inductor then generates on the card is a GPU matter."""
    return Plan(dry=True, device="cpu", repeats=1, copy_mib=4, compile_backend="aot_eager", budget_scale=4.0,
                rmsnorm=dict(rows=4, width=64, bandwidth_rows=[8]), rope=dict(tokens=4, heads=2, head_dim=16),
                router=dict(tokens=4, experts=[16], k=4),
                logprobs=dict(tokens=8, hidden=32, vocab=256, anchor_shapes=[[8, 32, "bfloat16"], [8, 32, "float32"]]),
                logprob_memory=dict(n=64, hidden=16, vocab=4096, dtype="float32"),
                zoo_models=("tiny-qwen3-moe",), engine_models=("tiny-qwen3-moe",),
                decode=dict(model="tiny-qwen3-moe", batches=[1, 2], prompt_len=4, new_tokens=4, repeats=1, goal=1.5),
                gpu_rl=_rl("tiny-qwen3-moe", steps=2, seconds=300, window=2, prompts_per_step=2, group_size=4,
                           max_new_tokens=4),
                tracker=dict(hidden=64, layers=1, vocab=256, seq=8, batch=1))
