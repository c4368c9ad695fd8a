"""Wall time per RL step and peak update memory: minirl's trainer vs TRL's ``GRPOTrainer``.

    .venv/bin/pip install -c requirements.txt -r requirements-bench.txt   # trl and what it adds
    MLAB_ZOO_DIR=.zoo .venv/bin/python benchmarks/bench_trl.py [--steps 10] [--threads N]
        [--task longtail_sorting --max-new-tokens 32]   # longer completions: generation matters
        [--model smollm2-135m --engines bf16,trl --memory-repeats 1]   # the real model, fewer blocks
        [--model smollm2-135m --engines bf16,bf16t,trl16]   # fp32 vs bf16 trainer vs TRL bf16=True

Why: minirl claims to be a *fast* small RL engine; the honest check is a mainstream trainer doing
the same work in the same run on the same box. Both get the SFT-warmed zoo Qwen3-MoE, the same
1-digit arithmetic prompts (same token ids: TRL sees as raw text exactly what minirl's ``encode``
tokenises, ``bos + prompt`` or the chat template's text), minirl's verifier as reward, 8 prompts
(``--prompts``; configs/real_model_rl.yaml takes 4) x 8 samples, <= 8 new tokens (options).
``--model smollm2-135m`` (the real instruct model) runs the issue's step instead: ``chat_arithmetic``
(2-digit ± 1-digit) in its chat template, no SFT warm-up, <= 32 new tokens, lr 2e-5;
temperature 1, lr 1e-3 (tiny model), no KL, no MoE aux loss, 2 AdamW steps per RL step (minirl
``minibatches=2``; TRL 32 completions per optimizer step, ``steps_per_generation=2``). Training is fp32
except in the bf16 rows: minirl's ``trainer_dtype: bfloat16`` (a bf16 compute copy over fp32 masters,
docs/rl.md) and TRL's ``bf16=True`` (autocast over fp32 weights).

How: one run does blocks of ``--steps`` RL steps per engine in the order ABC CBA (minirl bf16
rollout, minirl fp32 rollout, TRL), dropping each block's first step (warm-up), so drift and bursts
of outside load hit every engine alike. A step is timed around ``Trainer.train_step`` (minirl) and
from ``on_step_begin`` of an RL step's first optimizer step to ``on_step_end`` of its second (TRL).
Peak memory: one update (old logprobs + 2 AdamW steps) on the same 64 sequences in a fresh
subprocess (median of 3): Linux peak RSS (VmHWM, reset via /proc/self/clear_refs) minus RSS just
before. On a busy 2-core box (see the printed load average) use ``--threads 1``: 2 OpenMP threads
plus another process wait on each other at every op, and steps get 10-100x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from labs import zoo  # noqa: E402
from minirl import tasks  # noqa: E402
from bench_rl import REAL, reset_peak, rss_kb  # noqa: E402
from minirl.training.sft import encode, uses_chat  # noqa: E402
from minirl.training.train_config import TrainConfig  # noqa: E402
from minirl.training.trainer import Trainer, resolve_model  # noqa: E402

VARIANTS = {"minirl (bfloat16)": dict(engine_dtype="bfloat16"), "minirl (float32)": dict(engine_dtype="float32"),
            "minirl (fast)": dict(engine="minirl:typical,share_prefill=true", engine_dtype="float32",
                                  shared_prefix=True),
            "minirl bf16 trainer": dict(engine_dtype="bfloat16", trainer_dtype="bfloat16"),
            "minirl bf16 trainer (fast)": dict(engine_dtype="bfloat16", trainer_dtype="bfloat16",
                                               trainer_attention="eager", shared_prefix=True),
            "minirl fp32, vLLM": dict(engine="vllm", engine_dtype="bfloat16"),
            "minirl bf16 fast, vLLM": dict(engine="vllm", engine_dtype="bfloat16", trainer_dtype="bfloat16",
                                           trainer_attention="eager", shared_prefix=True)}
"""minirl's rows: engine dtype, ``fast`` = fp32 rollouts with each prompt prefilled once per group
plus the trainer's shared-prefix packing (docs/measurements/2026-11-26-real-model-step.md), and
``bf16t`` = ``bf16`` with the bf16 mixed-precision trainer (the others train in fp32), ``bf16tf`` = that
trainer with eager attention and shared-prefix packing; ``vllm32`` / ``vllm16`` = configs/real_model_rl.yaml's
rollouts (vLLM's CPU build, bf16) under the fp32 trainer it ships with / under ``bf16tf``'s trainer (the
others roll out on minirl's own engine)."""
TRL = "TRL GRPOTrainer"
TRL_BF16 = "TRL bf16=True"
TRLS = {TRL: False, TRL_BF16: True}
"""TRL's rows -> its ``bf16`` flag."""
ENGINES = (*VARIANTS, *TRLS)
SHORT = dict(zip(("bf16", "fp32", "fast", "bf16t", "bf16tf", "vllm32", "vllm16", "trl", "trl16"), ENGINES))
"""``--engines`` names."""
PHASES = ("time_rollout", "time_old_logprobs", "time_update", "time_sync")
REAL_LR = 2e-5
"""The real model's lr (configs/real_model_rl.yaml): at the tiny model's 1e-3, three updates taught
smollm2-135m to stop ending its answers (every minirl completion hit the 32-token cap, TRL's fresh
copy averaged 21), so the two sides generated different amounts of work per step."""
SETTINGS = dict(task="arithmetic", task_kwargs={"digits": 1}, sft_steps=100, prompts_per_step=8, group_size=8,
                max_new_tokens=8, temperature=1.0, lr=1e-3, kl_coef=0.0, minibatches=2, eval_every=0,
                checkpoint_every=0, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="RL steps per engine and block (first not timed)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--task", default="arithmetic", help="a minirl task (arithmetic uses 1 digit)")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per RL step, 8 samples each (even)")
    parser.add_argument("--model", default="tiny-qwen3-moe", help="zoo name (smollm2-135m: the issue's real step)")
    parser.add_argument("--engines", default="bf16,fp32,trl",
                        help="comma list of bf16, fp32, fast, bf16t, bf16tf, vllm32, vllm16 (minirl), trl, trl16 "
                             "(TRL fp32 / bf16=True); at least two")
    parser.add_argument("--memory-repeats", type=int, default=3,
                        help="fresh processes per peak-memory median (0: skip it)")
    parser.add_argument("--peak-memory", choices=("minirl", "trl"), help=argparse.SUPPRESS)  # child process
    parser.add_argument("--batch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prompts < 2 or args.prompts % 2:
        parser.error(f"--prompts {args.prompts}: an even number >= 2 (each RL step is 2 AdamW steps of half)")
    SETTINGS.update(task=args.task, task_kwargs={"digits": 1} if args.task == "arithmetic" else {},
                    max_new_tokens=args.max_new_tokens, prompts_per_step=args.prompts)
    if args.model == "smollm2-135m":
        SETTINGS.update(REAL, lr=REAL_LR)
    engines = tuple(SHORT.get(e.strip(), e.strip()) for e in args.engines.split(","))
    if not set(engines) <= set(ENGINES) or len(set(engines)) < 2 or not set(engines) & set(VARIANTS):
        parser.error(f"--engines {args.engines!r}: a comma list of {', '.join(SHORT)}: at least two, one of them "
                     f"minirl's")
    if args.threads:
        torch.set_num_threads(args.threads)
    base = zoo.build(args.model)
    if args.peak_memory:
        print(json.dumps(peak_update(args.peak_memory, base, args.batch)))
        return
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step of a block is warm-up and not timed)")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        rows, counts, batch = measure(base, args.steps, tmp, engines)
        torch.save(batch, f"{tmp}/batch.pt")
        print(f"[{2 * len(engines) + 1}/{2 * len(engines) + 1}] peak update memory: {args.memory_repeats} fresh "
              f"subprocesses each", file=sys.stderr)
        child = [sys.executable, __file__, "--batch", f"{tmp}/batch.pt", "--threads", str(torch.get_num_threads()),
                 "--task", args.task, "--max-new-tokens", str(args.max_new_tokens), "--model", args.model,
                 "--prompts", str(args.prompts)]
        mem = {w: statistics.median(json.loads(subprocess.run([*child, "--peak-memory", w], check=True, text=True,
                                                              capture_output=True).stdout.split()[-1])
                                    for _ in range(args.memory_repeats))
               for w in ("minirl", "trl") if args.memory_repeats and (w == "minirl" or set(engines) & set(TRLS))}
    print(f"\nRL step = {base.name}, {SETTINGS['task']}, {SETTINGS['prompts_per_step']} prompts x 8 samples, "
          f"<= {SETTINGS['max_new_tokens']} new tokens, 2 AdamW steps; CPU {cpu_name()}, "
          f"{torch.get_num_threads()} torch threads, load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f}; "
          f"median of 2 x {args.steps - 1} steps (blocks {'-'.join(e[:9] for e in engines)} and back, first step "
          f"of each dropped)")
    if counts:
        print(f"TRL completions per generation: {[n for n, _ in counts]}")
    report(rows, mem, args.memory_repeats)


def report(rows: dict[str, list[dict]], mem: dict[str, float], repeats: int = 3) -> None:
    """The table: medians, the reference row's s/step over each row's (TRL bf16=True where it ran,
    else TRL, else the first row), minirl's phase split, peak update memory."""
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("s_step", "length", *PHASES) if k in rs[0]}
           for name, rs in rows.items()}
    ref = next((n for n in (TRL_BF16, TRL) if n in med), next(iter(med)))
    print(f"{'engine':<26} {'s/step':>7} {'ref/this':>8} {'tok/compl':>9} {'rollout':>8} {'old_lp':>7} {'update':>7}"
          f" {'sync':>6} {'peak update MiB':>16}")
    for name, r in med.items():
        split = " ".join(f"{r[p]:{w}.3f}" for p, w in zip(PHASES, (8, 7, 7, 6))) if PHASES[0] in r else f"{'-':>31}"
        peak = mem.get("trl" if name in TRLS else "minirl", float("nan"))
        print(f"{name:<26} {r['s_step']:7.3f} {med[ref]['s_step'] / r['s_step']:7.2f}x {r['length']:9.2f} {split} "
              f"{peak:16.1f}")
    print(f"ref/this: {ref}'s s/step over this row's (> 1: faster). Peak update MiB: peak RSS (VmHWM) growth\n"
          f"over RSS before one update (old logprobs + 2 AdamW steps) on the same {8 * SETTINGS['prompts_per_step']} "
          "sequences (minirl's step-0\n"
          f"rollouts; TRL replays them via rollout_func), median of {repeats} fresh processes; engine dtype does not "
          f"enter it.")


