"""Records made by a real engine (vLLM, SGLang: CPU builds, in-process), audited: the issue's
"from a fresh clone, ``mlab audit`` names the planted cause on records from real vLLM and SGLang".

Shared by ``tests/vllm/test_rl_rollouts.py`` and ``tests/sglang/test_sglang.py``, which already hold
the tiny MoE's fp32 and bf16 engines (no extra start-up). The records go through minirl's writer
(``record_rollouts``) and ``aligntools.records``' reader, as a user's run would.
"""

from __future__ import annotations

from pathlib import Path

import aligntools
from aligntools.records import Record, from_object
from minirl import SamplingParams
from minirl.engine.rollout import Rollout
from minirl.training import rollout_records

PROMPTS = [[5, 17, 42, 9], [7, 7, 300, 12], [44, 3, 18, 250]]


def engine_records(engine, shift: bool = False, seed: int = 0) -> list[Record]:  # noqa: ANN001 - any RolloutEngine
    """4 samples of 16 tokens per prompt at T = 1, as records; ``shift``: each logprob is the next
    token's (the ``token_shift`` bug), from one more sampled token so every position has one. Also the
    real-engine rows of ``benchmarks/bench_audit.py --engines``."""
    outs = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=17, temperature=1.0, seed=seed))
    entries = [rollout_records.record(_shifted(o) if shift else o, rollout_records.sampling(1.0), 0)
               for o in outs if len(o.token_ids) >= 3]
    return from_object(entries, f"{type(engine).__name__} rollouts")


def _shifted(o: Rollout) -> Rollout:
    rows = len(o.prompt_ids) + len(o.token_ids) - 1
    experts = None if o.routed_experts is None else o.routed_experts[: rows - len(o.prompt_ids)]
    return Rollout(o.prompt_ids, o.token_ids[:-1], o.logprobs[1:], o.finish_reason,
                   routed_experts=experts, prompt_routed_experts=o.prompt_routed_experts)


def check_real_engine_records(fp32, bf16, model: Path) -> None:  # noqa: ANN001 - RolloutEngines
    """fp32 engine: aligned. The same engine with the logprobs shifted by one: ``token_shift``.
    bf16 engine: misaligned, ``numeric`` first (no semantic cause fits a rounding gap)."""
    aligned = aligntools.audit(engine_records(fp32), model)
    assert aligned.verdict == "aligned", aligned.summary()
    shifted = aligntools.audit(engine_records(fp32, shift=True), model)
    assert shifted.verdict == "misaligned" and shifted.causes[0].name == "token_shift", shifted.summary()
    rounded = aligntools.audit(engine_records(bf16), model)
    assert rounded.verdict == "misaligned" and rounded.causes[0].name == "numeric", rounded.summary()
    assert rounded.gap > 10 * aligned.gap  # bf16 rounding is far above the fp32 engine's gap
