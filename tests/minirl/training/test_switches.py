"""Every algorithm switch runs end to end from the YAML a user types (``configs/*.yaml``, at tiny
size), refused combinations fail before a model loads, and the trainer's numbers for the new
switches match their reference formulas."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

import minirl
from labs import cli
from minirl import tasks
from minirl.training import combinations
from minirl.algorithms import losses
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import policy_loss, reshape

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TINY = dict(sft_steps=0, n_train=8, n_eval=0, prompts_per_step=2, group_size=4, max_new_tokens=4, steps=2,
            minibatches=1, eval_every=0, checkpoint_every=0, progress=False)


class MixedRewards:
    """Arithmetic prompts rewarded by the parity of the completion: mixed rewards from the untrained
    tiny model, so every group has signal. On arithmetic itself it never answers right, every
    advantage is 0, and the update's forward (where a loss's own metrics come from) is skipped."""

    name = "mixed_rewards"

    def __init__(self, **_):
        self.inner = tasks.get("arithmetic", digits=1)

    def sample(self, rng):
        return self.inner.sample(rng)

    def verify(self, problem, completion):
        return float(sum(map(ord, completion)) % 2 == 0)


tasks.register("mixed_rewards", MixedRewards)
SIGNAL = dict(task="mixed_rewards", task_kwargs={})
SMALLER = {  # per file: what else has to shrink for a seconds-long run
    "gspo": SIGNAL, "espo": SIGNAL,  # their metrics are the loss's: measured only where it runs
    "c3po": dict(c3po_token_budget=8, c3po_chunk_tokens=4),
    "python_tool_roc": dict(max_new_tokens=16, steps=1),
    "zero_variance_filter": dict(zero_variance_max_batches=2),
}
EXPECT = {  # per file: metrics only that switch produces
    "grpo_icepop": {"frac_masked"}, "tis": {"ess"}, "mis": {"frac_masked"}, "gspo": {"ratio_mean"},
    "espo": {"espo_groups_per_seq", "espo_eps_mean"}, "zero_variance_filter": {"zero_variance_batches"},
    "zero_variance_reshape": {"zero_variance_smoothed", "group_size"}, "c3po": {"c3po_trained_groups"},
    "async": {"staleness_max", "samples_per_s"}, "ray": {"staleness_max", "samples_per_s"},
    "python_tool_roc": {"tool_calls", "tool_error_ratio"}, "router_replay_r3": {"abs_dlogp_max"},
}


def test_every_seed_experiment_has_its_config_file():
    """One example per seed experiment (other files under configs/ are run by their own tests)."""
    assert set(EXPECT) <= {p.stem for p in CONFIGS.glob("*.yaml")}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "ray" else n for n in sorted(EXPECT)])
def test_config_runs(name, zoo, tmp_path, request):
    """``minirl.train(dict)`` on the file's own keys, sizes shrunk; the switch's metrics are logged.
    ``ray`` is marked slow: a local Ray cluster alone takes 30-60 s to start on 2 loaded cores
    (the default run covers ray mode in tests/minirl/scale_out/test_ray_mode.py)."""
    text = (CONFIGS / f"{name}.yaml").read_text()
    values = yaml.safe_load(text)
    model = "tiny-qwen3-moe" if "tiny-qwen3-moe" in text else "tiny-qwen3"  # the model its header names
    values.update(TINY, **SMALLER.get(name, {}), model=str(zoo(model)),
                  out_dir=str(tmp_path / name))
    if name == "ray":
        ray = pytest.importorskip("ray")
        request.addfinalizer(ray.shutdown)  # the run starts a local cluster; other tests start their own
    result = minirl.train(values)
    assert [r["step"] for r in result.rows] == list(range(values["steps"]))
    assert result.log_path.exists()
    missing = EXPECT[name] - set(result.rows[-1])
    assert not missing, f"{name}: no {missing} in the log"
    unmeasured = {k for k in EXPECT[name] if not any(math.isfinite(r[k]) for r in result.rows if k in r)}
    assert not unmeasured, f"{name}: {unmeasured} logged but never measured"
    assert all(r["nan_skipped"] == 0 for r in result.rows)


def test_cli_runs_a_config_file(zoo, tmp_path, capsys):
    """``mlab train --config configs/gspo.yaml --set ...``: the command a user types."""
    sets = [f"{k}={v}" for k, v in {**TINY, "steps": 1, "model": zoo("tiny-qwen3-moe"),
                                    "out_dir": tmp_path / "gspo"}.items()]
    assert cli.main(["train", "--config", str(CONFIGS / "gspo.yaml"), *(a for s in sets for a in ("--set", s))]) == 0
    assert "done: 1 steps" in capsys.readouterr().out


class ToolWritingEngine:
    """A rollout engine whose completions are written here: a python call for the problem's
    expression, then the tool's printed result as the answer. It checks the plumbing around
    the model (sandbox, responses, masks, RoC), not what a model learns."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            context = self.tok.decode(p, skip_special_tokens=True).split("Problem:")[1]
            a, b, c = re.search(r"compute (\d+) \* (\d+) \+ (\d+)", context).groups()
            response = re.findall(r"<tool_response>(.*?)</tool_response>", context, re.S)
            call = json.dumps({"name": "python", "arguments": {"code": f"print({a} * {b} + {c})"}})
            text = f"<answer>{response[-1].strip()}</answer>" if response else f"<tool_call>{call}</tool_call>"
            ids = self.tok(text)["input_ids"]
            out.append(minirl.Rollout(list(p), ids, torch.full((len(ids),), -1.0), "stop"))
        return out

    def load_weights(self, model) -> None:
        pass