def measure(base: Path, steps: int, out: str, engines: tuple[str, ...] = ENGINES
            ) -> tuple[dict[str, list[dict]], list, tuple]:
    """Blocks ABC CBA (of ``engines``, TRL last) of ``steps`` RL steps -> per engine the timed rows
    (``s_step``, ``length``, minirl's phases), TRL's (completions, mean tokens) per generation,
    the first minirl engine's step-0 batch."""
    minirl = {name: BatchKeeper(minirl_config(base, f"{out}/{name}", **VARIANTS[name]))
              for name in engines if name in VARIANTS}
    cfg = next(iter(minirl.values())).cfg
    problems = tasks.splits(tasks.get(cfg.task, **cfg.task_kwargs), cfg.n_train, cfg.n_eval, cfg.seed)[0]
    rows: dict[str, list[dict]] = {name: [] for name in engines}
    counts: list[tuple[int, float]] = []
    order = [e for e in ENGINES if e in engines]
    for i, name in enumerate(order + order[::-1]):
        print(f"[{i + 1}/{2 * len(order) + 1}] {name}: {steps} RL steps", file=sys.stderr, flush=True)
        if name in minirl:
            rows[name] += minirl_block(minirl[name], steps)
        else:
            block, block_counts = trl_block(resolve_model(cfg), problems, steps, out, TRLS[name])
            rows[name] += block
            counts += block_counts
    return rows, counts, next(iter(minirl.values())).first_batch


