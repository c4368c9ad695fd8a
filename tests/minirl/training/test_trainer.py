"""The RL loop end to end: a short run learns, resume is exact, logs survive, bad input fails clearly."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from labs import cli
from minirl.training import checkpointing, run_log
from minirl.algorithms import losses
from minirl import tasks
from minirl.training.train_config import TrainConfig
from minirl.driver import train


def _comparable(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


def _same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[k] == y[k] or (math.isnan(x[k]) and math.isnan(y[k])) for k in x)
        for x, y in zip(a, b))


def test_short_run_increases_reward(quick_config):
    """8 fixed problems, 8 samples each, 8 steps: the reward on them rises (CPU, under a minute unloaded)."""
    cfg = quick_config(sft_steps=100, prompts_per_step=8, group_size=8, steps=8, lr=1e-3, minibatches=2)
    rows = train(cfg).rows
    rewards = [r["reward"] for r in rows]
    before, after = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"\nreward first 3 steps {before:.3f} -> last 3 steps {after:.3f}: {[round(r, 3) for r in rewards]}")
    assert after > before + 0.05


def test_resume_reproduces_uninterrupted_run(quick_config, tmp_path):
    full = train(quick_config(steps=4, checkpoint_every=2, out_dir=str(tmp_path / "full"))).rows
    part = quick_config(steps=2, checkpoint_every=2, out_dir=str(tmp_path / "part"))
    train(part)
    resumed = train(quick_config(steps=4, checkpoint_every=2, out_dir=str(tmp_path / "part")), resume=True)
    assert _same(_comparable(resumed.rows), _comparable(full))
    ds = run_log.load(resumed.log_path)  # the netCDF log holds the same rows
    assert list(ds["step"].values) == [0, 1, 2, 3]
    assert ds["reward"].values.tolist() == [r["reward"] for r in full]
    assert (resumed.out_dir / "curves.png").stat().st_size > 0  # the run's own figure (minirl.training.plot)


@pytest.mark.parametrize("changes", [
    dict(old_logprobs="bypass", router_replay="r3", loss="gspo", correction="none"),
    dict(router_replay="r2", correction="tis", correction_level="sequence", kl_coef=0.1, advantage="drgrpo",
         agg="seq-mean-token-sum", engine="minirl:typical,tp=2"),
    dict(correction="mis", correction_level="geometric", router_replay="r3", engine_dtype="float32",
         engine="minirl:aligned"),
])
def test_variants_run_and_log_every_metric(quick_config, changes):
    rows = train(quick_config(steps=1, **changes)).rows
    keys = set(rows[0])
    assert {"reward", "accuracy", "length", "entropy", "grad_norm", "frac_masked", "ess", "mismatch_kl_k3",
            "abs_dlogp_max", "logp_masked", "time_rollout", "time_sync"} <= keys
    if changes.get("old_logprobs") == "bypass":
        assert math.isfinite(rows[0]["mismatch_kl_k1"])  # measured on the first minibatch's update forward
    elif changes.get("engine") == "minirl:aligned":
        assert rows[0]["abs_dlogp_max"] < 1e-4  # aligned fp32 engine + R3: no gap


def test_reward_function_raising_counts_and_continues(quick_config):
    class Flaky:
        name = "flaky"

        def __init__(self):
            self.inner = tasks.get("arithmetic", digits=1)

        def sample(self, rng):
            return self.inner.sample(rng)

        def verify(self, problem, completion):
            raise RuntimeError("verifier bug")

    tasks.register("flaky", lambda **kw: Flaky())
    rows = train(quick_config(task="flaky", task_kwargs={}, sft_steps=0, steps=2)).rows
    assert [r["reward_errors"] for r in rows] == [8.0, 8.0] and all(r["reward"] == 0 for r in rows)


def test_a_step_with_no_signal_leaves_the_weights_alone(quick_config, tmp_path):
    """After one step with signal, every group is rewarded alike: advantages 0, gradient exactly
    0. AdamW would still move the weights on its momentum from the first step; the trainer skips
    the optimizer step instead, so three steps end on the weights one step left."""
    import transformers

    class SignalOnce:
        """Rewards 1, 0, 1, 0 ... for the first step's 8 completions, then 0 for all."""
        name = "signal-once"

        def __init__(self):
            self.inner, self.calls = tasks.get("arithmetic", digits=1), 0

        def sample(self, rng):
            return self.inner.sample(rng)

        def verify(self, problem, completion):
            self.calls += 1
            return float(self.calls <= 8 and self.calls % 2 == 1)

    tasks.register("signal-once", lambda **kw: SignalOnce())

    def weights_after(steps: int) -> dict[str, torch.Tensor]:
        out = tmp_path / f"run{steps}"
        cfg = quick_config(task="signal-once", task_kwargs={}, sft_steps=0, steps=steps, checkpoint_every=steps,
                           minibatches=1, out_dir=str(out))
        rows = train(cfg).rows
        model = transformers.AutoModelForCausalLM.from_pretrained(cfg.model)
        checkpointing.load(out / "checkpoint", model, torch.optim.AdamW(model.parameters()))
        return rows, model.state_dict()

    rows, one = weights_after(1)
    assert rows[0]["grad_norm"] > 0 and rows[0]["opt_skipped"] == 0
    rows, three = weights_after(3)
    assert [r["grad_norm"] for r in rows[1:]] == [0.0, 0.0] and [r["opt_skipped"] for r in rows[1:]] == [1.0, 1.0]
    for name, w in one.items():
        assert torch.equal(w, three[name]), f"{name} moved on a step with no gradient"


