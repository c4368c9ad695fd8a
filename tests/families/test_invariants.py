"""The invariants (aligntools/invariants.py) hold on every family the lab reads right, and refuse,
by name and with the size of the miss, every reading that is wrong: a family entry removed, a
scale the entry does not read, an engine capture whose layer output is misread."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from aligntools.invariants import InvariantError, prove_capture, prove_model, prove_reading, prove_trainer
from aligntools.tracker.tracker import capture
from minirl import families as fam
from minirl.engines import load_hf
from tests.families import tiny
from tests.families.conftest import families

#: Families outside the table (tiny.OUTSIDE) and the invariant each fails as the lab reads it
#: today (None: every invariant holds). docs/models.md's second table lists the same.
OUTSIDE_EXPECTED: dict[str, str | None] = {
    "gpt2": "embed_site", "bloom": "embed_site", "opt": "embed_site", "falcon": None,
    "exaone4": None, "falcon_h1": None, "granitemoeshared": None, "granitemoehybrid": None, "cohere2_moe": None, "nemotron": None,
    "apertus": None, "ernie4_5": None, "ministral3": None, "internlm3": None, "phi": "embed_site", "olmo": None,
    "hunyuan_v1_dense": None, "lfm2": "embed_site", "ernie4_5_moe": None, "glm4_moe": None, "exaone_moe": None,
    "llama4_text": "trainer_logprobs", "falcon_mamba": "embed_site", "nemotron_h": "embed_site",
}
FAST_OUTSIDE = ("falcon_h1", "gpt2", "exaone4")


def test_every_outside_family_has_an_expectation():
    assert set(OUTSIDE_EXPECTED) == set(tiny.OUTSIDE)


@pytest.mark.parametrize("model_type", families())
def test_every_family_of_the_table_proves_its_invariants(model_type, family_checkpoint):
    proof = prove_model(load_hf(family_checkpoint(model_type), "float32"))
    assert proof.has_entry and proof.holds, proof.line()
    assert [c.name for c in proof.checks] == ["trainer_logprobs", "logits_site", "embed_site", "final_chain"]


@pytest.mark.parametrize("model_type", [pytest.param(f, marks=() if f in FAST_OUTSIDE else pytest.mark.slow)
                                        for f in OUTSIDE_EXPECTED])
def test_outside_families_hold_or_are_refused_by_the_invariant_they_fail(model_type, family_checkpoint):
    proof = prove_model(load_hf(family_checkpoint(model_type), "float32"))
    failing = next((c.name for c in proof.checks if not c.holds), None)
    assert failing == OUTSIDE_EXPECTED[model_type], proof.line()
    if failing is None:
        assert proof.require() is proof
    else:
        with pytest.raises(InvariantError, match=rf"^{model_type} on transformers: .*(not proved|differ)"):
            proof.require()


def _without_entry(monkeypatch, model_type: str) -> None:
    monkeypatch.setattr(fam, "FAMILIES", {k: v for k, v in fam.FAMILIES.items() if k != model_type})


def test_falcon_h1_without_its_entry_is_refused_naming_the_multiplier_and_the_miss(family_checkpoint, monkeypatch):
    """The issue's case: lm_head_multiplier ignored. Its size is what log_softmax(z/2) vs
    log_softmax(z) gives on the probe batch, measured here in float64 as the reference."""
    model = load_hf(family_checkpoint("falcon_h1"), "float32")
    assert model.config.lm_head_multiplier == 0.5
    ids = torch.randint(3, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        z = model(ids).logits.double()  # already times 0.5
    gather = lambda lp: lp[:, :-1].gather(2, ids[:, 1:, None])[..., 0]  # noqa: E731
    expected = float((gather(torch.log_softmax(z, -1)) - gather(torch.log_softmax(z / 0.5, -1))).abs().max())
    _without_entry(monkeypatch, "falcon_h1")
    with pytest.raises(InvariantError) as err:
        prove_trainer(model)
    message = str(err.value)
    assert message.startswith("falcon_h1 on transformers: the trainer's log-probs differ from the model's own forward by")
    assert "`lm_head_multiplier` = 0.5" in message and "no `Family` entry" in message
    miss = float(message.split("forward by ")[1].split(" nats")[0])
    assert miss == pytest.approx(expected, rel=1e-2) and miss > 1e-2


def test_an_entry_that_forgets_a_scale_is_refused_at_every_invariant_it_breaks(family_checkpoint, monkeypatch):
    """Granite with its logits_scaling dropped from the entry: the trainer and the logits site
    both read lm_head's raw output, so both are refused (the embed site still holds)."""
    monkeypatch.setitem(fam.FAMILIES, "granite", dataclasses.replace(fam.FAMILIES["granite"], logits_divide_attr=None))
    proof = prove_model(load_hf(family_checkpoint("granite"), "float32"))
    failed = {c.name for c in proof.checks if not c.holds}
    assert failed == {"trainer_logprobs", "logits_site", "final_chain"}
    with pytest.raises(InvariantError, match="its entry does not read `logits_scaling` = 8.0"):
        proof.require()