def minirl_block(trainer: Trainer, steps: int) -> list[dict]:
    """``steps`` more RL steps, each timed around the whole ``train_step`` (its logged phases
    leave out reward scoring); the first is dropped."""
    rows = []
    for _ in range(steps):
        t = time.perf_counter()
        metrics = trainer.train_step(trainer.step)
        rows.append({"s_step": time.perf_counter() - t, **metrics})
        trainer.step += 1
    return rows[1:]


def trl_block(model_path: Path, problems: list, steps: int, out: str, bf16: bool = False) -> tuple[list[dict], list]:
    """``steps`` RL steps of a fresh ``GRPOTrainer`` (optimizer steps 2k and 2k+1 share one
    generation of ``8 * prompts_per_step``; ``bf16``: its ``bf16=True``); the first is dropped."""
    marks: list[float] = []

    class Clock(TrainerCallback):  # global_step is even at an RL step's first begin and at its last end
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            if state.global_step % 2 == 0:
                marks.append(time.perf_counter())

        on_step_end = on_step_begin

    trainer, counts = trl_trainer(model_path, problems, steps, out, [Clock()], bf16=bf16)
    trainer.train()
    times = [end - begin for begin, end in zip(marks[0::2], marks[1::2])]
    return [{"s_step": t, "length": n} for t, (_, n) in zip(times, counts)][1:], counts