def test_python_tool_runs_the_written_calls_in_the_sandbox(zoo, tmp_path):
    """Every trajectory's call runs in ``minirl.sandbox`` and its printed value comes back: all
    answers right (training and held-out), no tool errors, tool-response tokens out of the loss."""
    import transformers

    from minirl.training.trainer import Trainer, pack

    values = yaml.safe_load((CONFIGS / "python_tool_roc.yaml").read_text())
    values.update(TINY, steps=1, n_eval=2, model=str(zoo("tiny-qwen3")), out_dir=str(tmp_path / "t"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(values["model"])
    trainer = Trainer(TrainConfig(**values), ToolWritingEngine(tokenizer))
    drawn = trainer.groups.collect(0, seed=0)
    assert drawn.metrics["tool_calls"] == 1.0 and drawn.metrics["tool_error_ratio"] == 0.0
    assert drawn.rewards.tolist() == [1.0] * TINY["prompts_per_step"] * TINY["group_size"]  # G kept of 2G
    t = drawn.rollouts[0]
    assert 0 < sum(t.loss_mask) < len(t.loss_mask)  # model turns train, the tool's response does not
    batch = pack([t])
    assert batch.mask[0].sum() == sum(t.loss_mask)
    assert math.isfinite(trainer.train_step(0)["loss"])
    assert trainer.evaluate() == 1.0  # held-out problems are solved multi-turn too, not single-turn


@pytest.mark.slow  # the task SFT that teaches the tiny model the call format takes minutes on 2 cores
def test_python_tool_model_writes_its_own_tool_calls(zoo, tmp_path):
    """After the task SFT (``sft_steps`` of the config) the model itself writes ``<tool_call>``."""
    values = yaml.safe_load((CONFIGS / "python_tool_roc.yaml").read_text())
    values.update(TINY, steps=1, max_new_tokens=values["max_new_tokens"], sft_steps=values["sft_steps"],
                  model=str(zoo("tiny-qwen3")), out_dir=str(tmp_path / "t"))
    row = minirl.train(values).rows[0]
    assert row["tool_calls"] > 0  # mean calls per sampled trajectory


@pytest.mark.parametrize("changes, match", [
    (dict(loss="espo"), "correction: none"),
    (dict(rollout="c3po", mode="async"), "mode: sync with rollout: c3po"),
    (dict(rollout="c3po", router_replay="r3"), "r2 or none"),
    (dict(mode="ray", zero_variance="filter"), "mode: sync"),
    (dict(task="python_tool", mode="async"), "mode: sync"),
    (dict(downsample="roc"), "task: python_tool"),
    (dict(task="python_tool", router_replay="r3"), "router_replay: r2"),
    (dict(zero_variance="reshape", old_logprobs="bypass"), "old_logprobs: recompute"),
    (dict(router_replay="r2", old_logprobs="bypass"), "router_replay: r3"),
    (dict(shared_prefix=True, router_replay="r3"), "set shared_prefix: false"),
    (dict(adaptive_group=True, group_size=8, adaptive_group_max=4), "adaptive_group_max"),
    (dict(mode="fast"), "valid: sync, async, ray"),
    (dict(zero_variance="drop"), "valid: none, filter, reshape"),
    (dict(max_staleness=-1), "max_staleness"),
])
def test_refused_before_a_model_loads(changes, match):
    """No model path is given: the refusal must come from the config alone."""
    with pytest.raises(ValueError, match=match):
        TrainConfig(**changes)


def test_each_rule_refuses_and_docs_show_the_table():
    """docs/rl.md carries ``combinations.markdown()`` verbatim, so the table cannot drift."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "rl.md").read_text()
    table = doc.split("<!-- combinations:start -->\n")[1].split("<!-- combinations:end -->")[0]
    assert table == combinations.markdown()
    assert len(combinations.RULES) == table.count("\n") - 2


def _seqs(lengths: list[int], adv: list[float]) -> tuple:
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths], dtype=torch.float64)
    logp = torch.full_like(mask, -1.0, requires_grad=True)
    return logp, logp.detach().clone(), torch.tensor(adv, dtype=torch.float64), mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gspo_in_the_trainer_is_a_mean_over_sequences(agg):
    """Issue finding 1: lengths 1 and 3, advantages +1 and -1, on-policy (s = 1). GSPO's objective
    is mean_i(s_i A_i) = 0, ``gspo_loss``'s default; token-mean would give -(1 - 3)/4 = 0.5."""
    logp, old, adv, mask = _seqs([1, 3], [1.0, -1.0])
    loss, _ = policy_loss(TrainConfig(loss="gspo", agg=agg), logp, old, adv, mask, torch.ones_like(mask))
    reference, _ = losses.gspo_loss(logp, old, adv, mask)
    loss, reference = float(loss.detach()), float(reference.detach())
    assert loss == pytest.approx(reference, abs=1e-12) and loss == pytest.approx(0.0, abs=1e-12)
    token_mean = losses.ppo_clip_loss(logp, old, adv, mask, agg="token-mean")[0]
    assert float(token_mean.detach()) == pytest.approx(0.5)  # the number the trainer gave before the fix


def test_espo_in_the_trainer_is_espo_loss():
    """``loss: espo`` passes the config's ESPO options and pi_old's entropy through unchanged."""
    logp, old, adv, mask = _seqs([2, 3], [1.0, -1.0])
    with torch.no_grad():
        logp += torch.tensor([[0.1, -0.2, 0.0], [0.3, 0.05, -0.1]], dtype=torch.float64)
    entropy = torch.tensor([[0.5, 2.0, 0.0], [1.0, 0.2, 3.0]], dtype=torch.float64)
    c = TrainConfig(loss="espo", correction="none", espo_top_fraction=0.5, espo_alpha=0.3)
    loss, m = policy_loss(c, logp, old, adv, mask, torch.ones_like(mask), entropy, 16)
    ref, _ = minirl.algorithms.espo.espo_loss(logp, old, adv, entropy, mask, 16,
                                   minirl.algorithms.espo.EspoConfig(top_fraction=0.5, alpha=0.3))
    assert float(loss.detach()) == float(ref.detach()) == m["pg_loss"] and "espo_clip_frac" in m


def test_reshape_changes_only_zero_variance_groups():
    """RL-ZVP by hand: an all-correct group gets +α·H per token, a mixed group keeps its A."""
    adv = torch.tensor([0.0, 0.0, 0.7, -0.7])
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    entropy = torch.tensor([[0.5, 1.0], [2.0, 0.0], [1.0, 1.0], [3.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    out = reshape(adv, rewards, entropy, mask, group_size=2, alpha=0.1)
    assert torch.allclose(out[:2], torch.tensor([[0.05, 0.1], [0.2, 0.0]]))
    assert torch.equal(out[2:], torch.tensor([[0.7, 0.7], [-0.7, -0.7]]))
    assert math.isclose(float(out[1, 1]), 0.0)  # padding carries no advantage


def test_adaptive_group_size_resumes_from_the_logged_rates():
    """A resumed run rebuilds N from the rates in its log: the same N as the uninterrupted run."""
    from minirl.algorithms.zero_variance import ZeroVarianceMonitor

    steps = [[[1, 1], [0, 1]]] + [[[0, 1], [1, 0]]] * 3  # rates 0.5, 0, 0, 0: smoothed .5, .25, .125, .0625
    live = ZeroVarianceMonitor(n=4, n_min=4, n_max=32)
    rows = [live.update(groups) for groups in steps]
    resumed = ZeroVarianceMonitor(n=4, n_min=4, n_max=32)
    resumed.replay([r["zero_variance_rate"] for r in rows])
    assert [r["group_size"] for r in rows] == [4, 8, 8, 8]  # > 0.3 grows N, < 0.1 shrinks it
    assert resumed.n == live.n == 4
