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

import math
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


def test_SM01_fp16_logits_that_overflowed_name_the_dtype_and_bfloat16():
    """Gemma 3 in fp16: the first forward overflows; the fix is the dtype, not the weights or the lr."""
    z = _logits().half()
    z[2, 7] = INF
    msg = _refused(z, r"rows \[2\] are not finite \(\+inf")
    assert "overflowed float16 (largest finite value 65504)" in msg and "run the engine in bfloat16" in msg
    assert "overflowed" not in _refused(_logits().masked_fill(torch.eye(4, 3000, dtype=torch.bool), INF), "inf")


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


@pytest.mark.parametrize("case, temperature", [("SM08", 1e-38), ("SM08b", 1e-45)])
def test_SM08_SM08b_a_temperature_below_float32s_range_is_refused(case, temperature):
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


# ---------------------------------------------------------------- the other sampler cases (SM07-SM39)
NEG = float("-inf")


def _only(v: int, ids: list[int], b: int = 3) -> torch.Tensor:
    """[b, v] logits with ``ids`` the only finite entries (0: equal mass)."""
    z = torch.full((b, v), NEG)
    z[:, ids] = 0.0
    return z


def test_SM07_one_finite_logit_per_row_is_that_token():
    z = torch.full((2, 3000), NEG)
    z[0, 2999], z[1, 1024] = 1.0, 1.0  # the last id, and the first of a block
    assert _sample(z)[0].tolist() == [2999, 1024]


def test_SM09_a_huge_temperature_samples_near_uniform():
    tokens = _sample(torch.randn(4000, 8, generator=torch.Generator().manual_seed(1)), temperature=1e30)[0]
    assert (torch.bincount(tokens, minlength=8) / 4000 - 1 / 8).abs().max() < 0.03


@pytest.mark.parametrize("case, top_k", [("SM13", 3005), ("SM14", -1)])
def test_SM13_SM14_top_k_past_the_vocabulary_or_minus_1_is_off(case, top_k):
    z = _logits()
    assert torch.equal(_sample(z, top_k=top_k)[0], _sample(z)[0])


@pytest.mark.parametrize("case, value, match", [
    ("SM15", {"top_k": -2}, r"top_k=-2: use a positive k, or 0 / -1 to disable"),
    ("SM16", {"top_k": True}, r"top_k=True: must be an int, not bool"),
    ("SM18", {"temperature": "1"}, r"temperature='1': must be a finite number"),
    ("SM37", {"n": 0}, r"n=0: need at least one sample per prompt \(n >= 1\)"),
])
def test_SM15_SM16_SM18_SM37_bad_params_are_refused_naming_them(case, value, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**value)


@pytest.mark.parametrize("case, params", [("SM19", {"top_p": 0.5}), ("SM20", {"top_k": 1})])
def test_SM19_SM20_a_vocabulary_of_one_gives_token_0_logprob_0(case, params):
    tokens, raw, _ = _sample(torch.randn(3, 1), **params)
    assert tokens.tolist() == [0, 0, 0] and raw.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_SM21_vocab_0_is_refused(temperature):
    """Was an IndexError from torch's amax over an empty dimension."""
    with pytest.raises(ValueError, match=r"sampling step 0: the logits have shape \[2, 0\], a vocabulary of 0 tokens"
                                         r".*check the model's vocab_size"):
        _sample(torch.randn(2, 0), temperature=temperature)


def test_SM22_batch_0_is_an_empty_result():
    tokens, raw, _ = _sample(torch.randn(0, 10))
    assert tokens.shape == (0,) and raw.shape == (0,)


@pytest.mark.parametrize("case, v", [("SM23", 1024), ("SM24", 1025), ("SM25", 2049)])
def test_SM23_SM25_only_the_last_entry_possible_is_drawn(case, v):
    """V at and just past a block boundary: the one-entry last block is searched right."""
    assert _sample(_only(v, [v - 1]))[0].tolist() == [v - 1] * 3


def test_SM26_float16_logits_draw_only_unmasked_ids():
    ids = torch.randperm(3000, generator=torch.Generator().manual_seed(0))[:10].tolist()
    z = torch.full((64, 3000), NEG, dtype=torch.float16)
    z[:, ids] = torch.randn(10).half()
    assert set(_sample(z)[0].tolist()) <= set(ids)


@pytest.mark.parametrize("case, z", [("SM27", (torch.randn(4, 3000) * 1e30).bfloat16()),
                                     ("SM28", torch.randn(4, 3000, dtype=torch.float64))])
def test_SM27_SM28_bf16_near_its_max_and_float64_logits_give_valid_tokens(case, z):
    tokens, raw, _ = _sample(z)
    assert ((0 <= tokens) & (tokens < 3000)).all() and torch.isfinite(raw).all()


def test_SM29_SM31_inverse_cdf_at_its_documented_edges():
    """Internal preconditions (its docstring): u of 1 gives the last positive token (SM31); outside
    them (u of 0, an all-zero row SM29, a negative weight SM30) an index in range, never a crash;
    ``uniforms`` keeps u inside (0, 1)."""
    from minirl.engine.sampling import inverse_cdf, uniforms

    u = torch.tensor([0.0, 1.0], dtype=torch.float64)
    weights = torch.zeros(2, 3000)
    weights[:, [7, 1500, 2999]] = 1.0
    assert inverse_cdf(weights, u).tolist() == [0, 2999]
    assert inverse_cdf(torch.zeros(2, 10), u).tolist() == [0, 0]
    drawn = uniforms(0, torch.arange(10_000), 0)
    assert ((0 < drawn) & (drawn < 1)).all()
    assert 0 <= inverse_cdf(torch.tensor([[1.0, -1.0, 1.0]]), u[:1] + 0.5).item() < 3


def test_SM32_a_masked_last_block_is_never_drawn():
    z = torch.randn(1, 2100)
    z[:, 2048:] = NEG
    assert max(sample(z, SamplingParams(), seed, torch.arange(1), 0)[0].item() for seed in range(300)) < 2048


@pytest.mark.parametrize("case, seed, rows, step", [
    ("SM33", 0, [2**63 - 1, 0], 0), ("SM34", -5, [0, 1], -3), ("SM35", 10**30, [0, 1], 0)])
def test_SM33_SM35_extreme_seeds_rows_and_steps_are_valid_and_reproducible(case, seed, rows, step):
    z = _logits(2)
    first, again = (sample(z, SamplingParams(), seed, torch.tensor(rows), step)[0] for _ in range(2))
    assert torch.equal(first, again) and ((0 <= first) & (first < 3000)).all()


def test_SM36_SM38_odd_stop_ids_are_harmless_and_max_new_tokens_is_capped_by_positions(zoo):
    """Stop ids no token has never match; 10**12 new tokens stop at the model's last position."""
    eng = _engine(zoo, "float32", lambda weights: None)
    outs = eng.generate([[5, 6]], SamplingParams(max_new_tokens=10**12, stop_token_ids=(-1, 10**12), ignore_eos=True,
                                                 seed=0))
    assert len(outs[0].token_ids) == eng.spec.max_positions - 2


def test_SM39_draws_follow_the_probabilities_across_a_block_boundary():
    z = torch.full((4000, 3000), NEG)
    z[:, 1023], z[:, 1024], z[:, 5] = math.log(0.7), math.log(0.2), math.log(0.1)
    counts = torch.bincount(_sample(z)[0], minlength=1025)[[1023, 1024, 5]].tolist()
    assert all(abs(c - e) < 4 * math.sqrt(e) for c, e in zip(counts, (2800, 800, 400))), counts