def trl_trainer(model_path: Path, problems: list, steps: int, out: str, callbacks: list, rollout_func=None,
                bf16: bool = False):
    """A ``GRPOTrainer`` doing minirl's RL step -> (trainer, per generation (completions, mean
    tokens), filled by the reward function: the check that a step really scores all of them)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    by_prompt = {prompt_text(tok, p.prompt): p for p in problems}
    task = tasks.get(SETTINGS["task"], **SETTINGS["task_kwargs"])
    counts: list[tuple[int, float]] = []

    def reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]], **_) -> list[float]:
        counts.append((len(completions), statistics.mean(map(len, completion_ids))))
        return [float(task.verify(by_prompt[p], c)) for p, c in zip(prompts, completions)]

    args = GRPOConfig(output_dir=out, use_cpu=True, report_to="none", save_strategy="no", bf16=bf16,
                      num_generations=8, max_completion_length=SETTINGS["max_new_tokens"], temperature=1.0, beta=0.0,
                      learning_rate=SETTINGS["lr"], lr_scheduler_type="constant",
                      per_device_train_batch_size=4 * SETTINGS["prompts_per_step"], gradient_accumulation_steps=1,
                      steps_per_generation=2, max_steps=2 * steps, epsilon=0.2, epsilon_high=0.28,
                      router_aux_loss_coef=0.0, logging_steps=10**6, seed=0, disable_tqdm=rollout_func is not None)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tok, callbacks=callbacks,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in by_prompt]), rollout_func=rollout_func)
    trl_ids = trainer._tokenize_prompts(list(by_prompt))[0]  # exactly what TRL generates from
    assert trl_ids == [encode(tok, p.prompt)[0] for p in problems], "TRL and minirl prompt tokens differ"
    return trainer, counts


def cpu_name() -> str:
    """This box's CPU as lscpu names it, with whether it has AMX-BF16 (bf16 matmuls ~9x fp32's here)."""
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")), "?")
    return f"{name}, {'AMX-BF16' if 'amx_bf16' in info else 'no AMX-BF16'}"


def prompt_text(tok, prompt: str) -> str:
    """The text whose tokens are minirl's prompt ids (``encode``): TRL tokenises it as is."""
    if uses_chat(tok):
        return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tok.bos_token + prompt


def minirl_config(base: Path, out: str, **extra) -> TrainConfig:
    return TrainConfig(model=str(base), out_dir=out, **SETTINGS, **extra)


class BatchKeeper(Trainer):
    """minirl's Trainer, keeping step 0's rollouts: the batch both peak-memory runs update on;
    ``step``: the next RL step ``minirl_block`` runs (blocks continue one run)."""

    step = 0

    def learn(self, step: int, rollouts: list, rewards: torch.Tensor, group_size: int | None = None
              ) -> dict[str, float]:
        if step == 0:
            self.first_batch = (self.problems(0), rollouts, rewards)
        return super().learn(step, rollouts, rewards, group_size)


def peak_update(which: str, base: Path, batch_file: Path) -> float:
    """(child process) MiB of peak RSS growth over one update on the saved batch; TRL gets
    minirl's completions through ``rollout_func`` instead of generating."""
    problems, rollouts, rewards = torch.load(batch_file, weights_only=False)
    with tempfile.TemporaryDirectory() as out:
        if which == "minirl":
            trainer = Trainer(minirl_config(base, out))
            before = reset_peak()
            trainer.learn(0, rollouts, rewards)
            return (rss_kb("VmHWM") - before) / 1024
        queue: dict[tuple, list] = {}
        for r in rollouts:
            queue.setdefault(tuple(r.prompt_ids), []).append(list(r.token_ids))
        mark: dict[str, int] = {}

        def replay(prompts: list[str], trainer) -> dict:  # noqa: ANN001
            ids = trainer._tokenize_prompts(prompts)[0]
            return {"prompt_ids": ids, "completion_ids": [queue[tuple(i)].pop() for i in ids], "logprobs": None}

        class Peak(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
                mark.setdefault("before", reset_peak())

            def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
                mark["peak"] = rss_kb("VmHWM")

        trainer, counts = trl_trainer(resolve_model(minirl_config(base, out)), problems, 1, out, [Peak()], replay)
        trainer.train()
    assert [n for n, _ in counts] == [len(rollouts)], counts
    return (mark["peak"] - mark["before"]) / 1024


if __name__ == "__main__":
    main()
