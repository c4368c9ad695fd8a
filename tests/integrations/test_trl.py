"""TRL's ``GRPOTrainer`` with the lab attached (aligntools.integrations.trl), on the tiny zoo MoE on CPU.

Three runs of 3 steps share one module fixture: ``attached`` (minirl bf16 rollouts, records,
statistics and the per-site monitor every 2 steps), ``replayed`` (not attached, replaying the attached
run's records as its rollouts) and ``planted`` (attached, with an engine that samples at T = 0.7
while the run asks for T = 1).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import aligntools
from aligntools.integrations.trl import attach, rollout_func
from aligntools.records import read
from labs import cli
from minirl.training import run_log

PROMPTS = ["1+2=", "3+4=", "5+1=", "2+2="]
STEPS = 3
MONITOR_EVERY = 2


def reward(completions: list[str], completion_ids: list[list[int]], **_) -> list[float]:
    """Distinct tokens per completion: varies within a group, so every step has a gradient."""
    return [float(len(set(ids))) for ids in completion_ids]


def grpo(model_path: Path, out: Path, rollouts, steps_per_generation: int = 1, report_to: str = "none"):
    """A stock GRPOTrainer script's trainer, with ``rollouts`` as its ``rollout_func`` and a list the losses land in."""
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    losses: list[float] = []

    class Losses(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = GRPOConfig(output_dir=str(out), use_cpu=True, report_to=report_to, save_strategy="no", num_generations=4,
                      max_completion_length=8, per_device_train_batch_size=8 // steps_per_generation,
                      steps_per_generation=steps_per_generation, gradient_accumulation_steps=1, max_steps=STEPS,
                      learning_rate=1e-2, lr_scheduler_type="constant", beta=0.0, temperature=1.0, logging_steps=1,
                      seed=0, disable_tqdm=True)
    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype="float32")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, processing_class=tok, rollout_func=rollouts,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]), callbacks=[Losses()])
    return trainer, losses


def replay(folder: Path):
    """A rollout_func returning the records of ``folder``, step by step, in order."""
    steps = iter(sorted(folder.glob("step-*.jsonl")))

    def func(prompts: list, trainer) -> dict:  # noqa: ANN001
        recs = read(next(steps))
        assert [list(r.prompt_ids) for r in recs] == trainer._tokenize_prompts(prompts)[0]
        return {"prompt_ids": [list(r.prompt_ids) for r in recs],
                "completion_ids": [list(r.completion_ids) for r in recs], "logprobs": [list(r.logprobs) for r in recs]}
    return func


def planted_temperature(rollouts, temperature: float = 0.7):
    """The bug: the engine samples (and scores) at ``temperature`` whatever the trainer asks for."""
    def func(prompts: list, trainer) -> dict:  # noqa: ANN001
        rollouts._sync(trainer)
        generate = rollouts.engine.generate
        rollouts.engine.generate = lambda ids, p: generate(ids, dataclasses.replace(p, temperature=temperature))
        try:
            return rollouts(prompts, trainer)
        finally:
            rollouts.engine.generate = generate
    return func


@pytest.fixture(scope="module")
def runs(zoo, tmp_path_factory):
    """The three runs: their record folders, losses and the attachments' last statistics."""
    path = zoo("tiny-qwen3-moe")
    tmp = tmp_path_factory.mktemp("trl")
    out = {"path": path}
    trainer, out["attached_losses"] = grpo(path, tmp / "a", rollout_func("minirl:typical"), report_to="tensorboard")
    out["attached"] = attach(trainer, records=tmp / "a" / "records", monitor_every=MONITOR_EVERY)
    trainer.train()
    out["attached_logs"] = trainer.state.log_history
    trainer, out["replayed_losses"] = grpo(path, tmp / "b", replay(tmp / "a" / "records"))
    trainer.train()
    trainer, _ = grpo(path, tmp / "c", planted_temperature(rollout_func("minirl:typical")), steps_per_generation=2)
    out["planted"] = attach(trainer, records=tmp / "c" / "records")
    trainer.train()
    return out


