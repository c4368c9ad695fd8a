"""``micro_batch_size``: gradient accumulation inside a minibatch, the loss normalised as one batch.

The update with micro-batches must be the unsplit one to fp32 rounding in every aggregation mode
(a micro-batch normalised by its own token or sequence count would scale its rows' gradients by
up to the number of micro-batches: far outside the tolerance), and peak memory must follow the
micro-batch, not the group (measured as the peak RSS of a fresh process)."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from minirl.algorithms import advantages, losses
from minirl.training.trainer import Trainer, correct, pack, policy_loss
from minirl.training.trainer_forward import forward

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])
LENGTHS = [6, 2, 5, 1, 3, 6, 4, 2]  # uneven completions: token and sequence counts differ per micro-batch


@pytest.fixture(scope="module")
def trainer(zoo, tmp_path_factory):
    from minirl.training.train_config import TrainConfig

    return Trainer(TrainConfig(model=str(zoo("tiny-qwen3")), sft_steps=0, task="arithmetic", task_kwargs={"digits": 1},
                               n_train=8, n_eval=0, prompts_per_step=2, group_size=4, max_new_tokens=6,
                               minibatches=1, correction="icepop", lr=1e-5, grad_clip=1e6, eval_every=0,
                               out_dir=str(tmp_path_factory.mktemp("micro") / "run"), progress=False))


def _update(trainer: Trainer, rollouts: list, start: tuple, **changes) -> tuple[dict, dict[str, torch.Tensor]]:
    """One ``learn`` from the ``start`` weights and optimizer state -> (metrics, the master's gradient)."""
    trainer.cfg = dataclasses.replace(trainer.cfg, **changes)
    trainer.master.load_state_dict(start[0])
    trainer.opt.load_state_dict(copy.deepcopy(start[1]))  # it steps the loaded tensors in place
    metrics = trainer.learn(0, rollouts, REWARDS)
    return metrics, {k: p.grad.clone() for k, p in trainer.master.named_parameters() if p.grad is not None}


def _float64_reference(trainer: Trainer, rollouts: list, ref32: torch.nn.Module | None
                       ) -> dict[str, tuple[float, float]]:
    """The unsplit update's logged losses transcribed in float64 -> {key: (value, bound on an fp32
    run's distance to it)}.

    Both fp32 runs compute the loss from fp32 forwards (the old-logprob pass, the update's, the
    reference model's); the split run does the update's in micro-batches, whose other shapes round
    otherwise (BLAS blocking, SIMD width), so neither run is the other's reference. The loss sums
    terms of both signs (centred advantages) to far below their size, so a bound relative to the loss
    (the old ``rel=1e-5``) measured the cancellation, not the rounding. First order, an error of at
    most ``d`` in every input logprob moves a loss by at most ``d * S``, ``S`` the sum over tokens and
    inputs of ``|dloss/dlogp|`` (central differences of this transcription); the fp32 sums add
    ``n * eps * sum|terms|`` (``sum|terms| <= S`` near ratio 1). ``d``: the fp32 forward's error
    against the float64 one, measured on the unsplit batch (this CPU's rounding), floored at one ulp
    of the largest logprob, doubled for the micro-batches' unmeasured shapes."""
    c, eps = trainer.cfg, torch.finfo(torch.float32).eps
    batch = pack(rollouts)
    mask, adv = batch.mask.double(), advantages.ADVANTAGES.call(c.advantage, c, REWARDS, c.group_size).double()
    d, logp = 0.0, {}
    for name, model32 in (("policy", trainer.master), ("ref", ref32)):
        if model32 is not None:
            model = copy.deepcopy(model32).double()
            with torch.no_grad():
                logp[name] = forward(model, batch.sequences).logp.double() * mask
                fp32 = forward(model32, batch.sequences).logp.double() * mask
            d = max(d, float((fp32 - logp[name]).abs().max()))
    d = 2 * max(d, eps * float(logp["policy"].abs().max()))
    weights, mask, _ = correct(c, logp["policy"], batch.logp_infer.double(), mask)  # as ``Trainer.learn``

    def losses_of(lp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None = None) -> dict[str, float]:
        pg, _ = policy_loss(c, lp, old, adv, mask, weights)
        if ref is None:
            return {"loss": float(pg), "pg_loss": float(pg)}
        kl, km = losses.kl_penalty(lp, ref, mask, c.kl_estimator, c.agg)
        return {"loss": float(pg + c.kl_coef * kl), "pg_loss": float(pg), **km}

    inputs = [logp["policy"], logp["policy"]] + ([logp["ref"]] if "ref" in logp else [])  # ratio exactly 1
    value, h = losses_of(*inputs), 1e-6
    sens = dict.fromkeys(value, 0.0)
    for i in range(len(inputs)):
        for t in map(tuple, mask.nonzero().tolist()):
            step = torch.zeros_like(mask)
            step[t] = h
            hi = losses_of(*(x + step if j == i else x for j, x in enumerate(inputs)))
            lo = losses_of(*(x - step if j == i else x for j, x in enumerate(inputs)))
            for k in sens:
                sens[k] += abs(hi[k] - lo[k]) / (2 * h)
    return {k: (value[k], (d + int(mask.sum()) * eps) * sens[k]) for k in value}


@pytest.mark.parametrize("loss, agg, kl_coef", [("ppo", "token-mean", 0.0), ("ppo", "seq-mean-token-mean", 0.0),
                                                 ("ppo", "seq-mean-token-sum", 0.0), ("gspo", "token-mean", 0.1)])
def test_micro_batches_give_the_unsplit_update(trainer, loss, agg, kl_coef):
    """gspo + KL: the policy term normalises per sequence (gspo's own aggregation) and the KL per
    token (``agg``), in one loss. The logged losses are held to a float64 transcription of the
    unsplit update (``_float64_reference``), not to each other's bits."""
    drawn = trainer.groups.collect(0, 0)
    rollouts = [dataclasses.replace(r, token_ids=list(r.token_ids)[:n], logprobs=list(r.logprobs)[:n])
                for r, n in zip(drawn.rollouts, LENGTHS)]
    start = copy.deepcopy((trainer.master.state_dict(), trainer.opt.state_dict()))
    if kl_coef:
        trainer.ref = copy.deepcopy(trainer.master).eval().requires_grad_(False)
        with torch.no_grad():  # move the policy off the reference, so the KL term has a gradient
            for w in trainer.master.parameters():
                w.add_(0.01 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
        start = copy.deepcopy((trainer.master.state_dict(), trainer.opt.state_dict()))
    try:
        whole, g_whole = _update(trainer, rollouts, start, loss=loss, agg=agg, kl_coef=kl_coef, micro_batch_size=0)
        after = {k: v.clone() for k, v in trainer.master.state_dict().items()}
        split, g_split = _update(trainer, rollouts, start, loss=loss, agg=agg, kl_coef=kl_coef, micro_batch_size=3)
        stepped = {k: v.clone() for k, v in trainer.master.state_dict().items()}
        trainer.master.load_state_dict(start[0])
        reference = _float64_reference(trainer, rollouts, trainer.ref)  # from the start weights
    finally:
        trainer.ref = None
        trainer.master.load_state_dict(start[0])
    assert g_whole.keys() == g_split.keys() and g_whole
    num = sum(float((g_split[k] - g_whole[k]).double().pow(2).sum()) for k in g_whole)
    den = sum(float(g_whole[k].double().pow(2).sum()) for k in g_whole)
    assert den > 0 and (num / den) ** 0.5 < 1e-5  # fp32 rounding of a different summation order
    for k, g in g_whole.items():  # the same AdamW step where the gradient is signal: step 1 is ~lr * sign(g),
        real = g.abs() > 1e-4 * g.abs().max()  # so rounding noise in a ~0 entry moves it by +-lr either way
        torch.testing.assert_close(stepped[k][real], after[k][real], rtol=1e-6, atol=1e-9)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)  # a norm: no cancellation
    for key, (value, bound) in reference.items():
        for run in (whole, split):
            assert abs(run[key] - value) <= bound, (key, run[key], value, bound)


PEAK = r"""
import ctypes, dataclasses, json, re, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from minirl.training.train_config import TrainConfig
from minirl.training.trainer import Batch, Trainer

class NoEngine:  # the update alone is measured: no rollout engine to build
    def load_weights(self, model):
        pass

t = Trainer(TrainConfig(model=sys.argv[1], sft_steps=0, task="arithmetic", n_train=8, n_eval=0, prompts_per_step=1,
                        group_size=8, minibatches=1, correction="none", eval_every=0, out_dir=sys.argv[2],
                        progress=False), NoEngine())
g = torch.Generator().manual_seed(0)

def kb(field):
    return int(re.search(field + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1))

def update(rows, micro):
    t.cfg = dataclasses.replace(t.cfg, micro_batch_size=micro)
    seqs = torch.randint(0, 512, (rows, 96), generator=g).tolist()
    mask = torch.ones(rows, 95)
    mask[:, :8] = 0
    batch = Batch(seqs, mask, torch.zeros(rows, 95), None, [8] * rows)
    adv = torch.randn(rows, generator=g)
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the OS, then the peak mark reset to now
    Path("/proc/self/clear_refs").write_text("5")
    before = kb("VmRSS")
    t._update(0, batch, adv, torch.zeros(rows, 95), mask.clone(), mask, None, None)
    return (kb("VmHWM") - before) / 1024  # MiB: the update's peak over the RSS it started from

print(json.dumps([update(8, 4), update(8, 4), update(32, 4), update(32, 0)]))
"""


def test_peak_memory_follows_the_micro_batch_not_the_group(zoo, tmp_path):
    """Peak RSS growth of one update (Linux VmHWM, reset before each, over the RSS it starts from):
    8 rows then 32 with micro-batches of 4 rows (flat), then 32 unsplit (the control: the same rows
    in one forward do raise it)."""
    out = subprocess.run([sys.executable, "-c", PEAK, str(zoo("tiny-qwen3")), str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, check=True)
    _, small, large, unsplit = json.loads(out.stdout.strip().splitlines()[-1])
    assert unsplit - large > 80, (small, large, unsplit)  # the control (measured +168 MiB): 32 rows at once
    assert large - small < 0.1 * (unsplit - large), (small, large, unsplit)


def test_every_arm_logs_the_band_share_and_the_largest_minibatch_norm(trainer):
    """``icepop_band_out`` without a correction is the share IcePop masks on the same rollouts (its
    ``frac_masked``); ``grad_norm_max`` is at least the minibatches' mean norm; ``abs_dprob_mean``
    lies between 0 and ``abs_dprob_max``."""
    drawn = trainer.groups.collect(0, 0)
    # a mismatch some tokens leave the band by: the engine's logprob of every other token lowered by 2
    # nats (rho = e^2 > 5), the rest as sampled
    rollouts = [dataclasses.replace(r, logprobs=[lp - 2.0 * (t % 2) for t, lp in enumerate(r.logprobs)])
                for r in drawn.rollouts]
    start = copy.deepcopy((trainer.master.state_dict(), trainer.opt.state_dict()))
    try:
        none, _ = _update(trainer, rollouts, start, correction="none", minibatches=2, micro_batch_size=0)
        ice, _ = _update(trainer, rollouts, start, correction="icepop", minibatches=2)
    finally:
        trainer.master.load_state_dict(start[0])
        trainer.cfg = dataclasses.replace(trainer.cfg, minibatches=1)
    assert 0 < none["icepop_band_out"] == ice["icepop_band_out"] == ice["frac_masked"] < 1
    assert none["frac_masked"] == 0.0  # no correction masks nothing, yet the band share is logged
    assert none["grad_norm_max"] >= none["grad_norm"] > 0
    assert 0 < none["abs_dprob_mean"] <= none["abs_dprob_max"]


def test_micro_batches_with_espo_and_a_negative_size_are_refused():
    from minirl.training.train_config import TrainConfig

    with pytest.raises(ValueError, match="micro_batch_size=2 with loss: espo"):
        TrainConfig(micro_batch_size=2, loss="espo", correction="none")
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainConfig(micro_batch_size=-1)