def test_nan_loss_is_skipped_then_stops_with_checkpoint_intact(quick_config, monkeypatch, tmp_path):
    entry = losses.POLICY_LOSSES.entries["ppo"]
    real, calls = entry.fn, []

    def nan_after_two_steps(*args, **kwargs):
        calls.append(1)
        loss, metrics = real(*args, **kwargs)
        return (loss * float("nan") if len(calls) > 4 else loss), metrics  # 2 minibatches per step

    monkeypatch.setitem(losses.POLICY_LOSSES.entries, "ppo", dataclasses.replace(entry, fn=nan_after_two_steps))
    # kl_coef > 0: every minibatch runs the loss whatever the draws (without a KL term a minibatch whose
    # advantages are all 0 skips it, and the call count would no longer say which step is which)
    cfg = quick_config(steps=6, checkpoint_every=1, max_nan_steps=2, kl_coef=1e-3, out_dir=str(tmp_path / "nan"))
    with pytest.raises(RuntimeError, match="not finite for 2 steps in a row"):
        train(cfg)
    rows = run_log.load(tmp_path / "nan" / "metrics.nc")
    assert rows["nan_skipped"].values.tolist() == [0, 0, 1, 1]
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(cfg.model)
    opt = torch.optim.AdamW(model.parameters())
    state = checkpointing.load(tmp_path / "nan" / "checkpoint", model, opt)
    assert state["step"] == 3 and all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("values, match", [
    (dict(eps_hihg=0.3), "did you mean 'eps_high'"),
    (dict(icepop_alpha=5.0, icepop_beta=5.0), "icepop_alpha"),
    (dict(icepop_alpha=6.0), "icepop_alpha"),
    (dict(group_size=1), "group_size"),
    (dict(correction="icepopp"), "correction"),
    (dict(n_train=0), "n_train"),
    (dict(device="gpu"), "device='gpu'; valid: auto, cpu, cuda, cuda:N"),
])
def test_bad_config(values, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.from_dict(values)


def test_empty_dataset_and_missing_model(quick_config, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        train(quick_config(model=str(tmp_path)))
    with pytest.raises(ValueError, match="empty"):
        tasks.splits(tasks.get("arithmetic"), 0, 0, seed=0)


def test_cli_typo_gives_suggestion(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: /nowhere\ngroup_sise: 4\n")
    assert cli.main(["train", "--config", str(cfg)]) == 2
    assert "did you mean 'group_size'" in capsys.readouterr().err


def test_cli_runs_a_step(quick_config, tmp_path, capsys):
    cfg = quick_config()
    path = tmp_path / "run.yaml"
    import yaml

    path.write_text(yaml.safe_dump({k: v for k, v in cfg.to_dict().items() if k != "betas"}))
    assert cli.main(["train", "--config", str(path), "--set", "steps=1"]) == 0
    assert "done: 1 steps" in capsys.readouterr().out


@pytest.mark.parametrize("spec, match", [
    ("tgi", "unknown engine 'tgi'; engines here: minirl, vllm, sglang"),
    ("vllm:float16", "names dtype float16 but the dtype given is bfloat16"),
    ("vllm,bogus=1", "unknown vllm option 'bogus'"),
    ("vllm:float64", "'vllm:float64': 'float64' is not a vllm dtype"),
    ("vllm,max_model_len", "not a vllm dtype .* or key=value"),
    ("vllm:bfloat16,seed", "expected key=value"),
    ("vllm,max_model_len=lots", "is not a int"),
    ("minirl:typicl", "typicl"),
])
def test_bad_engine_spec_fails_before_any_engine_starts(spec, match, tmp_path):
    """``engine:`` in a config: minirl's own specs and vllm's reject typos
    with the valid choices, before a checkpoint is read or vLLM starts."""
    from minirl.engines import build_engine

    with pytest.raises(ValueError, match=match):
        build_engine(spec, tmp_path, "bfloat16", rollouts=True)


def test_device_resolution():
    from minirl.training.trainer import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device here"):
            resolve_device("cuda")


@pytest.mark.gpu
def test_trainer_runs_on_cuda(quick_config):
    """On a GPU the trainer's model, batch and logprob kernel (Triton) run on CUDA; the CPU
    rollout engine gets the weights copied back after each update."""
    from minirl.training.trainer import Trainer

    trainer = Trainer(quick_config(device="cuda", steps=2))
    rows = trainer.run().rows
    assert next(trainer.model.parameters()).is_cuda
    assert all(math.isfinite(r["loss"]) and r["nan_skipped"] == 0 for r in rows)


def _grads(model, out):
    model.zero_grad()
    (out.logp * out.valid).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prefix_forward_matches_padded(hf_moe, attn):
    """Packing each prompt once (block mask, per-completion positions) gives the padded forward's
    logprobs, entropies and gradients up to float reduction order, for ragged prompts and
    completions (a repeated completion included) in an interleaved order, under either attention
    kernel (eager attention adds the mask: a boolean one was read as 0/1 and scored 0.74 off)."""
    was = hf_moe.config._attn_implementation
    hf_moe.set_attn_implementation(attn)
    try:
        _check_shared_prefix(hf_moe)
    finally:
        hf_moe.set_attn_implementation(was)


def _check_shared_prefix(hf_moe) -> None:
    from minirl.training.trainer_forward import forward

    p1, p2 = [5, 9, 3, 7, 2], [4, 8, 1]
    seqs = [p1 + [11, 12, 13], p2 + [20], p1 + [14], p2 + [21, 22, 23, 24, 25], p1 + [11, 12, 13], p2 + [26, 27]]
    plens = [len(p1), len(p2), len(p1), len(p2), len(p1), len(p2)]
    padded, packed = forward(hf_moe, seqs), forward(hf_moe, seqs, prompt_lens=plens)
    assert torch.equal(packed.valid, padded.valid)
    assert torch.allclose(packed.logp, padded.logp, atol=1e-5, rtol=0)
    assert torch.allclose(packed.entropy, padded.entropy, atol=1e-5, rtol=0)
    assert padded.logp[padded.valid].abs().min() > 0  # real logprobs, not zeros on both sides
    g_pad, g_pack = _grads(hf_moe, padded), _grads(hf_moe, packed)
    assert g_pad.keys() == g_pack.keys()
    for name in g_pad:
        scale = float(g_pad[name].abs().max())  # embedding grads reach ~50: 1e-5 absolute is below fp32 noise
        assert torch.allclose(g_pack[name], g_pad[name], atol=1e-6 * max(scale, 1.0), rtol=1e-4), name
    with pytest.raises(ValueError, match="router"):
        forward(hf_moe, seqs, record_routing=True, prompt_lens=plens)


def test_shared_prefix_step_matches_default(quick_config, tmp_path):
    """One RL step with ``shared_prefix`` samples the same rollouts and lands on the same loss
    and gradient norm as the padded trainer forward (float reduction order apart)."""
    base = train(quick_config(steps=1, out_dir=str(tmp_path / "a"))).rows[0]
    packed = train(quick_config(steps=1, shared_prefix=True, out_dir=str(tmp_path / "b"))).rows[0]
    assert packed["reward"] == base["reward"] and packed["length"] == base["length"]
    for key in ("loss", "grad_norm", "entropy", "abs_dlogp_mean"):
        assert math.isclose(packed[key], base[key], rel_tol=1e-4, abs_tol=1e-6), (key, packed[key], base[key])


def test_trainer_attention_reaches_the_model_and_computes_the_same_step(quick_config, tmp_path):
    """``trainer_attention: eager`` loads the trainer's model with transformers' eager attention
    (what ``mlab check --train hf,attn=eager`` runs); in fp32 its step is sdpa's up to rounding."""
    from minirl.training.trainer import Trainer

    assert Trainer(quick_config(steps=1, trainer_attention="eager")).model.config._attn_implementation == "eager"
    base = train(quick_config(steps=1, out_dir=str(tmp_path / "a"))).rows[0]
    eager = train(quick_config(steps=1, trainer_attention="eager", out_dir=str(tmp_path / "b"))).rows[0]
    assert eager["reward"] == base["reward"]
    for key in ("loss", "grad_norm", "abs_dlogp_mean"):
        assert math.isclose(eager[key], base[key], rel_tol=1e-4, abs_tol=1e-6), (key, eager[key], base[key])


def test_an_engine_and_training_set_swapped_in_serve_the_steps(quick_config):
    """``trainer.engine = wrapper`` (gpu_check's flip probe, bench_rl's other side) and
    ``trainer.train_set = split`` (``labs.reproduce``'s shared split) reach the group source that
    draws the rollouts; once they were copied into it at construction and silently ignored."""
    from minirl.training.trainer import Trainer

    trainer = Trainer(quick_config(steps=1, zero_variance="filter", zero_variance_max_batches=3))
    calls = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def generate(self, prompts, params):
            calls.append(len(prompts))
            return self.inner.generate(prompts, params)

        def load_weights(self, model):
            self.inner.load_weights(model)

    trainer.engine = Counting(trainer.engine)
    shared = list(reversed(trainer.train_set))
    trainer.train_set = shared
    trainer.train_step(0)
    assert calls, "the swapped-in engine was never asked for rollouts"
    assert trainer.inputs.train_set is shared and trainer.groups.inputs.train_set is shared
