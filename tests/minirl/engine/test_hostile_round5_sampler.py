"""Hostile inputs, round 5 (issue 65 item 1), the sampler: a non-finite logit is a finding about the
model, not a crash. A row holding NaN or +inf, or with no token of positive mass, fails the step with
``NonFiniteLogitsError`` (a ValueError: one line, exit 2 at the CLI) naming the rows and what is
wrong, never an IndexError from ``inverse_cdf`` nor token 0 with a NaN logprob; the whole batch
fails, since RL needs every rollout sound. A +inf logit is refused too (at every temperature): it
is an overflow, and the trainer's log_softmax of the same logits is NaN. ``SamplingParams`` refuses
a temperature or top_p that float32, where the sampler computes, cannot hold. Each test is named by
its round-5 case id (SM: ``sample`` / ``SamplingParams``, EG: ``Engine.generate``) and says its input;
the rule they check is docs/engine.md's "Non-finite logits" paragraph."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from minirl import Engine
from minirl.engine.checkpoint import read_config, read_safetensors
from minirl.engine.sampling import NonFiniteLogitsError, SamplingParams, sample

NAN, INF = float("nan"), float("inf")
TINY = torch.finfo(torch.float32).tiny
MODEL_FIX = r"check its weights \(e\.g\. `mlab check`\) or lower the learning rate"
LM_HEAD, Q_PROJ = "lm_head.weight", "model.layers.0.self_attn.q_proj.weight"


def _logits(b: int = 4, v: int = 3000) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(0)) * 3


def _sample(z: torch.Tensor, **params) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    return sample(z, SamplingParams(**params), 0, torch.arange(z.shape[0]), 0)


def _refused(z: torch.Tensor, match: str, **params) -> str:
    """The refusal's message; ``pytest.raises`` fails on any other exception (IndexError included)."""
    with pytest.raises(NonFiniteLogitsError, match=match) as e:
        _sample(z, **params)
    return str(e.value)


def test_SM01_one_nan_in_a_row_is_refused_by_name():
    z = _logits()
    z[1, 1234] = NAN
    msg = _refused(z, r"sampling step 0: the logits of rows \[1\] are not finite \(NaN\)")
    assert "rows [0" not in msg and "[2" not in msg  # only the broken row is named
    assert "the model produced NaN/inf" in msg
    assert issubclass(NonFiniteLogitsError, ValueError)  # the CLI reports it as one line, exit 2


def test_SM01_rows_are_named_by_rollout_id():
    """``rows`` are the rollout ids (what ``Engine.generate`` passes), so they name the rollouts."""
    z = _logits()
    z[1, 5] = NAN
    with pytest.raises(NonFiniteLogitsError, match=r"step 7: the logits of rows \[41\] are not finite \(NaN\)"):
        sample(z, SamplingParams(), 0, torch.tensor([40, 41, 42, 43]), 7)


def test_SM02_an_all_nan_row_is_refused_by_name():
    z = _logits()
    z[2] = NAN
    _refused(z, r"rows \[2\] are not finite \(NaN\): the model produced NaN/inf: " + MODEL_FIX)


def test_SM03_an_all_minus_inf_row_is_refused_no_token_has_mass():
    z = _logits()
    z[0] = -INF
    _refused(z, r"rows \[0\] are all -inf \(no token has mass\)")


def test_SM03_minus_inf_beside_a_finite_logit_is_a_mask_not_a_finding():
    z = torch.full((2, 3000), -INF)
    z[0, 2999], z[1, 1024] = 0.5, -3.0
    for temperature in (1.0, 0.7, 0.0):
        tokens, raw, _ = _sample(z, temperature=temperature, top_p=0.9, top_k=5)
        assert tokens.tolist() == [2999, 1024] and raw.tolist() == [0.0, 0.0]


def test_SM04_a_plus_inf_logit_is_refused_naming_inf():
    z = _logits()
    z[3, 77] = INF
    _refused(z, r"rows \[3\] are not finite \(\+inf, an overflow\)")


def test_SM05_a_plus_inf_logit_is_refused_when_greedy_too():
    """The choice: refused at every temperature (one rule), not the inf token with a NaN logprob."""
    z = _logits()
    z[3, 77] = INF
    _refused(z, r"rows \[3\] are not finite \(\+inf", temperature=0)


def test_SM06_an_all_nan_row_is_refused_when_greedy_not_token_0():
    z = _logits()
    z[1] = NAN
    _refused(z, r"rows \[1\] are not finite \(NaN\)", temperature=0)


def test_SM01_to_SM04_every_broken_row_is_named_with_its_reason():
    z = _logits(5)
    z[1, 3], z[2], z[3, 9], z[4] = NAN, -INF, INF, NAN
    msg = _refused(z, "NaN")
    for part in ("rows [1, 4] are not finite (NaN)", "rows [2] are all -inf", "rows [3] are not finite (+inf"):
        assert part in msg


@pytest.mark.parametrize("temperature", [1e-38, 1e-45])
def test_SM08_a_temperature_below_float32s_range_is_refused(temperature):
    with pytest.raises(ValueError, match=rf"temperature={temperature!r} is outside float32's range.*0 for greedy"):
        SamplingParams(temperature=temperature)
    SamplingParams(temperature=TINY)  # the smallest normal float32 is accepted


