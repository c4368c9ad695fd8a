"""What attaching the lab costs a TRL ``GRPOTrainer`` step: attached vs unattached, same process.

    env $(.venv/bin/python -m labs.allocator) .venv/bin/python benchmarks/bench_trl_attached.py
        [--model smollm2-135m] [--steps 6] [--prompts 4] [--max-new-tokens 16] [--threads 1] [--monitor-every 2]

Why replayed rollouts: generation is the same work in both arms and would only dilute the cost;
every arm replays one fixed set of minirl bf16 completions (generated once, up front) through a
``rollout_func`` that still keeps a minirl bf16 engine synced to the trainer's weights every step (as
``rollout_func(spec)`` does, and the monitor reads), so a step is TRL's own work (scoring,
advantages, the loss forward and backward, AdamW) and the engine's weight sync, plus, when attached,
the lab's. TRL's default layout (one optimizer step per generation) is the one measured: there TRL
computes no old logprobs and the lab reads the loss forward's, so attaching adds no forward pass.
Arms: ``unattached``, ``stats`` (``attach(trainer)``: statistics only), ``records``
(``attach(trainer, records=...)``: JSONL every step too) and ``monitor`` (records and the per-site
monitor every ``--monitor-every`` steps), run in blocks U S R M M R S U of ``--steps`` optimizer
steps each, a fresh trainer per block, its first step dropped; the medians' ratio to
``unattached`` is the overhead (goal: <= 1.05 for stats and records; the monitor's is its reading
time over K). On a shared box those ratios swing by more than 5 %, so the CPU seconds spent inside
the attachment's own code are printed too; the monitor's first reading also measures the float64
noise floor, and a block's first step, dropped, is a reading step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("MLAB_ZOO_DIR", str(Path(__file__).resolve().parents[1] / ".zoo"))  # where the tests build it
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import transformers  # noqa: E402

from aligntools.integrations.trl import EngineRollouts, attach  # noqa: E402
from bench_trl import cpu_name  # noqa: E402
from labs import zoo  # noqa: E402
from minirl.engine.sampling import SamplingParams  # noqa: E402
from minirl.engines import build_engine  # noqa: E402

ARMS = ("unattached", "stats", "records", "monitor")
GROUP = 8
"""Completions per prompt (``num_generations``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="zoo name")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per block (the first is dropped)")
    parser.add_argument("--prompts", type=int, default=4, help=f"prompts per step, {GROUP} completions each")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared 2-core box a second OpenMP thread spins against other "
                             "processes and makes a step several times slower, tests/conftest.py)")
    parser.add_argument("--monitor-every", type=int, default=2, help="the monitor arm's monitor_every")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step of a block is warm-up and not timed)")
    path = zoo.build(args.model)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    prompts = [f"{a} + {b} =" for a, b in zip(range(1, args.prompts + 1), range(7, 7 + args.prompts))]
    completions = pregenerate(path, tok, prompts, args.max_new_tokens)
    load = os.getloadavg()
    times: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for i, arm in enumerate([*ARMS, *ARMS[::-1]]):
            print(f"[{i + 1}/{2 * len(ARMS)}] {arm}: {args.steps} steps", file=sys.stderr, flush=True)
            times[arm] += block(path, tok, prompts, completions, arm, args, Path(tmp) / f"{i}")
    med = {arm: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for arm, rows in times.items()}
    print(f"\nGRPOTrainer step on {args.model} (fp32 trainer, {args.prompts} prompts x {GROUP} replayed minirl bf16 "
          f"completions, <= {args.max_new_tokens} tokens; monitor every {args.monitor_every} steps); CPU {cpu_name()}, "
          f"{torch.get_num_threads()} torch threads, "
          f"load average {load[0]:.2f} -> {os.getloadavg()[0]:.2f}; median of 2 x {args.steps - 1} steps per arm")
    base = med["unattached"]
    print(f"{'arm':<12} {'wall s/step':>11} {'vs unattached':>13} {'CPU s/step':>10} {'vs unattached':>13} "
          f"{'lab CPU s/step':>14} {'lab share':>9}")
    for arm in ARMS:
        m = med[arm]
        print(f"{arm:<12} {m['wall']:11.3f} {m['wall'] / base['wall']:12.3f}x {m['cpu']:10.3f} "
              f"{m['cpu'] / base['cpu']:12.3f}x {m['lab_cpu']:14.4f} {m['lab_cpu'] / base['cpu']:8.2%}")
    print("lab share: CPU seconds inside the attachment (statistics, records, monitor readings) over an unattached "
          "step's CPU seconds;\n"
          "the ratios of whole steps carry the shared box's noise, the lab share does not.")


