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
    # kernels: op -> shape parameters (see kernel_stages.inputs)
    rmsnorm: dict = field(default_factory=dict)  # rows, width
    rope: dict = field(default_factory=dict)  # tokens, heads, head_dim
    router: dict = field(default_factory=dict)  # tokens, experts (list), k
    logprobs: dict = field(default_factory=dict)  # tokens, hidden, vocab
    logprob_memory: dict = field(default_factory=dict)  # n, hidden, vocab, dtype
    # models
    zoo_models: tuple[str, ...] = ()  # built by the prepare stage, reused by the later ones
    engine_models: tuple[str, ...] = ()
    decode: dict = field(default_factory=dict)  # batch, prompt_len, new_tokens, repeats (best of)
    trainer: dict = field(default_factory=dict)  # TrainConfig overrides
    tracker: dict = field(default_factory=dict)  # hidden, layers, vocab, seq, batch

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def from_json(cls, path: Path) -> "Plan":
        values = json.loads(Path(path).read_text())
        return cls(**{**values, "zoo_models": tuple(values["zoo_models"]),
                      "engine_models": tuple(values["engine_models"])})


_TRAINER = dict(model="tiny-qwen3-moe", sft_steps=0, task="arithmetic", task_kwargs={"digits": 1}, n_train=8, n_eval=4,
                prompts_per_step=2, group_size=4, steps=3, eval_every=0, checkpoint_every=0,
                correction="icepop", router_replay="r3", device="auto", progress=False)


def gpu_plan() -> Plan:
    """The card: the shapes the issue names (RMSNorm 4096 wide, 128-dim RoPE heads, top-8 of
    64/128 experts, V = 151,936), decode at batch 32 x 128 new tokens."""
    return Plan(dry=False, device="cuda", repeats=20, copy_mib=1024, compile_backend="inductor", budget_scale=1.0,
                rmsnorm=dict(rows=4096, width=4096), rope=dict(tokens=4096, heads=32, head_dim=128),
                router=dict(tokens=8192, experts=[64, 128], k=8),
                logprobs=dict(tokens=2048, hidden=2048, vocab=QWEN_VOCAB),
                logprob_memory=dict(n=4096, hidden=1024, vocab=QWEN_VOCAB, dtype="bfloat16"),
                zoo_models=("tiny-qwen3-moe", "smollm2-135m"),
                engine_models=("tiny-qwen3-moe", "smollm2-135m"),
                decode=dict(batch=32, prompt_len=32, new_tokens=128, repeats=3),
                trainer={**_TRAINER, "max_new_tokens": 8},
                tracker=dict(hidden=1024, layers=4, vocab=8192, seq=256, batch=2))


def dry_plan() -> Plan:
    """The CPU stand-in: every stage at sizes the Triton interpreter and 2 busy cores finish in
    seconds. torch.compile uses ``aot_eager`` (Dynamo tracing + AOT autograd, no C++ codegen):
    what inductor then generates on the card is a GPU matter."""
    return Plan(dry=True, device="cpu", repeats=1, copy_mib=4, compile_backend="aot_eager", budget_scale=4.0,
                rmsnorm=dict(rows=4, width=64), rope=dict(tokens=4, heads=2, head_dim=16),
                router=dict(tokens=4, experts=[16], k=4),
                logprobs=dict(tokens=8, hidden=32, vocab=256),
                logprob_memory=dict(n=64, hidden=16, vocab=4096, dtype="float32"),
                zoo_models=("tiny-qwen3-moe",), engine_models=("tiny-qwen3-moe",),
                decode=dict(batch=2, prompt_len=4, new_tokens=4, repeats=1),
                trainer={**_TRAINER, "steps": 1, "max_new_tokens": 2, "prompts_per_step": 1, "group_size": 2,
                         "minibatches": 1},
                tracker=dict(hidden=64, layers=1, vocab=256, seq=8, batch=1))
