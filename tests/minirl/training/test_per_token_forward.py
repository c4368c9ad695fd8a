"""``trainer_forward: per_token``: each completion token scored from its own prefix, as an engine with
``decode=recompute`` computes it. The same log-probs as the batched forward (to fp32 rounding, against a
float64 reference), and with the engine's shapes a bf16 trainer equals ``minirl:hf_exact`` bit for bit
over RL steps whose updates move the weights (slime's true on-policy, on CPU)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import transformers

from labs import cli, on_policy_lab
from minirl.training import run_log
from minirl.training.train_config import TrainConfig
from minirl.training.trainer_forward import forward, forward_per_token

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "on_policy_bitwise.yaml"
SEQUENCES = [[3, 9, 4, 17, 30, 2, 8, 41], [5, 6, 7, 11, 13]]
PROMPT_LENS = [3, 2]


def _model(path, dtype: torch.dtype) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()


def test_per_token_scores_the_completion_as_the_batched_forward_to_fp32_rounding(zoo):
    """Both fp32 forwards against the float64 one: the per-token path's error is the batched path's kind
    (a few fp32 roundings per op), bounded by the batched error plus a few fp32 ulps of the log-prob."""
    path = zoo("tiny-qwen3")
    with torch.no_grad():
        truth = forward(_model(path, torch.float64), SEQUENCES).logp  # [B, L-1]
        batched = forward(_model(path, torch.float32), SEQUENCES)
        per_token = forward_per_token(_model(path, torch.float32), SEQUENCES, PROMPT_LENS)
    completion = torch.zeros_like(per_token.valid)
    for i, (s, p) in enumerate(zip(SEQUENCES, PROMPT_LENS)):
        completion[i, p - 1: len(s) - 1] = True
    assert torch.equal(per_token.valid, completion)  # the prompt's own tokens are not scored
    assert (per_token.logp[~completion] == 0).all()
    ulps = 8 * torch.finfo(torch.float32).eps * (1 + truth.abs())
    err_batched = (batched.logp.double() - truth).abs()[completion]
    err_per_token = (per_token.logp.double() - truth).abs()[completion]
    assert err_per_token.max() <= err_batched.max() + ulps[completion].max()
    assert torch.allclose(per_token.entropy[completion], batched.entropy[completion], atol=1e-4)


def test_the_per_token_forward_carries_gradients(zoo):
    model = _model(zoo("tiny-qwen3"), torch.float32)
    out = forward_per_token(model, SEQUENCES, PROMPT_LENS)
    out.logp[out.valid].sum().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0 and model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("change", [{"shared_prefix": True}, {"router_replay": "r3"}])
def test_per_token_refuses_what_it_cannot_shape(change):
    with pytest.raises(ValueError, match="trainer_forward: per_token .* does not combine"):
        TrainConfig(trainer_forward="per_token", **change)


@pytest.mark.parametrize("model,gemms", [("tiny-qwen3", "emulated"), ("tiny-qwen3-moe", "auto")])
def test_a_bf16_trainer_scoring_per_token_equals_the_recomputing_engine_over_rl_steps(tmp_path, monkeypatch, model,
                                                                                      gemms):
    """``on_policy_lab``'s ``per_token_bf16`` setting, dense and MoE (its routing computed on both sides):
    the trainer's recomputed log-probs equal the engine's with max |Δ| exactly 0 at every step, the steps after the first reading weights an update moved and
    the sync carried (a policy after SFT, so groups earn mixed rewards and the gradient is not 0).

    On every CPU path (``MINIRL_BF16_GEMM``): where bf16 GEMMs are emulated, the per-token trainer keeps
    torch's own kernels as the ``hf_exact`` engine does (emulated, its GEMMs rounded apart from the
    engine's at ~1e-6 on some steps, one thread, AVX2)."""
    from minirl.training.trainer import Trainer

    monkeypatch.setenv("MINIRL_BF16_GEMM", gemms)

    sizes = dataclasses.replace(on_policy_lab.SMALL, steps=3, prompts_per_step=4, group_size=4, max_new_tokens=8)
    cfg = on_policy_lab.config(model, on_policy_lab.SETTINGS["per_token_bf16"], sizes, seed=0,
                               out_dir=str(tmp_path))
    rows = Trainer(cfg).run().rows
    assert [r["abs_dlogp_max"] for r in rows] == [0.0, 0.0, 0.0]
    assert any(r["grad_norm"] > 0 and r["opt_skipped"] == 0 for r in rows[:-1]), "no update moved the weights"


def test_the_config_a_user_types_trains_on_policy_bit_for_bit(zoo, tmp_path, capsys):
    """``mlab train --config configs/on_policy_bitwise.yaml --set model=PATH``, at tiny size: the file's own
    100-step SFT warm start, then RL steps whose recomputed log-probs equal the engine's exactly, with the
    CPU's own bf16 path (the tests above force the emulated one)."""
    sets = {"model": zoo("tiny-qwen3"), "steps": 3, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 8,
            "n_train": 32, "n_eval": 0, "eval_every": 0, "checkpoint_every": 0, "progress": False,
            "out_dir": tmp_path / "run"}
    args = ["train", "--config", str(CONFIG), *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]
    assert cli.main(args) == 0, capsys.readouterr().err
    log = run_log.load(tmp_path / "run" / "metrics.nc")
    assert log["abs_dlogp_max"].values.tolist() == [0.0, 0.0, 0.0]
    assert (log["grad_norm"].values[:2] > 0).any(), "no update moved the weights: pick a seed with mixed rewards"