def test_SM08_a_temperature_that_overflows_a_row_is_refused_naming_it():
    """Finite logits / a small (valid) temperature can exceed float32: named, with its fix."""
    z = _logits(2)
    z[1, 0] = 1e36
    _refused(z, r"rows \[1\] overflow float32 once divided by temperature=0\.001 \(largest logit 1e\+36\): "
                r"raise the temperature, or use 0 for greedy", temperature=0.001)


def test_SM10_a_top_p_below_float32s_smallest_is_refused_naming_top_p():
    with pytest.raises(ValueError, match=r"top_p=1e-300 is below float32's smallest normal number"):
        SamplingParams(top_p=1e-300)
    tokens, _, processed = _sample(_logits(), top_p=TINY, return_processed_logprobs=True)
    assert tokens.tolist() == _logits().argmax(-1).tolist()  # the smallest valid top_p keeps the top token
    assert processed.tolist() == [0.0] * 4


@pytest.mark.parametrize("top_p, message", [(0.0, r"top_p=0\.0 outside \(0, 1\]"), (-1e-300, "top_p=-1e-300 outside"),
                                            (1e-40, "top_p=1e-40 is below float32's smallest")])
def test_SM11_top_p_zero_or_below_float32s_smallest_is_refused_naming_top_p(top_p, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(top_p=top_p)


def test_SM12_top_p_nan_is_refused_naming_top_p():
    with pytest.raises(ValueError, match="top_p=nan: must be a finite number"):
        SamplingParams(top_p=NAN)


def test_SM17_temperature_minus_zero_is_greedy():
    z = _logits()
    tokens, raw, processed = _sample(z, temperature=-0.0, return_processed_logprobs=True)
    assert tokens.tolist() == z.argmax(-1).tolist()
    assert torch.equal(raw, z.log_softmax(-1).amax(-1)) and processed.tolist() == [0.0] * 4


def test_SM40_an_all_minus_inf_row_is_refused_with_top_p_and_temperature():
    z = _logits()
    z[2] = -INF
    _refused(z, r"rows \[2\] are all -inf \(no token has mass\)", temperature=0.7, top_p=0.9)


# ---------------------------------------------------------------- Engine.generate on tiny-llama

PROMPTS = [[5, 6, 9, 10], [11, 12]]


def _engine(zoo, dtype: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> Engine:
    """tiny-llama with its HF weights edited before loading (the engine's own path to its weights)."""
    path = zoo("tiny-llama")
    weights = dict(read_safetensors(path))
    edit(weights)
    return Engine(read_config(path), weights, dtype=dtype)


def _set(name: str, index: tuple[int, ...], value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(weights: dict[str, torch.Tensor]) -> None:
        weights[name] = weights[name].clone()
        weights[name][index] = value
    return edit


def _generate_refused(eng: Engine, match: str, **params) -> str:
    with pytest.raises(NonFiniteLogitsError, match=match) as e:
        eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, seed=0, **params))
    return str(e.value)


def test_EG01_a_nan_lm_head_row_is_refused_naming_non_finite_logits(zoo):
    eng = _engine(zoo, "float32", _set(LM_HEAD, (7,), NAN))
    _generate_refused(eng, r"sampling step 0: the logits of rows \[0, 1, 2, 3\] are not finite \(NaN\).*" + MODEL_FIX)


def test_EG02_a_nan_in_q_proj_is_refused_naming_non_finite_logits(zoo):
    eng = _engine(zoo, "float32", _set(Q_PROJ, (0, 0), NAN))
    _generate_refused(eng, r"rows \[0, 1, 2, 3\] are not finite \(NaN\)")


def test_EG03_an_overflowing_lm_head_row_is_refused_naming_inf(zoo):
    """Row 7 = 3e38: logit 7 overflows, to +inf in the rollouts of prompt 0 (named) and to -inf
    (a token without mass, harmless) in those of prompt 1."""
    eng = _engine(zoo, "float32", _set(LM_HEAD, (7,), 3e38))
    msg = _generate_refused(eng, r"rows \[0, 1\] are not finite \(\+inf, an overflow\)")
    assert "[2" not in msg


def test_EG04_a_bf16_engine_with_nan_in_q_proj_is_refused(zoo):
    eng = _engine(zoo, "bfloat16", _set(Q_PROJ, (0, 0), NAN))
    _generate_refused(eng, r"are not finite \(NaN\).*" + MODEL_FIX)


def test_EG05_a_bf16_engine_with_nan_in_q_proj_is_refused_when_greedy(zoo):
    eng = _engine(zoo, "bfloat16", _set(Q_PROJ, (0, 0), NAN))
    _generate_refused(eng, r"are not finite \(NaN\).*" + MODEL_FIX, temperature=0)


def test_EG06_a_bf16_engine_with_top_p_1e_300(zoo):
    """Refused at construction, before any engine runs; the smallest valid top_p keeps the top token."""
    with pytest.raises(ValueError, match=r"top_p=1e-300 is below float32's smallest normal number"):
        SamplingParams(top_p=1e-300)
    eng = _engine(zoo, "bfloat16", lambda weights: None)
    outs = eng.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=8, seed=0, top_p=TINY,
                                                return_processed_logprobs=True))
    assert all(o.processed_logprobs.tolist() == [0.0] * len(o.token_ids) for o in outs)