def test_an_unknown_family_that_holds_is_named_as_such(family_checkpoint):
    proof = prove_model(load_hf(family_checkpoint("olmo"), "float32"))
    assert not proof.has_entry and proof.holds
    assert proof.line().startswith("family olmo (no entry, on transformers): invariants hold")


def test_an_engine_capture_that_reads_a_layer_sum_as_a_delta_is_refused(zoo):
    """The exaone4 case on the engine side: a last ``resid_post`` that holds the residual twice
    (``hidden + residual`` read as a delta, then the residual added again)."""
    model = load_hf(zoo("tiny-llama"), "float32")
    ids = torch.randint(3, 500, (2, 10), generator=torch.Generator().manual_seed(2))
    cap = capture(model, ids, progress=False)
    assert prove_capture(cap, model, where="engine").require().checks[0].miss < 1e-6
    last = max((s for s in cap.sites if s.endswith("resid_post")), key=lambda s: int(s[1:s.index(".")]))
    layer = last.split(".")[0]
    cap.dataset[last] = cap.dataset[last] + cap.dataset[f"{layer}.resid_mid"]
    proof = prove_capture(cap, model, where="vllm:bfloat16")
    assert proof.checks[0].miss > 2 * proof.checks[0].limit
    with pytest.raises(InvariantError, match=r"on vllm:bfloat16: the engine's last `resid_post` through the final "
                                             r"norm differs from its `final_norm` site"):
        proof.require()


def test_bf16_limits_follow_the_dtype(zoo):
    """A correct reading in bf16 holds within the 16-bit limits (rounding, not a misreading)."""
    proof = prove_model(load_hf(zoo("tiny-llama"), "bfloat16"))
    assert proof.holds, proof.line()
    assert max(c.miss for c in proof.checks) > 0  # bf16 rounding shows; the limit is what lets it pass


def test_a_site_far_off_while_the_log_probs_agree_is_a_misreading_not_a_verdict(zoo):
    model = load_hf(zoo("tiny-llama"), "float32")
    sites = {"L0.resid_mid": 4e-3, "L1.resid_post": 0.858, "logits": 5e-3}
    with pytest.raises(InvariantError, match=r"llama on vllm:bfloat16: the worst compared site is off the training "
                                             r"engine while the final log-probs agree by 0.858 rel. L2 .*reads "
                                             r"L1.resid_post wrongly"):
        prove_reading(model, sites, logprobs_agree=True, where="vllm:bfloat16").require()
    assert prove_reading(model, sites, logprobs_agree=False, where="vllm:bfloat16").holds  # a real mismatch: a verdict
    assert prove_reading(model, {**sites, "L1.resid_post": 6e-3}, logprobs_agree=True, where="x").holds