def pregenerate(path: Path, tok, prompts: list[str], max_new: int) -> dict[tuple[int, ...], list[tuple]]:
    """Per prompt's token ids, ``GROUP`` (completion ids, logprobs) from the minirl bf16 engine."""
    engine = build_engine("minirl:typical", path, rollouts=True)
    ids = [tok(p)["input_ids"] for p in prompts]
    outs = engine.generate(ids, SamplingParams(n=GROUP, max_new_tokens=max_new, seed=0))
    done: dict[tuple[int, ...], list[tuple]] = {}
    for r in outs:
        done.setdefault(tuple(r.prompt_ids), []).append((list(r.token_ids), r.logprobs.tolist()))
    return done


class Replay(EngineRollouts):
    """A ``rollout_func`` handing each prompt its pre-generated completions in turn, while its minirl
    bf16 engine follows the trainer's weights as ``rollout_func("minirl:typical")``'s does: the
    monitor arm reads that engine, and every arm pays its weight sync."""

    def __init__(self, completions: dict[tuple[int, ...], list[tuple]]) -> None:
        super().__init__("minirl:typical")
        self.completions = completions
        self.served: dict[tuple[int, ...], int] = {}

    def __call__(self, prompts: list, trainer) -> dict:  # noqa: ANN001
        self._sync(trainer)
        ids = trainer._tokenize_prompts(prompts)[0]
        picked = []
        for p in map(tuple, ids):
            picked.append(self.completions[p][self.served.get(p, 0) % GROUP])
            self.served[p] = self.served.get(p, 0) + 1
        return {"prompt_ids": ids, "completion_ids": [c for c, _ in picked], "logprobs": [lp for _, lp in picked]}


def block(path: Path, tok, prompts: list[str], completions: dict, arm: str, args: argparse.Namespace,
          out: Path) -> list[dict[str, float]]:
    """``args.steps`` optimizer steps of a fresh trainer in ``arm`` -> per step (the first dropped) its wall
    and process CPU seconds, and the block's mean CPU seconds per step inside the lab's code."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    marks: list[tuple[float, float]] = []  # (wall, process CPU) at each step's begin and end
    lab_cpu = [0.0]  # process CPU seconds inside the attachment's own code, this block

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):  # noqa: ANN001
            marks.append((time.perf_counter(), time.process_time()))

        on_step_end = on_step_begin

    config = GRPOConfig(output_dir=str(out), use_cpu=True, report_to="none", save_strategy="no", num_generations=GROUP,
                        max_completion_length=args.max_new_tokens, per_device_train_batch_size=GROUP * args.prompts,
                        max_steps=args.steps, learning_rate=1e-6, beta=0.0, logging_steps=1, seed=0, disable_tqdm=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completion_ids, **_: [float(len(c)) for c in completion_ids],
                          args=config, processing_class=tok, rollout_func=Replay(completions), callbacks=[Clock()],
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))
    if arm != "unattached":
        att = attach(trainer, records=out / "records" if arm in ("records", "monitor") else None,
                     monitor_every=args.monitor_every if arm == "monitor" else 0)
        for name in ("after_generation", "after_loss_forward"):
            setattr(att, name, timed(getattr(att, name), lab_cpu))
    trainer.train()
    steps = [(e[0] - b[0], e[1] - b[1]) for b, e in zip(marks[0::2], marks[1::2])][1:]
    return [{"wall": w, "cpu": c, "lab_cpu": lab_cpu[0] / len(marks[0::2])} for w, c in steps]


def timed(method, total: list[float]):
    """``method``, adding the process CPU seconds it takes to ``total[0]``: the lab's own work, read
    apart from the step, because the wall time of a step on a shared box swings by more than 5 %."""
    def wrapped(*a, **kw):
        t = time.process_time()
        try:
            return method(*a, **kw)
        finally:
            total[0] += time.process_time() - t
    return wrapped


if __name__ == "__main__":
    main()
