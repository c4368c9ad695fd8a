"""The real-model RL pieces: the chat_arithmetic task and chat-template prompts in ``sft.encode``."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from minirl import tasks
from minirl.training.sft import encode
from minirl.tasks.chat_arithmetic import last_integer

TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def test_chat_arithmetic_verifier_reads_the_last_integer():
    p = tasks.Problem("What is 37 + 45? Answer with just the number.", "82", {"value": 82})
    task = tasks.get("chat_arithmetic")
    assert task.verify(p, "82")
    assert task.verify(p, "37 + 45 = 82.")
    assert task.verify(p, "The sum of 37 and 45 is 82")
    assert not task.verify(p, "82? No: 37 + 45 = 81")  # the last number is the answer
    assert not task.verify(p, "eighty-two")
    assert not task.verify(p, "")
    assert task.verify(tasks.Problem("What is 999 + 83?", "1082", {"value": 1082}), "It is 1,082.")
    assert last_integer("from -3 to -12") == -12
    assert last_integer("none here") is None


def test_chat_arithmetic_problems_have_the_operand_sizes_and_correct_answers():
    task = tasks.get("chat_arithmetic", digits=2, second_digits=1)
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(200)]
    assert problems == [task.sample(r) for r in [random.Random(0)] for _ in range(200)]
    ops = set()
    for p in problems:  # recompute each answer from the prompt text alone
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\? Answer with just the number\.", p.prompt).groups()
        assert 10 <= int(a) <= 99 and 0 <= int(b) <= 9
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert value >= 0 and p.meta["value"] == value and p.answer == str(value)
        assert task.verify(p, p.answer)
        ops.add(op)
    assert ops == {"+", "-"}
    train, held_out = tasks.splits(task, 200, 64, seed=0)
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}


def test_chat_arithmetic_refuses_bad_digits():
    with pytest.raises(ValueError, match=r"digits=0.*\[1, 9\]"):
        tasks.get("chat_arithmetic", digits=0)
    with pytest.raises(ValueError, match=r"second_digits=True"):
        tasks.get("chat_arithmetic", second_digits=True)


def test_min_words_asks_for_an_explanation_and_scores_a_shorter_answer_0():
    task = tasks.get("chat_arithmetic", digits=1, second_digits=1, min_words=10)
    p = task.sample(random.Random(0))
    assert p.prompt.endswith("? Explain your answer in at least 10 words, then give the number.")
    value = p.meta["value"]
    assert not task.verify(p, f"{value}")  # right, but 1 word
    assert not task.verify(p, f"The answer is {value}, since counting on gives {value}.")  # 9 words
    assert task.verify(p, f"The answer is {value}, since counting on from one gives {value}.")  # 10 words
    assert not task.verify(p, f"Counting on from the first number, one at a time, gives {value + 1}.")  # long, wrong
    plain = tasks.get("chat_arithmetic", digits=1, second_digits=1)
    assert plain.sample(random.Random(0)).prompt.endswith("? Answer with just the number.") and plain.verify(p, str(value))
    for bad in (-1, 2.5, True, 201):
        with pytest.raises(ValueError, match=rf"min_words={bad!r}: must be an int in \[0, 200\]"):
            tasks.get("chat_arithmetic", min_words=bad)


@pytest.fixture
def tokenizer(zoo):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(zoo("tiny-llama"))


def test_encode_without_chat_template_is_bos_plus_text(tokenizer):
    prompt, completion = encode(tokenizer, "Q: 3+4= A:", "7")
    assert prompt == [tokenizer.bos_token_id] + tokenizer("Q: 3+4= A:")["input_ids"]
    assert completion == tokenizer(" 7")["input_ids"] + [tokenizer.eos_token_id]
    with pytest.raises(ValueError, match="chat=True.*no chat_template"):
        encode(tokenizer, "Q: 3+4= A:", chat=True)


def test_encode_wraps_prompt_in_the_chat_template(tokenizer):
    tokenizer.chat_template = TEMPLATE
    prompt, completion = encode(tokenizer, "What is 3 + 4?", "7")
    assert tokenizer.decode(prompt) == "<|bos|>user: What is 3 + 4?\nassistant:"
    assert completion[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(completion[:-1]) == "7"  # the assistant turn starts at once, no space
    assert encode(tokenizer, "What is 3 + 4?", chat=False)[0][0] == tokenizer.bos_token_id
    assert encode(tokenizer, "What is 3 + 4?", chat=False)[0] != prompt


def test_real_model_config_is_grpo_icepop_with_vllm_and_runs_at_tiny_size(zoo, tmp_path):
    """configs/real_model_rl.yaml says what the measurements doc measured, and its keys train:
    on the tiny zoo Qwen3 (no chat template) with the minirl engine, so the test needs no vLLM."""
    import yaml

    import minirl

    values = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "real_model_rl.yaml").read_text())
    assert (values["engine"], values["engine_dtype"], values["correction"], values["task"]) == (
        "vllm", "bfloat16", "icepop", "chat_arithmetic")
    assert (values["prompts_per_step"], values["group_size"], values["max_new_tokens"], values["sft_steps"]) == (
        4, 8, 32, 0)  # the measured learning run's size (docs/measurements/2026-11-26-real-model-rl.md, section 5)
    values.update(model=str(zoo("tiny-qwen3")), engine="minirl:typical", n_train=8, n_eval=4, prompts_per_step=2,
                  group_size=4, max_new_tokens=4, steps=2, minibatches=1, eval_every=1, checkpoint_every=0,
                  out_dir=str(tmp_path / "run"), progress=False)
    rows = minirl.train(values).rows
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 2: the final policy's evaluation, a row of its own
    assert all(0 <= r["eval_accuracy"] <= 1 for r in rows)
    # IcePop's metric wherever a group was trained (zero_variance: filter trains none on a step whose groups
    # were all rewarded alike, which is every step of the untrained tiny model)
    assert all("frac_masked" in r or r.get("trained_groups") == 0 for r in rows[:2]) and "reward" not in rows[2]