def test_mlab_check_and_mlab_train_refuse_a_family_read_wrongly(family_checkpoint, monkeypatch, tmp_path, capsys):
    """From the commands a user types: exit 2 and the refusal, never a verdict or a run."""
    from labs.cli import main

    path = family_checkpoint("falcon_h1")
    _without_entry(monkeypatch, "falcon_h1")
    assert main(["check", "--model", str(path), "--tokens", "16", "--infer", "minirl:aligned"]) == 2
    err = capsys.readouterr().err
    assert "falcon_h1 on transformers: the trainer's log-probs differ from the model's own forward by" in err
    config = tmp_path / "rl.yaml"
    config.write_text(f"task: arithmetic\nsft_steps: 0\nn_train: 8\nn_eval: 0\nprompts_per_step: 2\ngroup_size: 2\n"
                      f"max_new_tokens: 4\nsteps: 1\nprogress: false\nmodel: {path}\nout_dir: {tmp_path / 'run'}\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "`lm_head_multiplier` = 0.5, which no `Family` entry reads" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.nc").exists()


def test_capturing_a_model_without_an_entry_says_its_sites_are_unproved(family_checkpoint, zoo):
    ids = torch.randint(3, 500, (1, 6), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"olmo: no `Family` entry .*prove_model\(model\).require\(\)"):
        capture(load_hf(family_checkpoint("olmo"), "float32"), ids, progress=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prove_model(load_hf(family_checkpoint("olmo"), "float32"))  # the proof itself does not warn
        capture(load_hf(zoo("tiny-llama"), "float32"), ids, progress=False)  # an entry: nothing to say


def test_a_proved_checkpoint_is_not_probed_again_unless_it_or_its_entry_changes(family_checkpoint, monkeypatch):
    from minirl import invariants

    path = family_checkpoint("falcon_h1")
    calls = []
    real = invariants.probe_forward
    monkeypatch.setattr(invariants, "probe_forward", lambda *a: calls.append(1) or real(*a))
    model = load_hf(path, "float32")
    prove_trainer(model)
    prove_trainer(load_hf(path, "float32"))
    assert len(calls) <= 1  # the second load of the same files under the same entry: cached
    _without_entry(monkeypatch, "falcon_h1")
    with pytest.raises(InvariantError):
        prove_trainer(model)  # another entry: probed again, and refused


def test_a_weight_sync_that_moves_the_engine_refuses_the_run(zoo):
    """``prove_sync`` asks the engine for its drift across a no-op sync on the probe batch (real
    vLLM measures it: tests/families/test_vllm_weight_sync.py); any drift refuses."""
    from aligntools.invariants import prove_sync

    model = load_hf(zoo("tiny-llama"), "float32")
    seen = []

    class Engine:
        def __init__(self, drift):
            self.drift = drift

        def sync_drift(self, m, ids):
            seen.append((m, tuple(ids.shape)))
            return self.drift

    assert prove_sync(Engine(0.0), model).holds and seen == [(model, (2, 12))]
    with pytest.raises(InvariantError, match=r"llama on Engine: the engine's log-probs move across a weight sync of "
                                             r"the weights it already serves by 1.23 nats"):
        prove_sync(Engine(1.23), model)
    assert prove_sync(object(), model) is None  # an engine that cannot measure it


def test_the_trainer_computes_without_dropout(family_checkpoint, tmp_path):
    """Seed-OSS ships ``residual_dropout: 0.1``: a trainer left in train mode scored every token
    with dropout (0.33 nats off the model's forward), which the trainer invariant refused. The
    trainer computes in eval mode, so its log-probs are the policy's and repeat exactly."""
    from minirl.training.trainer import Trainer
    from minirl.training.trainer_forward import trainer_logprobs
    from minirl.training.train_config import TrainConfig

    path = family_checkpoint("seed_oss")
    assert load_hf(path, "float32").config.residual_dropout == 0.1
    trainer = Trainer(TrainConfig(model=str(path), sft_steps=0, task="arithmetic", n_train=4, n_eval=0,
                                  engine="minirl:aligned", out_dir=str(tmp_path / "run"), progress=False))
    assert not trainer.master.training and not trainer.model.training
    seq = [[5, 9, 13, 2, 7, 30, 41]]
    assert torch.equal(trainer_logprobs(trainer.model, seq)[0], trainer_logprobs(trainer.model, seq)[0])
