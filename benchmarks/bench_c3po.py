"""C3PO++ vs the synchronous baseline: rollout-phase wall time at equal steps (Ring-1T §2.4.2).

Long-tail length task: the minirl Engine on a zoo model, sampling at T=1 with a stop-id set
calibrated so that ~2.5 % of sampled tokens end a rollout (geometric-like lengths, capped at
``--max-new-tokens``: a few rollouts run to the cap, as long CoTs do). Baseline step = one
``generate`` of ``--batch`` prompts to completion (waits for the longest). C3PO++ step = one
``C3poScheduler.step`` with pool Ω = ``--batch``, budget Φ = the baseline's mean completed tokens
per step (so both train on about the same number of tokens per step), σ = ``--sigma``.
No weights change between steps here (no trainer in the loop): this times the rollout phase only.

    .venv/bin/python benchmarks/bench_c3po.py
    .venv/bin/python benchmarks/bench_c3po.py --steps 6 --batch 16 --chunk 32
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from labs import zoo  # noqa: E402
from labs.c3po_lab import calibrate_stop_ids  # noqa: E402
from minirl import Engine, SamplingParams  # noqa: E402
from minirl.algorithms.c3po import C3poConfig, C3poScheduler  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen3")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--sigma", type=int, default=2)
    args = ap.parse_args()

    root = Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))
    engine = Engine.from_pretrained(zoo.build(args.model, out=root / f"{args.model}-seed0"))
    rng = random.Random(0)
    prompt = lambda: [1] + [rng.randrange(3, 500) for _ in range(8)]  # noqa: E731
    stop_ids = calibrate_stop_ids(engine, prompt)
    params = SamplingParams(temperature=1.0, stop_token_ids=stop_ids, seed=0)

    base_times, base_tokens, base_lens = [], [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        outs = engine.generate([prompt() for _ in range(args.batch)],
                               SamplingParams(temperature=1.0, stop_token_ids=stop_ids, seed=1000 + step,
                                              max_new_tokens=args.max_new_tokens))
        base_times.append(time.perf_counter() - t0)
        base_tokens.append(sum(len(o.token_ids) for o in outs))
        base_lens += [len(o.token_ids) for o in outs]
    budget = int(statistics.mean(base_tokens))

    cfg = C3poConfig(token_budget=budget, pool_capacity=args.batch, max_new_tokens=args.max_new_tokens,
                     retention=args.sigma, chunk_tokens=args.chunk)
    sched = C3poScheduler(engine, prompt, cfg, params)
    c3_times, c3_tokens, c3_lens, purged = [], [], [], 0
    for _ in range(args.steps):
        batch = sched.step()
        c3_times.append(batch.metrics["c3po/rollout_time_s"])
        c3_tokens.append(batch.metrics["c3po/completed_tokens"])
        c3_lens += [len(o.token_ids) for o in batch.rollouts]
        purged += batch.metrics["c3po/purged"]

    print(f"model={args.model} batch/pool={args.batch} max_new_tokens={args.max_new_tokens} "
          f"chunk={args.chunk} sigma={args.sigma} steps={args.steps} stop_ids={len(stop_ids)}")
    print(f"baseline : {statistics.mean(base_times):.2f} s/step, {statistics.mean(base_tokens):.0f} "
          f"trained tokens/step, rollout length mean {statistics.mean(base_lens):.0f} max {max(base_lens)}")
    print(f"C3PO++   : {statistics.mean(c3_times):.2f} s/step, {statistics.mean(c3_tokens):.0f} "
          f"trained tokens/step (Φ={budget}), rollout length mean {statistics.mean(c3_lens):.0f}, "
          f"purged {purged}, last version shares {batch.metrics['c3po/version_token_share']}")
    ratio = statistics.mean(base_times) / statistics.mean(c3_times)
    per_token = (sum(base_times) / sum(base_tokens)) / (sum(c3_times) / sum(c3_tokens))
    print(f"rollout-phase speedup (baseline / C3PO++ time per step): {ratio:.2f}x "
          f"(per trained token: {per_token:.2f}x; goal >= 1.5x)")


if __name__ == "__main__":
    main()
