"""``record_batch`` on a verl batch: verl is not installed here, so the batch is built with the keys
verl's ``RayPPOTrainer`` holds after ``batch.union(old_log_prob)`` with
``rollout.calculate_log_probs=True``, from real bf16 rollouts of the tiny zoo MoE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import aligntools
from aligntools.integrations.verl import record_batch
from aligntools.integrations.stats import mismatch_stats
from aligntools.records import read
from minirl.engine.sampling import SamplingParams
from minirl.engines import build_engine, load_hf

PROMPTS = [[1, 30, 31, 32], [1, 40, 41], [1, 50, 51, 52], [1, 60]]
R = 6  # response width


class TensorDictLike:
    """What ``DataProto.batch`` is: keys() and [], not a Mapping."""

    def __init__(self, tensors: dict) -> None:
        self._t = tensors

    def keys(self):  # noqa: ANN201
        return self._t.keys()

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._t[key]


class DataProtoLike:
    def __init__(self, tensors: dict) -> None:
        self.batch = TensorDictLike(tensors)


@pytest.fixture(scope="module")
def verl_batch(zoo):
    """[B = 4] prompts left-padded to P = 4, responses right-padded to R, bf16 engine logprobs as
    ``rollout_log_probs``, the fp32 model's as ``old_log_probs``, routed experts over P + R rows."""
    path = zoo("tiny-qwen3-moe")
    engine = build_engine("minirl:typical", path, rollouts=True)
    outs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=R, seed=0))
    P = max(map(len, PROMPTS))
    prompts = torch.zeros(len(PROMPTS), P, dtype=torch.long)
    responses = torch.zeros(len(PROMPTS), R, dtype=torch.long)
    attn = torch.zeros(len(PROMPTS), P + R, dtype=torch.long)
    rollout_lp = torch.zeros(len(PROMPTS), R)
    layers, k = outs[0].routed_experts.shape[1:]
    routed = torch.zeros(len(PROMPTS), P + R, layers, k, dtype=torch.uint8)
    for b, o in enumerate(outs):
        p, n = len(o.prompt_ids), len(o.token_ids)
        prompts[b, P - p:] = torch.tensor(o.prompt_ids)
        responses[b, :n] = torch.tensor(o.token_ids)
        attn[b, P - p:P + n] = 1
        rollout_lp[b, :n] = o.logprobs
        routed[b, P - p:P + n] = torch.cat([o.prompt_routed_experts, o.routed_experts]).to(torch.uint8)
    input_ids = torch.cat([prompts, responses], 1)  # [B, P + R]
    model = load_hf(path, "float32")
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attn,
                       position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, P - 1:-1]  # [B, R, V]
    old_lp = logits.log_softmax(-1).gather(-1, responses[..., None])[..., 0] * attn[:, P:]  # [B, R]
    return path, {"prompts": prompts, "responses": responses, "input_ids": input_ids, "attention_mask": attn,
                  "response_mask": attn[:, P:], "rollout_log_probs": rollout_lp, "old_log_probs": old_lp,
                  "routed_experts": routed}


def test_records_and_stats_from_a_dataproto(verl_batch, tmp_path):
    path, tensors = verl_batch
    stats = record_batch(DataProtoLike(tensors), 7, records=tmp_path, sampling={"temperature": 1.0},
                         logprobs_mode="raw")
    assert stats == mismatch_stats(tensors["old_log_probs"], tensors["rollout_log_probs"], tensors["response_mask"])
    assert 0 < stats["mismatch/abs_dlogp/mean"] < 0.5  # bf16 vs fp32: small, never zero
    recs = read(tmp_path / "step-000007.jsonl")
    assert len(recs) == 4 and all(r.step == 7 and r.logprobs_mode == "raw" for r in recs)
    mask = tensors["attention_mask"].bool()
    for b, r in enumerate(recs):
        assert list(r.prompt_ids) + list(r.completion_ids) == tensors["input_ids"][b][mask[b]].tolist()
        assert np.array_equal(r.routed_experts, tensors["routed_experts"][b][mask[b]].numpy())
    result = aligntools.audit(recs, path)
    assert result.verdict == "misaligned" and result.causes[0].name in ("numeric", "routing")


def test_missing_old_log_probs_names_the_verl_setting():
    with pytest.raises(KeyError, match="calculate_log_probs=True"):
        record_batch({"prompts": torch.zeros(1, 1)}, 0)