def test_records_written_per_step_and_readable(runs):
    files = sorted(runs["attached"].records.glob("step-*.jsonl"))
    assert [f.name for f in files] == [f"step-{s:06d}.jsonl" for s in range(STEPS)]
    recs = read(files[0])
    assert len(recs) == 8 and {r.step for r in recs} == {0}
    assert all(r.logprobs_mode == "processed" and r.sampling == {"temperature": 1.0} for r in recs)
    assert all(0 < len(r.completion_ids) <= 8 and len(r.logprobs) == len(r.completion_ids) for r in recs)


def test_stats_reach_trl_logs(runs):
    """Raw ratio statistics, ESS and per-bucket |Δ logprob| land in TRL's log history every step,
    through the loss-forward path (TRL's default layout computes no old logprobs)."""
    logged = [h for h in runs["attached_logs"] if "mismatch/ratio/mean" in h]
    assert len(logged) == STEPS
    for h in logged:
        assert h["mismatch/ratio/min"] <= h["mismatch/ratio/q50"] <= h["mismatch/ratio/max"]
        assert 0 < h["mismatch/ess/token"] <= 1 and 0 < h["mismatch/ess/sequence"] <= 1
        assert h["mismatch/abs_dlogp/mean"] > 0  # bf16 engine vs fp32 trainer: never bit-equal
        assert any(k.startswith("mismatch/abs_dlogp/p") for k in h)


def test_attached_loss_equals_unattached_on_same_rollouts(runs):
    assert len(runs["attached_losses"]) == STEPS
    assert runs["replayed_losses"] == runs["attached_losses"]


def test_bf16_records_audit_numeric(runs):
    result = aligntools.audit(runs["attached"].records / "step-000000.jsonl", runs["path"])
    assert result.verdict == "misaligned"
    assert [c.name for c in result.causes] == ["numeric"]


def test_planted_temperature_named_by_audit(runs):
    """The planted run uses TRL's other layout (two optimizer steps per generation): TRL computes old
    logprobs itself and the statistics come straight from them; a 0.7 temperature is far off 1."""
    assert runs["planted"].last_stats["mismatch/abs_dlogp/mean"] > 0.05
    result = aligntools.audit(runs["planted"].records / "step-000000.jsonl", runs["path"])
    assert result.causes[0].name == "temperature"
    assert result.causes[0].estimate == pytest.approx(0.7, rel=0.02)


def test_monitor_every_k_steps_reaches_trl_logs_and_the_records_run_log(runs, tmp_path, capsys):
    """The per-site monitor reads at step 0 and 2: its errors are in TRL's log history at those steps,
    and in ``records/metrics.nc`` beside each step's statistics, which ``mlab plot --sites`` draws."""
    logged = {h["step"] - 1: h for h in runs["attached_logs"] if "mismatch/ratio/mean" in h}  # TRL logs after the step
    read_at = [s for s, h in logged.items() if any(k.startswith("mismatch/rel_l2/") for k in h)]
    assert read_at == [0, 2]
    assert logged[0]["mismatch/rel_l2/L0.attn_out"] > 0  # bf16 engine vs fp32 trainer
    assert 0 <= logged[0]["mismatch/routing_flips/L0"] <= 1
    records = runs["attached"].records
    ds = run_log.load(records / "metrics.nc")
    assert ds["monitor_step"].values.tolist() == [0, 2]
    assert ds["step"].values.tolist() == list(range(STEPS))
    assert ds["abs_dlogp_mean"].values[-1] == pytest.approx(runs["attached"].last_stats["mismatch/abs_dlogp/mean"])
    site = ds["monitor_rel_l2"].sel(site="L0.attn_out").values
    assert site[0] == pytest.approx(logged[0]["mismatch/rel_l2/L0.attn_out"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (board,) = {p.parent for p in (records.parent).rglob("events.out.tfevents.*")}  # TRL's TensorBoard folder
    events = EventAccumulator(str(board))
    events.Reload()
    assert [e.step for e in events.Scalars("train/mismatch/rel_l2/L0.attn_out")] == [1, 3]  # TRL logs after the step
    png = tmp_path / "sites.png"
    assert cli.main(["plot", str(records), "--sites", "--out", str(png)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(png) and png.stat().st_size > 10_000


def test_monitor_needs_the_engine_in_this_process(runs, tmp_path):
    trainer, _ = grpo(runs["path"], tmp_path, replay(runs["attached"].records))
    with pytest.raises(ValueError, match="only a rollout_func\\(spec\\) engine"):
        attach(trainer, monitor_every=1)
