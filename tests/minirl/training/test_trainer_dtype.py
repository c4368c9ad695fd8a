"""``trainer_dtype: bfloat16``: bf16 compute over fp32 master weights, pinned against a float64
transcription of one training step on the tiny dense zoo model.

The float64 reference runs the same step (same rollouts, advantages, loss) on a float64 copy of the
starting weights; the bf16 trainer's loss and gradient must sit a bf16-sized distance from it, and
clearly further than the fp32 trainer's (so a "bf16" that silently computed in fp32 fails), and its
update must be AdamW's first step transcribed in float64 from its own fp32 gradient, landing in fp32
master weights (an update below bf16's resolution that a bf16 master would drop)."""

from __future__ import annotations

import copy

import pytest
import torch

from minirl.algorithms import advantages
from minirl.engines import load_hf
from minirl.training import resume
from minirl.training.trainer import Trainer, correct, pack, policy_loss
from minirl.training.trainer_forward import forward

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0])  # two informative groups of four
LR = 1e-5  # far below bf16's spacing at these weights' sizes: a bf16 master could not take the step


@pytest.fixture(scope="module")
def dense_path(zoo):
    return zoo("tiny-qwen3")


def _trainer(dense_path, tmp_path, dtype: str) -> Trainer:
    from minirl.training.train_config import TrainConfig

    return Trainer(TrainConfig(model=str(dense_path), sft_steps=0, task="arithmetic", task_kwargs={"digits": 1},
                               n_train=8, n_eval=2, prompts_per_step=2, group_size=4, max_new_tokens=6,
                               minibatches=1, correction="none", lr=LR, grad_clip=1e6, trainer_dtype=dtype,
                               out_dir=str(tmp_path / "run"), progress=False))


def _step(trainer: Trainer) -> tuple[list, dict[str, torch.Tensor], torch.Tensor]:
    """One ``learn`` on step 0's rollouts -> (rollouts, starting master weights, the trainer's
    logprobs of them before the update)."""
    drawn = trainer.groups.collect(0, 0)
    before = {k: v.detach().clone() for k, v in trainer.master.named_parameters()}
    with torch.no_grad():
        logp = forward(trainer.model, pack(drawn.rollouts).sequences).logp
    trainer.learn(0, drawn.rollouts, REWARDS)
    return drawn.rollouts, before, logp


