"""Real SGLang (CPU) against the transformers trainer: the capture at every site, the gate CLI,
the weight sync and a 2-step RL run with the monitor, on the tiny MoE. One SGLang start-up for
the module (``sglang_runner``); the check and train calls build their own runners in this process
(model load only: SGLang is already imported)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import aligntools
from labs.cli import main
from minirl import train
from minirl.engines import load_hf
from minirl.training import run_log
from minirl.training.train_config import TrainConfig
from tests.sglang.conftest import needs_sglang

pytestmark = needs_sglang
MOE = "tiny-qwen3-moe"


def test_fp32_sglang_equals_the_trainer_at_every_site(zoo, sglang_runner, prompt_ids):
    runner = sglang_runner(MOE)
    print(f"\nSGLang start-up (import + load {MOE}): {sglang_runner.started[(MOE, 'float32')]:.1f} s")
    cap = aligntools.capture(runner, prompt_ids, progress=False)
    train_cap = aligntools.capture(load_hf(zoo(MOE), "float32"), prompt_ids, progress=False)
    assert set(cap.sites) == set(train_cap.sites)  # every site, SGLang's own routing included
    cmp = aligntools.compare(train_cap, cap)
    rel = cmp.table["rel_l2"].dropna()
    assert len(rel) > 40 and rel.max() < 1e-5, rel.sort_values().tail()
    assert (cmp.table.filter(like="topk_ids", axis=0)["rel_l2"].fillna(0) == 0).all()
    lp = cap.dataset["logprobs"].values.reshape(prompt_ids.shape)  # every prompt position
    assert not np.isnan(lp[:, :-1]).any() and np.isnan(lp[:, -1]).all()
    assert cap.dataset.attrs["engine"] == "sglang"


def test_vllm_and_the_torchvision_stand_in_live_beside_sglang(sglang_runner):
    sglang_runner(MOE)  # SGLang imported, stand-ins installed
    import transformers.utils.import_utils as iu
    import vllm
    from torchvision.transforms import InterpolationMode

    from minirl.sglang.standins import StandInCalled

    assert vllm.__version__.startswith("0.") and not iu.is_torchvision_available()
    with pytest.raises(StandInCalled, match="torchvision.transforms.InterpolationMode.BICUBIC was called"):
        InterpolationMode.BICUBIC()


def test_weight_sync_serves_the_trainers_new_weights(zoo, sglang_runner, prompt_ids):
    from minirl.sglang.rollouts import SglangRollouts

    runner = sglang_runner(MOE)
    model = load_hf(zoo(MOE), "float32")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    before = aligntools.capture(runner, prompt_ids, sites="logprobs", progress=False)
    SglangRollouts(runner).load_weights(model)
    after = aligntools.capture(runner, prompt_ids, sites="logprobs", progress=False)
    ref = aligntools.capture(model, prompt_ids, sites="logprobs", progress=False)
    lp = {k: c.dataset["logprobs"].values for k, c in (("before", before), ("after", after), ("ref", ref))}
    ok = ~np.isnan(lp["ref"])
    assert np.abs(lp["before"][ok] - lp["ref"][ok]).max() > 1e-2  # the perturbation shows
    assert np.abs(lp["after"][ok] - lp["ref"][ok]).max() < 1e-4  # and the sync carried it
    SglangRollouts(runner).load_weights(load_hf(zoo(MOE), "float32"))  # the module's runner back as it was


def test_rollouts_carry_raw_logprobs_of_the_sampled_tokens(zoo, sglang_runner):
    from minirl import SamplingParams
    from minirl.sglang.rollouts import SglangRollouts

    engine = SglangRollouts(sglang_runner(MOE))
    prompts = [[5, 17, 42, 9], [7, 7, 300]]
    params = SamplingParams(n=3, max_new_tokens=6, temperature=1.0, seed=0)
    outs = engine.generate(prompts, params)
    assert [o.prompt_ids for o in outs] == [prompts[0]] * 3 + [prompts[1]] * 3  # prompt-major
    assert len({tuple(o.token_ids) for o in outs}) > 2  # the n samples differ
    assert [o.token_ids for o in engine.generate(prompts, params)] == [o.token_ids for o in outs]  # seeded
    hf = load_hf(zoo(MOE), "float32")
    for o in outs:
        with torch.no_grad():
            logp = hf(torch.tensor([o.prompt_ids + o.token_ids])).logits[0].log_softmax(-1)
        ref = logp[len(o.prompt_ids) - 1:-1].gather(1, torch.tensor(o.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(o.logprobs, ref, rtol=0, atol=1e-4)  # raw: temperature is not applied


def test_gate_cli_fp32_aligned_bf16_not(zoo, capsys):
    path = str(zoo(MOE))
    assert main(["check", "--model", path, "--infer", "sglang:float32", "--tokens", "64"]) == 0
    assert "ALIGNED: sglang:float32 vs hf:float32" in capsys.readouterr().out
    assert main(["check", "--model", path, "--infer", "sglang:bfloat16", "--tokens", "64"]) == 1
    out = capsys.readouterr().out
    assert "MISALIGNED: sglang:bfloat16 vs hf:float32" in out and "first divergence" in out.lower()


def test_two_step_rl_run_with_sglang_rollouts_and_the_monitor(zoo, tmp_path):
    cfg = TrainConfig(model=str(zoo(MOE)), sft_steps=0, task="arithmetic", task_kwargs={"digits": 1},
                      n_train=8, n_eval=4, prompts_per_step=2, group_size=4, max_new_tokens=4, steps=2, lr=1e-2,
                      eval_every=0, checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False,
                      engine="sglang", engine_dtype="float32", monitor_every=1)
    ds = run_log.load(train(cfg).log_path)
    assert ds["monitor_step"].values.tolist() == [0, 1, 2]
    rel = ds["monitor_rel_l2"].values
    assert np.isfinite(rel).all() and rel.max() < 1e-3  # fp32 SGLang serves the trainer's weights after each sync


def test_r3_is_refused_by_name_for_sglang(zoo, tmp_path):
    cfg = TrainConfig(model=str(zoo(MOE)), sft_steps=0, task="arithmetic", task_kwargs={"digits": 1}, n_train=8,
                      n_eval=0, steps=1, eval_every=0, checkpoint_every=0, out_dir=str(tmp_path / "r3"),
                      progress=False, engine="sglang:float32", router_replay="r3")
    with pytest.raises(ValueError, match="router_replay='r3'.*SglangRollouts returns none"):
        train(cfg)


def test_fingerprint_explains_sglangs_bf16_in_minirl_knobs(zoo, sglang_runner, prompt_ids):
    cap = aligntools.capture(sglang_runner(MOE, "bfloat16"), prompt_ids, progress=False)
    fp = aligntools.fingerprint(cap, zoo(MOE), passes=1)
    print(f"\n{fp!r}")
    assert 0 < fp.distance < 0.05  # bf16-sized, not a broken capture
    assert len(fp.explained) and (fp.explained["score_if_reverted"] > fp.score).all()  # each knob found matters
    assert fp.score <= min(np.log10(fp.table[c].dropna() + 1e-9).mean() for c in ("hf_exact", "typical"))
    assert fp.gap_start in cap.sites


@pytest.mark.slow
def test_two_step_rl_run_on_smollm2_with_sglang_bf16_rollouts(zoo, tmp_path):
    """The real model: SGLang bf16 rollouts, fp32 trainer, the monitor reading SGLang after each sync."""
    pytest.importorskip("gguf")
    cfg = TrainConfig(model=str(zoo("smollm2-135m")), sft_steps=0, task="chat_arithmetic",
                      task_kwargs={"digits": 2, "second_digits": 1}, n_train=16, n_eval=2, prompts_per_step=2,
                      group_size=4, max_new_tokens=16, temperature=0.7, steps=2, lr=2e-5, eval_every=0,
                      checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False, engine="sglang:bfloat16",
                      monitor_every=1)
    ds = run_log.load(train(cfg).log_path)
    assert ds["monitor_step"].values.tolist() == [0, 1, 2]
    rel = ds["monitor_rel_l2"].values
    assert np.isfinite(rel).all() and 0 < rel.max() < 0.2  # bf16 SGLang against the fp32 trainer: small, not zero


@pytest.mark.slow
def test_three_engines_row_at_small_size(tmp_path):
    from labs import reproduce

    assert reproduce.main(["--small", "--only", "three_engines", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "three_engines" / "summary.json").read_text())
    for engine in ("vllm:bfloat16", "sglang:bfloat16", "minirl:typical"):
        assert 0 < s["numbers"][f"logits_rel_l2 {engine}"] < 0.05, engine  # bf16-sized against the fp32 trainer
    assert s["numbers"]["fingerprint_distance minirl:typical"] == 0  # minirl finds itself exactly


def test_real_sglang_records_audit_aligned_in_fp32_shift_named_and_bf16_numeric(zoo, sglang_runner):
    from minirl.sglang.rollouts import SglangRollouts
    from tests.real_engine_audit import check_real_engine_records

    check_real_engine_records(SglangRollouts(sglang_runner(MOE)), SglangRollouts(sglang_runner(MOE, "bfloat16")),
                              zoo(MOE))
