"""SFT warm-up: a zoo model briefly fine-tuned on task-format traces, so RL starts from a
policy that sometimes succeeds (GRPO learns nothing from groups that are all wrong).

Cached next to the base checkpoint (for a zoo model: beside the zoo cache), keyed by a
fingerprint of everything the result depends on, written to a temporary sibling and renamed
into place, so an interrupted warm-up never leaves a half-written checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock
from tqdm.auto import tqdm

from minirl import tasks

SFT_FORMAT = 1  # bump when the recipe below changes


def warm_start(base: str | os.PathLike, task: str, task_kwargs: dict | None = None, steps: int = 300,
               seed: int = 0, lr: float = 2e-3, batch: int = 32, out: str | os.PathLike | None = None,
               progress: bool = True) -> Path:
    """Return a checkpoint of ``base`` after ``steps`` AdamW steps of next-token loss on the
    answers of ``task`` (prompt tokens are not trained on). ``base`` is a checkpoint directory;
    the result (default: ``<base>-sft-<task>-<fingerprint>`` beside it) is reused when its
    fingerprint matches. ``steps=0`` returns ``base``."""
    import transformers

    base = Path(base)
    if steps == 0:
        return base
    task_kwargs = dict(task_kwargs or {})
    weights = hashlib.sha256()
    for f in sorted(base.glob("*.safetensors")):
        weights.update(f.read_bytes())
    chat = uses_chat(transformers.AutoTokenizer.from_pretrained(base))
    parts = [SFT_FORMAT, weights.hexdigest(), task, task_kwargs, steps, seed, lr, batch] + (["chat"] if chat else [])
    key = json.dumps(parts, sort_keys=True)  # "chat" only when used: base models keep their cached warm-ups
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = Path(out) if out is not None else base.parent / f"{base.name}-sft-{task}-{fingerprint}"
    if (target / "sft.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.parent / f".{target.name}.lock"):  # a second caller waits for the first's result
        if (target / "sft.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            loss = _train(base, tmp, tasks.get(task, **task_kwargs), steps, seed, lr, batch, progress)
            (tmp / "sft.json").write_text(json.dumps({"base": str(base), "task": task, "task_kwargs": task_kwargs,
                                                      "steps": steps, "seed": seed, "final_loss": loss}, indent=2))
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def encode(tokenizer, prompt: str, completion: str | None = None, chat: bool | None = None
           ) -> tuple[list[int], list[int]]:
    """Token ids of a prompt and of a completion (text + ``eos``), tokenised separately: exactly
    the split a rollout has (prompt ids, then generated ids).

    ``chat``: send the prompt as one user turn of the tokenizer's chat template, ending with the
    assistant header, because an instruct model answers in the format it was tuned on (SmolLM2
    prompted with a raw ``Q: 59+63= A:`` answers "100" to every problem); its completion then
    starts the assistant turn and ends with the ``eos`` that closes it. Otherwise the prompt is
    ``bos`` + text and the completion starts with a space, the zoo models' pre-training format.
    ``None`` (the callers' default): chat exactly when the tokenizer has a chat template (the
    zoo's tiny models have none)."""
    chat = uses_chat(tokenizer) if chat is None else chat
    if chat:
        if not uses_chat(tokenizer):
            raise ValueError(f"chat=True but tokenizer {type(tokenizer).__name__} has no chat_template; "
                             f"pass chat=False (or None) for a base model")
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
        prompt_ids = bos + tokenizer(prompt)["input_ids"]
    if completion is None:
        return prompt_ids, []
    completion_ids = (tokenizer(completion, add_special_tokens=False) if chat else tokenizer(" " + completion))
    return prompt_ids, completion_ids["input_ids"] + [tokenizer.eos_token_id]


def uses_chat(tokenizer) -> bool:
    """Whether ``encode`` wraps prompts in ``tokenizer``'s chat template by default."""
    return bool(getattr(tokenizer, "chat_template", None))


def _train(base: Path, out: Path, task, steps: int, seed: int, lr: float, batch: int, progress: bool) -> float:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    rng = random.Random(seed + 7919)  # its own stream (repeats allowed), not the RL split's
    problems = [task.sample(rng) for _ in range(steps * batch)]
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for step in tqdm(range(steps), desc=f"SFT warm-up ({task.name})", unit="step", disable=not progress):
        ids, labels = _batch(tokenizer, problems[step * batch:(step + 1) * batch])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return float(loss.detach())


def _batch(tokenizer, problems: list[tasks.Problem]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, L] and labels [B, L] (-100 on prompt and padding)."""
    pairs = [encode(tokenizer, p.prompt, p.answer) for p in problems]
    length = max(len(a) + len(b) for a, b in pairs)
    ids = torch.full((len(pairs), length), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for i, (a, b) in enumerate(pairs):
        ids[i, : len(a) + len(b)] = torch.tensor(a + b)
        labels[i, len(a): len(a) + len(b)] = torch.tensor(b)
    return ids, labels