def _float64_reference(trainer: Trainer, rollouts: list, before: dict[str, torch.Tensor]
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The same step on a float64 copy of the starting weights -> (its logprobs, its gradient)."""
    c = trainer.cfg
    model = copy.deepcopy(trainer.master).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(before[name])
    batch = pack(rollouts)
    adv = advantages.ADVANTAGES.call(c.advantage, c, REWARDS, c.group_size).double()
    logp = forward(model, batch.sequences).logp  # [B, L-1] float64, with grad
    mask = batch.mask.double()
    weights, mask, _ = correct(c, logp.detach(), batch.logp_infer.double(), mask)
    loss, _ = policy_loss(c, logp, logp.detach(), adv, mask, weights)
    loss.backward()
    return logp.detach(), {k: p.grad for k, p in model.named_parameters()}


def _rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[k].double() - b[k]).pow(2).sum()) for k in b)
    return (num / sum(float(b[k].pow(2).sum()) for k in b)) ** 0.5


def test_bf16_step_against_a_float64_transcription(dense_path, tmp_path):
    errors = {}
    for dtype in ("float32", "bfloat16"):
        trainer = _trainer(dense_path, tmp_path, dtype)
        rollouts, before, logp = _step(trainer)
        logp64, grad64 = _float64_reference(trainer, rollouts, before)
        grads = {k: p.grad for k, p in trainer.master.named_parameters()}
        errors[dtype] = (_rel({"logp": logp}, {"logp": logp64}), _rel(grads, grad64))
        if dtype == "bfloat16":
            b1, b2 = trainer.cfg.betas
            eps = trainer.opt.param_groups[0]["eps"]
            moved = held = total = 0
            for name, p in trainer.master.named_parameters():
                assert p.dtype == torch.float32 and grads[name].dtype == torch.float32
                state = trainer.opt.state[p]
                assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
                g = grads[name].double()  # AdamW step 1 in float64: m_hat = g, v_hat = g^2
                m_hat, v_hat = (1 - b1) * g / (1 - b1), (1 - b2) * g * g / (1 - b2)
                expected = before[name].double() - LR * m_hat / (v_hat.sqrt() + eps)
                torch.testing.assert_close(p.double(), expected, rtol=2**-22, atol=LR * 1e-3)  # fp32 rounding of w
                changed = p != before[name]
                moved += int(changed.sum())
                held += int((changed & (p.bfloat16() == before[name].bfloat16())).sum())
                total += p.numel()
                compute = dict(trainer.model.named_parameters())[name]
                assert compute.dtype == torch.bfloat16 and torch.equal(compute, p.bfloat16())  # synced
            assert moved > 0.5 * total  # the step moved most weights...
            assert held > 0.5 * moved  # ...mostly by less than bf16 can represent: the master is fp32
    logp_err, grad_err = errors["bfloat16"]
    assert 1e-4 < logp_err < 2e-2 and 1e-3 < grad_err < 5e-2, errors  # bf16-sized (2^-8 = 4e-3), not fp32's
    assert errors["float32"][0] < 1e-5 and errors["float32"][1] < 1e-4, errors


def test_bf16_compute_copy_is_what_check_train_hf_bfloat16_loads(dense_path, tmp_path):
    """The monitor and ``mlab check --train hf:bfloat16`` read a bf16 model loaded by
    ``minirl.engines.load_hf``; the trainer's compute copy is that model: same tensors, same
    buffer dtypes (RoPE's inv_freq stays fp32), same fused logprobs."""
    trainer = _trainer(dense_path, tmp_path, "bfloat16")
    ref = load_hf(dense_path, "bfloat16")
    mine = dict(trainer.model.named_buffers()) | trainer.model.state_dict()
    theirs = dict(ref.named_buffers()) | ref.state_dict()
    assert mine.keys() == theirs.keys()
    for k, v in theirs.items():
        assert mine[k].dtype == v.dtype and torch.equal(mine[k], v), k
    seqs = [[1, 5, 9, 13, 2], [3, 4, 8]]
    with torch.no_grad():
        torch.testing.assert_close(forward(trainer.model, seqs).logp, forward(ref, seqs).logp, rtol=0, atol=0)
    assert trainer.master.dtype == torch.float32 and trainer.model.dtype == torch.bfloat16


def test_bf16_checkpoint_restores_fp32_masters_and_resume_keeps_the_dtype(dense_path, tmp_path):
    trainer = _trainer(dense_path, tmp_path, "bfloat16")
    _step(trainer)
    trainer.save_checkpoint(tmp_path / "ckpt", {"step": 1})
    fresh = _trainer(dense_path, tmp_path, "bfloat16")
    fresh.load_checkpoint(tmp_path / "ckpt")
    for (name, p), q, c in zip(trainer.master.named_parameters(), fresh.master.parameters(), fresh.model.parameters()):
        assert q.dtype == torch.float32 and torch.equal(p, q), name  # not rounded through bf16
        assert torch.equal(c, q.bfloat16()), name
    with pytest.raises(ValueError, match="trainer_dtype"):
        resume.changes({"trainer_dtype": "bfloat16"}, {"trainer_dtype": "float32"}, same_model=True)
    assert trainer.cfg.to_dict()["trainer_dtype"] == "bfloat16"  # what config.yaml records


def test_a_trainer_dtype_without_a_mixed_precision_recipe_is_refused():
    from minirl.training.train_config import TrainConfig

    with pytest.raises(ValueError, match="trainer_dtype.*float32.*bfloat16.*float16"):
        TrainConfig(trainer_dtype="float64")


def test_fp16_step_sits_between_fp32_and_bf16_against_float64(dense_path, tmp_path):
    """fp16 has 10 mantissa bits to bf16's 7 (2^-11 vs 2^-8 relative spacing): its step lies
    closer to float64 than bf16's and further than fp32's; the loss scale (2^16) is divided back
    out of the fp32 master gradient, which a missing unscale would multiply by 65536."""
    errors = {}
    for dtype in ("float32", "float16", "bfloat16"):
        trainer = _trainer(dense_path, tmp_path, dtype)
        rollouts, before, logp = _step(trainer)
        logp64, grad64 = _float64_reference(trainer, rollouts, before)
        errors[dtype] = (_rel({"logp": logp}, {"logp": logp64}),
                         _rel({k: p.grad for k, p in trainer.master.named_parameters()}, grad64))
        if dtype == "float16":
            assert trainer.model.dtype == torch.float16 and trainer.master.dtype == torch.float32
            assert trainer.loss_scale.scale == 2.0**16 and trainer.loss_scale.clean_steps == 1
    assert errors["float32"][0] < errors["float16"][0] < errors["bfloat16"][0], errors
    assert errors["float32"][1] < errors["float16"][1] < errors["bfloat16"][1] < 5e-2, errors


def test_fp16_overflow_skips_the_step_and_halves_the_scale(dense_path, tmp_path):
    """A scale so large that the fp16 backward overflows: the step is skipped (weights kept, as
    any non-finite gradient is) and the scale backs off, as torch.amp.GradScaler does."""
    trainer = _trainer(dense_path, tmp_path, "float16")
    trainer.loss_scale.scale = 2.0**120  # any loss gradient times this overflows fp16 (max 65504)
    drawn = trainer.groups.collect(0, 0)
    before = {k: v.detach().clone() for k, v in trainer.master.named_parameters()}
    metrics = trainer.learn(0, drawn.rollouts, REWARDS)
    assert metrics["nan_skipped"] == 1.0 and metrics["loss_scale"] == 2.0**119
    assert all(torch.equal(p, before[k]) for k, p in trainer.master.named_parameters())
    trainer.save_checkpoint(tmp_path / "ckpt", {"step": 1})
    fresh = _trainer(dense_path, tmp_path, "float16")
    fresh.load_checkpoint(tmp_path / "ckpt")
    assert fresh.loss_scale.scale == 2.0**119  # a resume keeps the scale it had found
